"""A scripted chat-completions server on 127.0.0.1, for testing agents without a model.

:class:`ScriptedLLM` is a real HTTP server speaking the OpenAI chat-completions wire format
(``POST /v1/chat/completions``, plain JSON or SSE streaming, and ``GET /v1/models``), so the
real ``openai`` client, retries and timeouts included, is exercised end to end. Each request
takes the next item of the script: a text reply, a native tool-call reply, an injected HTTP error
(e.g. 500, or 429 with ``Retry-After``), optionally after a delay; or a callable that sees the
request and returns one of those. Every request is recorded for assertions.

Token usage is estimated, not tokenized: a message costs 4 tokens plus ceil(len(text) / 4) for
its text (content, tool-call names and arguments), the tool definitions cost ceil(len(JSON) / 4),
and a reply costs ceil(len(text) / 4) for its content and tool calls. A reply can pin its own
counts (``prompt_tokens`` / ``completion_tokens``) for budget tests.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeAlias

from ...errors import ConfigError
from ._client import estimate_prompt_tokens, estimate_tokens

__all__ = [
    "RecordedRequest",
    "ScriptedError",
    "ScriptedLLM",
    "ScriptedReply",
    "ScriptedToolCall",
]


@dataclass(frozen=True, kw_only=True)
class ScriptedToolCall:
    """A native tool call in a scripted reply; a mapping ``arguments`` is sent as JSON."""

    name: str
    arguments: str | Mapping[str, Any] = "{}"
    id: str | None = None

    def arguments_json(self) -> str:
        a = self.arguments
        return a if isinstance(a, str) else json.dumps(a)


@dataclass(frozen=True, kw_only=True)
class ScriptedReply:
    """An assistant reply. ``finish_reason`` defaults to "tool_calls" when there are tool calls,
    else "stop"; ``delay`` seconds pass before the answer (for timeout tests)."""

    content: str = ""
    tool_calls: tuple[ScriptedToolCall, ...] = ()
    finish_reason: str | None = None
    delay: float = 0.0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


@dataclass(frozen=True, kw_only=True)
class ScriptedError:
    """An HTTP error answer in the OpenAI error shape, with an optional ``Retry-After``."""

    status: int
    message: str = "scripted error"
    retry_after: float | None = None
    delay: float = 0.0


Reply: TypeAlias = str | ScriptedReply | ScriptedError
Script: TypeAlias = Sequence[Reply | Callable[[dict[str, Any]], Reply]] | Callable[
    [dict[str, Any]], Reply]


@dataclass(frozen=True, kw_only=True)
class RecordedRequest:
    """One request the server received and what it answered."""

    path: str
    body: dict[str, Any]
    reply: ScriptedReply | ScriptedError
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    stream: bool = False
    headers: dict[str, str] = field(default_factory=dict)


def count_prompt_tokens(body: Mapping[str, Any]) -> int:
    """The rough prompt size documented in the module docstring."""
    messages = body.get("messages")
    tools = body.get("tools")
    return estimate_prompt_tokens(messages if isinstance(messages, list) else [],
                                  tools if isinstance(tools, list) else None)


def _reply_tokens(r: ScriptedReply) -> int:
    return estimate_tokens(r.content + "".join(c.name + c.arguments_json()
                                               for c in r.tool_calls))


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: ScriptedLLM


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.0"

    def log_message(self, format: str, *args: Any) -> None:  # quiet: tests read records
        pass

    def _json(self, status: int, payload: object, headers: Mapping[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str, kind: str = "invalid_request_error",
               headers: Mapping[str, str] | None = None) -> None:
        self._json(status, {"error": {"message": message, "type": kind, "param": None,
                                      "code": None}}, headers)

    def do_GET(self) -> None:
        owner = self.server.owner
        if self.path.rstrip("/") in ("/v1/models", "/models"):
            self._json(200, {"object": "list", "data": [
                {"id": owner.model, "object": "model", "created": 0, "owned_by": "memex"}]})
        else:
            self._error(404, f"no such endpoint: GET {self.path}")

    def do_POST(self) -> None:
        # A client that gave up (a timeout test) has nobody left to answer.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self._post()

    def _post(self) -> None:
        owner = self.server.owner
        if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
            self._error(404, f"no such endpoint: POST {self.path}")
            return
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw)
            if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
                raise ValueError("the body must be a JSON object with a 'messages' list")
        except ValueError as exc:
            owner._note_bad_request(f"{exc}")
            self._error(400, f"ScriptedLLM: bad request body: {exc}")
            return
        headers = {k.lower(): v for k, v in self.headers.items()}
        reply = owner._next_reply(self.path, body, headers)
        if reply.delay > 0 and owner._closing.wait(reply.delay):
            return
        if isinstance(reply, ScriptedError):
            headers = {}
            if reply.retry_after is not None:
                headers["Retry-After"] = f"{reply.retry_after:g}"
            kind = "rate_limit_error" if reply.status == 429 else (
                "server_error" if reply.status >= 500 else "invalid_request_error")
            self._error(reply.status, reply.message, kind, headers)
            return
        model = str(body.get("model") or owner.model)
        prompt = (reply.prompt_tokens if reply.prompt_tokens is not None
                  else count_prompt_tokens(body))
        completion = (reply.completion_tokens if reply.completion_tokens is not None
                      else _reply_tokens(reply))
        usage = {"prompt_tokens": prompt, "completion_tokens": completion,
                 "total_tokens": prompt + completion}
        finish = reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")
        calls = [{"id": c.id or f"call_{uuid.uuid4().hex[:12]}", "type": "function",
                  "function": {"name": c.name, "arguments": c.arguments_json()}}
                 for c in reply.tool_calls]
        ident = f"chatcmpl-{uuid.uuid4().hex[:16]}"
        if body.get("stream"):
            opts = body.get("stream_options") or {}
            wanted = opts.get("include_usage") and owner.stream_usage
            self._stream(ident, model, reply.content, calls, finish, usage if wanted else None)
            return
        message: dict[str, Any] = {"role": "assistant", "content": reply.content,
                                   "refusal": None}
        if calls:
            message["tool_calls"] = calls
        self._json(200, {"id": ident, "object": "chat.completion", "created": int(time.time()),
                         "model": model, "system_fingerprint": None,
                         "choices": [{"index": 0, "message": message, "logprobs": None,
                                      "finish_reason": finish}],
                         "usage": usage})

    def _stream(self, ident: str, model: str, content: str, calls: list[dict[str, Any]],
                finish: str, usage: dict[str, int] | None) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        created = int(time.time())

        def chunk(delta: dict[str, Any], finish_reason: str | None = None,
                  choices: bool = True, chunk_usage: object = None) -> None:
            payload: dict[str, Any] = {
                "id": ident, "object": "chat.completion.chunk", "created": created,
                "model": model, "system_fingerprint": None,
                "choices": [{"index": 0, "delta": delta, "logprobs": None,
                             "finish_reason": finish_reason}] if choices else []}
            if usage is not None:  # with include_usage, every chunk carries the key
                payload["usage"] = chunk_usage
            self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
            self.wfile.flush()

        chunk({"role": "assistant", "content": ""})
        for piece in _pieces(content):
            chunk({"content": piece})
        for i, call in enumerate(calls):
            fn = call["function"]
            chunk({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                   "function": {"name": fn["name"], "arguments": ""}}]})
            for piece in _pieces(fn["arguments"]):
                chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
        chunk({}, finish)
        if usage is not None:
            chunk({}, choices=False, chunk_usage=usage)
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


def _pieces(text: str) -> Iterator[str]:
    """Word-sized pieces (with their trailing whitespace), like a model's token stream."""
    yield from re.findall(r"\S+\s*|\s+", text)


