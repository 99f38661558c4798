"""Hostile guests, round 2 (SECURITY.md, "The runtime's own bookkeeping"): a guest that knows
how the host keeps its books tries to beat them. Each test runs against every backend and
pairs the attack with a positive control: the same probe doing what it may, so a test cannot
pass because the probe stopped working.

Classes: the disk ledger through a renamed folder's descriptor; links moved out of a mount;
another sandbox's files through the warm-image cache; trees too deep for the host to walk;
forks multiplying disk; door frames that cost more than their bytes; secrets in a compressed
egress response. Decompression bombs in checkpoint blobs and image files are host inputs,
tested once at the API (test_decoder_bombs.py).
"""

from __future__ import annotations

import ast
import gzip
import json
import os
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import brotli
import pytest

from memex import Limits, Mount, Sandbox
from memex.backends import Backend
from memex.host_tools import Egress, EgressPolicy
from memex.runtime_wasm import SandboxAPI

OpenSandbox = Callable[..., SandboxAPI[Any]]
MiB = 1 << 20
QUOTA = dict(timeout=20, memory=256 * MiB, disk_bytes=8 * MiB, disk_files=400, open_files=64)

# what the guest sees of its /tmp: (bytes of regular files, entries) by walking it
WALK = """
import os
def walk(top):
    size = n = 0
    for root, dirs, files in os.walk(top):
        n += len(dirs) + len(files)
        size += sum(os.lstat(os.path.join(root, f)).st_size for f in files)
    return size, n
"""


def _usable(sb: SandboxAPI[Any]) -> None:
    r = sb.run("6 * 7")
    assert r.ok and r.value == "42", r


# ---- the disk ledger --------------------------------------------------------------------------
RENAMED_DIR = WALK + """
import errno
fd = None
written = refused = 0
for i in range(40):
    try:
        os.mkdir(f'/tmp/d{i}')
        fd = os.open(f'/tmp/d{i}', os.O_RDONLY)
        os.rename(f'/tmp/d{i}', f'/tmp/moved{i}')   # the descriptor still names the folder
        os.mkdir(f'/tmp/d{i}')                        # a look-alike where it was
        f = os.open('big', os.O_CREAT | os.O_WRONLY, dir_fd=fd)
        os.close(fd)
        try:
            os.write(f, b'x' * (1 << 20)); written += 1
        finally:
            os.close(f)
        os.rmdir(f'/tmp/d{i}')                        # deleting the look-alike frees nothing
    except OSError as e:
        refused += e.errno == errno.EDQUOT
        break
print(written, refused, *walk('/tmp'))
"""


def test_a_renamed_folders_descriptor_cannot_beat_the_disk_ledger(
        open_sandbox: OpenSandbox) -> None:
    sb = open_sandbox(limits=Limits(**QUOTA))
    r = sb.run(RENAMED_DIR)
    assert r.ok, r
    written, refused, size, entries = map(int, r.stdout.split())
    # the writes through the old descriptor land in the renamed folder and are counted there:
    # the quota stops them at 8 MiB, and what the ledger says is what /tmp holds
    assert written == 8 and refused == 1, r.stdout
    assert size == 8 * MiB <= QUOTA["disk_bytes"]
    assert r.limit == "disk" and r.disk_bytes == size and r.disk_files == entries, r
    # positive control: deleting what was written frees it, and the space is usable again
    r = sb.run("import shutil\nfor n in os.listdir('/tmp'):\n    shutil.rmtree('/tmp/' + n)\n"
               "open('/tmp/again', 'wb').write(b'y' * (7 << 20))")
    assert r.ok and r.disk_bytes == 7 * MiB and r.limit is None, r


