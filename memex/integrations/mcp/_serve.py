"""Running ``memex mcp``: the tools the guest may call are loaded (``module:attribute`` host
tools, bridged MCP servers), then the server speaks stdio or streamable HTTP on the given
address, optionally behind a bearer token (compared in constant time; any request without it
gets 401 and never reaches a sandbox). Stopping the server (end of stdin, SIGTERM, Ctrl-C)
ends every session and closes every bridge."""

from __future__ import annotations

import collections
import contextlib
import hashlib
import importlib
import ipaddress
import json
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from typing import Any

import anyio
import uvicorn
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from mcp_types import INVALID_REQUEST, PARSE_ERROR, ErrorData, JSONRPCError
from pydantic import ValidationError

from ...errors import ConfigError
from ...host_tools import Tool, ToolSet
from ...runtime_wasm.internal import cancel_resolutions
from ...serving import ConnectionGuard, KeyRing, Principal, hash_key
from ._config import McpConfig
from ._server import PRINCIPAL, build_server, principal_of
from ._sessions import Sessions
from ._stdio import wire

__all__ = ["BearerAuth", "load_tools", "serve", "token_principals"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class BearerAuth:
    """ASGI middleware: HTTP requests must carry ``Authorization: Bearer <token>`` with a key
    of one of the ring's principals (the front ends' one authentication,
    ``memex.serving.KeyRing``: keys kept hashed, every stored hash compared in constant
    time). Anything else gets 401 before the MCP server sees the request."""

    def __init__(self, app: ASGIApp, ring: KeyRing[Principal] | str | list[str]) -> None:
        if isinstance(ring, str | list):  # tokens in clear: each its own principal
            tokens = [ring] if isinstance(ring, str) else list(ring)
            if not tokens or not all(tokens):
                raise ConfigError("the bearer token is empty")
            ring = token_principals(tokens)
        if not ring.principals():
            raise ConfigError("the bearer token is empty")
        self.app, self.ring = app, ring

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            got = dict(scope.get("headers") or ()).get(b"authorization")
            found = self.ring.bearer(got)
            if found is None:
                body = json.dumps({"jsonrpc": "2.0", "id": None, "error": {
                    "code": -32001, "message": "unauthorized: a valid bearer token is "
                    "required"}}).encode()
                await send({"type": "http.response.start", "status": 401, "headers": [
                    (b"content-type", b"application/json"),
                    (b"www-authenticate", b'Bearer realm="memex"'),
                    (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
            scope.setdefault("state", {})[PRINCIPAL] = found.name  # for the layers after
        await self.app(scope, receive, send)


def token_principals(tokens: list[str]) -> KeyRing[Principal]:
    """Each bearer token a principal of its own, kept only as its hash. Its name is the one
    earlier versions gave it (a digest of its header), so that sessions a durable server
    saved under it are still its own."""
    found: dict[str, Principal] = {}
    for t in tokens:
        name = "token:" + hashlib.sha256(f"Bearer {t}".encode()).hexdigest()[:16]
        found[name] = Principal(name=name, keys=(hash_key(t, min_length=1),))
    return KeyRing(found)


class FieldValues:
    """ASGI middleware: each header's value without the whitespace around it (RFC 9110
    §5.5: a field's parsing excludes leading and trailing OWS), before anything reads one.
    The 2026-07-28 protocol compares ``Mcp-Name`` and ``Mcp-Method`` with the body; a
    client or proxy that pads them (``Mcp-Name:  run_python``) is within HTTP and must be
    answered, not refused 400."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = scope["headers"]
            if any(v[:1] in _OWS or v[-1:] in _OWS for _, v in headers):
                scope = dict(scope, headers=[(k, v.strip(b" \t")) for k, v in headers])
        await self.app(scope, receive, send)


_OWS = (b" ", b"\t")


class EndsSessions:
    """ASGI middleware over the SDK's streamable HTTP app: each ``Mcp-Session-Id`` belongs
    to the principal whose request was answered with it. A request of another principal
    that names it is answered 404, as an unknown session would be, before the SDK sees it
    (else it could end the owner's MCP session, or detach its sandbox session). The owner's
    ``DELETE`` of it (the end of its MCP session), once the SDK accepts it, ends the sandbox
    session it used.

    The owners are kept while their MCP session may live: an id not seen for twice the
    SDK's idle timeout is forgotten (the SDK has ended it by then)."""

    def __init__(self, app: ASGIApp, sessions: Sessions, idle_timeout: float = 3600.0
                 ) -> None:
        self.app, self.sessions = app, sessions
        self._forget_after = 2 * idle_timeout
        self._owners: collections.OrderedDict[bytes, tuple[str, float]] = \
            collections.OrderedDict()

    def _owner_of(self, sid: bytes) -> str | None:
        now = time.monotonic()
        while self._owners:  # the oldest first: forget the ones the SDK has ended
            first, (_, seen) = next(iter(self._owners.items()))
            if now - seen <= self._forget_after:
                break
            del self._owners[first]
        found = self._owners.get(sid)
        if found is None:
            return None
        self._owners[sid] = (found[0], now)
        self._owners.move_to_end(sid)
        return found[0]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        principal = principal_of(scope)
        sid = headers.get(b"mcp-session-id")
        if sid:
            owner = self._owner_of(sid)
            if owner is not None and owner != principal:
                await _jsonrpc_error(send, 404, -32001, "Session not found")
                return
        status: list[int] = []

        async def watch(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status.append(int(message["status"]))
                given = dict(message.get("headers") or ()).get(b"mcp-session-id")
                if given and given not in self._owners:  # a new MCP session: its owner
                    self._owners[given] = (principal, time.monotonic())
            await send(message)

        await self.app(scope, receive, watch)
        if sid and scope.get("method") == "DELETE" and status and 200 <= status[0] < 300:
            self._owners.pop(sid, None)
            key = "http:" + sid.decode("latin-1")
            await anyio.to_thread.run_sync(self.sessions.end_connection, key)


async def _jsonrpc_error(send: Send, status: int, code: int, message: str) -> None:
    body = json.dumps({"jsonrpc": "2.0", "id": None,
                       "error": {"code": code, "message": message}}).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def _attr(spec: str, base: str) -> Any:
    mod, sep, attr = spec.partition(":")
    if not sep or not mod or not attr:
        raise ConfigError(f"a host tool is module:attribute, got {spec!r}")
    sys.path.insert(0, base)
    try:
        obj: Any = importlib.import_module(mod)
    except ImportError as exc:
        raise ConfigError(f"cannot import {mod!r} for the host tool {spec!r}: {exc}") from exc
    finally:
        sys.path.remove(base)
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"{mod!r} has no attribute {attr!r}") from None
    return obj


def load_tools(config: McpConfig) -> ToolSet:
    """The host tools and bridged servers' tools the configuration names, as one set (it
    holds the bridges' connections: close it)."""
    base = str(config.resolve("."))
    parts: list[ToolSet] = []
    try:
        own: list[Tool | Callable[..., Any]] = []
        for spec in config.tools:
            obj = _attr(spec, base)
            if isinstance(obj, ToolSet):
                parts.append(obj)
            elif isinstance(obj, list | tuple):
                own.extend(obj)
            else:
                own.append(obj)
        parts.insert(0, ToolSet(own))
        for b in config.bridge:
            parts.append(ToolSet.from_mcp(b.command, args=b.args, env=b.env, cwd=b.cwd,
                                          url=b.url, headers=b.headers, prefix=b.prefix,
                                          include=b.include, timeout=b.timeout))
        return parts[0].merge(*parts[1:])
    except BaseException:
        for p in parts:
            p.close()
        raise


@contextlib.contextmanager
def _running(config: McpConfig) -> Iterator[Sessions]:
    tools = load_tools(config)
    try:
        sessions = Sessions(config, tools)
        try:
            yield sessions
        finally:
            sessions.close()
    finally:
        tools.close()


class _Answering:
    """The SDK's stdio read stream, answering the lines it could not read as JSON-RPC (it
    would drop them): not JSON -> parse error (-32700, id null), JSON that is no JSON-RPC
    message -> invalid request (-32600, with its id when it has one). The answers go out
    through the SDK's own writer, so they never interleave with its messages."""

    def __init__(self, inner: Any, write: Any) -> None:
        self._inner, self._write = inner, write

    @property
    def last_context(self) -> Any:
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> Any:
        while True:
            item = await self._inner.receive()
            if not isinstance(item, Exception):
                return item
            await self._write.send(SessionMessage(_protocol_error(item)))

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> _Answering:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None

    async def __aenter__(self) -> _Answering:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _protocol_error(exc: Exception) -> JSONRPCError:
    errors = exc.errors() if isinstance(exc, ValidationError) else []
    if not errors or any(e.get("type") == "json_invalid" for e in errors):
        return JSONRPCError(jsonrpc="2.0", id=None, error=ErrorData(
            code=PARSE_ERROR, message="parse error: a line is one JSON-RPC message in JSON"))
    # The id is in the message itself: some error (a "missing" field) carries it as input.
    given = next((e["input"] for e in errors if isinstance(e.get("input"), dict)
                  and "id" in e["input"]), None)
    rid = given.get("id") if isinstance(given, dict) else None
    if isinstance(rid, bool) or not isinstance(rid, str | int):
        rid = None
    where = ".".join(str(x) for x in errors[0].get("loc", ()) if not isinstance(x, int))
    return JSONRPCError(jsonrpc="2.0", id=rid, error=ErrorData(
        code=INVALID_REQUEST, message="invalid request: not a JSON-RPC 2.0 message"
        + (f" ({where}: {errors[0].get('msg')})" if where else "")))


async def _run_stdio(server: Any, limit: int) -> None:
    """``server.run_stdio_async()`` over memex's own wire (:mod:`._stdio`; a line is at most
    ``limit`` bytes), with the read side answering malformed lines."""
    low = server._lowlevel_server  # the SDK's own stdio path drives this same server
    async with wire(limit) as (lines, out), stdio_server(lines, out) as (read, write):
        await low.run(_Answering(read, write), write, low.create_initialization_options())


class _Uvicorn(uvicorn.Server):
    """uvicorn without its own signal handling, which re-raises SIGTERM after shutting down
    and so would kill the process before the sessions are closed: ``serve`` handles it."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def _until_signalled(scope: anyio.CancelScope, on_signal: Callable[[], None]) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            cancel_resolutions("the server is stopping")  # a cell's fetch ends at once
            on_signal()
            scope.cancel()
            return


async def _reloads(reload: Callable[[], McpConfig], sessions: Sessions,
                   ring: KeyRing[Principal] | None) -> None:
    """On SIGHUP, read the config again: its principals (keys and bounds), the per-token
    bounds and [limits] apply from the next session, cell or checkpoint; a config that
    does not load keeps the running one (and says why)."""
    with anyio.open_signal_receiver(signal.SIGHUP) as signals:
        async for _ in signals:
            try:
                new = await anyio.to_thread.run_sync(reload)
                fresh = _ring(new) if ring is not None else None
            except ConfigError as exc:
                print(f"memex mcp: SIGHUP: the config is not taken: {exc}", file=sys.stderr,
                      flush=True)
                continue
            rest = sessions.reconfigure(new)
            if ring is not None and fresh is not None:
                ring.replace(fresh.principals())
            print("memex mcp: SIGHUP: principals and bounds read again"
                  + (f"; needs a restart: {', '.join(rest)}" if rest else ""),
                  file=sys.stderr, flush=True)


def serve(config: McpConfig, *, ready: Callable[[str], None] | None = None,
          reload: Callable[[], McpConfig] | None = None) -> None:
    """Serve until stopped (end of stdin, SIGTERM or SIGINT; every session is then ended and
    every bridge closed): stdio, or HTTP on ``config.http`` (``ready(url)`` once listening).
    The bearer token, when configured, is read from ``config.http.token_env``. ``reload``
    gives the config anew on SIGHUP (principals and bounds are then taken)."""
    ring = _ring(config) if config.transport == "http" else None
    with _running(config) as sessions:
        server = build_server(config, sessions)
        if config.transport == "stdio":
            async def stdio() -> None:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_until_signalled, tg.cancel_scope, lambda: None)
                    if reload is not None:
                        tg.start_soon(_reloads, reload, sessions, ring)
                    await _run_stdio(server, config.http.max_request_bytes)
                    tg.cancel_scope.cancel()

            anyio.run(stdio)
            return
        app: Any = server.streamable_http_app(
            max_request_body_size=config.http.max_request_bytes, host=config.http.host,
            session_idle_timeout=config.sessions.idle_timeout)
        app = EndsSessions(app, sessions, config.sessions.idle_timeout)
        if ring is not None:
            app = BearerAuth(app, ring)
        app = FieldValues(app)
        guard = ConnectionGuard(config.http.edge)
        uv = _Uvicorn(uvicorn.Config(app, host=config.http.host, port=config.http.port,
                                     log_level="warning", lifespan="on", **guard.config()))

        async def http() -> None:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_until_signalled, anyio.CancelScope(),
                              lambda: setattr(uv, "should_exit", True))
                tg.start_soon(_announce, uv, config, ready)
                if reload is not None:
                    tg.start_soon(_reloads, reload, sessions, ring)
                await uv.serve()
                tg.cancel_scope.cancel()

        anyio.run(http)


def _ring(config: McpConfig) -> KeyRing[Principal] | None:
    """Who may call: each token of ``http.token_env`` a principal of its own, and each
    ``[principals.NAME]`` with its keys; None only for ``--no-auth`` (see :func:`_token`)."""
    tokens = _token(config)
    if tokens is None:
        return None
    found = token_principals(tokens).principals() if tokens else {}
    found.update({n: Principal(name=n, keys=tuple(t.keys))
                  for n, t in config.principals.items()})
    return KeyRing(found)


def _token(config: McpConfig) -> list[str] | None:
    """The bearer tokens HTTP clients must send one of (the variable may hold several,
    comma-separated); None only when ``no_auth`` was asked for explicitly, on a loopback
    address (a server anyone on the network could drive would run their code)."""
    http = config.http
    if config.principals and not http.token_env:
        if http.no_auth:
            raise ConfigError("[principals] and --no-auth: choose one")
        return []  # the principals' keys alone
    if http.token_env:
        if http.no_auth:
            raise ConfigError("--token-env and --no-auth: choose one")
        raw = os.environ.get(http.token_env) or ""
        tokens = [t.strip() for t in raw.split(",")]
        if not raw.strip() or not all(tokens):
            raise ConfigError(f"the bearer token's variable ${http.token_env} is not set, "
                              "or holds an empty token")
        return tokens
    if not http.no_auth:
        raise ConfigError("memex mcp --http serves only with a bearer token: --token-env VAR "
                          "(or, on a loopback address only, --no-auth)")
    try:
        loopback = ipaddress.ip_address(http.host).is_loopback
    except ValueError:
        loopback = http.host == "localhost"
    if not loopback:
        raise ConfigError(f"--no-auth serves only on a loopback address, not {http.host!r}")
    print("memex mcp: warning: --no-auth: every process of this machine may run code here",
          file=sys.stderr, flush=True)
    return None


async def _announce(uv: uvicorn.Server, config: McpConfig,
                    ready: Callable[[str], None] | None) -> None:
    while not uv.started:
        if uv.should_exit:
            return
        await anyio.sleep(0.02)
    if ready is not None:
        port = uv.servers[0].sockets[0].getsockname()[1] if uv.servers else config.http.port
        ready(f"http://{config.http.host}:{port}/mcp")
