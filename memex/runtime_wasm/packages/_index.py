"""The package indexes MemEx reads guest packages from, read as hostile input: the simple
repository API (PEP 503 HTML and PEP 691 JSON pages, PEP 658 metadata files), over http(s)
or from a local folder (``file://``), each read bounded in bytes and time and cancellable.

Which indexes: pip's own configuration, read (never run): ``PIP_INDEX_URL`` and
``PIP_EXTRA_INDEX_URL``, else ``index-url`` and ``extra-index-url`` of pip's configuration
files (``[global]``, then ``[install]``), else PyPI. A project is taken from the first index
that lists it, in that order (as uv does; pip would merge every index's files, which lets an
extra index shadow a name of the first: dependency confusion). Credentials come from the URL
or ``~/.netrc``; ``PIP_CERT``/``cert`` names the CA bundle.
"""

from __future__ import annotations

import base64
import configparser
import contextlib
import hashlib
import html.parser
import json
import os
import re
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ...errors import PackageError
from .._tls import index_tls

__all__ = ["DEFAULT_INDEX", "Index", "IndexFile", "cancel_all", "configured_indexes",
           "redact"]

DEFAULT_INDEX = "https://pypi.org/simple"
MAX_PAGE_BYTES = 32 << 20
"""A project's page (PyPI's largest are a few MiB)."""
MAX_METADATA_BYTES = 4 << 20
MAX_PAGE_FILES = 50_000
READ_TIMEOUT = 30.0
"""Seconds one read may wait on the network (the whole resolution has its own deadline)."""
MAX_REDIRECTS = 5
MAX_REQUESTS = 2_000
"""Reads one resolution may make (pages, metadata files, wheels): a tree that names more
projects than this is refused, whatever each read costs."""
MAX_FILES_KEPT = 200_000
"""File entries one resolution keeps from the pages it read (PyPI's largest projects list a
few thousand): what its memory holds is bounded by this, not by the pages' count."""
_CHUNK = 1 << 16
_JSON = "application/vnd.pypi.simple.v1+json"
_ACCEPT = f"{_JSON}, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.1"


@dataclass(frozen=True)
class IndexFile:
    """One file a project's page lists."""

    filename: str
    url: str
    index: str  # the index that listed it (credentials removed)
    sha256: str | None  # from the page: what the bytes must hash to
    requires_python: str | None
    yanked: bool
    metadata: str | None  # PEP 658: None (no metadata file), "" (one, no hash), or its sha256


def redact(url: str) -> str:
    """``url`` without its credentials (for messages and records)."""
    p = urllib.parse.urlsplit(url)
    if p.username is None and p.password is None:
        return url
    host = p.hostname or ""
    if p.port:
        host += f":{p.port}"
    return urllib.parse.urlunsplit((p.scheme, host, p.path, p.query, p.fragment))


