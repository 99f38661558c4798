"""An MCP server's tools as typed host tools (``ToolSet.from_mcp``): the guest calls them as
Python functions through the usual host-tools path (arguments checked against each tool's
``inputSchema`` on the host, budgets, the gate, call records), and the host forwards the call
to the server over one MCP client session.

The session lives on its own event-loop thread (an anyio blocking portal), shared by every
call of every sandbox the tool set serves; calls run concurrently on it. A connection found
dead before a call is sent (the server exited or restarted) is reopened and the call goes on
it; a connection lost while a call was in flight fails that call (it may or may not have run)
unless the tool says it is read-only or idempotent, which is then retried once on a new
connection. Results: ``structuredContent`` validated against the tool's ``outputSchema`` and
returned as a record (``{"result": x}`` wrappers unwrapped to ``x``), text that is JSON
decoded, images/audio/resources as the records of ``_mcp_content``; ``isError`` raises in the
guest with the server's message.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import dataclasses
import json
import threading
import types
import typing
from collections.abc import AsyncIterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anyio
import anyio.from_thread
import httpx2
import mcp_types as mt
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from ..errors import ConfigError, MCPServerError
from ..runtime_wasm.internal import http_tls
from ._mcp_content import McpAudio, McpImage, McpResource, McpResourceLink
from ._params import ReturnInvalid
from ._schema import schema_type, validator_errors, validator_for
from ._tool import Tool

__all__ = ["McpConnection", "mcp_tools"]

T = typing.TypeVar("T")
_CONNECTION_ERRORS = (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream,
                      httpx2.TransportError, OSError)
_MAX_PAGES = 1000
_CONTENT_RECORDS = (McpImage, McpAudio, McpResource, McpResourceLink)


@dataclasses.dataclass(kw_only=True)
class _Live:
    client: Client
    stop: anyio.Event
    scope: anyio.CancelScope
    done: Future[None]
    ended: threading.Event  # the transport reached end of stream: nothing more can be sent


class _WatchedRead:
    """A transport's read stream that records when it ends (the server exited), so that a
    connection known dead is reopened before a call is sent on it."""

    def __init__(self, inner: Any, ended: threading.Event) -> None:
        self._inner, self._ended = inner, ended

    @property
    def last_context(self) -> Any:
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> Any:
        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._ended.set()
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> _WatchedRead:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> _WatchedRead:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


@asynccontextmanager
async def _watched(transport: Any, ended: threading.Event) -> AsyncIterator[tuple[Any, Any]]:
    async with transport as (read, write):
        yield _WatchedRead(read, ended), write


class McpConnection:
    """One MCP client session to a server started as ``command args`` (stdio) or reached at
    ``url`` (streamable HTTP, with ``headers``), opened at once and reopened when found dead.
    Thread-safe; ``close()`` is idempotent."""

    def __init__(self, command: str | None = None, *, args: Sequence[str] = (),
                 env: Mapping[str, str] | None = None, cwd: str | None = None,
                 url: str | None = None, headers: Mapping[str, str] | None = None,
                 connect_timeout: float = 30.0) -> None:
        if (command is None) == (url is None):
            raise ConfigError("an MCP server is a command (stdio) or a url, exactly one")
        if url is not None and not url.startswith(("http://", "https://")):
            raise ConfigError(f"an MCP server url is http(s)://..., got {url!r}")
        if not connect_timeout > 0:
            raise ConfigError("connect_timeout must be > 0")
        self.label = url or " ".join([str(command), *args])
        self._stdio = None if command is None else StdioServerParameters(
            command=command, args=list(args), env=dict(env) if env is not None else None,
            cwd=cwd)
        self._url, self._headers = url, dict(headers or {})
        self._connect_timeout = connect_timeout
        self._lock = threading.Lock()
        self._live: _Live | None = None
        self._closed = False
        self.reconnects = 0
        self._portal_cm = anyio.from_thread.start_blocking_portal()
        self._portal = self._portal_cm.__enter__()
        self.loop: asyncio.AbstractEventLoop = self._portal.call(asyncio.get_running_loop)
        """The event loop the session lives on (its calls run there)."""
        try:
            self._ensure()
        except BaseException:
            self.close()
            raise

    # ---- the session --------------------------------------------------------------------
    @asynccontextmanager
    async def _client(self, ended: threading.Event) -> AsyncIterator[Client]:
        async with AsyncExitStack() as stack:
            if self._stdio is not None:
                transport: Any = stdio_client(self._stdio)
            else:
                assert self._url is not None
                timeout = httpx2.Timeout(30, read=None)  # a call's bound is the tool's
                http = await stack.enter_async_context(
                    httpx2.AsyncClient(headers=self._headers, timeout=timeout,
                                       verify=http_tls()))
                transport = streamable_http_client(self._url, http_client=http)
            yield await stack.enter_async_context(Client(_watched(transport, ended)))

    async def _hold(self, ready: threading.Event, box: dict[str, Any]) -> None:
        """The task that owns one session: open it, hand it out, wait until told to stop
        (``scope`` lets a stop that hangs, e.g. closing a dead transport, be cut short)."""
        try:
            with anyio.CancelScope() as box["scope"]:
                async with self._client(box["ended"]) as client:
                    box["live"] = (client, anyio.Event())
                    ready.set()
                    await box["live"][1].wait()
        except Exception as exc:
            box.setdefault("error", exc)
        finally:
            ready.set()

    def _connect(self) -> _Live:
        ready = threading.Event()
        box: dict[str, Any] = {"ended": threading.Event()}
        done = self._portal.start_task_soon(self._hold, ready, box)
        if not ready.wait(self._connect_timeout) or "live" not in box:
            done.cancel()
            why = box.get("error")
            detail = f": {type(why).__name__}: {why}" if why is not None else \
                f" within {self._connect_timeout:g}s"
            raise MCPServerError(f"cannot connect to the MCP server {self.label}{detail}")
        client, stop = box["live"]
        return _Live(client=client, stop=stop, scope=box["scope"], done=done,
                     ended=box["ended"])

    def _ensure(self) -> _Live:
        with self._lock:
            if self._closed:
                raise MCPServerError(f"the connection to {self.label} is closed")
            live = self._live
            if live is not None and (live.done.done() or live.ended.is_set()):
                # the server went away between calls: reopen before anything is sent
                self._live = live = None
                self.reconnects += 1
            if live is None:
                live = self._live = self._connect()
            return live

    def _drop(self, live: _Live) -> None:
        with self._lock:
            if self._live is live:
                self._live = None
                self.reconnects += 1
        self._stop(live)

    def _stop(self, live: _Live) -> None:
        """End a session's task: asked to stop, then cancelled if it does not within 2 s."""
        for step in (live.stop.set, live.scope.cancel):
            if live.done.done():
                return
            with contextlib.suppress(Exception):
                self._portal.call(step)
                live.done.result(timeout=2)

    # ---- calls ----------------------------------------------------------------------------
    def _live_now(self) -> _Live | None:
        """The open session, or None when there is none or it went away (then _ensure)."""
        with self._lock:
            if self._closed:
                raise MCPServerError(f"the connection to {self.label} is closed")
            live = self._live
            if live is None or live.done.done() or live.ended.is_set():
                return None
            return live

    async def arun(self, fn: typing.Callable[[Client], typing.Awaitable[Any]], *,
                   timeout: float | None = None, retry: bool = False) -> Any:
        """:meth:`run`, on the connection's own loop (:attr:`loop`)."""
        live = self._live_now()
        if live is None:  # (re)connecting waits for the session's task: not on its loop
            live = await anyio.to_thread.run_sync(self._ensure)
        try:
            # asyncio's own timeout: anyio's looks up the running library on every call
            async with asyncio.timeout(timeout):
                return await fn(live.client)
        except TimeoutError:
            raise MCPServerError(f"the MCP server {self.label} did not answer within "
                                 f"{timeout:g}s") from None
        except (MCPError, *_CONNECTION_ERRORS) as exc:
            if isinstance(exc, MCPError) and exc.code != mt.CONNECTION_CLOSED:
                raise MCPServerError(f"{self.label}: {exc.error.message}") from None
            await anyio.to_thread.run_sync(self._drop, live)
            if retry or isinstance(exc, httpx2.ConnectError):  # safe, or provably not sent
                return await self.arun(fn, timeout=timeout, retry=False)
            raise MCPServerError(f"the connection to the MCP server {self.label} was lost "
                                 "during the call (it may or may not have run); the next call "
                                 "reconnects") from None

    def run(self, fn: typing.Callable[[Client], typing.Awaitable[Any]], *,
            timeout: float | None = None, retry: bool = False) -> Any:
        """``await fn(client)`` on the session, within ``timeout`` seconds. A connection lost
        during the call fails it (MCPServerError) unless ``retry`` (the call is safe to
        repeat), which tries once more on a new connection."""
        # Straight to the loop: a portal call first waits for the loop to start its task,
        # a second round trip between threads.
        return self.wait(self.arun(fn, timeout=timeout, retry=retry))

    def wait(self, coro: typing.Coroutine[Any, Any, T]) -> T:
        """``coro`` run on the connection's loop, waited for here (from any other thread)."""
        try:
            if self._closed:
                raise RuntimeError
            future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        except RuntimeError:  # closed, or its loop ended
            coro.close()
            raise MCPServerError(f"the connection to {self.label} is closed") from None
        try:
            return future.result()
        except BaseException:
            future.cancel()  # the caller was interrupted: so is the call (or it ended)
            raise

    def list_tools(self) -> list[mt.Tool]:
        """Every tool the server lists (all pages)."""

        async def pages(client: Client) -> list[mt.Tool]:
            out: list[mt.Tool] = []
            cursor: str | None = None
            seen: set[str] = set()
            for _ in range(_MAX_PAGES):
                page = await client.list_tools(cursor=cursor)
                out += page.tools
                cursor = page.next_cursor
                if not cursor or cursor in seen:
                    break
                seen.add(cursor)
            return out

        listed: list[mt.Tool] = self.run(pages, timeout=self._connect_timeout, retry=True)
        return listed

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            live, self._live = self._live, None
        if live is not None:
            self._stop(live)
        with contextlib.suppress(RuntimeError):  # anything left is cancelled, not awaited
            self._portal.call(self._portal.stop, True)
        self._portal_cm.__exit__(None, None, None)

    def __repr__(self) -> str:
        return f"<McpConnection {self.label}{' closed' if self._closed else ''}>"


