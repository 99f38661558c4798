"""The HTTP edge of the service: typed error answers (:class:`ApiError`, MemEx errors
translated to a status and a stable code), the request-body cap and the access log, as plain
ASGI middleware (no per-request task or body copy)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from typing import Any

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import (
    BackendBusy,
    ConfigError,
    GuestFileError,
    MemexError,
    SandboxClosed,
    SandboxLost,
)
from ._metrics import Metrics

__all__ = ["Access", "ApiError", "BodyCap", "TooLarge", "invalid_request", "too_large",
           "translate"]

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
    """422 for a body that does not fit its schema, naming the first error (pydantic's)."""
    first = errors[0] if errors else {}
    where = ".".join(str(p) for p in first.get("loc", ()))
    return ApiError(422, "invalid_request", f"{where}: {first.get('msg', 'invalid request')}")


def too_large(cap: int) -> ApiError:
    return ApiError(413, "too_large", f"request bodies are capped at {cap} bytes")


def translate(exc: MemexError) -> ApiError:
    name, reason = type(exc).__name__, getattr(exc, "reason", None)
    reason = reason if isinstance(reason, str) else None
    if isinstance(exc, ConfigError):
        return ApiError(422, "invalid", str(exc), type_=name)
    if isinstance(exc, GuestFileError):
        return ApiError(400, "guest_file", str(exc), type_=name)
    if isinstance(exc, SandboxLost):
        return ApiError(410, "session_lost", str(exc), type_=name, reason=reason)
    if isinstance(exc, SandboxClosed):
        return ApiError(409, "session_closed", str(exc), type_=name, reason=reason)
    if isinstance(exc, BackendBusy):
        status = 503 if exc.reason == "closed" else 429
        return ApiError(status, "busy", str(exc), type_=name, reason=reason,
                        headers={"Retry-After": "1"})
    return ApiError(409, "sandbox_error", str(exc), type_=name)


class BodyCap:
    """Refuse request bodies past the cap (413) before a handler reads them, whether the
    size is declared or streamed."""

    def __init__(self, app: ASGIApp, cap: int) -> None:
        self.app, self.cap = app, cap

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        refused = too_large(self.cap)
        if declared is not None and declared.isdigit() and int(declared) > self.cap:
            await refused.response()(scope, receive, send)
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


class TooLarge(Exception):
    pass


class Access:
    """One JSON access-log line and one metrics count per HTTP answer (a plain ASGI
    middleware: no per-request task or body copy)."""

    def __init__(self, app: ASGIApp, metrics: Metrics, log: bool) -> None:
        self.app, self.metrics, self.log = app, metrics, log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = [500]

        async def seen(msg: Message) -> None:
            if msg["type"] == "http.response.start":
                status[0] = msg["status"]
            await send(msg)

        try:
            await self.app(scope, receive, seen)
        finally:
            self.metrics.request(status[0])
            if self.log:
                ACCESS.info(json.dumps({
                    "method": scope["method"], "path": scope["path"], "status": status[0],
                    "ms": round((time.perf_counter() - start) * 1000, 2),
                    "tenant": (scope.get("state") or {}).get("tenant")}))