# ---- links ------------------------------------------------------------------------------------
LINKS_CELL = """
import os
out = {}
def attempt(name, f):
    try:
        f(); out[name] = 'done'
    except OSError as e:
        out[name] = e.strerror
os.makedirs('/w/a/b', exist_ok=True)
attempt('descending link', lambda: os.symlink('t', '/w/a/b/ok'))
attempt('move it up', lambda: os.rename('/w/a/b/ok', '/w/ok'))
attempt('move its folder up', lambda: os.rename('/w/a/b', '/w/b'))
attempt('climbing link', lambda: os.symlink('../t', '/w/a/up'))
attempt('move the planted link up', lambda: os.rename('/w/planted/in', '/w/in'))
attempt('move the planted folder', lambda: os.rename('/w/planted', '/w/a/planted'))
fd = os.open('/w/a', os.O_RDONLY)
os.rename('/w/a', '/w/c')                      # a descriptor of a folder moved elsewhere
attempt('climb via old descriptor', lambda: os.symlink('../../outside', 'x', dir_fd=fd))
attempt('descend via old descriptor', lambda: os.symlink('t', 'y', dir_fd=fd))
attempt('hard link out of /w', lambda: os.link('/tmp/f', '/w/h'))
open('/tmp/f', 'w').write('f')
attempt('rename from /tmp into /w', lambda: os.rename('/tmp/f', '/w/f'))
print(out)
"""


def test_links_stay_inside_a_mount_through_renames_and_old_descriptors(
        open_sandbox: OpenSandbox, tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "planted").mkdir(parents=True)
    (work / "t").write_text("target")
    os.symlink("../t", work / "planted" / "in")  # the host's own link, climbing one level
    sb = open_sandbox(limits=Limits(**QUOTA), mounts=[
        Mount(host_path=work, guest_path="/w", writable=True, links=True)])
    r = sb.run(LINKS_CELL)
    assert r.ok, r
    out = ast.literal_eval(r.stdout)
    denied, xdev = "Operation not permitted", "Cross-device link"
    assert out == {
        # positive controls: links that descend are made and move anywhere in the mount
        "descending link": "done", "move it up": "done", "move its folder up": "done",
        "descend via old descriptor": "done",
        # refused: a link that climbs, moving a link that climbs (or its folder), links and
        # renames between places
        "climbing link": denied, "move the planted link up": denied,
        "move the planted folder": denied, "climb via old descriptor": denied,
        "hard link out of /w": denied, "rename from /tmp into /w": xdev,
    }, out
    root = str(work.resolve())
    for p in work.rglob("*"):
        if p.is_symlink():
            resolved = os.path.realpath(p)
            assert resolved == root or resolved.startswith(root + os.sep), (p, resolved)
    _usable(sb)


# ---- the warm-image cache ---------------------------------------------------------------------
def test_the_warm_cache_never_carries_one_sandboxs_files_to_another(
        open_sandbox: OpenSandbox, tmp_path: Path) -> None:
    """Two sandboxes with the same preload, env and guest paths, different folders behind the
    mount that a preloaded module reads at import (matplotlib reads its rc file from
    ``MPLCONFIGDIR``): neither starts with what the other's folder held (before, the second
    started from the image the first one's import had made of the first one's folder)."""
    cfgs = []
    for tag, width in (("first", "7.5"), ("second", "2.5")):
        d = tmp_path / tag
        d.mkdir()
        (d / "matplotlibrc").write_text(f"lines.linewidth: {width}\n")
        cfgs.append(d)
    env = {"MPLCONFIGDIR": "/cfg"}
    probe = "import matplotlib\nmatplotlib.rcParams['lines.linewidth']"
    got = []
    for d in cfgs:
        sb = open_sandbox(limits=Limits(**QUOTA), preload=["matplotlib"], env=env,
                          mounts=[Mount(host_path=d, guest_path="/cfg")])
        got.append(sb.run(probe).value)
    # built in a guest whose mounts are empty: each gets matplotlib's own default
    assert got == ["1.5", "1.5"], got
    # positive control: imported in the sandbox itself, the module does read the mount
    sb = open_sandbox(limits=Limits(**QUOTA), env=env,
                      mounts=[Mount(host_path=cfgs[0], guest_path="/cfg")])
    assert sb.run(probe).value == "7.5"