class ScriptedLLM:
    """A chat-completions server on 127.0.0.1 answering from a script.

    ``script`` is a sequence whose items are used in order, one per chat request (a ``str`` is
    a text reply; an item may also be a callable ``(request_json) -> reply``), or a single
    callable used for every request. When a sequence runs out, the request gets HTTP 500 with
    an explanatory message (recorded like any answer). ``base_url`` is what the ``openai``
    client wants; ``requests`` lists what was received. ``stream_usage=False`` leaves the
    usage chunk out of streams even when asked, as llama.cpp's server does. Starts on
    construction; ``close()`` is idempotent, and so is leaving the ``with`` block.
    """

    def __init__(self, script: Script, *, model: str = "scripted",
                 stream_usage: bool = True) -> None:
        if callable(script):
            self._items: list[Reply | Callable[[dict[str, Any]], Reply]] | None = None
            self._fn: Callable[[dict[str, Any]], Reply] | None = script
        elif isinstance(script, str | bytes) or not isinstance(script, Sequence):
            raise ConfigError("a script is a sequence of replies or a callable, "
                              f"got {type(script).__name__}")
        else:
            for i, item in enumerate(script):
                if not (callable(item) or isinstance(item, str | ScriptedReply | ScriptedError)):
                    raise ConfigError(f"script item {i} is not a reply: {item!r:.200}")
            self._items, self._fn = list(script), None
        self.model = model
        self.stream_usage = stream_usage
        self._lock = threading.Lock()
        self._requests: list[RecordedRequest] = []
        self._bad: list[str] = []
        self._used = 0
        self._closing = threading.Event()
        self._closed = False
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.owner = self
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05},
                                        name="memex-scripted-llm", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every chat request received so far, in order (a copy)."""
        with self._lock:
            return list(self._requests)

    @property
    def bad_requests(self) -> list[str]:
        """Why each unreadable request body (answered 400) was refused."""
        with self._lock:
            return list(self._bad)

    @property
    def remaining(self) -> int | None:
        """Script items not used yet (None for a callable script)."""
        with self._lock:
            return None if self._items is None else len(self._items) - self._used

    def _note_bad_request(self, why: str) -> None:
        with self._lock:
            self._bad.append(why)

    def _next_reply(self, path: str, body: dict[str, Any],
                    headers: dict[str, str]) -> ScriptedReply | ScriptedError:
        with self._lock:
            n = len(self._requests) + 1
            item: Reply | Callable[[dict[str, Any]], Reply] | None
            if self._items is None:
                item = self._fn
            elif self._used < len(self._items):
                item = self._items[self._used]
                self._used += 1
            else:
                item = None
        if item is None:
            reply: ScriptedReply | ScriptedError = ScriptedError(
                status=500, message=f"ScriptedLLM: the script is exhausted: request #{n} "
                f"came after all {self._used} scripted replies were used")
        else:
            reply = _resolve(item, body)
        tools = body.get("tools")
        rec = RecordedRequest(path=path, body=body, reply=reply,
                              messages=list(body.get("messages") or []),
                              tools=list(tools) if isinstance(tools, list) else None,
                              stream=bool(body.get("stream")), headers=headers)
        with self._lock:
            self._requests.append(rec)
        return reply

    def close(self) -> None:
        """Stop serving and free the port; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._closing.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> ScriptedLLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else self.base_url
        return f"ScriptedLLM({state}, {len(self._requests)} requests)"


def _resolve(item: Reply | Callable[[dict[str, Any]], Reply],
             body: dict[str, Any]) -> ScriptedReply | ScriptedError:
    if callable(item):
        try:
            item = item(body)
        except Exception as exc:
            tb = "".join(traceback.format_exception_only(exc)).strip()
            return ScriptedError(status=500, message=f"ScriptedLLM: the script raised: {tb}")
    if isinstance(item, str):
        return ScriptedReply(content=item)
    if isinstance(item, ScriptedReply | ScriptedError):
        return item
    return ScriptedError(status=500, message=f"ScriptedLLM: the script returned {item!r:.200}, "
                         "not a str, ScriptedReply or ScriptedError")