def _pip_config() -> dict[str, str]:
    """index-url, extra-index-url, cert and no-index from pip's configuration files, in pip's
    order (later wins): the machine's, the user's, the environment's (the running Python's
    prefix), then ``PIP_CONFIG_FILE``; ``[global]`` then ``[install]`` of each."""
    files: list[Path] = []
    for d in (os.environ.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(":"):
        if d:
            files.append(Path(d) / "pip" / "pip.conf")
    files.append(Path("/etc/pip.conf"))
    home = Path.home()
    files.append(home / ".pip" / "pip.conf")
    files.append(Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config") / "pip" /
                 "pip.conf")
    files.append(Path(sys.prefix) / "pip.conf")
    named = os.environ.get("PIP_CONFIG_FILE")
    if named == os.devnull:
        return {}
    if named:
        files.append(Path(named))
    stamps = []
    for f in files:  # parsed again only when a file changed (a stat each: microseconds)
        try:
            st = f.stat()
            stamps.append((str(f), st.st_mtime_ns, st.st_size))
        except OSError:
            stamps.append((str(f), 0, -1))
    key = tuple(stamps)
    if _CONFIG[0] == key:
        return dict(_CONFIG[1])
    out = _read_config(files)
    _CONFIG[:] = [key, out]
    return dict(out)


_CONFIG: list[Any] = [None, {}]


def _read_config(files: list[Path]) -> dict[str, str]:
    out: dict[str, str] = {}
    for f in files:
        parser = configparser.RawConfigParser()
        try:
            if f.is_file() and f.stat().st_size < (1 << 20):
                parser.read(f, encoding="utf-8")
        except (OSError, configparser.Error, UnicodeDecodeError):
            continue
        for section in ("global", "install"):
            if parser.has_section(section):
                for key in ("index-url", "extra-index-url", "cert", "no-index"):
                    if parser.has_option(section, key):
                        out[key] = parser.get(section, key)
    return out


def configured_indexes(index_url: str | None = None) -> tuple[str, ...]:
    """The indexes to read, first first: ``index_url`` alone when given, else pip's."""
    if index_url:
        return (index_url.rstrip("/"),)
    conf = _pip_config()
    no_index = os.environ.get("PIP_NO_INDEX") or conf.get("no-index") or ""
    if no_index.strip().lower() in ("1", "true", "yes", "on"):
        raise PackageError("pip is configured with no-index (find-links only): guest packages "
                           "come from an index (PIP_INDEX_URL, or a file:// simple index "
                           "folder), which MemEx reads itself")
    first = os.environ.get("PIP_INDEX_URL") or conf.get("index-url") or DEFAULT_INDEX
    extra = os.environ.get("PIP_EXTRA_INDEX_URL") or conf.get("extra-index-url") or ""
    out: list[str] = []
    for u in (first, *extra.split()):
        u = u.strip().rstrip("/")
        if u and u not in out:
            out.append(u)
    return tuple(out)


def _cert() -> str | None:
    return os.environ.get("PIP_CERT") or _pip_config().get("cert") or None


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.base: str | None = None
        self.anchors: list[dict[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "base" and self.base is None:
            self.base = dict(attrs).get("href")
        elif tag == "a" and len(self.anchors) <= MAX_PAGE_FILES:
            self.anchors.append(dict(attrs))


_HEX64 = re.compile(r"[0-9a-f]{64}")


def _sha_of(text: str | None) -> str | None:
    """A sha256 named as ``sha256=HEX`` (a fragment or PEP 658 attribute), else None."""
    if not text:
        return None
    for part in text.split("&"):
        algo, _, value = part.partition("=")
        if algo.strip().lower() == "sha256" and _HEX64.fullmatch(value.strip().lower()):
            return value.strip().lower()
    return None


class _Cancelled(PackageError):
    pass


_ALL: set[Index] = set()
_ALL_LOCK = threading.Lock()


def cancel_all(reason: str = "the server is stopping") -> None:
    """Stop every resolution of this process now: their open reads are closed (a server's
    SIGTERM: no fetch outlives it, none waits on a slow index)."""
    with _ALL_LOCK:
        live = list(_ALL)
    for idx in live:
        idx.cancel(reason)


class Index:
    """The configured indexes for one resolution: pages and files, read bounded, with one
    deadline and a cancel that closes whatever read is open."""

    def __init__(self, urls: Sequence[str], *, deadline: float, download_budget: int) -> None:
        if not urls:
            raise PackageError("no package index is configured")
        self.urls = tuple(urls)
        self.deadline = deadline
        self.requests = 0
        # wheel bytes downloaded (the set's, and candidates whose metadata had to be read
        # from the wheel itself): one budget for both
        self.downloaded = 0
        self.download_budget = download_budget
        self._kept = 0  # file entries of the pages kept
        self._cancelled: str | None = None
        self._open: set[IO[bytes]] = set()
        self._lock = threading.Lock()
        self._pages: dict[str, tuple[str, list[IndexFile]] | None] = {}
        # host -> (user, password): an index's credentials go to its own host only
        self._creds: dict[str, tuple[str, str]] = {}
        for u in self.urls:
            p = urllib.parse.urlsplit(u)
            if p.username is not None and p.hostname:
                self._creds[p.hostname] = (urllib.parse.unquote(p.username),
                                           urllib.parse.unquote(p.password or ""))
        self._opener = urllib.request.build_opener(
            urllib.request.HTTPSHandler(context=index_tls(_cert())), _Redirects())

    def __enter__(self) -> Index:
        with _ALL_LOCK:
            _ALL.add(self)
        return self

    def __exit__(self, *exc: object) -> None:
        with _ALL_LOCK:
            _ALL.discard(self)

    def cancel(self, reason: str) -> None:
        with self._lock:
            self._cancelled = reason
            live = list(self._open)
        for f in live:
            with contextlib.suppress(Exception):
                f.close()

    def _check(self) -> None:
        if self._cancelled is not None:
            raise _Cancelled(f"the package resolution was stopped: {self._cancelled}")
        if time.monotonic() > self.deadline:
            raise PackageError("the package resolution ran out of time")

    # ---- pages ---------------------------------------------------------------------------
    def project(self, name: str) -> tuple[str, list[IndexFile]] | None:
        """(index, files) of the first index that lists project ``name`` (canonical), None
        when none does."""
        if name in self._pages:
            return self._pages[name]
        found = None
        for base in self.urls:
            files = self._page(base, name)
            if files is not None:
                found = (redact(base), files)
                self._kept += len(files)
                if self._kept > MAX_FILES_KEPT:
                    raise PackageError(f"the resolution read pages listing more than "
                                       f"{MAX_FILES_KEPT} files (at {name})")
                break
        self._pages[name] = found
        return found

    def _page(self, base: str, name: str) -> list[IndexFile] | None:
        url = f"{base}/{urllib.parse.quote(name)}/"
        try:
            body, final, kind = self._get(url, MAX_PAGE_BYTES, accept=_ACCEPT, page=True)
        except _NotFound:
            return None
        if kind.split(";")[0].strip() == _JSON:
            return self._from_json(body, final, base, name)
        return self._from_html(body, final, base, name)

    def _from_json(self, body: bytes, final: str, base: str, name: str) -> list[IndexFile]:
        try:
            doc = json.loads(body)
            entries = doc["files"]
            if not isinstance(entries, list):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            raise PackageError(f"the index {redact(base)} answered {name!r} with a page that "
                               "is not the simple API's JSON") from None
        out = []
        for e in entries[:MAX_PAGE_FILES]:
            if not isinstance(e, dict) or not isinstance(e.get("filename"), str) or \
                    not isinstance(e.get("url"), str):
                continue
            hashes = e.get("hashes")
            sha = str(hashes.get("sha256", "")).lower() if isinstance(hashes, dict) else ""
            meta = e.get("core-metadata", e.get("dist-info-metadata"))
            meta_sha: str | None = None
            if meta is True:
                meta_sha = ""
            elif isinstance(meta, dict):
                m = str(meta.get("sha256", "")).lower()
                meta_sha = m if _HEX64.fullmatch(m) else ""
            rp = e.get("requires-python")
            f = self._file(final, base, e["filename"], e["url"],
                           sha if _HEX64.fullmatch(sha) else None,
                           rp if isinstance(rp, str) else None,
                           bool(e.get("yanked")), meta_sha)
            if f is not None:
                out.append(f)
        return out

    def _from_html(self, body: bytes, final: str, base: str, name: str) -> list[IndexFile]:
        parser = _Links()
        try:
            parser.feed(body.decode("utf-8", "replace"))
            parser.close()
        except Exception:  # html.parser on hostile input: any failure is one answer
            raise PackageError(f"the index {redact(base)} answered {name!r} with a page "
                               "that cannot be read") from None
        page = urllib.parse.urljoin(final, parser.base) if parser.base else final
        out = []
        for a in parser.anchors[:MAX_PAGE_FILES]:
            href = a.get("href")
            if not href:
                continue
            target, _, frag = href.partition("#")
            filename = urllib.parse.unquote(target.rsplit("/", 1)[-1])
            meta_attr = a.get("data-core-metadata", a.get("data-dist-info-metadata"))
            meta_sha: str | None = None
            if meta_attr is not None and meta_attr.lower() != "false":
                meta_sha = _sha_of(meta_attr) or ""
            f = self._file(page, base, filename, target, _sha_of(frag),
                           a.get("data-requires-python"), "data-yanked" in a, meta_sha)
            if f is not None:
                out.append(f)
        return out

    @staticmethod
    def _file(page: str, base: str, filename: str, href: str, sha: str | None,
              requires_python: str | None, yanked: bool, meta: str | None) -> IndexFile | None:
        """A file entry, None for one whose address the index may not send us to: a page
        served over http(s) names only http(s) files (never this machine's paths)."""
        url = urllib.parse.urljoin(page, href)
        scheme = urllib.parse.urlsplit(url).scheme.lower()
        page_scheme = urllib.parse.urlsplit(page).scheme.lower()
        if scheme not in ("http", "https") and not (scheme == "file" == page_scheme):
            return None
        if "/" in filename or "\\" in filename or not filename or len(filename) > 255:
            return None
        return IndexFile(filename, url, redact(base), sha, requires_python, yanked, meta)

    # ---- files ---------------------------------------------------------------------------
    def metadata(self, f: IndexFile) -> bytes:
        """The PEP 658 metadata file of ``f`` (checked against its hash when the page gave
        one)."""
        body, _, _ = self._get(f.url + ".metadata", MAX_METADATA_BYTES)
        if f.metadata and hashlib.sha256(body).hexdigest() != f.metadata:
            raise PackageError(f"{f.filename}: its metadata file from {f.index} does not "
                               "match the hash the index gave for it")
        return body

    def download(self, f: IndexFile, dest: Path, cap: int) -> str:
        """``f`` written to ``dest`` (at most ``cap`` bytes, and what is left of the
        resolution's download budget, else PackageError); its sha256, which must be the one
        the index gave."""
        h = hashlib.sha256()
        left = self.download_budget - self.downloaded
        if left <= 0:
            raise PackageError(f"fetching {f.filename} would download more than "
                               f"{self.download_budget} bytes in one resolution: refused")
        with dest.open("wb") as out:
            for chunk in self._stream(f.url, min(cap, left)):
                self.downloaded += len(chunk)
                h.update(chunk)
                out.write(chunk)
        digest = h.hexdigest()
        if f.sha256 is not None and digest != f.sha256:
            raise PackageError(f"{f.filename} from {f.index}: its bytes do not match the "
                               "sha256 the index gave for them")
        return digest

    # ---- the wire --------------------------------------------------------------------------
    def _auth(self, url: str) -> dict[str, str]:
        """The credentials for ``url``'s host: its own, an index's on that host, or
        ``~/.netrc``'s."""
        p = urllib.parse.urlsplit(url)
        if p.username is not None:
            return _basic(urllib.parse.unquote(p.username), urllib.parse.unquote(p.password or ""))
        if not p.hostname:
            return {}
        if p.hostname in self._creds:
            return _basic(*self._creds[p.hostname])
        import netrc

        with contextlib.suppress(OSError, netrc.NetrcParseError):
            found = netrc.netrc().authenticators(p.hostname)
            if found:
                return _basic(found[0], found[2] or "")
        return {}

    def _get(self, url: str, cap: int, *, accept: str | None = None, page: bool = False
             ) -> tuple[bytes, str, str]:
        parts: list[bytes] = []
        meta: dict[str, str] = {}
        for chunk in self._stream(url, cap, accept=accept, page=page, meta=meta):
            parts.append(chunk)
        return b"".join(parts), meta.get("url", url), meta.get("type", "")

    def _stream(self, url: str, cap: int, *, accept: str | None = None, page: bool = False,
                meta: dict[str, str] | None = None) -> Iterator[bytes]:
        """The bytes at ``url`` in chunks, at most ``cap`` of them (PackageError past it)."""
        self._check()
        self.requests += 1
        if self.requests > MAX_REQUESTS:
            raise PackageError(f"the resolution made more than {MAX_REQUESTS} reads of the "
                               "index: refused")
        if urllib.parse.urlsplit(url).scheme.lower() == "file":
            yield from self._local(url, cap, page, meta)
            return
        req = urllib.request.Request(_bare(url), headers={"User-Agent": "memex",
                                                         **({"Accept": accept} if accept
                                                            else {}),
                                                         **self._auth(url)})
        timeout = max(0.1, min(READ_TIMEOUT, self.deadline - time.monotonic()))
        try:
            resp = self._opener.open(req, timeout=timeout)
        except urllib.error.HTTPError as exc:
            exc.close()
            if page and exc.code in (404, 410):
                raise _NotFound from None
            raise PackageError(f"{redact(url)} answered {exc.code}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            self._check()
            raise PackageError(f"{redact(url)} cannot be reached: "
                               f"{getattr(exc, 'reason', exc)}") from None
        with self._lock:
            self._open.add(resp)
        try:
            if meta is not None:
                meta["url"], meta["type"] = resp.geturl(), resp.headers.get("Content-Type", "")
            declared = resp.headers.get("Content-Length")
            if declared and declared.isdigit() and int(declared) > cap:
                raise PackageError(f"{redact(url)} is {int(declared)} bytes, more than "
                                   f"{cap}")
            got = 0
            while True:
                self._check()
                try:
                    chunk = resp.read(_CHUNK)
                except (OSError, ValueError, AttributeError) as exc:
                    self._check()
                    raise PackageError(f"reading {redact(url)} failed: {exc}") from None
                if not chunk:
                    return
                got += len(chunk)
                if got > cap:
                    raise PackageError(f"{redact(url)} is more than {cap} bytes")
                yield chunk
        finally:
            with self._lock:
                self._open.discard(resp)
            resp.close()

    def _local(self, url: str, cap: int, page: bool, meta: dict[str, str] | None
               ) -> Iterator[bytes]:
        path = Path(urllib.request.url2pathname(urllib.parse.urlsplit(url).path))
        if page and path.is_dir():
            path = path / "index.html"
        if meta is not None:
            meta["url"], meta["type"] = url, "text/html"
        try:
            f = path.open("rb")
        except OSError:
            if page:
                raise _NotFound from None
            raise PackageError(f"{url} cannot be read") from None
        with f:
            got = 0
            while chunk := f.read(_CHUNK):
                self._check()
                got += len(chunk)
                if got > cap:
                    raise PackageError(f"{url} is more than {cap} bytes")
                yield chunk


class _NotFound(Exception):
    pass


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Follows at most MAX_REDIRECTS, to http(s) only."""

    max_redirections = MAX_REDIRECTS

    def redirect_request(self, req: urllib.request.Request, fp: IO[bytes], code: int,
                         msg: str, headers: Any, newurl: str) -> urllib.request.Request | None:
        if urllib.parse.urlsplit(newurl).scheme.lower() not in ("http", "https"):
            raise PackageError(f"{redact(req.full_url)} redirected outside http(s)")
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urllib.parse.urlsplit(newurl).netloc != \
                urllib.parse.urlsplit(req.full_url).netloc:
            new.remove_header("Authorization")  # credentials stay with their host
        return new


def _bare(url: str) -> str:
    """``url`` without credentials or fragment (what goes on the wire)."""
    p = urllib.parse.urlsplit(redact(url))
    return urllib.parse.urlunsplit((p.scheme, p.netloc, p.path, p.query, ""))


def _basic(user: str, password: str) -> dict[str, str]:
    token = f"{user}:{password}".encode()
    return {"Authorization": "Basic " + base64.b64encode(token).decode()}