# ---- trees the host walks ---------------------------------------------------------------------
DEEP = """
import os, errno
fd = os.open('/tmp', os.O_RDONLY)
depth = 0
err = None
while True:
    try:
        os.mkdir('d', dir_fd=fd)
    except OSError as e:
        err = e.errno
        break
    nfd = os.open('d', os.O_RDONLY, dir_fd=fd)
    os.close(fd)
    fd = nfd
    depth += 1
print(depth, err == errno.ENAMETOOLONG)
"""


def test_a_guest_tree_is_bounded_in_depth_and_closing_it_leaves_nothing(
        backend: Backend, open_sandbox: OpenSandbox) -> None:
    sb = open_sandbox(limits=Limits(**QUOTA))
    r = sb.run(DEEP)
    assert r.ok and r.stdout == "64 True\n" and r.limit == "disk", r
    # positive control: a tree as deep as the bound (a path of 64 parts) is like any other
    r = sb.run("open('/tmp/' + '/'.join(['d'] * 63) + '/leaf', 'w').write('x')\n"
               "sorted(os.listdir('/tmp/' + '/'.join(['d'] * 63)))")
    assert r.ok and r.value == "['d', 'leaf']", r
    r = sb.run("os.rename('/tmp/d/d', '/tmp/e')\nos.rename('/tmp/e', '/tmp/d/d')\n"
               "try:\n    os.rename('/tmp/d', '/tmp/d2')\n    os.mkdir('/tmp/x')\n"
               "    os.rename('/tmp/d2', '/tmp/x/d')\nexcept OSError as e:\n    print(e.errno)")
    assert r.ok and r.stdout == "37\n", r  # moving the tree one level down: too deep
    if isinstance(sb, Sandbox):
        from memex.runtime_wasm.internal import scratch_dir

        scratch = scratch_dir(sb)
        sb.close()  # a deep tree, iteratively removed, never a RecursionError
        assert not scratch.exists()
    else:
        sb.close()
    _usable(open_sandbox(limits=Limits(**QUOTA)))


# ---- forks ------------------------------------------------------------------------------------
def test_forks_share_the_parents_files_until_written_and_hold_one_quota(
        open_sandbox: OpenSandbox) -> None:
    sb = open_sandbox(limits=Limits(**{**QUOTA, "disk_bytes": 16 * MiB}))
    assert sb.run("import os\nopen('/tmp/data', 'wb').write(b'p' * (6 << 20))").ok
    forks = [sb.fork() for _ in range(6)]
    try:
        # six forks hold the 6 MiB once: the family's count, as each of them reports it
        for f in forks:
            r = f.run("os.path.getsize('/tmp/data')")
            assert r.value == str(6 * MiB) and r.disk_bytes == 6 * MiB, r
        # positive control: a fork's write is its own (a copy made on its first write)
        r = forks[0].run("with open('/tmp/data', 'r+b') as f:\n    f.write(b'F')\n"
                         "open('/tmp/data', 'rb').read(2)")
        assert r.value == "b'Fp'" and r.disk_bytes == 12 * MiB, r
        assert sb.run("open('/tmp/data', 'rb').read(2)").value == "b'pp'"
        assert forks[1].run("open('/tmp/data', 'rb').read(2)").value == "b'pp'"
        # one quota for the family: a second copy would pass 16 MiB
        r = forks[1].run("try:\n    open('/tmp/data', 'ab').write(b'x')\n"
                         "except OSError as e:\n    print(e.strerror)")
        assert r.stdout == "Quota exceeded\n" and r.limit == "disk", r
    finally:
        for f in forks:
            f.close()
    # the forks' copies went with them (a worker closes a sandbox without the caller waiting:
    # the count follows within moments)
    deadline = time.monotonic() + 30
    while (left := sb.run("1").disk_bytes) != 6 * MiB and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left == 6 * MiB


