"""Shared pieces of the egress tests: a real HTTP(S) server on 127.0.0.1, the loopback-only
guard, a sandbox with guest helpers, and name resolution that never leaves the process.

Only loopback addresses are ever contacted: every connection the egress client opens goes
through ``open_connection``, which the autouse guard replaces with one that refuses any other
address (and records what was contacted), and the system resolver is replaced by one that
refuses (tests resolve their made-up names with an injected resolver).
"""

from __future__ import annotations

import ast
import ipaddress
import json
import ssl
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from certs import self_signed

from memex import Limits, Sandbox, TurnStatus
from memex.host_tools import Egress, EgressPolicy
from memex.host_tools.egress import _fetch  # the guard below patches its connect and DNS

GUEST_HELPERS = r'''
import json, urllib.request, urllib.error, http.client
from memex_guest import net
def attempt(fn):
    try:
        return ("ok", fn())
    except Exception as e:
        return ("error", type(e).__name__, getattr(e, "kind", None), getattr(e, "rule", None),
                str(e))
'''


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _reply(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
               *, chunked: bool = False) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(0, len(body), 1000):
                part = body[i:i + 1000]
                self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
            return
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _handle(self) -> None:
        u = urllib.parse.urlsplit(self.path)
        q = dict(urllib.parse.parse_qsl(u.query))
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        seen = {"method": self.command, "path": self.path, "body": body,
                "headers": {k.lower(): v for k, v in self.headers.items()}}
        self.server.seen.append(seen)
        if u.path == "/echo":
            self._reply(200, json.dumps({**seen, "body": body.decode("latin-1")}).encode(),
                        {"Content-Type": "application/json; charset=utf-8", "X-Echo": "1"})
        elif u.path == "/redirect":
            self._reply(int(q.get("code", "302")), b"moved", {"Location": q["to"]})
        elif u.path == "/bytes":
            self._reply(200, b"x" * int(q["n"]), chunked=q.get("chunked") == "1")
        elif u.path == "/slow":
            time.sleep(float(q.get("s", "1")))
            self._reply(200, b"late")
        elif u.path == "/status":
            self._reply(int(q["code"]), b"status body", {"Content-Type": "text/plain"})
        else:
            self._reply(200, b'{"hello": "world"}', {"Content-Type": "application/json"})

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_PATCH = _handle


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.seen: list[dict[str, Any]] = []
        self.sni: list[str | None] = []

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client that gave up
            super().handle_error(request, client_address)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def url(self, path: str = "/", host: str = "127.0.0.1", scheme: str = "http") -> str:
        return f"{scheme}://{host}:{self.port}{path}"


def _serve(srv: _Server) -> Iterator[_Server]:
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.01},
                     daemon=True)
    t.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(timeout=5)


@pytest.fixture(scope="module")
def server() -> Iterator[_Server]:
    """A real HTTP/1.1 server on 127.0.0.1 (``seen`` lists what it received)."""
    yield from _serve(_Server())


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for ``secure.test``."""
    return self_signed(tmp_path_factory.mktemp("tls"), "/CN=secure.test", "DNS:secure.test")


@pytest.fixture(scope="module")
def tls_server(tls_files: tuple[Path, Path]) -> Iterator[_Server]:
    """The same server behind TLS (certificate for secure.test); ``sni`` lists the names
    clients asked for."""
    cert, key = tls_files
    srv = _Server()
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    ctx.sni_callback = lambda sock, name, c: srv.sni.append(name)  # type: ignore[assignment,misc]
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    yield from _serve(srv)


@pytest.fixture
def client_tls(tls_files: tuple[Path, Path]) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(tls_files[0]))
    return ctx


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every address the egress client connects to (loopback only, enforced)."""
    contacted: list[str] = []
    real = _fetch.open_connection

    def guarded(address: str, port: int, timeout: float) -> Any:
        contacted.append(address)
        if not ipaddress.ip_address(address).is_loopback:
            raise AssertionError(f"a test tried to connect to {address}")
        return real(address, port, timeout)

    def no_system_dns(host: str, port: int) -> list[str]:
        raise OSError(f"tests resolve names with an injected resolver ({host})")

    monkeypatch.setattr(_fetch, "open_connection", guarded)
    monkeypatch.setattr(_fetch, "system_resolver", no_system_dns)
    yield contacted
    assert all(ipaddress.ip_address(a).is_loopback for a in contacted), contacted


class Names:
    """An injected resolver: made-up names to fixed addresses, counting lookups."""

    def __init__(self, table: dict[str, list[str]]) -> None:
        self.table = table
        self.calls: list[str] = []

    def __call__(self, host: str, port: int) -> list[str]:
        self.calls.append(host)
        if host not in self.table:
            raise OSError(f"no such test name {host!r}")
        return self.table[host]


@pytest.fixture(scope="module")
def egress_sandbox() -> Iterator[Sandbox]:
    """One sandbox for a test module, with the guest helpers loaded."""
    sb = Sandbox(limits=Limits(timeout=20))
    r = sb.run(GUEST_HELPERS)
    assert r.status is TurnStatus.OK, r
    yield sb
    sb.close()


@pytest.fixture
def attach(egress_sandbox: Sandbox) -> Iterator[Callable[..., Egress]]:
    """``attach(policy, **Egress kwargs)``: an Egress serving the module's sandbox."""
    made: list[Egress] = []

    def make(policy: EgressPolicy | dict[str, Any] | None, **kwargs: Any) -> Egress:
        eg = Egress(policy, **kwargs).attach(egress_sandbox)
        made.append(eg)
        return eg

    yield make
    for eg in made:
        eg.detach()


def guest(sb: Sandbox, code: str) -> Any:
    """Run ``code`` whose last line is a literal-safe expression; its value."""
    r = sb.run(code)
    assert r.status is TurnStatus.OK, r
    assert r.value is not None, r
    return ast.literal_eval(r.value)


def local_policy(port: int | None = None, **limits: Any) -> dict[str, Any]:
    """A policy allowing the test server by an explicit loopback rule."""
    rule: dict[str, Any] = {"name": "local", "action": "allow", "ip": "127.0.0.1"}
    if port is not None:
        rule["port"] = port
    return {"rules": [rule], "limits": limits}