# ---- tools --------------------------------------------------------------------------------
class _ToolFailed(Exception):
    """The server answered ``isError``: the guest gets its message."""


def _is_wrapper(schema: object) -> bool:
    """The ``{"result": x}`` object SDKs put around a primitive return."""
    return (isinstance(schema, dict) and schema.get("type") == "object"
            and isinstance(schema.get("properties"), dict)
            and list(schema["properties"]) == ["result"])


def _record_class(name: str, schema: Mapping[str, Any], root: Mapping[str, Any],
                  depth: int = 0) -> Any:
    """A frozen dataclass for an object schema with properties (nested ``$ref`` objects get
    their own), so the guest stub shows the record's fields; else its plain annotation."""
    if depth > 8:
        return Any
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith(("#/$defs/", "#/definitions/")):
        key = "$defs" if ref.startswith("#/$defs/") else "definitions"
        target = root.get(key, {}).get(ref.rsplit("/", 1)[-1])
        if isinstance(target, dict):
            return _record_class(str(target.get("title") or ref.rsplit("/", 1)[-1]),
                                 target, root, depth + 1)
    props = schema.get("properties")
    if schema.get("type") != "object" or not isinstance(props, dict) or not props:
        return schema_type(dict(schema), root)
    required = set(schema.get("required", ()))
    fields: list[Any] = []
    for prop, sub in props.items():
        if not (isinstance(prop, str) and prop.isidentifier() and not prop.startswith("_")):
            return schema_type(dict(schema), root)  # not expressible as fields: a dict
        ann = _record_class(prop.title(), sub, root, depth + 1) if isinstance(sub, dict) \
            else Any
        if prop in required:
            fields.append((prop, ann))
        else:
            fields.append((prop, ann | None, dataclasses.field(default=None)))
    fields.sort(key=lambda f: len(f) == 3)  # required fields first
    cls_name = "".join(ch for ch in name.title() if ch.isalnum()) or "Result"
    return dataclasses.make_dataclass(cls_name, fields, frozen=True, kw_only=True)


