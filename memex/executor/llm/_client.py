"""A chat-completions client for any OpenAI-compatible endpoint, with our own retries.

The ``openai`` package does the HTTP; this module owns everything an agent loop needs around it:
configuration from arguments or the environment, retries with exponential backoff and jitter on
429 (honouring ``Retry-After``), 5xx and connection errors (the SDK's own retries are off so that
the attempt count is ours and recorded), token usage, cost from a per-model price table, and
streaming for the CLI. Every failure leaves as an :class:`~memex.errors.LLMError`; no ``openai``
or ``httpx`` exception escapes.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx2
import openai

from ...errors import ConfigError, LLMConnectionError, LLMError, LLMResponseError, LLMTimeoutError
from ...runtime_wasm.internal import http_tls, retry_after

__all__ = [
    "DEFAULT_PRICES",
    "Completion",
    "LLMClient",
    "Price",
    "ToolCall",
    "Usage",
    "estimate_prompt_tokens",
    "estimate_tokens",
]

_T = TypeVar("_T")

# HTTP statuses worth another try: request timeout, conflict, rate limit, server errors.
_RETRY_STATUSES = frozenset({408, 409, 429})
# A server asking for a longer pause than this is refused rather than waited for.
MAX_RETRY_AFTER = 60.0


@dataclass(frozen=True, kw_only=True)
class Usage:
    """Token counts as the endpoint reported them (zeros when it reported none)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        if not isinstance(other, Usage):
            return NotImplemented
        return Usage(prompt_tokens=self.prompt_tokens + other.prompt_tokens,
                     completion_tokens=self.completion_tokens + other.completion_tokens,
                     total_tokens=self.total_tokens + other.total_tokens)


@dataclass(frozen=True, kw_only=True)
class Price:
    """USD per one million tokens, prompt (input) and completion (output)."""

    input: float
    output: float

    def cost(self, usage: Usage) -> float:
        return (usage.prompt_tokens * self.input + usage.completion_tokens * self.output) / 1e6


# List prices (USD per 1M tokens) when this table was written; pass ``prices=`` to override or
# extend. Local models served on 127.0.0.1 cost nothing. A model matches its exact name or the
# longest entry its name starts with ("gpt-4o-mini-2024-07-18" -> "gpt-4o-mini").
DEFAULT_PRICES: Mapping[str, Price] = {
    "gpt-4o": Price(input=2.50, output=10.00),
    "gpt-4o-mini": Price(input=0.15, output=0.60),
    "gpt-4.1": Price(input=2.00, output=8.00),
    "gpt-4.1-mini": Price(input=0.40, output=1.60),
    "gpt-4.1-nano": Price(input=0.10, output=0.40),
    "qwen2.5-coder-1.5b-instruct": Price(input=0.0, output=0.0),
    "qwen2.5-coder-0.5b-instruct": Price(input=0.0, output=0.0),
}


@dataclass(frozen=True, kw_only=True)
class ToolCall:
    """One native (API-level) tool call of an assistant reply; ``arguments`` is the raw JSON
    text the model wrote, unparsed (it may be invalid)."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, kw_only=True)
class Completion:
    """One assistant reply. ``latency`` is the wall seconds of the attempt that succeeded
    (for a stream: from the request to the last chunk); ``attempts`` counts every try;
    ``cost`` is USD from the price table, None when the model has no price;
    ``usage_estimated`` says the endpoint reported no usage (llama.cpp's server sends none when
    streaming) and ``usage`` is the rough :func:`estimate_prompt_tokens` count instead."""

    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str | None = None
    usage: Usage = Usage()
    cost: float | None = None
    latency: float = 0.0
    attempts: int = 1
    model: str = ""
    usage_estimated: bool = False

    def to_message(self) -> dict[str, Any]:
        """The reply as an assistant message for the next request. ``content`` is always a
        string: llama.cpp's server answers HTTP 500 to an assistant message with null content."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.tool_calls]
        return msg


