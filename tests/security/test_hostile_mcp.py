"""`memex mcp` as strangers meet it (SECURITY.md, "The shared server"): over HTTP it serves
only with a token unless told otherwise, and then only on loopback; its connections are
guarded as `memex serve`'s are; calls sent at once run in the order they arrived; each bearer
token is a principal held to its own bounds by the session core."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult

MEMEX = shutil.which("memex", path=str(Path(sys.executable).parent)) or "memex"
ACCEPT = {"Accept": "application/json, text/event-stream"}


def _start(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([MEMEX, "mcp", "--http", "--port", "0", *args],
                            stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})


def _url(p: subprocess.Popen[str]) -> str:
    assert p.stderr is not None
    deadline = time.monotonic() + 60
    lines = []
    while time.monotonic() < deadline:
        line = p.stderr.readline()
        lines.append(line)
        if "serving http://" in line:
            return line.split("serving ", 1)[1].split(" ", 1)[0].rstrip(";")
        if not line and p.poll() is not None:
            break
    raise AssertionError("".join(lines))


@pytest.mark.parametrize("args, why", [
    ((), "only with a bearer token"),
    (("--no-auth", "--host", "0.0.0.0"), "only on a loopback address"),
])
@pytest.mark.slow
def test_http_without_a_token_refuses_to_start(args: tuple[str, ...], why: str) -> None:
    p = _start(*args)
    try:
        assert p.wait(60) == 2
        assert p.stderr is not None and why in p.stderr.read()
    finally:
        p.kill()


HEADER_TIMEOUT = 2.0  # the no-auth server's [http] header_timeout (default 10 s)


@pytest.fixture(scope="module")
def no_auth(tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    config = tmp_path_factory.mktemp("mcp") / "mcp.toml"
    config.write_text(f"[http]\nheader_timeout = {HEADER_TIMEOUT}\n")
    p = _start("--no-auth", "--timeout", "20", "--config", str(config))
    try:
        url = _url(p)
        yield url, p
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(30)


def _rpc(url: str, method: str, params: dict[str, object], rid: int = 1,
         headers: dict[str, str] | None = None) -> httpx2.Response:
    return httpx2.post(url, json={"jsonrpc": "2.0", "id": rid, "method": method,
                                  "params": params},
                       headers={**ACCEPT, **(headers or {})}, timeout=60)


@pytest.mark.slow
def test_no_auth_on_loopback_serves_and_says_so(no_auth: tuple[str, subprocess.Popen[str]]
                                                ) -> None:
    url, _ = no_auth
    r = _rpc(url, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                 "clientInfo": {"name": "t", "version": "1"}})
    assert r.status_code == 200, r.text


@pytest.mark.slow
def test_the_mcp_servers_connections_are_guarded(no_auth: tuple[str, subprocess.Popen[str]]
                                                 ) -> None:
    """Half-open connections are evicted (at most 32 pending per address) and closed at
    the header timeout the config's ``[http]`` table sets; a real client is served
    meanwhile."""
    url, _ = no_auth
    host, port = url.split("//", 1)[1].split("/", 1)[0].split(":")
    held = []
    for _ in range(100):
        s = socket.create_connection((host, int(port)), timeout=10)
        s.sendall(b"POST /mcp HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        held.append(s)
    try:
        r = _rpc(url, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                     "clientInfo": {"name": "t", "version": "1"}})
        assert r.status_code == 200
        closed = 0
        # still open at the default's 10 s would be a timeout here: the setting not taken
        for s in held:
            s.settimeout(3 * HEADER_TIMEOUT)
            try:
                closed += s.recv(1024) == b""
            except TimeoutError:
                pytest.fail(f"a half-open connection outlived the {HEADER_TIMEOUT} s header "
                            "timeout of [http]")
            except OSError:  # reset by the server: closed too
                closed += 1
        assert closed == len(held)
    finally:
        for s in held:
            s.close()


@pytest.mark.slow
def test_calls_sent_at_once_run_in_the_order_they_arrived() -> None:
    """Twenty run_python calls written to a stdio server without waiting for any answer run
    in the order they were sent (a host sending a model's parallel tool calls)."""
    p = subprocess.Popen([MEMEX, "mcp", "--timeout", "20"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert p.stdin is not None and p.stdout is not None

    def send(obj: dict[str, object]) -> None:
        assert p.stdin is not None
        p.stdin.write(json.dumps(obj) + "\n")
        p.stdin.flush()

    got: dict[object, dict[str, object]] = {}  # answers by id, in whatever order they come
    deadline = time.monotonic() + 120

    def answer(rid: int) -> dict[str, object]:
        assert p.stdout is not None
        while rid not in got:
            assert time.monotonic() < deadline, f"no answer to {rid}"
            line = p.stdout.readline()
            assert line, "the server ended"
            msg = json.loads(line)
            got[msg.get("id")] = dict(msg)
        return got.pop(rid)

    try:
        send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}})
        answer(0)
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        call = {"jsonrpc": "2.0", "method": "tools/call"}
        send({**call, "id": 1, "params": {"name": "run_python", "arguments": {
            "code": "seen = []"}}})
        answer(1)
        for i in range(20):
            send({**call, "id": 100 + i, "params": {"name": "run_python", "arguments": {
                "code": f"seen.append({i})"}}})
        for i in range(20):
            answer(100 + i)
        send({**call, "id": 2, "params": {"name": "run_python", "arguments": {
            "code": "seen"}}})
        result = answer(2)["result"]
        assert isinstance(result, dict)
        assert result["structuredContent"]["value"] == str(list(range(20)))
    finally:
        p.kill()
        p.wait(30)


