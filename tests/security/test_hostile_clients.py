"""Strangers at the door of `memex serve` (SECURITY.md, "The shared server"): clients with no
key, clients that never finish a request, clients that send costly bodies. A real server on
127.0.0.1 with small edge bounds; each attack beside a positive control (a real client of
the same server, served as usual)."""

from __future__ import annotations

import importlib.util
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from served import Served, client_for_test, cluster_toml, start_server

EDGE = ("max_connections = 60\nmax_pending = 40\nmax_pending_per_peer = 16\n"
        "header_timeout = 1.5\nbody_timeout = 1.5\nkeep_alive_timeout = 2\n"
        "max_body_bytes = 33554432\n")


@pytest.fixture(scope="module", params=["one server", pytest.param("cluster", marks=[
    pytest.mark.ray, pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                                        reason="Ray is not installed")])])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Served]:
    """One server, then a front of a Ray cluster (the same edge: every attack runs on both)."""
    folder = tmp_path_factory.mktemp("edge")
    extra = EDGE
    if request.param == "cluster":
        extra += cluster_toml(request.getfixturevalue("ray_cluster"), folder)
    served = start_server(folder, {"a": "max_sessions = 50", "b": "max_sessions = 50"},
                          server=extra)
    yield served
    served.stop()


def _addr(served: Served) -> tuple[str, int]:
    host, port = served.url.rsplit("//", 1)[1].split(":")
    return host, int(port)


