"""The service client retries what is safe to retry: an idempotent call (GET, PUT, DELETE)
the service refuses for now (429/503 with Retry-After) is made again after the wait asked,
a bounded number of times; a POST never is. Against a real HTTP server on 127.0.0.1 that
answers as the service does when it is busy."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from memex.backends.internal import Client
from memex.errors import ConfigError, ServiceError


class _Busy(ThreadingHTTPServer):
    """Answers the first ``refusals`` requests 429 (or ``status``) with ``Retry-After:
    retry_after``, then 200 with an empty session list; counts what it was asked."""

    refusals = 0
    status = 429
    retry_after = "0"
    seen: list[str]


def _handler(server: _Busy) -> type[BaseHTTPRequestHandler]:
    class H(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            server.seen.append(self.command)
            if len(server.seen) <= server.refusals:
                body = json.dumps({"error": {"code": "busy", "message": "busy for now"}})
                self.send_response(server.status)
                self.send_header("Retry-After", server.retry_after)
            else:
                body = json.dumps({"sessions": [], "id": "s_1"})
                self.send_response(200)
            data = body.encode()
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = _answer

        def log_message(self, *_a: object) -> None:
            pass

    return H


@pytest.fixture
def busy() -> Iterator[_Busy]:
    server = _Busy(("127.0.0.1", 0), BaseHTTPRequestHandler)
    server.seen = []
    server.RequestHandlerClass = _handler(server)
    th = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01},
                     daemon=True)
    th.start()
    yield server
    server.shutdown()
    server.server_close()


def _client(server: _Busy, **kw: int) -> Client:
    return Client(f"http://127.0.0.1:{server.server_address[1]}", "k" * 20, timeout=10, **kw)


def test_an_idempotent_call_refused_for_now_is_made_again(busy: _Busy) -> None:
    busy.refusals = 2
    with _client(busy) as c:
        assert c.sessions() == []
    assert busy.seen == ["GET", "GET", "GET"]


def test_retries_are_bounded(busy: _Busy) -> None:
    busy.refusals, busy.status = 100, 503
    with _client(busy, retries=2) as c, pytest.raises(ServiceError, match="busy for now"):
        c.sessions()
    assert busy.seen == ["GET"] * 3  # the call and its 2 retries


def test_a_post_is_never_retried(busy: _Busy) -> None:
    busy.refusals = 1
    with _client(busy) as c, pytest.raises(ServiceError, match="busy for now"):
        c.create()
    assert busy.seen == ["POST"]


def test_a_wait_past_the_bound_or_no_retry_after_is_answered_at_once(busy: _Busy) -> None:
    busy.refusals, busy.retry_after = 1, "3600"
    with _client(busy) as c, pytest.raises(ServiceError):
        c.sessions()
    assert busy.seen == ["GET"]
    busy.seen.clear()
    busy.refusals, busy.retry_after = 1, "soon"
    with _client(busy) as c, pytest.raises(ServiceError):
        c.sessions()
    assert busy.seen == ["GET"]
    busy.seen.clear()
    with _client(busy, retries=0) as c, pytest.raises(ServiceError):
        busy.refusals, busy.retry_after = 1, "0"
        c.sessions()
    assert busy.seen == ["GET"]
    with pytest.raises(ConfigError):
        _client(busy, retries=-1)


def test_an_idle_connection_is_not_reused_past_the_clients_keepalive(
        busy: _Busy, monkeypatch: pytest.MonkeyPatch) -> None:
    """The client drops a pooled connection idle for KEEPALIVE_EXPIRY, which is below memex
    serve's own idle keep-alive: a call is never sent on a connection the server is closing
    as idle at that moment (a POST that met that close failed, and is not retried)."""
    from memex.backends import _remote
    from memex.serving import EdgeLimits

    assert EdgeLimits().keep_alive_timeout > _remote.KEEPALIVE_EXPIRY
    monkeypatch.setattr(_remote, "KEEPALIVE_EXPIRY", 0.2)
    connections = []
    plain = busy.RequestHandlerClass

    class KeepAlive(plain):  # type: ignore[misc, valid-type]
        protocol_version = "HTTP/1.1"  # keeps the connection open between calls

        def setup(self) -> None:
            connections.append(self.client_address)
            super().setup()

    busy.RequestHandlerClass = KeepAlive
    with _client(busy) as c:
        c.create()
        c.create()
        assert len(connections) == 1  # control: back to back, one connection kept
        time.sleep(0.3)  # idle past the client's keep-alive
        c.create()
        assert len(connections) == 2