async def _call(url: str, token: str, tool: str, **args: Any) -> CallToolResult:
    """One tool call by a client holding ``token`` (the stateless protocol: a call naming
    no session starts one)."""
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                  timeout=None) as h, \
            Client(streamable_http_client(url, http_client=h)) as client:
        result: CallToolResult = await client.call_tool(tool, args)
        return result


def _text(r: CallToolResult) -> str:
    return "\n".join(c.text for c in r.content if hasattr(c, "text"))


@pytest.mark.slow
def test_each_token_is_held_to_its_own_bounds() -> None:
    """Two tokens, each its own principal (the session core's owner): one at its session
    bound gives up its own oldest idle session for a new one (never the other's, which
    keeps its state); one at its memory bound cannot keep a checkpoint (its size counted
    with its sessions) while a smaller one fits; neither can use the other's session
    handle."""
    p = _start("--token-env", "MEMEX_TEST_TOKENS", "--total-sessions", "6",
               "--max-sessions-per-token", "2", "--max-memory-per-token", "600M",
               "--memory", "256M", "--timeout", "30", env={"MEMEX_TEST_TOKENS": "tok-a,tok-b"})
    try:
        url = _url(p)

        async def go() -> None:
            r = await _call(url, "tok-b", "run_python", code="kept = 'b'")  # b's, first
            assert not r.is_error, _text(r)
            b_sid = (r.structured_content or {})["session"]
            first = await _call(url, "tok-a", "run_python", code="x = 1")
            assert not first.is_error, _text(first)
            oldest = (first.structured_content or {})["session"]
            assert not (await _call(url, "tok-a", "run_python", code="1")).is_error
            r = await _call(url, "tok-a", "run_python", code="x = 3")  # a is at its 2
            assert not r.is_error, _text(r)
            sid = (r.structured_content or {})["session"]
            r = await _call(url, "tok-a", "run_python", code="x", session=oldest)
            assert r.is_error and "no session" in _text(r)  # a's oldest made the room
            r = await _call(url, "tok-b", "run_python", code="kept", session=b_sid)
            assert not r.is_error and (r.structured_content or {})["value"] == "'b'"  # control
            r = await _call(url, "tok-b", "run_python", code="x", session=sid)
            assert r.is_error and "no session" in _text(r)  # a's handle is not b's
            # memory: a holds 2 x 256 MiB of sessions; a fresh guest's checkpoint fits
            # within 600 MiB, one holding 100 MiB more does not (and is not kept)
            r = await _call(url, "tok-a", "checkpoint", name="small", session=sid)
            assert not r.is_error, _text(r)
            r = await _call(url, "tok-a", "run_python", code="big = bytearray(100 << 20)",
                            session=sid)
            assert not r.is_error, _text(r)
            r = await _call(url, "tok-a", "checkpoint", name="big", session=sid)
            assert r.is_error and "not kept" in _text(r) and "its bound is" in _text(r)
            r = await _call(url, "tok-a", "restore", name="small", session=sid)
            assert not r.is_error, _text(r)
            r = await _call(url, "tok-a", "restore", name="big", session=sid)
            assert r.is_error and "no checkpoint 'big'" in _text(r)
            r = await _call(url, "tok-b", "checkpoint", name="big", session=b_sid)  # b's own
            assert not r.is_error, _text(r)

        anyio.run(go)
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(30)
