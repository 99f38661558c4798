"""The ASGI application of ``memex serve`` (FastAPI): the routes of ``_routes`` over one
``_service.Service``, with typed JSON answers for every error (an unknown route and a body
that does not fit the schema included) and the body cap and access log in front."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..backends import Backend
from ..errors import BackendBusy
from ._config import ServiceConfig
from ._http import (
    PUBLIC_PATHS,
    Access,
    ApiError,
    AuthFirst,
    BodyCap,
    invalid_request,
    translate,
)
from ._models import API_VERSION
from ._routes import router
from ._service import Service

__all__ = ["create_app"]


def create_app(config: ServiceConfig, *, backend: Backend | None = None) -> FastAPI:
    """The service for ``config``; ``backend`` (default: built from the config) holds the
    sandboxes and is closed with the app."""
    if config.cluster is not None:
        from ._cluster import ClusterService  # Ray only when serving on a cluster

        svc: Service = ClusterService(config)
    else:
        svc = Service(config, backend)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await svc.start()
        try:
            yield
        finally:
            await svc.stop()

    app = FastAPI(title="MemEx service", version=API_VERSION, lifespan=lifespan,
                  description="Sandboxed Python sessions per tenant (docs/service.md).")
    app.state.service = svc
    # outermost last: the access log, then the key (from the headers alone), then the body
    app.add_middleware(BodyCap, cap=config.max_body_bytes)
    app.add_middleware(AuthFirst, lookup=svc.keys.lookup)
    app.add_middleware(Access, metrics=svc.metrics, log=config.access_log)
    app.include_router(router)

    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        status = exc.status_code
        if status == 400:  # a body FastAPI could not decode at all: as one that is not JSON
            return ApiError(422, "invalid_request", f"body: {exc.detail}",
                            type_="ConfigError").response()
        code = {404: "not_found", 405: "method_not_allowed"}.get(status, "http_error")
        headers = dict(exc.headers or {})
        if status == 405:  # every method the path has (one route serves one method)
            headers["Allow"] = ", ".join(_methods_of(app, request))
        return ApiError(status, code, str(exc.detail), headers=headers).response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return invalid_request(exc.errors()).response()

    @app.exception_handler(BackendBusy)
    async def _busy(_: Request, exc: BackendBusy) -> JSONResponse:
        # "try again" that no route translated: an actor's (the cluster's control actor
        # finding its storage away), which Ray raises as RayTaskError(BackendBusy): answered
        # from its cause (429 or 503 with Retry-After; not the remote traceback as message)
        cause = getattr(exc, "cause", None)
        return translate(cause if isinstance(cause, BackendBusy) else exc).response()

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        # (a part of the cluster restarting never comes here: Access answers it, 503)
        logging.getLogger("memex.service").exception("unhandled error")
        return ApiError(500, "internal", f"internal error ({type(exc).__name__})").response()

    return app


def _methods_of(app: FastAPI, request: Request) -> list[str]:
    """The methods the routes matching the request's path serve. FastAPI (0.165) keeps an
    included router as one entry of ``app.routes`` with no methods of its own (its routes
    are its ``original_router``'s): it is walked too, else every 405 had an empty Allow."""
    from starlette.routing import Match

    methods: set[str] = set()
    todo: list[Any] = list(app.routes)
    while todo:  # iterative; the app's own tree, a few levels deep
        route = todo.pop()
        inner = getattr(route, "original_router", None)
        if inner is not None:
            todo.extend(inner.routes)
            continue
        match, _ = route.matches(request.scope)
        if match is not Match.NONE:
            methods.update(getattr(route, "methods", None) or ())
    return sorted(methods)


def _openapi(app: FastAPI) -> dict[str, Any]:
    """The OpenAPI document with the bearer scheme declared: the key is checked by the
    ``AuthFirst`` middleware (before any route), which FastAPI's generator cannot see, so
    generated clients and the docs page would not know every route but the public ones
    needs ``Authorization: Bearer <key>`` and may answer 401."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    doc = get_openapi(title=app.title, version=app.version, description=app.description,
                      routes=app.routes)
    doc.setdefault("components", {})["securitySchemes"] = {"bearer": {
        "type": "http", "scheme": "bearer",
        "description": "a tenant's API key (serve.toml keeps its sha256); for /metrics, one "
                       "of metrics_keys"}}
    doc["security"] = [{"bearer": []}]
    unauthorized = {"description": "no key, or a key no tenant holds (answered from the "
                    "headers alone, before the body is read)",
                    "content": {"application/json": {"schema": {
                        "$ref": "#/components/schemas/ErrorBody"}}}}
    for path, ops in doc.get("paths", {}).items():
        for op in ops.values():
            if path in PUBLIC_PATHS and path != "/metrics":  # /metrics takes a metrics key
                op["security"] = []  # answered without a key
            else:
                op.setdefault("responses", {}).setdefault("401", unauthorized)
    app.openapi_schema = doc
    return doc
