"""A package index on 127.0.0.1 (PEP 503 simple pages, with each file's sha256, and each
wheel's metadata beside it as PEP 658 says, as PyPI does) serving wheels the tests build:
what MemEx fetches guest packages from in the tests."""

from __future__ import annotations

import base64
import hashlib
import http.server
import threading
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from packaging.utils import canonicalize_name


def build_wheel(folder: Path, name: str, version: str, files: dict[str, str | bytes],
                requires: tuple[str, ...] = (), tag: str = "py3-none-any") -> Path:
    """A wheel of ``files`` (path -> content) with its metadata and RECORD."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires)
    body: dict[str, bytes] = {k: v.encode() if isinstance(v, str) else v
                              for k, v in files.items()}
    body[f"{info}/METADATA"] = meta.encode()
    body[f"{info}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: memex-tests\n"
                             f"Root-Is-Purelib: {str(tag.endswith('any')).lower()}\n"
                             f"Tag: {tag}\n").encode()
    record = []
    for path, data in body.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(data)}")
    record.append(f"{info}/RECORD,,")
    body[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    out = folder / f"{dist}-{version}-{tag}.whl"
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in body.items():
            z.writestr(path, data)
    return out


def _metadata(wheel: Path) -> bytes | None:
    """The wheel's METADATA, None when it has none to give (a malformed wheel: the index
    then names no metadata file for it, as one built by another tool might)."""
    try:
        with zipfile.ZipFile(wheel) as z:
            name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            return z.read(name)
    except (zipfile.BadZipFile, StopIteration, OSError):
        return None


class PackageIndex:
    """Serves every wheel in ``folder`` at ``url`` (``/simple/<name>/``)."""

    def __init__(self, folder: Path, metadata: bool = True) -> None:
        self.folder = folder
        self.metadata = metadata  # serve each wheel's METADATA beside it (PEP 658), as PyPI
        self.requests: list[str] = []
        self.slow: set[str] = set()  # files sent 64 KiB every 10 ms
        self.sent: dict[str, int] = {}  # bytes of each slow file sent before the end
        self.undeclared: set[str] = set()  # slow files sent without a Content-Length
        self.swap: dict[str, bytes] = {}  # files served with other bytes than their page's hash
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                index.requests.append(self.path)
                parts = [p for p in self.path.split("?")[0].split("/") if p]
                if len(parts) == 2 and parts[0] == "simple":
                    links = []
                    for f in sorted(index.folder.iterdir()):
                        if f.suffix not in (".whl", ".gz"):
                            continue
                        if canonicalize_name(f.name.split("-")[0]) == canonicalize_name(
                                parts[1]):
                            sha = hashlib.sha256(f.read_bytes()).hexdigest()
                            meta = ""
                            found = _metadata(f) if index.metadata and f.suffix == ".whl" \
                                else None
                            if found is not None:
                                msha = hashlib.sha256(found).hexdigest()
                                meta = f' data-core-metadata="sha256={msha}"'
                            links.append(f'<a href="/files/{f.name}#sha256={sha}"{meta}>'
                                         f'{f.name}</a>')
                    if not links:
                        return self._send(404, b"not found", "text/plain")
                    page = "<!DOCTYPE html><html><body>" + "".join(links) + "</body></html>"
                    return self._send(200, page.encode(), "text/html")
                if len(parts) == 2 and parts[0] == "files" and parts[1].endswith(".metadata"):
                    f = index.folder / parts[1][:-len(".metadata")]
                    found = _metadata(f) if index.metadata and f.is_file() and \
                        f.parent == index.folder else None
                    if found is not None:
                        return self._send(200, found, "application/octet-stream")
                if len(parts) == 2 and parts[0] == "files":
                    f = index.folder / parts[1]
                    if f.is_file() and f.parent == index.folder:
                        if f.name in index.slow:
                            return self._trickle(f)
                        return self._send(200, index.swap.get(f.name) or f.read_bytes(),
                                          "application/octet-stream")
                self._send(404, b"not found", "text/plain")

            def _trickle(self, f: Path) -> None:
                data = f.read_bytes()
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                if f.name not in index.undeclared:  # else its end is the connection's
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                index.sent[f.name] = 0
                try:
                    for i in range(0, len(data), 1 << 16):
                        self.wfile.write(data[i:i + (1 << 16)])
                        self.wfile.flush()
                        index.sent[f.name] = i + len(data[i:i + (1 << 16)])
                        time.sleep(0.01)
                except OSError:  # the client went away
                    pass

            def _send(self, status: int, body: bytes, kind: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple"
        # its shutdown waits for the loop's next look (every poll_interval: 0.5 s unless
        # told), twice a test for some: a short one
        self._thread = threading.Thread(target=self.server.serve_forever,
                                        kwargs={"poll_interval": 0.01}, daemon=True)
        self._thread.start()

    def fetched(self) -> list[str]:
        """The files (wheels, sdists) downloaded so far; metadata files aside."""
        return [p.rsplit("/", 1)[1] for p in self.requests
                if p.startswith("/files/") and not p.endswith(".metadata")]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def package_index(folder: Path, metadata: bool = True) -> Iterator[PackageIndex]:
    index = PackageIndex(folder, metadata)
    try:
        yield index
    finally:
        index.close()


def hostile_wheel(folder: Path, name: str, marker: Path) -> Path:
    """A wheel of ``name`` whose dependency is a direct reference to a source tree on this
    machine whose build code (setup.py) would leave ``marker``: what a host that builds it
    runs."""
    tree = folder / f"{name}-evilsrc"
    tree.mkdir(exist_ok=True)
    (tree / "setup.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
        "from setuptools import setup\nsetup(name='memexevil', version='1.0')\n")
    return build_wheel(folder, name, "1.0", {f"{name.replace('-', '_')}.py": ""},
                       requires=(f"memexevil @ file://{tree}",))
