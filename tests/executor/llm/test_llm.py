"""LLMClient through the real openai client against ScriptedLLM on 127.0.0.1 (no mocking)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memex.errors import (
    ConfigError,
    LLMConnectionError,
    LLMError,
    LLMResponseError,
    LLMTimeoutError,
    MemexError,
)
from memex.executor.internal import count_prompt_tokens
from memex.executor.llm import (
    DEFAULT_PRICES,
    Completion,
    LLMClient,
    Price,
    ScriptedError,
    ScriptedLLM,
    ScriptedReply,
    ScriptedToolCall,
    ToolCall,
    Usage,
)
from memex.runtime_wasm.internal import retry_after as _retry_after  # the clients' one parser

USER = [{"role": "user", "content": "What is 2 + 2?"}]
TOOLS = [{"type": "function", "function": {
    "name": "python", "description": "run code",
    "parameters": {"type": "object", "properties": {"code": {"type": "string"}},
                   "required": ["code"]}}}]


@pytest.fixture
def env_clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MEMEX_MODEL", "OPENAI_BASE_URL", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)


def client_for(llm: ScriptedLLM, **kw: Any) -> LLMClient:
    kw.setdefault("backoff", 0.0)
    kw.setdefault("timeout", 10.0)
    return LLMClient(model=kw.pop("model", "scripted"), base_url=llm.base_url, **kw)


def test_text_completion_usage_and_cost() -> None:
    with ScriptedLLM(["The answer is 4."]) as llm, \
            client_for(llm, prices={"scripted": (1.0, 2.0)}) as c:
        r = c.complete(USER)
        body = llm.requests[0].body
    assert isinstance(r, Completion)
    assert r.content == "The answer is 4."
    assert r.tool_calls == ()
    assert r.finish_reason == "stop"
    assert r.attempts == 1
    assert r.model == "scripted"
    assert r.latency > 0
    prompt = count_prompt_tokens(body)
    assert r.usage == Usage(prompt_tokens=prompt, completion_tokens=4, total_tokens=prompt + 4)
    assert r.cost == pytest.approx((prompt * 1.0 + 4 * 2.0) / 1e6)
    assert body["temperature"] == 0.0 and body["max_tokens"] == 1024
    assert body["messages"] == USER


def test_pinned_usage_price_prefix_and_unknown_price() -> None:
    reply = ScriptedReply(content="x", prompt_tokens=1000, completion_tokens=500)
    with ScriptedLLM([reply, reply]) as llm:
        with client_for(llm, model="gpt-4o-mini-2024-07-18") as c:
            r = c.complete(USER)
        assert r.usage == Usage(prompt_tokens=1000, completion_tokens=500, total_tokens=1500)
        p = DEFAULT_PRICES["gpt-4o-mini"]
        assert r.cost == pytest.approx((1000 * p.input + 500 * p.output) / 1e6)
        with client_for(llm, model="my-own-model") as c:
            assert c.complete(USER).cost is None
            assert c.price_of("gpt-4.1-mini-x") == DEFAULT_PRICES["gpt-4.1-mini"]
            assert c.price_of("gpt-4.1-x") == DEFAULT_PRICES["gpt-4.1"]


def test_usage_adds_up() -> None:
    a = Usage(prompt_tokens=1, completion_tokens=2, total_tokens=3)
    b = Usage(prompt_tokens=10, completion_tokens=20, total_tokens=30)
    assert a + b == Usage(prompt_tokens=11, completion_tokens=22, total_tokens=33)
    assert sum([a, b], Usage()) == a + b
    assert Price(input=1, output=2).cost(b) == pytest.approx(50 / 1e6)


def test_native_tool_call_and_round_trip() -> None:
    call = ScriptedToolCall(name="python", arguments={"code": "print(1)"}, id="call_1")
    with ScriptedLLM([ScriptedReply(tool_calls=(call,)), "done"]) as llm, client_for(llm) as c:
        r = c.complete(USER, tools=TOOLS, tool_choice="auto")
        assert r.tool_calls == (ToolCall(id="call_1", name="python",
                                         arguments='{"code": "print(1)"}'),)
        assert r.finish_reason == "tool_calls"
        assert r.content == ""
        history = [*USER, r.to_message(),
                   {"role": "tool", "tool_call_id": "call_1", "content": "1"}]
        assert c.complete(history).content == "done"
        first, second = llm.requests
    assert first.tools == TOOLS
    assert first.body["tool_choice"] == "auto"
    sent = second.messages[1]
    # content is always a string, never null (llama.cpp answers HTTP 500 to null)
    assert sent["content"] == ""
    assert sent["tool_calls"][0]["function"] == {"name": "python",
                                                 "arguments": '{"code": "print(1)"}'}
    assert second.messages[2]["role"] == "tool"


def test_null_content_is_sent_as_empty_string() -> None:
    with ScriptedLLM(["ok"]) as llm, client_for(llm) as c:
        c.complete([{"role": "assistant", "content": None}, {"role": "user", "content": "go"}])
        assert llm.requests[0].messages[0]["content"] == ""


def test_per_call_settings_are_sent() -> None:
    with ScriptedLLM(["ok"]) as llm, client_for(llm) as c:
        c.complete(USER, stop=["```\n"], temperature=0.7, max_reply_tokens=33, seed=5,
                   extra_body={"top_k": 1})
        body = llm.requests[0].body
    assert body["stop"] == ["```\n"]
    assert (body["temperature"], body["max_tokens"], body["seed"], body["top_k"]) == (
        0.7, 33, 5, 1)


def test_stream_text_then_completion() -> None:
    text = "Let me think.\n```python\nprint(2 + 2)\n```\n"
    with ScriptedLLM([text]) as llm, client_for(llm, prices={"scripted": (1.0, 1.0)}) as c:
        items = list(c.stream(USER))
        assert llm.requests[0].stream is True
    *deltas, final = items
    assert all(isinstance(d, str) for d in deltas) and len(deltas) > 1
    assert "".join(str(d) for d in deltas) == text
    assert isinstance(final, Completion)
    assert final.content == text
    assert final.finish_reason == "stop"
    assert final.usage.completion_tokens == (len(text) + 3) // 4
    assert final.usage.total_tokens == final.usage.prompt_tokens + final.usage.completion_tokens
    assert final.cost is not None and final.cost > 0


def test_stream_without_usage_is_estimated() -> None:
    with ScriptedLLM(["abcd" * 5], stream_usage=False) as llm, client_for(llm) as c:
        *_, final = list(c.stream(USER))
        body = llm.requests[0].body
    assert isinstance(final, Completion)
    assert final.usage_estimated is True
    assert final.usage.prompt_tokens == count_prompt_tokens(body) > 0
    assert final.usage.completion_tokens == 5


def test_reported_usage_is_not_estimated() -> None:
    with ScriptedLLM(["x", "y"]) as llm, client_for(llm) as c:
        assert c.complete(USER).usage_estimated is False
        *_, final = list(c.stream(USER))
    assert isinstance(final, Completion) and final.usage_estimated is False


def test_stream_tool_calls() -> None:
    calls = (ScriptedToolCall(name="sql", arguments={"query": "select 1"}, id="a"),
             ScriptedToolCall(name="python", arguments='{"code": "x = 1"}', id="b"))
    with ScriptedLLM([ScriptedReply(tool_calls=calls)]) as llm, client_for(llm) as c:
        *deltas, final = list(c.stream(USER, tools=TOOLS))
    assert deltas == []
    assert isinstance(final, Completion)
    assert final.tool_calls == (
        ToolCall(id="a", name="sql", arguments='{"query": "select 1"}'),
        ToolCall(id="b", name="python", arguments='{"code": "x = 1"}'))
    assert final.finish_reason == "tool_calls"


def test_stream_retries_opening() -> None:
    with ScriptedLLM([ScriptedError(status=503), "fine"]) as llm, client_for(llm) as c:
        *_, final = list(c.stream(USER))
    assert isinstance(final, Completion)
    assert (final.content, final.attempts) == ("fine", 2)


def test_retry_on_500_then_success() -> None:
    seen: list[tuple[int, float, LLMError]] = []
    script = [ScriptedError(status=500, message="boom"), ScriptedError(status=502), "ok"]
    with ScriptedLLM(script) as llm, \
            client_for(llm, on_retry=lambda *a: seen.append(a)) as c:
        r = c.complete(USER)
        assert len(llm.requests) == 3
    assert (r.content, r.attempts) == ("ok", 3)
    assert [a for a, _, _ in seen] == [1, 2]
    assert isinstance(seen[0][2], LLMResponseError) and seen[0][2].status == 500
    assert "boom" in str(seen[0][2])


def test_retry_on_429_waits_what_retry_after_asks() -> None:
    seen: list[float] = []
    script = [ScriptedError(status=429, message="slow down", retry_after=0.25), "ok"]
    # A huge backoff proves the pause came from Retry-After, not from the backoff formula.
    with ScriptedLLM(script) as llm, \
            client_for(llm, backoff=100.0, max_backoff=100.0,
                       on_retry=lambda _a, pause, _e: seen.append(pause)) as c:
        r = c.complete(USER)
    assert (r.content, r.attempts) == ("ok", 2)
    assert seen == [0.25]


def test_backoff_is_exponential_with_jitter_and_capped() -> None:
    seen: list[float] = []
    with ScriptedLLM([ScriptedError(status=500)] * 4 + ["ok"]) as llm, \
            client_for(llm, backoff=0.01, max_backoff=0.03, max_retries=4,
                       on_retry=lambda _a, pause, _e: seen.append(pause)) as c:
        assert c.complete(USER).attempts == 5
    for pause, cap in zip(seen, [0.01, 0.02, 0.03, 0.03], strict=True):
        assert cap * 0.5 <= pause <= cap


def test_retry_after_beyond_limit_fails_at_once() -> None:
    with ScriptedLLM([ScriptedError(status=429, retry_after=3600), "never"]) as llm, \
            client_for(llm) as c:
        with pytest.raises(LLMResponseError) as info:
            c.complete(USER)
        assert len(llm.requests) == 1
    assert info.value.status == 429 and info.value.attempts == 1
    assert "3600" in str(info.value)


def test_exhausted_retries_raise_with_attempt_count() -> None:
    with ScriptedLLM([ScriptedError(status=500, message="down")] * 3) as llm, \
            client_for(llm, max_retries=2) as c:
        with pytest.raises(LLMResponseError) as info:
            c.complete(USER)
        assert len(llm.requests) == 3
    err = info.value
    assert isinstance(err, LLMError) and isinstance(err, MemexError)
    assert (err.status, err.attempts) == (500, 3)
    assert "after 3 attempts" in str(err) and "down" in str(err)
    assert err.__cause__ is not None  # the openai exception is chained, not leaked


def test_client_errors_are_not_retried() -> None:
    with ScriptedLLM([ScriptedError(status=400, message="bad tool schema"), "x"]) as llm, \
            client_for(llm) as c:
        with pytest.raises(LLMResponseError, match="bad tool schema") as info:
            c.complete(USER)
        assert len(llm.requests) == 1
    assert (info.value.status, info.value.attempts) == (400, 1)


def test_script_exhaustion_surfaces_as_clear_error() -> None:
    with ScriptedLLM(["one"]) as llm, client_for(llm, max_retries=1) as c:
        c.complete(USER)
        with pytest.raises(LLMResponseError, match="script is exhausted") as info:
            c.complete(USER)
    assert info.value.attempts == 2


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_connection_refused() -> None:
    port = _closed_port()
    with LLMClient(model="m", base_url=f"http://127.0.0.1:{port}/v1", max_retries=2,
                   backoff=0.0) as c, pytest.raises(LLMConnectionError) as info:
        c.complete(USER)
    assert info.value.attempts == 3
    assert not isinstance(info.value, LLMTimeoutError)
    assert f"127.0.0.1:{port}" in str(info.value)


def test_timeout_then_success_and_timeout_exhausted() -> None:
    with ScriptedLLM([ScriptedReply(content="late", delay=30), "on time"]) as llm, \
            client_for(llm, timeout=0.3, max_retries=1) as c:
        r = c.complete(USER)
    assert (r.content, r.attempts) == ("on time", 2)
    with ScriptedLLM([ScriptedReply(content="late", delay=30)]) as llm, \
            client_for(llm, timeout=0.3, max_retries=0) as c, \
            pytest.raises(LLMTimeoutError) as info:
        c.complete(USER)
    assert isinstance(info.value, LLMConnectionError)
    assert info.value.attempts == 1
    assert "0.3s" in str(info.value)


def test_acomplete_with_retry_in_fresh_event_loops() -> None:
    script = [ScriptedError(status=500), "async one", "async two"]
    with ScriptedLLM(script) as llm, client_for(llm) as c:
        first = asyncio.run(c.acomplete(USER))
        second = asyncio.run(c.acomplete(USER, tools=TOOLS))
    assert (first.content, first.attempts) == ("async one", 2)
    assert second.content == "async two"


def test_acomplete_raises_llm_errors() -> None:
    port = _closed_port()
    c = LLMClient(model="m", base_url=f"http://127.0.0.1:{port}/v1", max_retries=0)
    with pytest.raises(LLMConnectionError):
        asyncio.run(c.acomplete(USER))


def test_environment_configuration(monkeypatch: pytest.MonkeyPatch, env_clean: None) -> None:
    with ScriptedLLM(["from env"]) as llm:
        monkeypatch.setenv("MEMEX_MODEL", "env-model")
        monkeypatch.setenv("OPENAI_BASE_URL", llm.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test-123")
        with LLMClient() as c:
            assert (c.model, c.base_url) == ("env-model", llm.base_url)
            assert c.complete(USER).content == "from env"
        req = llm.requests[0]
    assert req.body["model"] == "env-model"
    assert req.headers.get("authorization") == "Bearer sk-test-123"
    assert "sk-test-123" not in repr(c)


def test_arguments_override_environment(monkeypatch: pytest.MonkeyPatch,
                                        env_clean: None) -> None:
    monkeypatch.setenv("MEMEX_MODEL", "env-model")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    with ScriptedLLM(["x"]) as llm, LLMClient(model="arg-model", base_url=llm.base_url) as c:
        c.complete(USER)
        assert llm.requests[0].body["model"] == "arg-model"
        # no key anywhere: a local server gets a placeholder, never a missing-key error
        assert llm.requests[0].headers.get("authorization", "").startswith("Bearer ")


def test_missing_configuration_is_a_clear_error(monkeypatch: pytest.MonkeyPatch,
                                                env_clean: None) -> None:
    with pytest.raises(ConfigError, match="MEMEX_MODEL"):
        LLMClient()
    with pytest.raises(ConfigError, match="OPENAI_BASE_URL"):
        LLMClient(model="m")
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    assert LLMClient(model="m").base_url is None  # the OpenAI API itself
    for bad in ({"timeout": 0}, {"max_retries": -1}, {"backoff": -1.0}):
        with pytest.raises(ConfigError):
            LLMClient(model="m", base_url="http://127.0.0.1:9/v1", **bad)


def test_bad_messages_are_refused_before_sending() -> None:
    with ScriptedLLM(["x"]) as llm, client_for(llm) as c:
        with pytest.raises(ConfigError, match="message 1"):
            c.complete([*USER, {"content": "no role"}])
        assert llm.requests == []


def test_close_is_idempotent_and_final() -> None:
    with ScriptedLLM(["x"]) as llm:
        c = client_for(llm)
        c.complete(USER)
        c.close()
        c.close()
        with pytest.raises(ConfigError, match="closed"):
            c.complete(USER)
        with pytest.raises(ConfigError, match="closed"):
            asyncio.run(c.acomplete(USER))


class _Garbage(BaseHTTPRequestHandler):
    """Answers 200 with bodies that are not chat completions."""

    bodies: ClassVar[list[bytes]] = []

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        data = self.bodies.pop(0)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def garbage_server() -> Iterator[tuple[str, list[bytes]]]:
    bodies: ClassVar[list[bytes]] = []
    handler = type("H", (_Garbage,), {"bodies": bodies})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.01},
                     daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/v1", bodies
    finally:
        srv.shutdown()
        srv.server_close()


def test_malformed_responses_become_llm_response_errors(
        garbage_server: tuple[str, list[bytes]]) -> None:
    url, bodies = garbage_server
    bodies += [json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                           "choices": []}).encode(),
               b"this is not json"]
    with LLMClient(model="m", base_url=url, max_retries=0) as c:
        with pytest.raises(LLMResponseError, match="no choices"):
            c.complete(USER)
        with pytest.raises(LLMError) as info:
            c.complete(USER)
    assert info.value.__cause__ is not None


@given(st.floats(min_value=0, max_value=1e6, allow_nan=False))
def test_retry_after_parses_seconds(seconds: float) -> None:
    assert _retry_after({"retry-after": repr(seconds)}) == pytest.approx(seconds)
    assert _retry_after({"retry-after-ms": repr(seconds * 1000)}) == pytest.approx(seconds)


@given(st.text(max_size=40))
def test_retry_after_never_raises(value: str) -> None:
    got = _retry_after({"retry-after": value})
    assert got is None or got >= 0


def test_retry_after_http_date_and_absent() -> None:
    assert _retry_after(None) is None
    assert _retry_after({}) is None
    assert _retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0
    assert _retry_after({"retry-after-ms": "soon", "retry-after": "2"}) == 2.0