def _hwm(served: Served) -> int:
    """The server process's peak resident memory so far (bytes)."""
    with open(f"/proc/{served.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def _closed(sock: socket.socket, within: float) -> bool:
    """Whether the server closes ``sock`` within ``within`` seconds (reading what it sends)."""
    sock.settimeout(0.2)
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if sock.recv(65536) == b"":
                return True
        except TimeoutError:
            continue
        except OSError:
            return True
    return False


def _quiet_turn(served: Served) -> None:
    """The positive control: a tenant's whole request cycle, answered."""
    c = client_for_test(served.url, served.keys["b"])
    sid = c.create()["id"]
    assert c.run(sid, "6 * 7")["result"]["value"] == "42"
    c.close_session(sid)


# ---- authenticate first ---------------------------------------------------------------------
@pytest.mark.slow
def test_a_stranger_is_refused_from_the_headers_before_the_body_is_read(server: Served) -> None:
    """30 MiB of nested empty arrays with no key: 401 from the headers alone (the server
    answers before the body is sent and reads none of it); with a key, the same body is
    refused as too costly to parse (413), never parsed, never a 500."""
    body = b"[" * (15 << 20) + b"]" * (15 << 20)
    before = _hwm(server)
    host, port = _addr(server)
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  + f"Content-Length: {len(body)}\r\n\r\n".encode())
        s.sendall(body[:65536])  # the server answers without waiting for the rest
        s.settimeout(10)
        head = s.recv(65536)
    assert head.startswith(b"HTTP/1.1 401"), head[:200]
    assert b"tenant" not in head and b"sha256" not in head
    r = httpx2.post(f"{server.url}/v1/sessions", content=body, timeout=60,
                    headers={"Authorization": f"Bearer {server.keys['a']}",
                             "Content-Type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "too_large", r.text[:200]
    assert _hwm(server) - before < 128 << 20  # the body once (capped), never its objects
    _quiet_turn(server)


@pytest.mark.parametrize("path", ["/v1/sessions", "/v1/sessions/s_x/run", "/no/such/route",
                                  "/v1/tools"])
def test_an_unauthenticated_request_learns_nothing(server: Served, path: str) -> None:
    for key in (None, "Bearer not-a-key-0123456789", "Basic eA=="):
        headers = {"Authorization": key} if key else {}
        r = httpx2.get(f"{server.url}{path}", headers=headers, timeout=10)
        assert r.status_code == 401, (path, key, r.status_code)  # even an unknown route
        assert r.json()["error"]["code"] == "unauthorized"
    assert httpx2.get(f"{server.url}/readyz", timeout=10).json() == {"status": "ready"}
    m = httpx2.get(f"{server.url}/metrics", timeout=10)
    assert m.status_code == 401 and "tenant" not in m.text
    # positive control: the same request with a key is answered
    r = httpx2.get(f"{server.url}/v1/sessions",
                   headers={"Authorization": f"Bearer {server.keys['a']}"}, timeout=10)
    assert r.status_code == 200


# ---- connections ------------------------------------------------------------------------------
@pytest.mark.slow
def test_half_open_connections_cannot_lock_out_a_tenant(server: Served) -> None:
    """Hundreds of connections from this address that each send half a request head: the
    oldest are closed as new ones come (at most 16 pending per address), the rest at the
    header timeout, and a tenant on the same address is served throughout."""
    host, port = _addr(server)
    held = []
    for _ in range(300):
        s = socket.create_connection((host, port), timeout=10)
        s.sendall(b"GET /v1/sessions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        held.append(s)
    try:
        for _ in range(3):
            _quiet_turn(server)
        # every one of them is closed by the server: evicted, or at the header timeout
        assert all(_closed(s, 5.0) for s in held)
    finally:
        for s in held:
            s.close()
    _quiet_turn(server)


@pytest.mark.slow
def test_a_request_head_or_body_that_stops_is_closed(server: Served) -> None:
    host, port = _addr(server)
    with socket.create_connection((host, port), timeout=10) as idle:
        assert _closed(idle, 5.0)  # connected, sent nothing: closed at the header timeout
    with socket.create_connection((host, port), timeout=10) as body:
        body.sendall(f"PUT /v1/sessions/s_x/files?path=/tmp/x HTTP/1.1\r\nHost: x\r\n"
                     f"Authorization: Bearer {server.keys['a']}\r\n"
                     "Content-Length: 1000\r\n\r\n".encode() + b"x" * 10)
        assert _closed(body, 5.0)  # the body stopped: closed at the body timeout
    # positive control: a slow client within the bounds is served
    with socket.create_connection((host, port), timeout=10) as slow:
        for part in (b"GET /healthz HTTP/1.1\r\n", b"Host: x\r\n", b"\r\n"):
            slow.sendall(part)
            time.sleep(0.3)
        slow.settimeout(5)
        assert slow.recv(4096).startswith(b"HTTP/1.1 200")


def test_a_head_that_never_ends_is_cut(server: Served) -> None:
    host, port = _addr(server)
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        try:
            for _ in range(200):  # 1.6 MB of headers, quickly
                s.sendall(b"X-Pad: " + b"p" * 8000 + b"\r\n")
        except OSError:
            pass  # closed under us: what should happen
        assert _closed(s, 5.0)


@pytest.mark.slow
def test_past_max_connections_a_new_one_is_refused_until_one_closes(server: Served) -> None:
    host, port = _addr(server)
    held = []
    try:
        for _ in range(60):  # whole requests, kept alive: not pending, so not evicted
            s = socket.create_connection((host, port), timeout=10)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            s.settimeout(5)
            assert s.recv(4096).startswith(b"HTTP/1.1 200")
            held.append(s)
        with socket.create_connection((host, port), timeout=10) as extra:
            extra.settimeout(5)
            assert extra.recv(4096).startswith(b"HTTP/1.1 503")
        for s in held:  # the idle ones close at the keep-alive timeout
            assert _closed(s, 6.0)
    finally:
        for s in held:
            s.close()
    _quiet_turn(server)  # positive control: room again


def test_json_bodies_cost_what_the_api_needs(server: Served) -> None:
    """A body nested deeper than any parser's recursion is refused before parsing (413), as
    are too many containers; a real body is taken."""
    auth = {"Authorization": f"Bearer {server.keys['a']}"}
    for body in (b'{"limits": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
                 json.dumps({"env": {f"k{i}": str(i) for i in range(10)},
                             "preload": [[[]]] * 300}).encode()):
        r = httpx2.post(f"{server.url}/v1/sessions", content=body, timeout=30,
                        headers={**auth, "Content-Type": "application/json"})
        assert r.status_code == 413, r.text[:200]
    r = httpx2.post(f"{server.url}/v1/sessions", json={"env": {"A": "1"}}, headers=auth,
                    timeout=60)
    assert r.status_code == 201, r.text
    httpx2.delete(f"{server.url}/v1/sessions/{r.json()['id']}", headers=auth, timeout=30)


def test_an_unauthenticated_websocket_is_closed_before_it_is_accepted(server: Served) -> None:
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    ws_url = "ws" + server.url[4:] + "/v1/sessions/s_x/turns"
    with pytest.raises(InvalidStatus) as refused:
        connect(ws_url, additional_headers={"Authorization": "Bearer nope-nope-nope-nope"},
                open_timeout=10)
    assert refused.value.response.status_code == 403
    _quiet_turn(server)


def test_the_server_config_refuses_bad_edge_values(tmp_path: Path) -> None:
    from memex import ConfigError
    from memex.service import load_config

    for line in ("header_timeout = 0", "max_pending = -1", "body_timeout = true",
                 "max_connections = 'many'"):
        bad = tmp_path / "bad.toml"
        bad.write_text(f"[server]\n{line}\n")
        with pytest.raises(ConfigError):
            load_config(bad)