# ---- the door ---------------------------------------------------------------------------------
DOOR_BOMBS = {
    # one array of 16M empty arrays: 1.2 GB of host objects if decoded
    "empty arrays": "b'\\xdd' + (n - 5).to_bytes(4, 'big') + b'\\x90' * (n - 5)",
    # arrays of 64K empty maps each, every one within the per-container bound
    "nested maps": "b'\\xdd' + (200).to_bytes(4, 'big') + (b'\\xdd' + (65536).to_bytes(4, "
                   "'big') + b'\\x80' * 65536) * 200",
    # a declared array far longer than the frame
    "declared length": "b'\\xdd\\xff\\xff\\xff\\xff' + b'\\x90' * 1000",
    # 17 MiB: over the byte cap, refused before it is copied out of the guest
    "over the cap": "b'\\x90' * (17 << 20)",
}


@pytest.mark.parametrize("name", sorted(DOOR_BOMBS))
def test_a_costly_door_frame_is_refused_and_the_sandbox_goes_on(
        open_sandbox: OpenSandbox, name: str) -> None:
    sb = open_sandbox(limits=Limits(**QUOTA))
    r = sb.run(f"import _host, msgpack\nn = 16 << 20\nframe = {DOOR_BOMBS[name]}\n"
               "reply = msgpack.unpackb(_host.call(frame))\ndel frame\n"
               "(reply['ok'], reply['error']['kind'])")
    assert r.ok and r.value == "(False, 'too_large')", r
    # positive control: a real frame of the same size (bulk bytes) is decoded and answered
    r = sb.run("import msgpack, memex_guest\nbig = b'z' * (15 << 20)\n"
               "frame = msgpack.packb({'v': 1, 'id': 7, 'op': 'nope', 'args': [big]})\n"
               "del big\nreply = msgpack.unpackb(_host.call(frame))\n"
               "(len(frame) > 15 << 20, reply['id'], reply['error']['kind'])")
    assert r.ok and r.value == "(True, 7, 'unknown_op')", r
    _usable(sb)


# ---- egress -----------------------------------------------------------------------------------
TOKEN = "egress-secret-5b1e07"


class _Echo(BaseHTTPRequestHandler):
    """Answers with the Authorization header it received, in the content coding asked for:
    ``/echo?enc=gzip`` honours the client's Accept-Encoding, ``&force=1`` ignores it."""

    seen: ClassVar[list[dict[str, str]]] = []

    def do_GET(self) -> None:
        q = dict(p.split("=", 1) for p in (self.path.split("?", 1)[1:] or [""])[0].split("&")
                 if "=" in p)
        type(self).seen.append({k.lower(): v for k, v in self.headers.items()})
        body = json.dumps({"auth": self.headers.get("Authorization", "")}).encode()
        enc = q.get("enc", "identity")
        accepted = self.headers.get("Accept-Encoding", "")
        if enc != "identity" and (q.get("force") or enc in accepted):
            body = {"gzip": gzip.compress, "deflate": zlib.compress,
                    "rawdeflate": lambda b: zlib.compress(b, wbits=-15),
                    "br": brotli.compress, "zstd": lambda b: b"\x28\xb5\x2f\xfd" + b}[enc](body)
            enc = "deflate" if enc == "rawdeflate" else enc
        else:
            enc = "identity"
        self.send_response(200)
        if enc != "identity":
            self.send_header("Content-Encoding", enc)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def echo_server() -> Iterator[int]:
    _Echo.seen = []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.01},
                     daemon=True).start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


FETCH = """
from memex_guest import net
out = []
for q, ask in QUERIES:
    try:
        r = net.fetch(f'http://HOST:PORT/echo?{q}', headers={'Accept-Encoding': ask})
        out.append([r.headers.get('content-encoding', ''), r.body.hex()])
    except Exception as e:
        out.append(['error', type(e).__name__ + ': ' + str(e)[:120]])
print(json.dumps(out))
"""


