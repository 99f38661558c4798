"""MCP servers' tools inside the guest (``ToolSet.from_mcp``), against a real MCP server
process written for these tests (mcp_test_server.py), over stdio and streamable HTTP on
127.0.0.1: typed values, unwrapped primitives, aliases, errors, timeouts, reconnects, the gate,
every page of the listing, and both agent action spaces."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lanes import examples

from memex import Limits, Sandbox, ToolHost, ToolSet, TurnStatus
from memex.errors import ConfigError, MCPServerError

SERVER = str(Path(__file__).with_name("mcp_test_server.py"))


@pytest.fixture(scope="module")
def mcp_tools() -> Iterator[ToolSet]:
    ts = ToolSet.from_mcp(sys.executable, args=[SERVER])
    yield ts
    ts.close()


@pytest.fixture
def guest(mcp_tools: ToolSet) -> Iterator[Sandbox]:
    with Sandbox(limits=Limits(timeout=20)) as sb, ToolHost(mcp_tools).attach(sb):
        yield sb


def value(sb: Sandbox, code: str) -> str | None:
    r = sb.run(code)
    assert r.ok, (r.exception, r.stderr)
    return r.value


def failure(sb: Sandbox, code: str) -> tuple[str, str]:
    r = sb.run(code)
    assert r.exception is not None, r
    return r.exception.type.rsplit(".", 1)[-1], r.exception.message


def test_the_listing_becomes_typed_functions(mcp_tools: ToolSet, guest: Sandbox) -> None:
    assert mcp_tools.names == ("get-weather", "add", "primes", "image", "stats", "fail", "slow",
                               "pid", "record")
    assert mcp_tools.aliases == {"get-weather": "get_weather"}
    assert value(guest, "import inspect; str(inspect.signature(get_weather))") == \
        "'(city: str, days: int = 1) -> tools.Weather'"
    doc = value(guest, "get_weather.__doc__")
    assert doc is not None and "Weather for a city." in doc and "days" in doc
    assert value(guest, "str(inspect.signature(add))") == "'(a: int, b: int) -> int'"
    assert value(guest, "str(inspect.signature(primes))") == "'(n: int) -> list[int]'"
    assert mcp_tools["get-weather"].annotations == {"readOnlyHint": True}
    assert mcp_tools["fail"].annotations == {"destructiveHint": True}
    assert mcp_tools["add"].origin == "mcp"


def test_values_arrive_typed(guest: Sandbox) -> None:
    # an output schema: a record with attributes (not a dict)
    assert value(guest, "w = get_weather('Oslo', 2)\n(type(w).__name__, w.city, w.high, "
                        "w.conditions)") == "('Weather', 'Oslo', 22.0, ['sunny', 'sunny'])"
    assert value(guest, "w.to_dict()['high']") == "22.0"
    # the {"result": x} wrapper around primitives is unwrapped
    assert value(guest, "add(2, 3) + 1") == "6"
    assert value(guest, "primes(5)") == "[2, 3, 5, 7, 11]"
    # text that is JSON is decoded; an image is a record with bytes
    assert value(guest, "stats([1.0, 2.0, 4.5])") == "{'mean': 2.5, 'n': 3}"
    assert value(guest, "img = image()\n(type(img).__name__, img.mime_type, img.data[:4])") == \
        "('McpImage', 'image/png', b'\\x89PNG')"


def test_errors_and_bad_arguments(guest: Sandbox, mcp_tools: ToolSet) -> None:
    kind, message = failure(guest, "fail('the reason')")
    assert kind == "ToolExecutionError" and "the reason" in message
    with ToolHost(mcp_tools).attach(guest) as host:
        kind, message = failure(guest, "add(2, 'x')")
        assert kind == "ToolArgumentError" and "'x' is not of type 'integer'" in message
        assert host.calls[-1].outcome == "invalid_arguments" and not host.calls[-1].ran
        # a real signature: a missing argument is the guest's own TypeError
        assert failure(guest, "get_weather()")[0] == "TypeError"


@pytest.mark.slow
def test_a_slow_call_times_out_and_the_next_works() -> None:
    with ToolSet.from_mcp(sys.executable, args=[SERVER], timeout=0.5) as ts, \
            Sandbox(limits=Limits(timeout=20)) as sb, ToolHost(ts).attach(sb):
        start = time.monotonic()
        kind, message = failure(sb, "slow(5)")
        assert kind == "ToolTimeoutError", message
        assert time.monotonic() - start < 4
        assert value(sb, "add(1, 1)") == "2"


def test_the_turn_s_deadline_cuts_a_call_the_tool_s_timeout_would_allow() -> None:
    # The guest's thread waits on the MCP session's loop itself (no worker thread): the
    # turn's deadline still bounds the wait, and the call is cancelled, not left running.
    with ToolSet.from_mcp(sys.executable, args=[SERVER], timeout=30) as ts, \
            Sandbox(limits=Limits(timeout=1.5)) as sb, ToolHost(ts).attach(sb):
        start = time.monotonic()
        r = sb.run("slow(10)")
        assert r.status is TurnStatus.KILLED and r.limit == "deadline", r
        assert time.monotonic() - start < 6
        start = time.monotonic()
        assert value(sb, "add(1, 1)") == "2"  # the session is free again at once
        assert time.monotonic() - start < 3


def _until(done: Any) -> None:
    """Wait for ``done()`` (the suite's hang guard bounds the wait, not a guess)."""
    while not done():
        time.sleep(0.01)


@pytest.mark.slow
def test_reconnects_after_the_server_is_killed(tmp_path: Path) -> None:
    started = tmp_path / "started"
    with ToolSet.from_mcp(sys.executable, args=[SERVER],
                          env={"MCP_TEST_STARTED": str(started)}) as ts, \
            Sandbox(limits=Limits(timeout=20)) as sb, ToolHost(ts).attach(sb):
        [conn] = ts._resources
        first = int(value(sb, "pid()") or 0)
        os.kill(first, signal.SIGKILL)
        _until(lambda: conn._live_now() is None)
        # the death was seen before the next call was sent: even a call that is not safe to
        # repeat goes through on a new connection
        assert value(sb, "record('a')") == "1"
        second = int(value(sb, "pid()") or 0)
        assert second != first
        # killed while a call is in flight (once the server has begun it): that call fails
        # clearly, the next reconnects
        def kill_once_begun() -> None:
            _until(started.exists)
            os.kill(second, signal.SIGKILL)

        threading.Thread(target=kill_once_begun, daemon=True).start()
        kind, message = failure(sb, "slow(60)")
        assert kind == "ToolExecutionError" and "may or may not have run" in message
        assert value(sb, "add(20, 22)") == "42"


def test_the_gate_sees_the_servers_annotations(mcp_tools: ToolSet) -> None:
    def no_destructive(req: Any) -> bool:
        return not req.tool.annotations.get("destructiveHint")

    with Sandbox() as sb, ToolHost(mcp_tools, gate=no_destructive).attach(sb):
        assert failure(sb, "fail('x')")[0] == "ToolDeniedError"
        assert value(sb, "add(1, 2)") == "3"


def test_every_page_of_the_listing() -> None:
    with ToolSet.from_mcp(sys.executable, args=[SERVER, "--many"]) as ts:
        assert len(ts) == 69  # 7 pages of 10
        assert "extra_59" in ts
        with Sandbox() as sb, ToolHost(ts).attach(sb):
            assert value(sb, "extra_59()") == "59"


@pytest.mark.slow
def test_include_and_bad_servers() -> None:
    with ToolSet.from_mcp(sys.executable, args=[SERVER], include=["add"]) as ts:
        assert ts.names == ("add",)
    with pytest.raises(ConfigError, match="has no tool 'nope'"):
        ToolSet.from_mcp(sys.executable, args=[SERVER], include=["nope"])
    with pytest.raises(MCPServerError, match="cannot connect"):
        ToolSet.from_mcp("/nonexistent/mcp-server", connect_timeout=10)
    with pytest.raises(MCPServerError, match="cannot connect"):
        ToolSet.from_mcp(sys.executable, args=["-c", "import sys; sys.exit(3)"],
                         connect_timeout=10)
    with pytest.raises(ConfigError, match="exactly one"):
        ToolSet.from_mcp(sys.executable, url="http://127.0.0.1:1/mcp")
    with pytest.raises(ConfigError, match="http"):
        ToolSet.from_mcp(url="ftp://127.0.0.1/mcp")


@pytest.mark.slow
def test_close_is_idempotent_and_a_closed_set_fails_clearly() -> None:
    ts = ToolSet.from_mcp(sys.executable, args=[SERVER])
    ts.close()
    ts.close()
    with Sandbox() as sb, ToolHost(ts).attach(sb):
        kind, message = failure(sb, "add(1, 2)")
        assert kind == "ToolExecutionError" and "closed" in message


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def http_server() -> Iterator[str]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, SERVER, "--http", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    yield f"http://127.0.0.1:{port}/mcp"
    proc.terminate()
    proc.wait(10)


@pytest.mark.slow
def test_over_streamable_http(http_server: str) -> None:
    with ToolSet.from_mcp(url=http_server, headers={"X-Test": "1"}) as ts, \
            Sandbox() as sb, ToolHost(ts).attach(sb):
        assert value(sb, "get_weather('Rome').city") == "'Rome'"
        assert value(sb, "import asyncio\nawait asyncio.gather(add(1, 2), add(3, 4))") == \
            "[3, 7]"


@settings(max_examples=examples(40), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.sampled_from(["city", "days", "other"]),
                       st.one_of(st.none(), st.booleans(), st.integers(-10, 10),
                                 st.floats(-1e6, 1e6, allow_nan=False),
                                 st.text(max_size=8), st.lists(st.integers(), max_size=2)),
                       max_size=3))