def _build(ann: object, value: object) -> Any:
    """``value`` (JSON) as an instance of the record class ``ann`` built by _record_class."""
    if isinstance(ann, type) and dataclasses.is_dataclass(ann) and isinstance(value, dict):
        kw = {}
        for f in dataclasses.fields(ann):
            if f.name in value:
                inner = typing.get_args(f.type)[0] if isinstance(f.type, types.UnionType) \
                    else f.type
                kw[f.name] = _build(inner, value[f.name])
        return ann(**kw)
    return value


def _content(item: object) -> Any:
    if isinstance(item, mt.TextContent):
        text = item.text
        if text.strip()[:1] in ("{", "[", '"') or text.strip() in ("true", "false", "null") \
                or _numeric(text):
            try:
                return json.loads(text)
            except ValueError:
                return text
        return text
    if isinstance(item, mt.ImageContent | mt.AudioContent):
        try:
            data = base64.b64decode(item.data, validate=True)
        except (binascii.Error, ValueError):
            data = item.data.encode()
        cls = McpImage if isinstance(item, mt.ImageContent) else McpAudio
        return cls(data=data, mime_type=item.mime_type)
    if isinstance(item, mt.EmbeddedResource):
        res = item.resource
        if isinstance(res, mt.TextResourceContents):
            return McpResource(uri=str(res.uri), mime_type=res.mime_type, text=res.text)
        blob = getattr(res, "blob", "")
        return McpResource(uri=str(res.uri), mime_type=res.mime_type,
                           data=base64.b64decode(blob) if blob else b"")
    if isinstance(item, mt.ResourceLink):
        return McpResourceLink(uri=str(item.uri), name=item.name,
                               description=item.description, mime_type=item.mime_type)
    return item.model_dump(mode="json", by_alias=True) if hasattr(item, "model_dump") else item


