"""ScriptedLLM as a wire-level chat-completions server: raw HTTP and the real openai client."""

from __future__ import annotations

import json
import socket
import threading
import urllib.error
import urllib.request
from typing import Any

import openai
import pytest

from memex.errors import ConfigError
from memex.executor.internal import count_prompt_tokens
from memex.executor.llm import ScriptedError, ScriptedLLM, ScriptedReply, ScriptedToolCall

USER = [{"role": "user", "content": "hi"}]


def post(url: str, body: Any, path: str = "/chat/completions") -> tuple[int, dict[str, str], bytes]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def sse_events(raw: bytes) -> list[Any]:
    text = raw.decode()
    assert text.endswith("data: [DONE]\n\n")
    events = [e for e in text.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    return [json.loads(e[6:]) for e in events[:-1]]


def test_plain_completion_wire_format() -> None:
    with ScriptedLLM(["hello there"], model="m1") as llm:
        status, headers, raw = post(llm.base_url, {"model": "asked", "messages": USER})
    assert status == 200 and headers["Content-Type"] == "application/json"
    body = json.loads(raw)
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["model"] == "asked"
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "hello there", "refusal": None}
    assert choice["finish_reason"] == "stop"
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}


def test_stream_wire_format_with_and_without_usage() -> None:
    with ScriptedLLM(["one two three", "four"]) as llm:
        _, headers, raw = post(llm.base_url, {"messages": USER, "stream": True,
                                              "stream_options": {"include_usage": True}})
        _, _, raw2 = post(llm.base_url, {"messages": USER, "stream": True})
    assert headers["Content-Type"] == "text/event-stream"
    events = sse_events(raw)
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    assert len({e["id"] for e in events}) == 1
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
    assert text == "one two three"
    assert events[-2]["choices"][0]["finish_reason"] == "stop"
    assert events[-1]["choices"] == []
    assert events[-1]["usage"]["completion_tokens"] == 4
    assert all(e["usage"] is None for e in events[:-1])
    plain = sse_events(raw2)
    assert all("usage" not in e for e in plain) and plain[-1]["choices"]


def test_models_endpoint_through_openai() -> None:
    with ScriptedLLM([], model="tiny") as llm:
        client = openai.OpenAI(base_url=llm.base_url, api_key="x", max_retries=0)
        assert [m.id for m in client.models.list()] == ["tiny"]
        client.close()


def test_tool_call_reply_and_recorded_request() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    reply = ScriptedReply(content="calling", tool_calls=(
        ScriptedToolCall(name="f", arguments={"a": 1}),))
    with ScriptedLLM([reply]) as llm:
        client = openai.OpenAI(base_url=llm.base_url, api_key="x", max_retries=0)
        r = client.chat.completions.create(model="m", messages=USER,  # type: ignore[arg-type]
                                           tools=tools)  # type: ignore[arg-type]
        client.close()
        rec = llm.requests[0]
    msg = r.choices[0].message
    assert msg.content == "calling"
    assert msg.tool_calls is not None and msg.tool_calls[0].function.name == "f"
    assert json.loads(msg.tool_calls[0].function.arguments) == {"a": 1}
    assert msg.tool_calls[0].id.startswith("call_")
    assert r.choices[0].finish_reason == "tool_calls"
    assert rec.path == "/v1/chat/completions"
    assert rec.messages == USER and rec.tools == tools and rec.stream is False
    assert rec.reply == reply


def test_callable_script_sees_each_request() -> None:
    def echo(req: dict[str, Any]) -> str:
        return f"you said {req['messages'][-1]['content']}"

    with ScriptedLLM(echo) as llm:
        for word in ("a", "b", "c"):
            _, _, raw = post(llm.base_url, {"messages": [{"role": "user", "content": word}]})
            assert json.loads(raw)["choices"][0]["message"]["content"] == f"you said {word}"
        assert llm.remaining is None
        assert len(llm.requests) == 3


def test_callable_items_and_failures_are_500_with_reason() -> None:
    def broken(req: dict[str, Any]) -> str:
        raise RuntimeError("script bug")

    def wrong(req: dict[str, Any]) -> Any:
        return 42

    with ScriptedLLM([broken, wrong, lambda req: "fine"]) as llm:
        s1, _, raw1 = post(llm.base_url, {"messages": USER})
        s2, _, raw2 = post(llm.base_url, {"messages": USER})
        s3, _, raw3 = post(llm.base_url, {"messages": USER})
        recs = llm.requests
    assert (s1, s2, s3) == (500, 500, 200)
    assert "RuntimeError: script bug" in json.loads(raw1)["error"]["message"]
    assert "returned 42" in json.loads(raw2)["error"]["message"]
    assert json.loads(raw3)["choices"][0]["message"]["content"] == "fine"
    assert isinstance(recs[0].reply, ScriptedError) and recs[0].reply.status == 500