def estimate_tokens(text: str) -> int:
    """A rough token count without a tokenizer: ceil(len(text) / 4)."""
    return math.ceil(len(text) / 4)


def estimate_prompt_tokens(messages: Sequence[Any],
                           tools: Sequence[Any] | None = None) -> int:
    """A rough prompt size: per message 4 tokens plus :func:`estimate_tokens` of its text
    (content, tool-call names and arguments), plus the tool definitions' JSON."""
    total = 0
    for m in messages:
        if not isinstance(m, Mapping):
            continue
        content = m.get("content")
        text = content if isinstance(content, str) else json.dumps(content or "")
        for c in m.get("tool_calls") or ():
            fn = c.get("function", {}) if isinstance(c, Mapping) else {}
            text += str(fn.get("name", "")) + str(fn.get("arguments", ""))
        total += 4 + estimate_tokens(text)
    if tools:
        total += estimate_tokens(json.dumps(list(tools)))
    return total


def _env(name: str) -> str | None:
    value = os.environ.get(name, "").strip()
    return value or None


def _clean_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or "role" not in m:
            raise ConfigError(f"message {i} is not a chat message with a 'role': {m!r:.200}")
        msg = dict(m)
        if msg.get("content") is None:
            msg["content"] = ""  # never null: llama.cpp's server fails on it (HTTP 500)
        out.append(msg)
    return out