def _numeric(text: str) -> bool:
    t = text.strip()
    try:
        float(t)
    except ValueError:
        return False
    return bool(t) and t.lower() not in ("nan", "inf", "-inf", "infinity", "-infinity")


def _message(result: mt.CallToolResult) -> str:
    texts = [c.text for c in result.content if isinstance(c, mt.TextContent)]
    return "\n".join(texts) or "the MCP server reported an error with no message"


class _ResultChecker:
    """The tool's checker with returns() turning a CallToolResult into the guest's value."""

    def __init__(self, base: Any, name: str, output: Mapping[str, Any] | None, returns: Any
                 ) -> None:
        self._base = base
        self._name = name
        self._output = output
        self._validator = validator_for(output, f"tool {name!r} outputSchema") if output \
            else None
        self._returns = returns

    def arguments(self, given: dict[str, Any]) -> dict[str, Any]:
        checked: dict[str, Any] = self._base.arguments(given)
        return checked

    def json_schema(self) -> dict[str, Any]:
        schema: dict[str, Any] = self._base.json_schema()
        return schema

    def returns(self, value: Any) -> Any:
        if not isinstance(value, mt.CallToolResult):
            return value
        structured = value.structured_content
        if self._validator is not None and structured is not None:
            errors = validator_errors(self._validator, structured)
            if errors:
                raise ReturnInvalid(errors)
            if _is_wrapper(self._output):
                return structured.get("result")
            return _build(self._returns, structured)
        items = [_content(c) for c in value.content]
        if structured is not None and not items:
            return structured
        return items[0] if len(items) == 1 else items


def _tool(conn: McpConnection, spec: mt.Tool, timeout: float | None) -> Tool:
    output = spec.output_schema if isinstance(spec.output_schema, dict) else None
    if output is not None and _is_wrapper(output):
        returns = schema_type(output["properties"]["result"], output)
    elif output is not None:
        returns = _record_class(str(output.get("title") or f"{spec.name}_result"), output,
                                output)
    else:
        returns = Any
    hints: dict[str, Any] = (spec.annotations.model_dump(by_alias=True, exclude_none=True)
                             if spec.annotations is not None else {})
    if spec.title and "title" not in hints:
        hints["title"] = spec.title
    safe = bool(hints.get("readOnlyHint") or hints.get("idempotentHint"))
    name = spec.name

    async def call(**arguments: Any) -> mt.CallToolResult:
        result: mt.CallToolResult = await conn.arun(
            lambda client: client.call_tool(name, dict(arguments)), timeout=timeout,
            retry=safe)
        if result.is_error:
            raise _ToolFailed(_message(result))
        return result

    def handler(**arguments: Any) -> mt.CallToolResult:
        return conn.wait(call(**arguments))

    # A ToolHost runs ``call`` on the session's loop and the guest's thread waits for it
    # there: no worker thread in between (two thread hops fewer per call).
    handler.memex_runs_on = (conn.loop, call)  # type: ignore[attr-defined]

    definition = {"name": name, "description": spec.description or "",
                  "parameters": spec.input_schema or {"type": "object", "properties": {}}}
    base = Tool.from_openai(definition, handler, timeout=timeout)
    return dataclasses.replace(base, returns=returns, origin="mcp", annotations=hints,
                               records=_CONTENT_RECORDS,
                               checker=_ResultChecker(base.checker, name, output, returns))


def mcp_tools(conn: McpConnection, *, timeout: float | None = 30.0,
              include: Sequence[str] | None = None) -> list[Tool]:
    """The server's tools (``include``: only these names, in the server's order)."""
    listed = conn.list_tools()
    if include is not None:
        known = {t.name for t in listed}
        missing = [n for n in include if n not in known]
        if missing:
            raise ConfigError(f"the MCP server {conn.label} has no tool {missing[0]!r}; it "
                              f"has {', '.join(sorted(known)) or 'none'}")
        listed = [t for t in listed if t.name in set(include)]
    return [_tool(conn, t, timeout) for t in listed]
