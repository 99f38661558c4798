"""``memex mcp`` driven by the real MCP client, as a host would: over stdio (the command started
by the client) and streamable HTTP on 127.0.0.1 (started here), with a bearer token."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, ImageContent

MEMEX = shutil.which("memex", path=str(Path(sys.executable).parent)) or "memex"
BRIDGED = str(Path(__file__).parents[2] / "host_tools" / "mcp" / "mcp_test_server.py")
TOKEN = "test-token-7f3a"


def run(fn: Callable[[], Awaitable[Any]]) -> Any:
    return anyio.run(fn)


@asynccontextmanager
async def stdio(*args: str, cwd: str | None = None) -> AsyncIterator[Client]:
    params = StdioServerParameters(command=MEMEX, args=["mcp", *args], cwd=cwd)
    async with Client(params) as client:
        yield client


async def call(client: Client, tool: str, **args: Any) -> CallToolResult:
    result: CallToolResult = await client.call_tool(tool, args)
    return result


def structured(r: CallToolResult) -> dict[str, Any]:
    assert r.structured_content is not None, r
    return r.structured_content


def text(r: CallToolResult) -> str:
    return "\n".join(c.text for c in r.content if hasattr(c, "text"))


# ---- stdio ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_tools_have_schemas_and_honest_annotations() -> None:
    async def go() -> None:
        async with stdio() as c:
            tools = {t.name: t for t in (await c.list_tools()).tools}
            assert set(tools) == {"run_python", "reset", "list_files", "read_file",
                                  "write_file", "checkpoint", "restore"}
            rp = tools["run_python"]
            assert rp.input_schema["required"] == ["code"]
            assert set(rp.input_schema["properties"]) == {"code", "timeout", "session"}
            assert {"status", "stdout", "value", "exception", "limit", "session"} <= set(
                (rp.output_schema or {})["properties"])
            a = {n: t.annotations for n, t in tools.items()}
            assert a["run_python"] is not None and a["run_python"].destructive_hint
            assert a["run_python"].open_world_hint is False  # no egress policy given
            for name in ("list_files", "read_file"):
                assert a[name] is not None and a[name].read_only_hint and a[name].idempotent_hint
            assert a["checkpoint"] is not None and a["checkpoint"].destructive_hint is False
            assert a["restore"] is not None and a["restore"].destructive_hint
            assert "persistent Python sandbox" in (c.instructions or "")
    run(go)


@pytest.mark.slow
def test_state_errors_and_limits() -> None:
    async def go() -> None:
        async with stdio("--timeout", "2") as c:
            r = await call(c, "run_python", code="x = 41")
            assert not r.is_error and structured(r)["status"] == "ok"
            session = structured(r)["session"]
            r = await call(c, "run_python", code="print('hi')\nx + 1")
            assert structured(r)["value"] == "42" and structured(r)["stdout"] == "hi\n"
            assert structured(r)["session"] == session  # one session per stdio connection
            r = await call(c, "run_python", code="1 / 0")
            assert r.is_error and structured(r)["exception"]["type"] == "ZeroDivisionError"
            start = time.monotonic()
            r = await call(c, "run_python", code="while True:\n    x += 1")
            assert r.is_error and time.monotonic() - start < 15
            s = structured(r)
            assert s["status"] == "killed" and s["limit"] == "deadline" and s["rolled_back"]
            assert "time limit" in text(r)
            r = await call(c, "run_python", code="import os\nos._exit(3)")  # a guest trap
            assert r.is_error and structured(r)["rolled_back"]
            r = await call(c, "run_python", code="x")
            assert structured(r)["value"] == "41"  # state as before the killed cells
            r = await call(c, "run_python", code="1", timeout=-1)
            assert r.is_error  # bad arguments are the client's error, not a dead server
            r = await call(c, "run_python", code="1", session="no-such-session")
            assert r.is_error and "no session" in text(r)
    run(go)


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@pytest.mark.slow
def test_files_mounts_and_figures(tmp_path: Path) -> None:
    ro, rw = tmp_path / "ro", tmp_path / "rw"
    ro.mkdir()
    rw.mkdir()
    (ro / "data.csv").write_text("a,b\n1,2\n")

    async def go() -> None:
        async with stdio("--mount", f"{ro}:/data", "--mount", f"{rw}:/out:rw") as c:
            r = await call(c, "write_file", path="/tmp/note.txt", content="hello")
            assert not r.is_error and structured(r)["size"] == 5
            r = await call(c, "run_python", code="open('/tmp/note.txt').read()")
            assert structured(r)["value"] == "'hello'"
            r = await call(c, "write_file", path="/tmp/b.bin",
                           content=base64.b64encode(b"\x00\xff").decode(), encoding="base64")
            r = await call(c, "read_file", path="/tmp/b.bin")
            assert structured(r)["encoding"] == "base64"
            assert base64.b64decode(structured(r)["content"]) == b"\x00\xff"
            listing = structured(await call(c, "list_files", path="/data"))["entries"]
            assert [(e["name"], e["kind"], e["size"]) for e in listing] == [
                ("data.csv", "file", 8)]
            r = await call(c, "write_file", path="/data/x.txt", content="no")
            assert r.is_error and "read-only" in text(r)
            assert not (ro / "x.txt").exists()
            r = await call(c, "run_python", code="open('/data/y', 'w')")
            assert r.is_error  # the guest cannot write there either
            r = await call(c, "write_file", path="/out/r.txt", content="yes")
            assert not r.is_error and (rw / "r.txt").read_text() == "yes"
            r = await call(c, "read_file", path="/etc/passwd")
            assert r.is_error and "not under /tmp or a mount" in text(r)
            code = textwrap.dedent("""\
                import matplotlib.pyplot as plt
                fig = plt.figure(figsize=(4, 3))
                plt.plot([1, 2, 3], [3, 1, 2])
                fig.savefig('/tmp/plot.png', dpi=50)
                None""")
            r = await call(c, "run_python", code=code)
            images = [x for x in r.content if isinstance(x, ImageContent)]
            assert not r.is_error and structured(r)["figures"] == 1 and len(images) == 1
            assert images[0].mime_type == "image/png"
            w, h = _png_size(base64.b64decode(images[0].data))
            assert 200 <= w <= 400 and 150 <= h <= 300  # 4x3 inches at 100 dpi, trimmed
            r = await call(c, "run_python", code="len(plt.get_fignums())")
            assert structured(r)["value"] == "0" and structured(r)["figures"] == 0
            r = await call(c, "read_file", path="/tmp/plot.png")  # a saved figure, as an image
            images = [x for x in r.content if isinstance(x, ImageContent)]
            assert len(images) == 1 and _png_size(base64.b64decode(images[0].data)) == (200, 150)
    run(go)


@pytest.mark.slow
def test_checkpoint_restore_and_reset() -> None:
    async def go() -> None:
        async with stdio() as c:
            await call(c, "run_python", code="v = 'before'")
            r = await call(c, "checkpoint", name="one")
            assert not r.is_error and structured(r)["name"] == "one"
            r = await call(c, "checkpoint", name="one")
            assert r.is_error and "replace" in text(r)
            await call(c, "run_python", code="v = 'after'")
            r = await call(c, "restore", name="one")
            assert not r.is_error
            assert structured(await call(c, "run_python", code="v"))["value"] == "'before'"
            r = await call(c, "restore", name="two")
            assert r.is_error and "no checkpoint 'two'" in text(r)
            assert not (await call(c, "reset")).is_error
            r = await call(c, "run_python", code="v")
            assert r.is_error and structured(r)["exception"]["type"] == "NameError"
            await call(c, "restore", name="one")  # checkpoints outlive a reset
            assert structured(await call(c, "run_python", code="v"))["value"] == "'before'"
    run(go)


@pytest.mark.slow
def test_two_connections_never_share_a_guest() -> None:
    async def go() -> None:
        async with stdio() as a, stdio() as b:
            await call(a, "run_python", code="secret = 1")
            r = await call(b, "run_python", code="secret")
            assert r.is_error
            sa = structured(await call(a, "run_python", code="1"))["session"]
            r = await call(b, "run_python", code="secret", session=sa)
            assert r.is_error and "no session" in text(r)
    run(go)


@pytest.mark.slow
def test_host_tools_and_bridged_servers_from_a_config(tmp_path: Path) -> None:
    (tmp_path / "ops_tools.py").write_text(textwrap.dedent('''
        from memex import tool

        @tool
        def lookup(key: str) -> int:
            """The value of a key in the operator's table."""
            return {"alpha": 1, "beta": 2}[key]
    '''))
    (tmp_path / "memex-mcp.toml").write_text(textwrap.dedent(f'''
        name = "ops"
        tools = ["ops_tools:lookup"]

        [limits]
        timeout = 10
        memory = "512M"

        [[bridge]]
        command = {json.dumps(sys.executable)}
        args = [{json.dumps(BRIDGED)}]
        include = ["add", "get-weather"]
        prefix = "w_"

        [sessions]
        max_checkpoints = 2
    '''))

    async def go() -> None:
        async with stdio("--config", str(tmp_path / "memex-mcp.toml")) as c:
            assert "lookup(key: str) -> int" in (c.instructions or "")
            r = await call(c, "run_python", code="lookup('beta') + w_add(40, 0)")
            assert structured(r)["value"] == "42", text(r)
            r = await call(c, "run_python", code="w_get_weather('Oslo').city")
            assert structured(r)["value"] == "'Oslo'"
            r = await call(c, "run_python", code="lookup('gamma')")
            assert r.is_error and "ToolExecutionError" in text(r)
            for name in ("a", "b"):
                assert not (await call(c, "checkpoint", name=name)).is_error
            r = await call(c, "checkpoint", name="c")
            assert r.is_error and "maximum of 2 checkpoints" in text(r)
    run(go)


@pytest.mark.slow
def test_a_bad_config_is_refused_with_the_key(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[limits]\ntimeout = -1\nbogus = 3\n")
    out = subprocess.run([MEMEX, "mcp", "--config", str(cfg)], capture_output=True, text=True,
                         timeout=60, stdin=subprocess.DEVNULL)
    assert out.returncode == 2
    assert "limits.timeout" in out.stderr and "limits.bogus" in out.stderr
    assert out.stdout == ""  # nothing but protocol ever goes to stdout


def raw_sender(p: subprocess.Popen[str]) -> Callable[[str], dict[str, Any]]:
    """Send a line to a ``memex mcp`` process started with pipes; its answer line, as JSON."""
    def send(line: str) -> dict[str, Any]:
        assert p.stdin is not None and p.stdout is not None
        p.stdin.write(line + "\n")
        p.stdin.flush()
        answer: dict[str, Any] = json.loads(p.stdout.readline())  # each line is JSON
        return answer
    return send


@pytest.mark.slow
def test_malformed_lines_get_protocol_errors_and_the_server_goes_on() -> None:
    p = subprocess.Popen([MEMEX, "mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True)
    assert p.stdin is not None and p.stdout is not None
    send = raw_sender(p)
    try:
        assert send("this is not json")["error"]["code"] == -32700
        bad = send('{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": 5}')
        assert bad["error"]["code"] == -32600 and bad["id"] == 7  # answered by its id
        assert send('{"jsonrpc": "1.0", "id": "x", "method": "ping"}')["id"] == "x"
        assert send('[1, 2]')["id"] is None
        init = send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"}}}))
        assert init["id"] == 1 and "tools" in init["result"]["capabilities"]
        p.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"})
                      + "\n")
        answer = send(json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "run_python", "arguments": {"code": "6 * 7"}}}))
        assert answer["result"]["structuredContent"]["value"] == "42"
    finally:
        p.stdin.close()
        assert p.wait(30) == 0


def _init(rid: int = 1) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": rid, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"}}})


def _cell(rid: int, code: str) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {
        "name": "run_python", "arguments": {"code": code}}})


INITIALIZED = json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"})


@pytest.mark.slow
def test_over_a_pipe_a_long_line_is_refused_and_stray_output_misses_the_wire(
        tmp_path: Path) -> None:
    (tmp_path / "noisy.py").write_text(textwrap.dedent('''
        import os, sys

        def shout(word: str) -> str:
            """Print to the process's stdout three ways, then answer."""
            print("stray print", word)
            sys.stdout.flush()
            os.write(1, b"stray write\\n")
            return word.upper()
    '''))
    (tmp_path / "memex-mcp.toml").write_text(
        'tools = ["noisy:shout"]\n\n[http]\nmax_request_bytes = 4096\n')
    p = subprocess.Popen([MEMEX, "mcp", "--config", str(tmp_path / "memex-mcp.toml")],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stdin is not None and p.stdout is not None
    send = raw_sender(p)
    try:
        assert send(_init())["id"] == 1
        p.stdin.write(INITIALIZED + "\n")
        long_cell = _cell(2, "x = '" + "a" * 5000 + "'")
        assert send(long_cell)["error"]["code"] == -32700  # over 4096 bytes: not read
        # positive control: a cell just under the bound runs
        ok = send(_cell(3, "x = '" + "a" * 3900 + "'\nlen(x)"))
        assert ok["result"]["structuredContent"]["value"] == "3900"
        r = send(_cell(4, "shout('hi')"))
        assert r["id"] == 4 and r["result"]["structuredContent"]["value"] == "'HI'"
    finally:
        p.stdin.close()
        assert p.wait(30) == 0
        rest = p.stdout.read()
        err = p.stderr.read() if p.stderr else ""
    assert rest == ""  # nothing after the last answer: the stray output went to stderr
    assert "stray print hi" in err and "stray write" in err


@pytest.mark.slow
def test_a_client_that_stops_reading_ends_the_server_as_the_end_of_input_does() -> None:
    # It exited 1 with a traceback (the SDK's writer met the closed pipe); now the input
    # ends there, sessions are closed and the exit is 0, while the client still holds stdin.
    p = subprocess.Popen([MEMEX, "mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stdin is not None and p.stdout is not None and p.stderr is not None
    try:
        assert raw_sender(p)(_init())["id"] == 1  # positive control: answered while read
        p.stdout.close()
        with contextlib.suppress(BrokenPipeError):
            p.stdin.write("\n".join([INITIALIZED, _cell(2, "print('x' * 100)")]) + "\n")
            p.stdin.flush()
        rc = p.wait(60)
    finally:
        if p.poll() is None:
            p.kill()
        with contextlib.suppress(BrokenPipeError):
            p.stdin.close()
    err = p.stderr.read()
    assert rc == 0, err
    assert "Traceback" not in err and "stopped reading" in err


@pytest.mark.slow
def test_with_a_file_for_stdout_the_sdk_transport_serves(tmp_path: Path) -> None:
    answers_file = tmp_path / "answers.jsonl"
    with answers_file.open("wb") as stdout:
        p = subprocess.Popen([MEMEX, "mcp"], stdin=subprocess.PIPE, stdout=stdout,
                             stderr=subprocess.DEVNULL)
        assert p.stdin is not None
        try:
            p.stdin.write("\n".join([_init(), INITIALIZED, _cell(2, "6 * 7")]).encode() + b"\n")
            p.stdin.flush()
            deadline = time.monotonic() + 120
            while answers_file.read_text().count("\n") < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            p.stdin.close()
            assert p.wait(30) == 0
    answers = [json.loads(line) for line in answers_file.read_text().splitlines()]
    assert [a["id"] for a in answers] == [1, 2]
    assert answers[1]["result"]["structuredContent"]["value"] == "42"


# ---- streamable HTTP ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def http_server() -> Iterator[tuple[str, subprocess.Popen[str]]]:
    with _http_server() as served:
        yield served


@contextlib.contextmanager
def _http_server(*args: str) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    env = dict(os.environ, MEMEX_TEST_TOKEN=TOKEN)
    p = subprocess.Popen([MEMEX, "mcp", "--http", "--port", "0", "--token-env",
                          "MEMEX_TEST_TOKEN", "--timeout", "30", *args],
                         stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    assert p.stderr is not None
    line = p.stderr.readline()
    assert "serving http://127.0.0.1:" in line, line
    url = line.split("serving ", 1)[1].split(" ", 1)[0]
    yield url, p
    p.send_signal(signal.SIGTERM)
    assert p.wait(30) == 0  # a graceful stop: sessions ended, exit 0


@asynccontextmanager
async def http(url: str, token: str = TOKEN, mode: Any = "auto") -> AsyncIterator[Client]:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                  timeout=None) as h, \
            Client(streamable_http_client(url, http_client=h), mode=mode) as client:
        yield client


@pytest.mark.slow
def test_http_refuses_a_wrong_or_missing_token(http_server: tuple[str, Any]) -> None:
    url, _ = http_server
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        r = httpx2.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                        headers={**headers, "Accept": "application/json, text/event-stream"})
        assert r.status_code == 401 and r.json()["error"]["code"] == -32001

    async def go() -> None:
        with pytest.raises(BaseException):  # noqa: B017 - the client fails its handshake
            async with http(url, token="wrong") as c:
                await c.list_tools()
    run(go)


def test_http_sessions_by_handle_and_by_mcp_session_id(http_server: tuple[str, Any]) -> None:
    url, _ = http_server

    async def go() -> None:
        async with http(url) as c:  # stateless protocol: the handle keeps the state
            r = await call(c, "run_python", code="y = 6")
            sid = structured(r)["session"]
            assert "pass it as `session`" in text(r)
            assert (await call(c, "run_python", code="y")).is_error  # a new session
            r = await call(c, "run_python", code="y * 7", session=sid)
            assert structured(r)["value"] == "42"
        async with http(url) as other:
            r = await call(other, "run_python", code="y", session=sid)
            assert not r.is_error  # same token: the handle works (it is the capability)
        async with http(url, mode="legacy") as c:  # a handshake-era client: Mcp-Session-Id
            r1 = await call(c, "run_python", code="z = 3")
            r2 = await call(c, "run_python", code="z * 2")
            assert structured(r2)["value"] == "6"
            assert structured(r1)["session"] == structured(r2)["session"] != sid
            async with http(url) as meanwhile:  # its handle works while it is connected
                r = await call(meanwhile, "run_python", code="z",
                               session=structured(r1)["session"])
                assert structured(r)["value"] == "3"
        async with http(url) as after:  # it ended its MCP session (DELETE): so did its sandbox
            r = await call(after, "run_python", code="z", session=structured(r1)["session"])
            assert r.is_error and "no session" in text(r)
    run(go)


def test_http_malformed_request_is_a_protocol_error(http_server: tuple[str, Any]) -> None:
    url, _ = http_server
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json",
               "Accept": "application/json, text/event-stream"}
    r = httpx2.post(url, content=b"{not json", headers=headers)
    assert r.status_code == 400 and r.json()["error"]["code"] == -32700

    async def go() -> None:
        async with http(url) as c:
            assert not (await call(c, "run_python", code="1")).is_error
    run(go)


@pytest.mark.slow
def test_a_client_that_disconnects_mid_call_leaves_a_working_server(
        http_server: tuple[str, Any]) -> None:
    url, _ = http_server

    async def session() -> str:
        async with http(url) as c:
            r = await call(c, "run_python", code="kept = 'yes'")
            return str(structured(r)["session"])

    sid = run(session)
    script = textwrap.dedent(f"""
        import anyio, httpx2
        from mcp import Client
        from mcp.client.streamable_http import streamable_http_client
        async def main():
            async with httpx2.AsyncClient(headers={{"Authorization": "Bearer {TOKEN}"}},
                                          timeout=None) as h, \\
                    Client(streamable_http_client({url!r}, http_client=h)) as c:
                print("calling", flush=True)
                await c.call_tool("run_python", {{"code": "while True: kept = 'no'",
                                                  "session": {sid!r}}})
        anyio.run(main)
    """)
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "calling"
    time.sleep(1.5)  # the cell is running
    p.kill()
    p.wait(10)

    async def after() -> None:
        async with http(url) as c:
            start = time.monotonic()
            r = await call(c, "run_python", code="kept", session=sid)
            # the abandoned cell was interrupted (not left to its 30 s limit) and rolled back
            assert structured(r)["value"] == "'yes'", text(r)
            assert time.monotonic() - start < 15
    run(after)


def _rpc(url: str, token: str, body: dict[str, Any], sid: str | None = None,
         method: str = "POST") -> tuple[int, str | None, dict[str, Any] | None]:
    """(status, the Mcp-Session-Id answered, the JSON-RPC message) of one raw request."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json",
               "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": "2025-06-18"}
    if sid is not None:
        headers["Mcp-Session-Id"] = sid
    r = httpx2.request(method, url, headers=headers, timeout=60,
                       content=json.dumps(body).encode() if method == "POST" else None)
    msg = None
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        data = [ln[5:].strip() for ln in r.text.splitlines() if ln.startswith("data:")]
        msg = json.loads(data[-1]) if data and data[-1] else None
    elif r.content:
        msg = r.json()
    return r.status_code, r.headers.get("mcp-session-id"), msg


def test_an_mcp_session_id_is_its_principal_s_alone() -> None:
    """Two bearer tokens, two principals. A handshake-era client's Mcp-Session-Id is bound
    to the principal it was given to: another principal that names it (a call, a DELETE)
    is answered 404 as for an unknown session, and the owner's session and sandbox state
    stay untouched (that principal used to be able to detach the owner's sandbox session or
    end its MCP session). The control: the owner's own DELETE ends it."""
    a, b = "principal-a-token-1", "principal-b-token-2"
    env = dict(os.environ, MEMEX_TEST_TOKENS=f"{a},{b}")
    p = subprocess.Popen([MEMEX, "mcp", "--http", "--port", "0", "--token-env",
                          "MEMEX_TEST_TOKENS", "--timeout", "30"],
                         stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert p.stderr is not None
        line = p.stderr.readline()
        url = line.split("serving ", 1)[1].split(" ", 1)[0]
        status, sid, _ = _rpc(url, a, {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                                       "params": {"protocolVersion": "2025-06-18",
                                                  "capabilities": {},
                                                  "clientInfo": {"name": "a", "version": "1"}}})
        assert status == 200 and sid, (status, sid)
        assert _rpc(url, a, {"jsonrpc": "2.0", "method": "notifications/initialized"},
                    sid)[0] == 202

        def cell(token: str, rid: int, code: str) -> tuple[int, dict[str, Any] | None]:
            st, _, msg = _rpc(url, token, {"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                                           "params": {"name": "run_python",
                                                      "arguments": {"code": code}}}, sid)
            return st, msg

        st, msg = cell(a, 2, "x = 41")
        assert st == 200 and msg is not None and not msg["result"]["isError"], msg
        st, msg = cell(b, 3, "x")  # b names a's MCP session
        assert st == 404 and msg is not None and msg["error"]["message"] == "Session not found"
        assert _rpc(url, b, {}, sid, method="DELETE")[0] == 404
        st, msg = cell(a, 4, "x + 1")  # a's session, state and all, is still a's
        assert st == 200 and msg is not None, msg
        assert msg["result"]["structuredContent"]["value"] == "42", msg
        assert _rpc(url, a, {}, sid, method="DELETE")[0] == 200  # the owner ends it
        assert cell(a, 5, "x")[0] == 404
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0


# ---- progress -------------------------------------------------------------------------------
WAITS_FOR_GO = textwrap.dedent("""\
    import os, time
    print('first', flush=True)
    while not os.path.exists('/sig/go'):  # the host makes it once it heard 'first'
        time.sleep(0.02)
    print('second')
    'done'""")


async def _heard_while_running(c: Client, sig: Path, **args: Any
                               ) -> tuple[CallToolResult, list[tuple[float, str | None]]]:
    """A cell that prints, then waits for the host: the host lets it go only on hearing its
    first line as progress, so without progress notifications it runs into its deadline."""
    heard: list[tuple[float, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        heard.append((progress, message))
        if message and "first" in message:
            (sig / "go").touch()

    r = await c.call_tool("run_python", {"code": WAITS_FOR_GO, **args},
                          progress_callback=on_progress)
    return r, heard


@pytest.mark.slow
def test_a_long_cell_s_output_comes_as_progress_while_it_runs(tmp_path: Path) -> None:
    """Over stdio and over HTTP, a client that sent a progress token hears what the cell
    printed while it runs (``notifications/progress``: the message is the new output,
    progress the seconds run, growing); the result still holds all of it. The control: a
    call without a token hears nothing, and the same cell runs into its deadline."""
    sig = tmp_path / "sig"
    sig.mkdir()

    async def go() -> None:
        async with stdio("--timeout", "20", "--mount", f"{sig}:/sig") as c:
            r, heard = await _heard_while_running(c, sig)
            assert not r.is_error and structured(r)["value"] == "'done'", r
            assert structured(r)["stdout"] == "first\nsecond\n"
            assert any(m and m.startswith("first") for _, m in heard), heard
            progress = [p for p, _ in heard]
            assert progress == sorted(set(progress)), progress  # each one greater
            (sig / "go").unlink()
            r = await call(c, "run_python", code=WAITS_FOR_GO, timeout=2)  # no token
            assert r.is_error and structured(r)["limit"] == "deadline", r
        with _http_server("--mount", f"{sig}:/sig") as (url, _):
            async with http(url) as c:
                r, heard = await _heard_while_running(c, sig)
                assert not r.is_error and structured(r)["value"] == "'done'", r
                assert any(m and m.startswith("first") for _, m in heard), heard
    run(go)
