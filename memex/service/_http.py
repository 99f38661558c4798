"""The HTTP edge of the service: typed error answers (:class:`ApiError`, MemEx errors
translated to a status and a stable code), the request-body cap and the access log, as plain
ASGI middleware (no per-request task or body copy)."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import (
    BackendBusy,
    ConfigError,
    GuestFileError,
    GuestFileTooLarge,
    MemexError,
    NotGranted,
    PackageError,
    SandboxClosed,
    SandboxLost,
)
from ..serving import QuotaExceeded, bearer_key
from ._logs import REQUEST_ID, request_id_from
from ._metrics import Metrics

__all__ = ["MAX_JSON_CONTAINERS", "PUBLIC_PATHS", "Access", "ApiError", "AuthFirst", "BodyCap",
           "TooLarge", "bearer", "invalid_request", "too_large", "translate"]

ACCESS = logging.getLogger("memex.service.access")


class ApiError(Exception):
    """An answer with a typed error body (raised by handlers, rendered by the app)."""

    def __init__(self, status: int, code: str, message: str, *, type_: str | None = None,
                 reason: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.type, self.reason, self.headers = type_, reason, headers

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "type": self.type,
                          "reason": self.reason}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def invalid_request(errors: Sequence[Any]) -> ApiError:
    """422 for a body that does not fit its schema, naming the first error (pydantic's); a
    ConfigError, as the same argument refused by a local backend is (RemoteBackend raises
    that type)."""
    first = errors[0] if errors else {}
    where = ".".join(str(p) for p in first.get("loc", ()))
    return ApiError(422, "invalid_request", f"{where}: {first.get('msg', 'invalid request')}",
                    type_="ConfigError")


def too_large(cap: int) -> ApiError:
    return ApiError(413, "too_large", f"request bodies are capped at {cap} bytes")


def translate(exc: MemexError) -> ApiError:
    name, reason = type(exc).__name__, getattr(exc, "reason", None)
    reason = reason if isinstance(reason, str) else None
    if isinstance(exc, NotGranted):  # authenticated, but not allowed that
        return ApiError(403, "forbidden", str(exc), type_=name)
    if isinstance(exc, ConfigError):
        return ApiError(422, "invalid", str(exc), type_=name)
    if isinstance(exc, PackageError):  # a guest package that cannot be had (it says which)
        return ApiError(422, "package", str(exc), type_=name)
    if isinstance(exc, GuestFileTooLarge):
        return ApiError(413, "too_large", str(exc), type_=name)
    if isinstance(exc, GuestFileError):  # the path names no file of the session's
        return ApiError(404, "guest_file", str(exc), type_=name)
    if isinstance(exc, SandboxLost):
        return ApiError(410, "session_lost", str(exc), type_=name, reason=reason)
    if isinstance(exc, SandboxClosed):
        return ApiError(409, "session_closed", str(exc), type_=name, reason=reason)
    if isinstance(exc, QuotaExceeded):  # an owner (or the server) at one of its bounds
        return ApiError(429, "quota", str(exc),
                        headers={"Retry-After": str(exc.retry_after)})
    if isinstance(exc, BackendBusy):
        status = 503 if exc.reason in ("closed", "no_room", "unavailable") else 429
        return ApiError(status, "busy", str(exc), type_=name, reason=reason,
                        headers={"Retry-After": "1"})
    return ApiError(409, "sandbox_error", str(exc), type_=name)


PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/openapi.json", "/docs",
                          "/docs/oauth2-redirect", "/redoc"})
"""Paths answered without a tenant's key (each reveals nothing of tenants, keys or the
configuration; ``/metrics`` asks for a metrics key of its own)."""
MAX_JSON_CONTAINERS = 256
"""Arrays and objects a JSON request body may hold: every body of the API holds fewer than
50 (a session's limits, mounts, preload and env). Past it the body is refused before it is
parsed: JSON's nesting would otherwise reach the parser's recursion limit."""


def bearer(headers: Sequence[tuple[bytes, bytes]]) -> str | None:
    """The key of ``Authorization: Bearer <key>`` among raw ASGI headers (the front ends'
    one reading of it: ``memex.serving.bearer_key``)."""
    for name, value in headers:
        if name == b"authorization":
            return bearer_key(value)
    return None


class AuthFirst:
    """Authenticate before any work: a request (or WebSocket) outside :data:`PUBLIC_PATHS`
    without a valid tenant key gets 401 (a WebSocket: closed before it is accepted) from its
    headers alone, before its body is read or a route is matched. The tenant's name goes in
    ``scope["state"]["tenant"]``."""

    def __init__(self, app: ASGIApp, lookup: Callable[[str | None], Any]) -> None:
        self.app, self.lookup = app, lookup

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket") or scope["path"] in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        tenant = self.lookup(bearer(scope.get("headers") or ()))
        if tenant is None:
            if kind == "websocket":
                await send({"type": "websocket.close", "code": 4401})
                return
            await ApiError(401, "unauthorized", "a valid API key is required "
                           "(Authorization: Bearer <key>)",
                           headers={"WWW-Authenticate": "Bearer",
                                    "Connection": "close"}).response()(scope, receive, send)
            return
        scope.setdefault("state", {})["tenant"] = tenant.name
        await self.app(scope, receive, send)


class BodyCap:
    """Refuse request bodies past the cap (413) before a handler reads them, whether the
    size is declared or streamed; a JSON body is also bounded in what parsing it costs
    (:data:`MAX_JSON_CONTAINERS`), checked on its bytes before any parser sees it."""

    def __init__(self, app: ASGIApp, cap: int) -> None:
        self.app, self.cap = app, cap

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        refused = too_large(self.cap)
        if declared is not None and declared.isdigit() and int(declared) > self.cap:
            await refused.response()(scope, receive, send)
            return
        if headers.get(b"content-type", b"").split(b";")[0].strip() == b"application/json":
            await self._json(scope, receive, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            msg = await receive()
            seen += len(msg.get("body", b""))
            if seen > self.cap:
                raise TooLarge
            return msg

        try:
            await self.app(scope, counted, send)
        except TooLarge:
            await refused.response()(scope, receive, send)

    async def _json(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A JSON body, read whole under the cap and checked, then handed on."""
        parts: list[bytes] = []
        size = 0
        while True:
            msg = await receive()
            if msg["type"] != "http.request":
                return  # the client went away
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > self.cap:
                await too_large(self.cap).response()(scope, receive, send)
                return
            parts.append(chunk)
            if not msg.get("more_body", False):
                break
        body = b"".join(parts)
        del parts
        if body.count(b"[") + body.count(b"{") > MAX_JSON_CONTAINERS:
            await ApiError(413, "too_large", "a JSON body holds at most "
                           f"{MAX_JSON_CONTAINERS} arrays and objects"
                           ).response()(scope, receive, send)
            return
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def actor_away(exc: BaseException) -> str | None:
    """Why a request cannot be answered now when ``exc`` is Ray's word that an actor it
    needed (a cluster's control actor, a slab, a Ray backend's host) is restarting, gone or
    slow to answer: the request may be sent again (503 with Retry-After), never a 500."""
    rex = sys.modules.get("ray.exceptions")  # Ray is loaded only where actors are used
    if rex is None or not isinstance(exc, (rex.RayActorError, rex.GetTimeoutError)):
        return None
    return (f"a part of the cluster this request needs is restarting or away "
            f"({type(exc).__name__}): try again")


class TooLarge(Exception):
    pass


class Access:
    """One JSON access-log line and one metrics count per HTTP answer (a plain ASGI
    middleware: no per-request task or body copy)."""

    def __init__(self, app: ASGIApp, metrics: Metrics, log: bool) -> None:
        self.app, self.metrics, self.log = app, metrics, log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        rid = request_id_from(scope.get("headers") or [])
        token = REQUEST_ID.set(rid)  # every line logged while serving it carries its id
        try:
            if scope["type"] == "websocket":
                await self.app(scope, receive, send)
                return
            await self._http(scope, receive, send, rid)
        finally:
            REQUEST_ID.reset(token)

    async def _http(self, scope: Scope, receive: Receive, send: Send, rid: str) -> None:
        start = time.perf_counter()
        status, started = [500], [False]

        async def seen(msg: Message) -> None:
            if msg["type"] == "http.response.start":
                started[0] = True
                status[0] = msg["status"]
                msg = {**msg, "headers": [*msg.get("headers", ()),
                                          (b"x-request-id", rid.encode())]}
            await send(msg)

        try:
            await self.app(scope, receive, seen)
        except Exception as exc:
            # a part of the cluster restarting is answered here, not by the app's last
            # handler: Starlette sends that one's answer and then raises on (its server
            # logs a traceback as an error, and this log said 500 for the 503 sent)
            away = actor_away(exc)
            if away is None or started[0]:
                raise
            logging.getLogger("memex.service").warning("%s", away)
            await ApiError(503, "unavailable", away, headers={"Retry-After": "1"}
                           ).response()(scope, receive, seen)
        finally:
            self.metrics.request(status[0])
            if self.log:
                ACCESS.info(json.dumps({
                    "method": scope["method"], "path": scope["path"], "status": status[0],
                    "ms": round((time.perf_counter() - start) * 1000, 2),
                    "tenant": (scope.get("state") or {}).get("tenant")}))
