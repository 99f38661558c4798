"""The attack corpus (SECURITY.md): what a hostile tenant's code tries, run against every
backend. Each attack ends with the same state checks: the host process is alive and raised
nothing, no file outside the sandbox was touched, and the sandbox either answers the next cell
or was rolled back to its last good turn.

Families: escapes (filesystem, links, ``..``, absolute and /proc-style paths, descriptor
guessing), resource bombs (CPU, memory, stack, output, disk bytes, file count, descriptors,
door and tool-call flooding), protocol abuse (forged and oversized door frames, malformed
msgpack ext types, deep nesting, forged control frames, concurrent re-entry) and egress SSRF
spellings. Spawn flooding is an agent-level attack: test_spawn_flood.py (every local backend)
and tests/executor/spawn/test_spawn_tree.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from memex import Door, Limits, Mount, TurnStatus
from memex.host_tools import Egress, EgressPolicy, ToolBudget, ToolHost
from memex.runtime_wasm import SandboxAPI

OpenSandbox = Callable[..., SandboxAPI[Any]]
MiB = 1 << 20
SECRET = "host-secret-7f3a9c"
TIGHT = dict(timeout=10, memory=256 * MiB, disk_bytes=8 * MiB, disk_files=200, open_files=48,
             stdout_bytes=64 << 10)


@pytest.fixture
def outside(tmp_path: Path) -> Iterator[Path]:
    """A host folder the sandbox must never see or change, with a secret in it; checked (names,
    sizes, contents, modes) after the test."""
    root = tmp_path / "outside"
    root.mkdir()
    (root / "secret.txt").write_text(SECRET)
    (root / "sub").mkdir()
    (root / "sub" / "data.bin").write_bytes(os.urandom(256))
    before = _fingerprint(root)
    yield root
    assert _fingerprint(root) == before, "a file outside the sandbox changed"


def _fingerprint(root: Path) -> list[tuple[str, int, str]]:
    out = []
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else ""
        out.append((str(p.relative_to(root)), st.st_mode, digest))
    return out


def _usable(sb: SandboxAPI[Any]) -> None:
    r = sb.run("6 * 7")
    assert r.ok and r.value == "42", r


def _no_secret(*texts: str | None) -> None:
    for t in texts:
        assert SECRET not in (t or "")


# ---- escapes ------------------------------------------------------------------------------------
ESCAPE_PATHS = ["{o}/secret.txt", "/tmp/../{o}/secret.txt", "/tmp/../../../../{o}/secret.txt",
                "../../../../{o}/secret.txt", "/proc/self/environ", "/proc/self/mem",
                "/proc/1/root/{o}/secret.txt", "/dev/mem", "/etc/passwd", "/sys/kernel",
                "/usr/local/lib/../../../{o}/secret.txt", "/memex/../{o}/secret.txt",
                "//{o}/secret.txt", "/tmp/./../{o}/./secret.txt"]


def test_filesystem_escapes_find_nothing(open_sandbox: OpenSandbox, outside: Path) -> None:
    sb = open_sandbox(limits=Limits(**TIGHT))
    paths = [p.format(o=str(outside).lstrip("/")) for p in ESCAPE_PATHS]
    code = (f"import os\ngot = []\nfor p in {paths!r}:\n    try:\n"
            "        with open(p, 'rb') as f:\n"
            "            got.append('READ ' + p + ' ' + repr(f.read(200)))\n"
            "    except OSError as e:\n        got.append(type(e).__name__)\n"
            "for op in (lambda: os.chdir('/tmp/../..'), lambda: os.listdir('/tmp/..'),\n"
            "           lambda: os.rename('/tmp', '/x'), lambda: os.rmdir('/usr/local/lib'),\n"
            "           lambda: open('/usr/local/lib/new', 'w'),\n"
            "           lambda: os.remove('/memex/site/msgpack/__init__.py')):\n"
            "    try:\n        op(); got.append('DONE')\n    except OSError as e:\n"
            "        got.append(type(e).__name__)\nprint('\\n'.join(got))\n")
    r = sb.run(code)
    assert r.ok, r
    _no_secret(r.stdout, r.stderr)
    lines = r.stdout.splitlines()
    assert len(lines) == len(paths) + 6
    assert not [ln for ln in lines if ln.startswith(("READ", "DONE"))], r.stdout
    _usable(sb)


def test_descriptor_guessing_reaches_no_host_descriptor(open_sandbox: OpenSandbox,
                                                        outside: Path) -> None:
    with open(outside / "secret.txt") as held:  # a host descriptor a guess might hit
        sb = open_sandbox(limits=Limits(**TIGHT))
        r = sb.run("import os\nseen = []\nfor fd in range(0, 4096):\n    try:\n"
                   "        os.lseek(fd, 0, 0)\n        seen.append((fd, os.read(fd, 64)))\n"
                   "    except OSError:\n        pass\nprint(sorted(fd for fd, _ in seen), "
                   "[d for _, d in seen])\n")
        assert r.ok, r
        _no_secret(r.stdout, r.stderr)
        assert held.fileno() > 0
    _usable(sb)


def test_links_cannot_point_out_of_a_writable_mount(open_sandbox: OpenSandbox, tmp_path: Path,
                                                    outside: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    sb = open_sandbox(limits=Limits(**TIGHT),
                      mounts=[Mount(host_path=work, guest_path="/work", writable=True)])
    target = os.path.relpath(outside / "secret.txt", work)
    r = sb.run(f"import os\nout = []\nfor make in (lambda: os.symlink({target!r}, '/work/l'),\n"
               "             lambda: os.symlink('/etc/passwd', '/work/l2'),\n"
               "             lambda: os.symlink('..', '/tmp/up'),\n"
               "             lambda: os.link('/usr/local/lib/python315.zip', '/tmp/zip'),\n"
               "             lambda: os.link('/memex/site/memex_guest/net.py', '/work/h')):\n"
               "    try:\n        make(); out.append('made')\n"
               "    except OSError as e:\n        out.append(e.strerror)\nprint(out)\n")
    assert r.ok and "made" not in r.stdout, r
    assert list(work.iterdir()) == []
    _usable(sb)


def test_no_native_code_and_no_state_shared_between_sandboxes(open_sandbox: OpenSandbox
                                                              ) -> None:
    a, b = open_sandbox(limits=Limits(**TIGHT)), open_sandbox(limits=Limits(**TIGHT))
    r = a.run("out = []\nfor m in ('_ctypes', 'cffi', '_posixsubprocess', 'resource'):\n"
              "    try:\n        __import__(m); out.append(m)\n    except ImportError:\n"
              "        pass\nimport ctypes  # a stub on wasm32-wasi: every entry point refuses\n"
              "for f in (lambda: ctypes.CDLL(None), lambda: ctypes.string_at(0xFFFFFFF0, 8),\n"
              "          lambda: ctypes.memmove(16, b'x' * 8, 8)):\n    try:\n"
              "        f(); out.append('native')\n"
              "    except (OSError, NameError, AttributeError):\n        pass\n"
              "mine = 'a-only'\nopen('/tmp/a', 'w').write('a')\nout")
    assert r.ok and r.value == "[]", r
    r = b.run("import os\n('mine' in globals(), os.listdir('/tmp'))")
    assert r.ok and r.value == "(False, [])", r


# ---- resource bombs -----------------------------------------------------------------------------
BOMBS = {
    "cpu": ("while True:\n    pass", {"timeout": 1.0}, "deadline"),
    "memory": ("x = bytearray(1 << 29)", {}, "memory"),
    "memory-creep": ("xs = []\nwhile True:\n    xs.append(bytearray(1 << 20))", {}, "memory"),
    "stack": ("def f(n):\n    return f(n + 1)\nf(0)", {}, None),
    "stack-repr": ("x = []\nfor _ in range(200000):\n    x = [x]\nrepr(x)", {}, None),
    "output": ("import sys\nfor _ in range(64):\n    sys.stdout.write('x' * (1 << 20))", {},
               None),
    "disk-bytes": ("f = open('/tmp/fill', 'wb')\nwhile True:\n    f.write(b'x' * (1 << 20))",
                   {}, "disk"),
    "disk-sparse": ("f = open('/tmp/s', 'wb')\nf.seek(1 << 40)\nf.write(b'x')\nf.flush()", {},
                    "disk"),
    "disk-files": ("import os\ni = 0\nwhile True:\n    open(f'/tmp/f{i}', 'w').close(); i += 1",
                   {}, "disk"),
    "disk-dirs": ("import os\np = '/tmp'\nwhile True:\n    p += '/d'\n    os.mkdir(p)", {},
                  "disk"),
    "descriptors": ("open('/tmp/x', 'w').close()\nfs = []\nwhile True:\n"
                    "    fs.append(open('/tmp/x'))", {}, "open_files"),
    "dir-descriptors": ("import os\nfds = []\nwhile True:\n    fds.append(os.open('/tmp', "
                        "os.O_RDONLY))", {}, "open_files"),
    "fork": ("import os\nos.fork()", {}, None),
    "threads": ("import threading\nthreading.Thread(target=print).start()", {}, None),
    "subprocess": ("import subprocess\nsubprocess.run(['sh', '-c', 'id'])", {}, None),
    "exit": ("import os\nos._exit(3)", {}, "exit"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BOMBS))
def test_resource_bombs_end_the_turn_not_the_host(open_sandbox: OpenSandbox, name: str,
                                                  outside: Path) -> None:
    code, extra, limit = BOMBS[name]
    sb = open_sandbox(limits=Limits(**{**TIGHT, **extra}))
    sb.run("kept = 'state'")
    r = sb.run(code)
    assert r.status is not TurnStatus.OK or name == "output", r
    if limit is not None:
        assert r.limit == limit, r
    if name == "output":
        assert "stdout" in r.truncated and len(r.stdout) <= 70 << 10
    assert r.disk_bytes <= TIGHT["disk_bytes"] and r.disk_files <= TIGHT["disk_files"]
    if r.status is TurnStatus.KILLED or r.status is TurnStatus.EXIT:
        assert r.rolled_back, r
    after = sb.run("kept")
    assert after.value == "'state'", after
    sb.run("import os, shutil\nfor n in os.listdir('/tmp'):\n"
           "    p = '/tmp/' + n\n    shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)")
    _usable(sb)


@pytest.mark.slow
def test_door_flooding_is_answered_and_bounded(open_sandbox: OpenSandbox) -> None:
    door = Door(keep_calls=100)
    door.register("ping", lambda: 1, inline=True)
    # 3 s: in-process the flood takes a tenth of a second; over Ray's relay (a round trip a
    # call) it meets the deadline whatever the deadline, so a longer one only waits longer
    sb = open_sandbox(limits=Limits(**{**TIGHT, "timeout": 3}), door=door)
    r = sb.run("import _host, memex_guest\nbad = 0\nfor i in range(3000):\n"
               "    bad += b'protocol' in _host.call(b'\\xc1' * (i % 50))\n"
               "ok = sum(memex_guest.call('ping') for _ in range(1000))\n(bad, ok)")
    # answered call by call; a backend whose door is slower ends the flood at the deadline
    assert (r.ok and r.value == "(3000, 1000)") or (r.limit == "deadline" and r.rolled_back), r
    assert 0 < len(door.calls) <= 100
    _usable(sb)


def test_tool_call_flooding_stops_at_the_budget(open_sandbox: OpenSandbox) -> None:
    def echo(x: int) -> int:
        """Return x."""
        return x

    sb = open_sandbox(limits=Limits(**TIGHT))
    with ToolHost([echo], budget=ToolBudget(calls_per_turn=50, calls_per_sandbox=80)).attach(
            sb) as host:
        r = sb.run("n = 0\ntry:\n    while True:\n        echo(1); n += 1\n"
                   "except tools.ToolError as e:\n    print(n, e.kind)\n")
        assert r.ok and r.stdout.startswith("50 "), r
        r = sb.run("import asyncio\nres = await asyncio.gather(*[echo(i) for i in range(200)], "
                   "return_exceptions=True)\nsum(isinstance(x, int) for x in res)")
        assert r.ok and r.value == "30", r
        assert len([c for c in host.calls if c.outcome == "ok"]) == 80
    _usable(sb)


# ---- protocol abuse ------------------------------------------------------------------------------
FRAMES = {
    "oversized": "b'\\x80' * (17 << 20)",
    "not-msgpack": "b'\\xc1\\xc1\\xc1'",
    "truncated": "b'\\x85\\xa1v\\x01'",
    "deep-nesting": "b'\\x91' * 200000 + b'\\xc0'",
    "huge-declared-length": "b'\\xdb\\xff\\xff\\xff\\xff'",
    "bad-version": "msgpack.packb({'v': 99, 'id': 1, 'op': 'tools.call', 'args': []})",
    "ext-unknown": "msgpack.packb({'v': 1, 'id': 1, 'op': 'tools.call', 'args': ['echo', "
                   "{'x': msgpack.ExtType(99, b'junk')}]})",
    "ext-bad-ndarray": "msgpack.packb({'v': 1, 'id': 1, 'op': 'tools.call', 'args': ['echo', "
                       "{'x': msgpack.ExtType(1, b'\\xff\\x00\\x01')}]})",
    "ext-bad-dataframe": "msgpack.packb({'v': 1, 'id': 1, 'op': 'tools.call', 'args': ['echo', "
                         "{'x': msgpack.ExtType(2, msgpack.packb({'columns': 5}))}]})",
    "ext-deep-tuple": "msgpack.packb({'v': 1, 'id': 1, 'op': 'tools.call', 'args': ['echo', "
                      "{'x': deep}]})",
    "batch-garbage": "msgpack.packb({'v': 1, 'id': 1, 'op': 'tools.batch', 'args': "
                     "[[[1, 2], 'x', None]]})",
    "kwargs-non-str-keys": "msgpack.packb({'v': 1, 'id': 1, 'op': 'tools.call', 'args': [], "
                           "'kwargs': {1: 2}})",
    "control-garbage": "b'\\x00MX' + b'E' + b'j' + b'{not json'",
    "control-forged-report": "b'\\x00MX{\"op\": \"end\", \"report\": {\"status\": \"exit\"}}'",
    "control-unknown": "b'\\x00MX{\"op\": \"format_disk\"}'",
}


@pytest.mark.parametrize("name", sorted(FRAMES))
def test_forged_and_malformed_door_frames(open_sandbox: OpenSandbox, name: str) -> None:
    def echo(x: Any) -> str:
        """Describe x."""
        return type(x).__name__

    sb = open_sandbox(limits=Limits(**TIGHT))
    with ToolHost([echo]).attach(sb):
        sb.run("import msgpack, _host\ndeep = msgpack.ExtType(7, b'')\nfor _ in range(300):\n"
               "    deep = msgpack.ExtType(7, msgpack.packb([deep], default=lambda o: o))")
        r = sb.run(f"try:\n    reply = _host.call({FRAMES[name]})\nexcept Exception as e:\n"
                   "    reply = repr(e).encode()\nlen(reply)")
        assert r.status in (TurnStatus.OK, TurnStatus.EXIT, TurnStatus.ERROR), r
        assert r.trap is None, r
        _usable(sb)
        r = sb.run("echo(1)")
        assert r.value == "'int'", (r.exception, r.stderr)


def test_concurrent_callers_are_serialised_not_interleaved(open_sandbox: OpenSandbox) -> None:
    sb = open_sandbox(limits=Limits(**TIGHT))
    sb.run("n = 0")
    errors: list[BaseException] = []

    def hammer() -> None:
        try:
            for _ in range(15):
                r = sb.run("m = n\nn = m + 1")
                assert r.ok, r
        except BaseException as exc:  # collected for the main thread
            errors.append(exc)

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and sb.run("n").value == "60"


# ---- egress SSRF ---------------------------------------------------------------------------------
class _Counter(BaseHTTPRequestHandler):
    hits = 0

    def do_GET(self) -> None:
        type(self).hits += 1
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"reached")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def target_server() -> Iterator[int]:
    _Counter.hits = 0
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Counter)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.01},
                     daemon=True)
    t.start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


SSRF = ["http://127.0.0.1:{p}/", "http://localhost:{p}/", "http://localhost.:{p}/",
        "http://127.1:{p}/", "http://0x7f000001:{p}/", "http://2130706433:{p}/",
        "http://0177.0.0.1:{p}/", "http://[::1]:{p}/", "http://[::ffff:127.0.0.1]:{p}/",
        "http://[::ffff:7f00:1]:{p}/", "http://0.0.0.0:{p}/", "http://rebind.test:{p}/",
        "http://public.test@127.0.0.1:{p}/", "http://127.0.0.1%2f@public.test:{p}/",
        "http://169.254.169.254/latest/meta-data/", "http://metadata.google.internal/",
        "http://[fd00:ec2::254]/", "http://100.100.100.200/", "http://10.0.0.1/",
        "ftp://127.0.0.1:{p}/", "file:///etc/passwd", "gopher://127.0.0.1:{p}/",
        "http://①②⑦.0.0.1:{p}/", "HTTP://127.0.0.1:{p}/", "http://127.0.0.1:{p}\\@public.test/"]


SSRF_CELL = """
import json, urllib.request, http.client
from memex_guest import net
out = []
for u in URLS:
    for how in ('urllib', 'fetch'):
        try:
            if how == 'urllib':
                urllib.request.urlopen(u, timeout=5).read()
            else:
                net.fetch(u, timeout=5)
            out.append((u, how, 'REACHED'))
        except Exception as e:
            out.append((u, how, type(e).__name__))