def test_arguments_are_checked_against_the_input_schema(mcp_tools: ToolSet,
                                                        args: dict[str, Any]) -> None:
    tool = mcp_tools["get-weather"]
    schema = tool.to_openai()["function"]["parameters"]
    valid = jsonschema.Draft202012Validator(schema).is_valid(args)
    try:
        checked = tool.checker.arguments(args)
    except Exception as exc:
        assert not valid, exc
        return
    assert valid
    result = tool.checker.returns(tool.handler(**checked))  # the server takes what we let by
    assert result.city == args["city"]


def test_an_agent_uses_mcp_tools_in_both_action_spaces(mcp_tools: ToolSet) -> None:
    from pydantic import BaseModel

    from memex.executor import MemexAgent, SandboxSpec
    from memex.executor.llm import LLMClient, ScriptedLLM, ScriptedReply, ScriptedToolCall

    class Answer(BaseModel):
        high: float

    def agent(srv: ScriptedLLM, space: str) -> MemexAgent:
        llm = LLMClient("scripted", base_url=srv.base_url, max_retries=0, timeout=30)
        return MemexAgent(model=llm, tools=mcp_tools, submit=Answer, action_space=space,  # type: ignore[arg-type]
                          sandbox=SandboxSpec(limits=Limits(timeout=20)))

    code = ["```python\nw = get_weather('Oslo', days=3)\nprint(w.high)\n```",
            "```python\nsubmit({'high': w.high})\n```"]
    with ScriptedLLM(code) as srv:
        r = agent(srv, "code").run("How warm will Oslo get?")
        prompt = srv.requests[0].messages[0]["content"]
    assert r.submitted and r.answer == Answer(high=23.0)
    assert "get_weather(city: str, days: int = 1) -> tools.Weather" in prompt
    assert "23.0" in r.trajectory.steps[0].observation

    calls = [ScriptedReply(tool_calls=(ScriptedToolCall(name="get-weather",
                                                        arguments={"city": "Oslo", "days": 3}),)),
             ScriptedReply(tool_calls=(ScriptedToolCall(name="submit",
                                                        arguments={"answer": {"high": 23}}),))]
    with ScriptedLLM(calls) as srv:
        r = agent(srv, "tools").run("How warm will Oslo get?")
        offered = {t["function"]["name"]: t["function"] for t in srv.requests[0].tools or []}
    assert r.submitted and r.answer == Answer(high=23.0)
    assert offered["get-weather"]["parameters"]["required"] == ["city"]
    assert '"high": 23.0' in r.trajectory.steps[0].observation