class LLMClient:
    """A chat-completions client with retries, usage and cost.

    ``model``, ``base_url`` and ``api_key`` come from the arguments, else from ``MEMEX_MODEL``,
    ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY``. A ``base_url`` without a key (a local server)
    sends a placeholder key. ``max_retries`` counts retries after the first attempt; the pause
    before retry n is ``min(max_backoff, backoff * 2**(n-1))`` scaled by a random factor in
    [0.5, 1], or what the server's ``Retry-After`` asks (up to 60 s; a longer ask fails now).
    ``prices`` (model name -> :class:`Price` or ``(input, output)`` USD per 1M tokens) is merged
    over :data:`DEFAULT_PRICES`. ``on_retry(attempt, pause, error)`` is called before each pause
    with the failed attempt's number and error (e.g. for the CLI to say "retrying in 2s").
    """

    def __init__(self, model: str | None = None, base_url: str | None = None,
                 api_key: str | None = None, *, timeout: float = 300.0, max_retries: int = 3,
                 backoff: float = 0.5, max_backoff: float = 20.0,
                 prices: Mapping[str, Price | tuple[float, float]] | None = None,
                 temperature: float | None = 0.0, max_reply_tokens: int | None = 1024,
                 on_retry: Callable[[int, float, LLMError], None] | None = None) -> None:
        self.model = model or _env("MEMEX_MODEL") or ""
        self.base_url = base_url or _env("OPENAI_BASE_URL")
        key = api_key or _env("OPENAI_API_KEY")
        if not self.model:
            raise ConfigError("no model configured: pass model=... or set MEMEX_MODEL")
        if self.base_url is None and key is None:
            raise ConfigError(
                "no LLM endpoint configured: pass base_url=... (any OpenAI-compatible server, "
                "e.g. `memex model serve`) or set OPENAI_BASE_URL and/or OPENAI_API_KEY")
        if not (timeout > 0):
            raise ConfigError(f"timeout must be positive, got {timeout!r}")
        if max_retries < 0:
            raise ConfigError(f"max_retries must be >= 0, got {max_retries!r}")
        if backoff < 0 or max_backoff < 0:
            raise ConfigError("backoff and max_backoff must be >= 0")
        self._api_key = key or "memex-local"
        self.timeout = float(timeout)
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.temperature = temperature
        self.max_reply_tokens = max_reply_tokens
        self.on_retry = on_retry
        table: dict[str, Price] = dict(DEFAULT_PRICES)
        for name, p in (prices or {}).items():
            table[name] = p if isinstance(p, Price) else Price(input=p[0], output=p[1])
        self.prices: Mapping[str, Price] = table
        self._client: openai.OpenAI | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"LLMClient(model={self.model!r}, base_url={self.base_url!r})"

    def with_model(self, model: str) -> LLMClient:
        """A new client for ``model`` at the same endpoint, with the same settings."""
        return LLMClient(model=model, base_url=self.base_url, api_key=self._api_key,
                         timeout=self.timeout, max_retries=self.max_retries,
                         backoff=self.backoff, max_backoff=self.max_backoff,
                         prices=dict(self.prices), temperature=self.temperature,
                         max_reply_tokens=self.max_reply_tokens, on_retry=self.on_retry)

    # -- resources -------------------------------------------------------------------------------

    def _sync(self) -> openai.OpenAI:
        if self._closed:
            raise ConfigError("this LLMClient is closed")
        if self._client is None:
            self._client = openai.OpenAI(
                api_key=self._api_key, base_url=self.base_url, timeout=self.timeout,
                max_retries=0, http_client=openai.DefaultHttpxClient(verify=http_tls()))
        return self._client

    def close(self) -> None:
        """Release the HTTP connection pool; idempotent."""
        self._closed = True
        client, self._client = self._client, None
        if client is not None:
            client.close()

    def __enter__(self) -> LLMClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- pricing ---------------------------------------------------------------------------------

    def price_of(self, model: str) -> Price | None:
        """The price entry for ``model``: exact name, else the longest prefix in the table."""
        if model in self.prices:
            return self.prices[model]
        best = max((n for n in self.prices if model.startswith(n)), key=len, default=None)
        return self.prices[best] if best is not None else None

    def _cost(self, usage: Usage, *models: str) -> float | None:
        for m in models:
            price = self.price_of(m) if m else None
            if price is not None:
                return price.cost(usage)
        return None

    # -- requests --------------------------------------------------------------------------------

    def _kwargs(self, messages: Sequence[Mapping[str, Any]], *,
                tools: Sequence[Mapping[str, Any]] | None, tool_choice: object, stop: object,
                temperature: float | None, max_reply_tokens: int | None, seed: int | None,
                extra_body: Mapping[str, Any] | None) -> dict[str, Any]:
        kw: dict[str, Any] = {"model": self.model, "messages": _clean_messages(messages)}
        temp = self.temperature if temperature is None else temperature
        limit = self.max_reply_tokens if max_reply_tokens is None else max_reply_tokens
        for key, value in (("tools", list(tools) if tools else None),
                           ("tool_choice", tool_choice), ("stop", stop), ("temperature", temp),
                           ("max_tokens", limit), ("seed", seed),
                           ("extra_body", dict(extra_body) if extra_body else None)):
            if value is not None:
                kw[key] = value
        return kw

    def _delay(self, exc: Exception, attempt: int) -> float | None:
        """Seconds to wait before another try after ``exc`` on try ``attempt``, or None when
        ``exc`` is final (not retryable, or no retries left)."""
        if attempt > self.max_retries:
            return None
        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            if status not in _RETRY_STATUSES and status < 500:
                return None
            asked = retry_after(exc.response.headers)
            if asked is not None:
                return asked if asked <= MAX_RETRY_AFTER else None
        elif not isinstance(exc, openai.APIConnectionError | httpx2.TransportError):
            return None
        pause: float = min(self.max_backoff, self.backoff * 2.0 ** (attempt - 1))
        return pause * random.uniform(0.5, 1.0)

    def _error(self, exc: Exception, attempts: int) -> LLMError:
        where = self.base_url or "the OpenAI API"
        tries = f"after {attempts} attempt{'s' if attempts != 1 else ''}"
        if isinstance(exc, openai.APITimeoutError):
            return LLMTimeoutError(
                f"{where} did not answer within {self.timeout:g}s ({tries})", attempts=attempts)
        if isinstance(exc, openai.APIConnectionError | httpx2.TransportError):
            cause = exc.__cause__ or exc
            return LLMConnectionError(f"cannot reach {where}: {cause} ({tries})",
                                      attempts=attempts)
        if isinstance(exc, openai.APIStatusError):
            body = exc.body
            detail = str(body.get("message") or exc.message) if isinstance(body, dict) else (
                exc.message)
            asked = retry_after(exc.response.headers)
            if asked is not None and asked > MAX_RETRY_AFTER:
                detail += f" (asked to retry after {asked:.0f}s, more than {MAX_RETRY_AFTER:.0f}s)"
            return LLMResponseError(f"{where} answered HTTP {exc.status_code}: {detail} ({tries})",
                                    status=exc.status_code, attempts=attempts)
        return LLMResponseError(f"unreadable answer from {where}: {exc} ({tries})",
                                attempts=attempts)

    def _completion(self, resp: Any, attempts: int, latency: float) -> Completion:
        try:
            if not resp.choices:
                raise ValueError("the response has no choices")
            choice = resp.choices[0]
            msg = choice.message
            calls = tuple(
                ToolCall(id=c.id or f"call_{i}", name=c.function.name,
                         arguments=c.function.arguments or "")
                for i, c in enumerate(msg.tool_calls or ()) if c.type == "function")
            usage = _usage(resp.usage)
            model = resp.model or self.model
            return Completion(content=msg.content or "", tool_calls=calls,
                              finish_reason=choice.finish_reason, usage=usage,
                              cost=self._cost(usage, self.model, model), latency=latency,
                              attempts=attempts, model=model)
        except (AttributeError, TypeError, ValueError) as exc:
            raise LLMResponseError(
                f"unreadable chat completion from {self.base_url or 'the OpenAI API'}: {exc}",
                attempts=attempts) from exc

    def _retrying(self, call: Callable[[], _T]) -> tuple[_T, int, float]:
        attempt = 0
        while True:
            attempt += 1
            start = time.monotonic()
            try:
                return call(), attempt, time.monotonic() - start
            except (openai.OpenAIError, httpx2.HTTPError, ValueError) as exc:
                pause = self._delay(exc, attempt)
                if pause is None:
                    raise self._error(exc, attempt) from exc
                if self.on_retry is not None:
                    self.on_retry(attempt, pause, self._error(exc, attempt))
            time.sleep(pause)

    async def _aretrying(self, call: Callable[[], Awaitable[_T]]) -> tuple[_T, int, float]:
        attempt = 0
        while True:
            attempt += 1
            start = time.monotonic()
            try:
                return await call(), attempt, time.monotonic() - start
            except (openai.OpenAIError, httpx2.HTTPError, ValueError) as exc:
                pause = self._delay(exc, attempt)
                if pause is None:
                    raise self._error(exc, attempt) from exc
                if self.on_retry is not None:
                    self.on_retry(attempt, pause, self._error(exc, attempt))
            await asyncio.sleep(pause)

    def complete(self, messages: Sequence[Mapping[str, Any]], *,
                 tools: Sequence[Mapping[str, Any]] | None = None, tool_choice: object = None,
                 stop: str | Sequence[str] | None = None, temperature: float | None = None,
                 max_reply_tokens: int | None = None, seed: int | None = None,
                 extra_body: Mapping[str, Any] | None = None) -> Completion:
        """One chat completion, retried as configured; raises :class:`LLMError` for good."""
        kw = self._kwargs(messages, tools=tools, tool_choice=tool_choice, stop=stop,
                          temperature=temperature, max_reply_tokens=max_reply_tokens, seed=seed,
                          extra_body=extra_body)
        client = self._sync()
        resp, attempts, latency = self._retrying(lambda: client.chat.completions.create(**kw))
        return self._completion(resp, attempts, latency)

    async def acomplete(self, messages: Sequence[Mapping[str, Any]], *,
                        tools: Sequence[Mapping[str, Any]] | None = None,
                        tool_choice: object = None, stop: str | Sequence[str] | None = None,
                        temperature: float | None = None, max_reply_tokens: int | None = None,
                        seed: int | None = None,
                        extra_body: Mapping[str, Any] | None = None) -> Completion:
        """:meth:`complete` for asyncio. Each call opens its own async connection pool, so it
        works from any event loop (``asyncio.run`` per rollout included)."""
        if self._closed:
            raise ConfigError("this LLMClient is closed")
        kw = self._kwargs(messages, tools=tools, tool_choice=tool_choice, stop=stop,
                          temperature=temperature, max_reply_tokens=max_reply_tokens, seed=seed,
                          extra_body=extra_body)
        async with openai.AsyncOpenAI(
                api_key=self._api_key, base_url=self.base_url, timeout=self.timeout,
                max_retries=0, http_client=openai.DefaultAsyncHttpxClient(verify=http_tls()),
        ) as client:
            resp, attempts, latency = await self._aretrying(
                lambda: client.chat.completions.create(**kw))
        return self._completion(resp, attempts, latency)

    def stream(self, messages: Sequence[Mapping[str, Any]], *,
               tools: Sequence[Mapping[str, Any]] | None = None, tool_choice: object = None,
               stop: str | Sequence[str] | None = None, temperature: float | None = None,
               max_reply_tokens: int | None = None, seed: int | None = None,
               extra_body: Mapping[str, Any] | None = None) -> Iterator[str | Completion]:
        """Yield the reply's text deltas as they arrive, then the final :class:`Completion`.

        Opening the stream is retried like :meth:`complete`; a stream that breaks after text
        was yielded is not (the caller saw part of a reply) and raises
        :class:`LLMConnectionError`. Usage comes from the endpoint's final usage chunk
        (``stream_options.include_usage``); for an endpoint that sends none it is estimated
        (``usage_estimated``)."""
        kw = self._kwargs(messages, tools=tools, tool_choice=tool_choice, stop=stop,
                          temperature=temperature, max_reply_tokens=max_reply_tokens, seed=seed,
                          extra_body=extra_body)
        kw["stream"] = True
        kw["stream_options"] = {"include_usage": True}
        client = self._sync()
        start = time.monotonic()
        chunks, attempts, _ = self._retrying(lambda: client.chat.completions.create(**kw))
        text: list[str] = []
        calls: dict[int, dict[str, str]] = {}
        finish: str | None = None
        usage = Usage()
        model = self.model
        try:
            for chunk in chunks:
                model = chunk.model or model
                if chunk.usage is not None:
                    usage = _usage(chunk.usage)
                for choice in chunk.choices or ():
                    finish = choice.finish_reason or finish
                    delta = choice.delta
                    for tc in delta.tool_calls or ():
                        slot = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                        slot["id"] = tc.id or slot["id"]
                        if tc.function is not None:
                            slot["name"] += tc.function.name or ""
                            slot["arguments"] += tc.function.arguments or ""
                    if delta.content:
                        text.append(delta.content)
                        yield delta.content
        except (openai.OpenAIError, httpx2.HTTPError, ValueError) as exc:
            raise self._error(exc, attempts) from exc
        finally:
            chunks.close()
        tool_calls = tuple(ToolCall(id=c["id"] or f"call_{i}", name=c["name"],
                                    arguments=c["arguments"])
                           for i, c in sorted(calls.items()))
        content = "".join(text)
        estimated = usage.total_tokens == 0
        if estimated:
            prompt = estimate_prompt_tokens(kw["messages"], kw.get("tools"))
            out = estimate_tokens(content + "".join(c.name + c.arguments for c in tool_calls))
            usage = Usage(prompt_tokens=prompt, completion_tokens=out, total_tokens=prompt + out)
        yield Completion(content=content, tool_calls=tool_calls, finish_reason=finish,
                         usage=usage, cost=self._cost(usage, self.model, model),
                         latency=time.monotonic() - start, attempts=attempts, model=model,
                         usage_estimated=estimated)


def _usage(raw: object) -> Usage:
    if raw is None:
        return Usage()
    prompt = int(getattr(raw, "prompt_tokens", 0) or 0)
    completion = int(getattr(raw, "completion_tokens", 0) or 0)
    total = int(getattr(raw, "total_tokens", 0) or 0) or prompt + completion
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=total)