c = http.client.HTTPConnection('127.0.0.1', PORT, timeout=5)
c.request('GET', '/')
try:
    c.getresponse()
except net.EgressDenied as e:
    out.append(('http.client', str(e)[:14]))
print(json.dumps(out))
"""


def test_ssrf_spellings_never_reach_loopback(open_sandbox: OpenSandbox,
                                            target_server: int) -> None:
    """A policy that allows any public host: every spelling of loopback, private and metadata
    addresses (and a name that resolves to loopback) is refused, through urllib, http.client
    and fetch alike, with the one exception family."""
    def resolver(host: str, port: int) -> list[str]:
        return ["127.0.0.1"] if host in ("rebind.test", "public.test") else []

    policy = EgressPolicy.from_dict({"rules": [{"action": "allow", "host": "*"}]})
    # 51 refusals through the door: on the cluster, beside a CPU hog, they took past TIGHT's
    # 10 s deadline (the turn was killed); the deadline bounds a hang, it is not the subject
    sb = open_sandbox(limits=Limits(**{**TIGHT, "timeout": 120}))
    Egress(policy, resolver=resolver).attach(sb)
    urls = [u.format(p=target_server) for u in SSRF]
    r = sb.run(SSRF_CELL.replace("URLS", repr(urls)).replace("PORT", str(target_server)))
    assert r.ok, r
    out = json.loads(r.stdout)
    assert ["http.client", "egress denied:"] in out
    assert len(out) == 2 * len(urls) + 1
    # refused by the egress policy, or by the stdlib before a request exists (a scheme urllib
    # does not know, a host it cannot encode, a file:// path the guest does not have)
    kinds = {row[-1] for row in out[:-1]}
    assert kinds <= {"EgressDenied", "URLError", "InvalidURL", "UnicodeEncodeError",
                     "ValueError"}, out
    assert _Counter.hits == 0
    _usable(sb)


NO_NET_CELL = """
import socket, urllib.request, http.client
out = []
c = http.client.HTTPConnection('127.0.0.1', PORT)
for f in (lambda: socket.socket(), lambda: socket.create_connection(('127.0.0.1', PORT)),
          lambda: socket.getaddrinfo('localhost', 80),
          lambda: urllib.request.urlopen('http://127.0.0.1:PORT/'),
          lambda: (c.request('GET', '/'), c.getresponse())):
    try:
        f()
        out.append('REACHED')
    except BaseException as e:
        out.append((type(e).__name__, isinstance(e, PermissionError),
                    str(e).startswith('egress denied: ')))
print(out)
"""


def test_no_network_is_one_answer(open_sandbox: OpenSandbox, target_server: int) -> None:
    """Without egress: a raw socket, DNS, urllib and http.client all raise EgressDenied (a
    PermissionError) whose text starts ``egress denied: <what>:``."""
    sb = open_sandbox(limits=Limits(**TIGHT))
    r = sb.run(NO_NET_CELL.replace("PORT", str(target_server)))
    assert r.ok, r
    assert r.stdout == str([("EgressDenied", True, True)] * 5) + "\n", r.stdout
    assert _Counter.hits == 0