def test_injected_errors_and_retry_after_header() -> None:
    script = [ScriptedError(status=429, message="slow", retry_after=1.5),
              ScriptedError(status=503, message="busy")]
    with ScriptedLLM(script) as llm:
        s1, h1, raw1 = post(llm.base_url, {"messages": USER})
        s2, h2, raw2 = post(llm.base_url, {"messages": USER})
    assert (s1, h1["Retry-After"]) == (429, "1.5")
    assert json.loads(raw1)["error"] == {"message": "slow", "type": "rate_limit_error",
                                         "param": None, "code": None}
    assert s2 == 503 and "Retry-After" not in h2
    assert json.loads(raw2)["error"]["type"] == "server_error"


def test_exhausted_script_answers_500_and_records_it() -> None:
    with ScriptedLLM(["only"]) as llm:
        post(llm.base_url, {"messages": USER})
        assert llm.remaining == 0
        status, _, raw = post(llm.base_url, {"messages": USER})
        recs = llm.requests
    assert status == 500
    assert "script is exhausted: request #2" in json.loads(raw)["error"]["message"]
    assert len(recs) == 2 and isinstance(recs[1].reply, ScriptedError)


def test_bad_bodies_and_paths_are_refused_without_using_the_script() -> None:
    with ScriptedLLM(["kept"]) as llm:
        s1, _, raw1 = post(llm.base_url, b"{not json")
        s2, _, raw2 = post(llm.base_url, {"messages": "not a list"})
        s3, _, _ = post(llm.base_url, {"messages": USER}, path="/completions")
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(llm.base_url + "/nothing", timeout=10)
        assert (s1, s2, s3, info.value.code) == (400, 400, 404, 404)
        assert "bad request body" in json.loads(raw1)["error"]["message"]
        assert "'messages' list" in json.loads(raw2)["error"]["message"]
        assert len(llm.bad_requests) == 2
        assert llm.requests == [] and llm.remaining == 1
        _, _, raw = post(llm.base_url, {"messages": USER})
        assert json.loads(raw)["choices"][0]["message"]["content"] == "kept"


def test_bad_scripts_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="sequence of replies"):
        ScriptedLLM("just a string")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="item 1"):
        ScriptedLLM(["ok", 3])  # type: ignore[list-item]


def test_token_estimate_rule() -> None:
    body = {"messages": [{"role": "user", "content": "abcd" * 3},
                         {"role": "assistant", "content": "",
                          "tool_calls": [{"function": {"name": "ab", "arguments": "cdefg"}}]}],
            "tools": [{"x": 1}]}
    # 4 + ceil(12/4) ; 4 + ceil(7/4) ; ceil(len('[{"x": 1}]')/4)
    assert count_prompt_tokens(body) == (4 + 3) + (4 + 2) + 3


def test_pinned_usage() -> None:
    with ScriptedLLM([ScriptedReply(content="x", prompt_tokens=7, completion_tokens=9)]) as llm:
        _, _, raw = post(llm.base_url, {"messages": USER})
    assert json.loads(raw)["usage"] == {"prompt_tokens": 7, "completion_tokens": 9,
                                        "total_tokens": 16}


def test_close_is_idempotent_frees_the_port_and_interrupts_delays() -> None:
    llm = ScriptedLLM([ScriptedReply(content="slow", delay=60)])
    port = llm.port
    done = threading.Event()

    def waiter() -> None:
        try:
            post(llm.base_url, {"messages": USER})
        except OSError:
            pass
        finally:
            done.set()

    t = threading.Thread(target=waiter, daemon=True)
    t.start()
    while not llm.requests:
        threading.Event().wait(0.01)
    llm.close()
    llm.close()
    assert done.wait(30), "close() left a delayed request hanging"
    with socket.socket() as s, pytest.raises(ConnectionRefusedError):
        s.connect(("127.0.0.1", port))
    assert "closed" in repr(llm)
    with ScriptedLLM([]) as other:
        pass
    other.close()