def _with_secret(open_sandbox: OpenSandbox, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A sandbox whose egress reaches api.test and plain.test (both 127.0.0.1), the host
    injecting a bearer token into requests to api.test only."""
    monkeypatch.setenv("MEMEX_TEST_EGRESS_TOKEN", TOKEN)
    policy = EgressPolicy.from_dict({
        "rules": [{"action": "allow", "host": ["api.test", "plain.test"], "ip": "127.0.0.1"}],
        "secrets": [{"name": "tok", "host": "api.test", "scheme": "http", "header":
                     "Authorization", "format": "Bearer {value}",
                     "env": "MEMEX_TEST_EGRESS_TOKEN"}]})
    sb = open_sandbox(limits=Limits(**QUOTA))
    Egress(policy, resolver=lambda host, port: ["127.0.0.1"]).attach(sb)
    return sb


def test_a_secret_never_reaches_the_guest_inside_a_compressed_body(
        open_sandbox: OpenSandbox, echo_server: int, monkeypatch: pytest.MonkeyPatch) -> None:
    sb = _with_secret(open_sandbox, monkeypatch)
    queries = [("enc=gzip", "gzip"), ("enc=gzip&force=1", "gzip"), ("enc=br&force=1", "br"),
               ("enc=deflate&force=1", "deflate"), ("enc=rawdeflate&force=1", "deflate"),
               ("enc=zstd&force=1", "zstd")]

    def fetch(host: str) -> list[list[str]]:
        r = sb.run("import json\n" + FETCH.replace("QUERIES", repr(queries))
                   .replace("HOST", host).replace("PORT", str(echo_server)))
        assert r.ok, r
        return list(json.loads(r.stdout))

    out = fetch("api.test")
    # the server got the secret, and was asked for no content coding
    assert all(s.get("authorization") == f"Bearer {TOKEN}" for s in _Echo.seen), _Echo.seen
    assert all(s.get("accept-encoding") == "identity" for s in _Echo.seen), _Echo.seen
    for (q, _), (enc, body) in zip(queries[:-1], out[:-1], strict=True):
        text = bytes.fromhex(body).decode()
        assert enc == "" and json.loads(text) == {"auth": "Bearer [REDACTED]"}, (q, enc, text)
    assert out[-1][0] == "error" and "zstd" in out[-1][1], out[-1]  # cannot check: refused
    # positive control: where no secret goes out, the guest asks for and gets compression
    _Echo.seen = []
    out = fetch("plain.test")
    assert _Echo.seen[0].get("accept-encoding") == "gzip" and "authorization" not in _Echo.seen[0]
    assert out[0][0] == "gzip"
    assert json.loads(gzip.decompress(bytes.fromhex(out[0][1]))) == {"auth": ""}
    assert out[2][0] == "br"


class _Reflect(BaseHTTPRequestHandler):
    """Reflects the token of the Authorization header it received wherever ``mode`` says:
    the reason phrase, a header's name, a gzip transfer coding under chunked, the part of
    it a ``Range`` asks for, or a 206 nobody asked for. Written by hand: http.server would
    not send most of these."""

    protocol_version = "HTTP/1.1"
    seen: ClassVar[list[dict[str, str]]] = []

    def do_GET(self) -> None:
        mode = self.path.split("mode=", 1)[-1]
        type(self).seen.append({k.lower(): v for k, v in self.headers.items()})
        token = self.headers.get("Authorization", "").removeprefix("Bearer ")
        body = json.dumps({"auth": token}).encode()
        status, reason, extra = 200, "OK", [f"Content-Length: {len(body)}"]
        asked = self.headers.get("Range", "")
        if mode == "reason":
            reason = f"OK {token or 'plain'}"
        elif mode == "hname":
            extra.append(f"X-Echo-{token or 'none'}: 1")
        elif mode == "te":
            z = gzip.compress(body)
            body = f"{len(z):x}\r\n".encode() + z + b"\r\n0\r\n\r\n"
            extra = ["Transfer-Encoding: gzip, chunked"]
        elif mode == "range" and asked.startswith("bytes="):
            lo, hi = (int(x) for x in asked[6:].split("-"))
            part = body[lo:hi + 1]
            status, reason = 206, "Partial Content"
            extra = [f"Content-Range: bytes {lo}-{hi}/{len(body)}",
                     f"Content-Length: {len(part)}"]
            body = part
        elif mode == "partial":
            status, reason = 206, "Partial Content"
            extra.append(f"Content-Range: bytes 0-{len(body) - 1}/{len(body) * 2}")
        head = f"HTTP/1.1 {status} {reason}\r\n" + "".join(f"{h}\r\n" for h in extra)
        self.wfile.write(head.encode() + b"Connection: close\r\n\r\n" + body)
        self.close_connection = True

    def log_message(self, *args: Any) -> None:
        pass


REFLECTED = """
import json
from memex_guest import net
out = {}
for mode, headers in CASES:
    try:
        r = net.fetch(f'http://HOST:PORT/r?mode={mode}', headers=headers)
        out[mode] = [r.status, r.reason, [[k, v] for k, v in r.headers.items()],
                     r.body.decode('latin-1')]
    except Exception as e:
        out[mode] = ['error', type(e).__name__ + ': ' + str(e)[:200]]
print(json.dumps(out))
"""


def test_a_secret_reaches_the_guest_only_in_a_response_seen_whole(
        open_sandbox: OpenSandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reflecting server hands the injected secret back in the status line's reason, in a
    header's name, under a transfer coding layered with chunked, and in halves through Range:
    the guest gets it redacted or not at all (Range and If-Range are not sent; a transfer
    coding the host does not undo and a partial response are refused). The control: to a
    host no secret goes to, the same server's reason, header names, Range and 206 reach the
    guest as sent."""
    _Reflect.seen = []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Reflect)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.01},
                     daemon=True).start()
    port = srv.server_address[1]
    sb = _with_secret(open_sandbox, monkeypatch)
    cases = [("plain", {}), ("reason", {}), ("hname", {}), ("te", {}),
             ("range", {"Range": "bytes=0-12", "If-Range": "x"}), ("partial", {})]

    def fetch(host: str, extra: dict[str, str] | None = None) -> dict[str, Any]:
        code = REFLECTED.replace("CASES", repr(cases)).replace("HOST", host) \
            .replace("PORT", str(port))
        r = sb.run(code)
        assert r.ok, r
        return dict(json.loads(r.stdout))

    try:
        out = fetch("api.test")
        assert all(s.get("authorization") == f"Bearer {TOKEN}" for s in _Reflect.seen)
        assert not any("range" in s or "if-range" in s for s in _Reflect.seen), _Reflect.seen
        assert TOKEN not in json.dumps(out) and TOKEN[:8] not in json.dumps(out), out
        assert out["plain"][0] == 200 and json.loads(out["plain"][3]) == {
            "auth": "[REDACTED]"}
        assert out["reason"][1] == "OK [REDACTED]"
        assert ["X-Echo-[REDACTED]", "1"] in out["hname"][2], out["hname"]
        assert out["te"][0] == "error" and "transfer coding" in out["te"][1], out["te"]
        assert out["range"][0] == 200 and json.loads(out["range"][3]) == {
            "auth": "[REDACTED]"}
        assert out["partial"][0] == "error" and "partial response" in out["partial"][1]
        # the control: no secret goes out, nothing is held back
        _Reflect.seen = []
        plain = fetch("plain.test")
        assert "authorization" not in _Reflect.seen[0]
        assert plain["reason"][1] == "OK plain" and ["X-Echo-none", "1"] in plain["hname"][2]
        assert plain["range"][0] == 206 and plain["range"][3] == '{"auth": ""}'[:13]
        assert plain["partial"][0] == 206
        assert any(s.get("range") == "bytes=0-12" for s in _Reflect.seen)
    finally:
        srv.shutdown()
        srv.server_close()
