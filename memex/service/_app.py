"""The ASGI application of ``memex serve`` (FastAPI): sessions, turns, forks, checkpoints,
files and the door WebSocket, per tenant, with typed JSON errors.

Every blocking sandbox operation runs on a bounded thread pool (``threads``), so the event
loop only moves bytes: the door WebSocket of a session keeps answering while its turn runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Annotated, Any

import anyio
import anyio.to_thread
from fastapi import Depends, FastAPI, Query, Request, Response, WebSocket, WebSocketDisconnect
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..backends import Backend, ProcessSandbox, TenantQuota, get_backend
from ..backends.worker import limits_to_wire, result_to_wire
from ..errors import ConfigError, MemexError, SandboxError
from ..host_tools import Egress, EgressRecord
from ..runtime_wasm import (
    GuestFile,
    Limits,
    Mount,
    OutputListener,
    Sandbox,
    SandboxAPI,
    TurnResult,
)
from ._config import KeyRing, ServiceConfig, TenantConfig
from ._door import ClientDoor
from ._durable import Keeper
from ._http import Access, ApiError, BodyCap, translate
from ._metrics import Metrics
from ._models import (
    API_VERSION,
    CheckpointOut,
    CreateSession,
    ErrorBody,
    FileList,
    FileOut,
    RestoreIn,
    RunIn,
    RunOut,
    SessionList,
    SessionOut,
)
from ._sessions import QuotaExceeded, Session, SessionTable, TurnGate, new_session_id

__all__ = ["create_app"]

AUDIT = logging.getLogger("memex.service.audit")
_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody} for status in (401, 404, 422, 429)}


def _key_of(headers: Any) -> str | None:
    auth = str(headers.get("authorization", ""))
    return auth[7:] if auth[:7].lower() == "bearer " else None


def _tenant_of(request: Request) -> TenantConfig:
    """The tenant whose API key the request carries (401 otherwise)."""
    tenant: TenantConfig | None = request.app.state.keys.lookup(_key_of(request.headers))
    if tenant is None:
        raise ApiError(401, "unauthorized", "a valid API key is required "
                       "(Authorization: Bearer <key>)", headers={"WWW-Authenticate": "Bearer"})
    request.state.tenant = tenant.name
    return tenant


Tenant = Annotated[TenantConfig, Depends(_tenant_of)]


def _default_backend(config: ServiceConfig) -> Backend:
    if config.backend == "pool":
        quotas = {t.name: TenantQuota(turns_per_second=t.turns_per_second, queued=t.queued,
                                      burst=max(1, int(t.turns_per_second or 1)))
                  for t in config.tenants.values()}
        return get_backend("pool", workers=config.workers, warm=config.warm,
                           limits=Limits(timeout=config.warm_timeout),
                           preload=config.preload, quotas=quotas,
                           max_sandboxes=config.max_sandboxes, acquire_timeout=10.0)
    if config.backend == "subprocess":
        return get_backend("subprocess", workers=config.workers)
    return get_backend(config.backend)


def create_app(config: ServiceConfig, *, backend: Backend | None = None) -> FastAPI:
    """The service for ``config``; ``backend`` (default: built from the config) holds the
    sandboxes and is closed with the app."""
    keys = KeyRing(config)
    table = SessionTable()
    metrics = Metrics()
    limiter = anyio.CapacityLimiter(config.threads)
    holder: dict[str, Backend] = {}

    def the_backend() -> Backend:
        if "b" not in holder:
            holder["b"] = backend if backend is not None else _default_backend(config)
        return holder["b"]

    def serve_egress(s: Session, sb: SandboxAPI[Any]) -> None:
        """The tenant's egress policy on the session's door (server-side: the client cannot
        stand in for it); its decisions go to the audit log."""
        tenant = keys.tenants().get(s.tenant)
        if tenant is None or tenant.egress is None:
            return
        if s.egress is None:
            def record(rec: EgressRecord) -> None:
                d = rec.to_dict()
                AUDIT.info(json.dumps({"event": "egress", "tenant": s.tenant, "session": s.id,
                                       **{k: d.get(k) for k in (
                                           "method", "url", "decision", "rule", "outcome",
                                           "reason", "status", "request_bytes",
                                           "response_bytes")}}))
            s.egress = Egress(tenant.egress, label=f"{s.tenant}/{s.id}", on_record=record)
        s.egress.attach(sb, install=False)  # a fresh guest routes urllib to the door already

    streaming: set[asyncio.Future[None]] = set()
    gate = TurnGate()
    keeper = Keeper(table, the_backend, state_dir=config.state_dir,
                    save_interval=config.save_interval, idle_evict=config.idle_evict,
                    on_open=serve_egress)

    def on(s: Session, fn: Callable[[SandboxAPI[Any]], Any]) -> Callable[[], Any]:
        """``fn(sandbox)`` with the session's sandbox, opened again if it was evicted."""
        def call() -> Any:
            with keeper.using(s) as sb:
                return fn(sb)
        return call

    async def blocking(fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return await anyio.to_thread.run_sync(fn, *args, limiter=limiter)
        except MemexError as exc:
            raise translate(exc) from exc

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await anyio.to_thread.run_sync(the_backend)
        loaded = await anyio.to_thread.run_sync(keeper.load)
        if loaded:
            AUDIT.info(json.dumps({"event": "restart", "sessions": loaded}))
        keeper.start()
        try:
            yield
        finally:
            sessions = table.drain()
            saved = await anyio.to_thread.run_sync(keeper.stop, sessions)
            AUDIT.info(json.dumps({"event": "shutdown", "closed": len(sessions),
                                   "saved": saved}))
            await anyio.to_thread.run_sync(the_backend().close)

    app = FastAPI(title="MemEx service", version=API_VERSION, lifespan=lifespan,
                  description="Sandboxed Python sessions per tenant (docs/service.md).")
    app.state.keys = keys
    app.add_middleware(BodyCap, cap=config.max_body_bytes)
    app.add_middleware(Access, metrics=metrics, log=config.access_log)

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return ApiError(exc.status_code, code, str(exc.detail),
                        headers=dict(exc.headers or {})).response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return ApiError(422, "invalid_request",
                        f"{where}: {first.get('msg', 'invalid request')}").response()

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        logging.getLogger("memex.service").exception("unhandled error")
        return ApiError(500, "internal", f"internal error ({type(exc).__name__})").response()

    def session_of(tenant: TenantConfig, sid: str) -> Session:
        s = table.get(tenant.name, sid)
        if s is None:
            raise ApiError(404, "not_found", f"no session {sid!r}")
        return s  # last_used moves with uses of its sandbox (Keeper.using), not lookups

    def out(s: Session) -> SessionOut:
        return SessionOut(**s.info(), limits=limits_to_wire(s.limits))

    # ---- health -------------------------------------------------------------------------
    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", responses={503: {"model": ErrorBody}})
    async def readyz() -> JSONResponse:
        b = holder.get("b")
        if b is None or b.closed:
            return ApiError(503, "not_ready", "the backend is not running").response()
        return JSONResponse({"status": "ready", "sessions": sum(table.counts().values()),
                             "config_error": keys.last_error})

    @app.get("/metrics")
    async def metrics_text() -> Response:
        metrics.sessions(table.counts())
        return Response(metrics.render(), media_type=metrics.content_type)

    # ---- sessions -----------------------------------------------------------------------
    v1 = f"/{API_VERSION}"

    def make_session(tenant: TenantConfig, body: CreateSession) -> Session:
        try:  # no limits: those of the warm sandboxes
            limits = Limits(**body.limits) if body.limits is not None else \
                Limits(timeout=config.warm_timeout)
        except TypeError as exc:
            raise ConfigError(f"limits: {exc}") from None
        tenant.check_limits(limits)
        mounts = []
        for m in body.mounts:
            host = Path(m.host).resolve()
            tenant.check_mount(host, m.writable)
            mounts.append(Mount(host_path=host, guest_path=m.guest, writable=m.writable,
                                links=m.links))
        try:
            table.reserve(tenant, limits)
        except QuotaExceeded as exc:
            raise ApiError(429, "quota", str(exc), headers={"Retry-After": str(
                exc.retry_after)}) from None
        try:
            door = ClientDoor()
            sb = the_backend().open(limits=limits, mounts=mounts, preload=body.preload,
                                    door=door, env=body.env, tenant=tenant.name)
            s = Session(id=new_session_id(), tenant=tenant.name, sandbox=sb, door=door,
                        limits=limits, mounts=tuple(mounts), preload=tuple(body.preload),
                        env=body.env)
            try:
                serve_egress(s, sb)
            except MemexError:
                sb.close()
                raise
            table.add(s)
            keeper.changed(s)  # saved (when durable) like any changed session
        finally:
            table.release(tenant.name, limits)
        AUDIT.info(json.dumps({"event": "create", "tenant": tenant.name, "session": s.id,
                               "memory": limits.memory, "timeout": limits.timeout,
                               "mounts": [str(m.host_path) for m in mounts]}))
        return s

    @app.post(f"{v1}/sessions", status_code=201, responses=_ERRORS)
    async def create(body: CreateSession, tenant: Tenant
                     ) -> SessionOut:
        return out(await blocking(make_session, tenant, body))

    @app.get(f"{v1}/sessions", responses=_ERRORS)
    async def list_sessions(tenant: Tenant) -> SessionList:
        return SessionList(sessions=[out(s) for s in table.of(tenant.name)])

    @app.get(f"{v1}/sessions/{{sid}}", responses=_ERRORS)
    async def get_session(sid: str, tenant: Tenant) -> SessionOut:
        return out(session_of(tenant, sid))

    @app.delete(f"{v1}/sessions/{{sid}}", status_code=204, responses=_ERRORS)
    async def close(sid: str, tenant: Tenant) -> Response:
        s = table.pop(tenant.name, sid)
        if s is None:
            raise ApiError(404, "not_found", f"no session {sid!r}")
        if s.sandbox is not None:
            await blocking(s.sandbox.close)
        keeper.forget(s)
        AUDIT.info(json.dumps({"event": "close", "tenant": tenant.name, "session": sid,
                               "turns": s.turns}))
        return Response(status_code=204)

    def turn_of(s: Session, tenant: TenantConfig, body: RunIn,
                emit: OutputListener | None = None) -> Callable[[SandboxAPI[Any]], TurnResult]:
        def turn(sb: SandboxAPI[Any]) -> TurnResult:
            with gate.turn(tenant):
                return turn_now(sb)

        def turn_now(sb: SandboxAPI[Any]) -> TurnResult:
            keeper.turn_begins(s)
            try:
                if emit is None:
                    return sb.run(body.code, timeout=body.timeout, filename=body.filename)
                if isinstance(sb, Sandbox | ProcessSandbox):  # they hear output as written
                    return sb.run(body.code, timeout=body.timeout, filename=body.filename,
                                  on_output=emit)
                r = sb.run(body.code, timeout=body.timeout, filename=body.filename)
                for stream, text in (("stdout", r.stdout), ("stderr", r.stderr)):
                    if text:
                        emit(stream, text)  # a backend that cannot stream: all at the end
                return r
            finally:
                keeper.changed(s)
        return turn

    def answer_of(s: Session, tenant: TenantConfig, body: RunIn, r: TurnResult
                  ) -> dict[str, Any]:
        metrics.turn(tenant.name, r)
        if AUDIT.isEnabledFor(logging.INFO):  # one line per turn: built only when kept
            event: dict[str, Any] = {"event": "run", "tenant": tenant.name, "session": s.id,
                                     "status": r.status.value, "limit": r.limit,
                                     "seconds": round(r.duration, 4),
                                     "code_bytes": len(body.code)}
            if config.log_code:
                event["code"] = body.code
            AUDIT.info(json.dumps(event))
        answer: dict[str, Any] = {"result": result_to_wire(r), "turns": s.turns}
        if s.notice is not None:  # said once, on the first answer after a restore
            answer["restored"], s.notice = s.notice, None
        return answer

    @app.post(f"{v1}/sessions/{{sid}}/run", response_model=RunOut, responses=_ERRORS)
    async def run(sid: str, body: RunIn, tenant: Tenant) -> Response:
        s = session_of(tenant, sid)
        r: TurnResult = await blocking(on(s, turn_of(s, tenant, body)))
        # the hot path: encoded once, not validated again against RunOut
        return Response(json.dumps(answer_of(s, tenant, body, r)),
                        media_type="application/json")

    @app.post(f"{v1}/sessions/{{sid}}/run/stream", responses={
        **_ERRORS, 200: {"content": {"text/event-stream": {}}, "description":
                         "server-sent events: output {stream, text} as the guest writes, "
                         "then result (the body of /run) or error (an error body)"}})
    async def run_stream(sid: str, body: RunIn, tenant: Tenant) -> StreamingResponse:
        s = session_of(tenant, sid)
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

        def emit(stream: str, text: str) -> None:
            loop.call_soon_threadsafe(events.put_nowait,
                                      ("output", {"stream": stream, "text": text}))

        async def drive() -> None:
            try:
                r: TurnResult = await blocking(on(s, turn_of(s, tenant, body, emit)))
                await events.put(("result", answer_of(s, tenant, body, r)))
            except ApiError as exc:
                await events.put(("error", exc.body()))
            except Exception as exc:
                logging.getLogger("memex.service").exception("streamed turn failed")
                await events.put(("error", ApiError(500, "internal", "internal error "
                                                    f"({type(exc).__name__})").body()))

        # the turn finishes even if the client goes away (as on /run); only its events drop
        task = asyncio.ensure_future(drive())
        streaming.add(task)  # held until done (the loop keeps only a weak reference)
        task.add_done_callback(streaming.discard)

        async def sse() -> AsyncIterator[str]:
            while True:
                kind, data = await events.get()
                yield f"event: {kind}\ndata: {json.dumps(data)}\n\n"
                if kind != "output":
                    break
            await task

        return StreamingResponse(sse(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store"})

    @app.post(f"{v1}/sessions/{{sid}}/fork", status_code=201, responses=_ERRORS)
    async def fork(sid: str, tenant: Tenant) -> SessionOut:
        s = session_of(tenant, sid)

        def do_fork(sb: SandboxAPI[Any]) -> Session:
            table.reserve(tenant, s.limits)
            try:
                child = sb.fork()  # its door is the parent's (shared, see ClientDoor)
                c = Session(id=new_session_id(), tenant=tenant.name, sandbox=child,
                            door=s.door, parent=s.id, limits=s.limits, mounts=s.mounts,
                            preload=s.preload, env=s.env, turn_base=s.turns - child.turns,
                            egress=s.egress)  # a fork shares its door, hence its egress
                table.add(c)
                keeper.changed(c)
                return c
            finally:
                table.release(tenant.name, s.limits)

        try:
            return out(await blocking(on(s, do_fork)))
        except QuotaExceeded as exc:
            raise ApiError(429, "quota", str(exc), headers={"Retry-After": "1"}) from None

    def shared() -> Path:
        if config.shared_dir is None:
            raise ApiError(409, "not_configured", "this server has no shared_dir to move "
                           "sessions between nodes through (docs/service.md)")
        return config.shared_dir

    @app.post(f"{v1}/sessions/{{sid}}/park", status_code=204, responses=_ERRORS)
    async def park(sid: str, tenant: Tenant) -> Response:
        s = session_of(tenant, sid)
        await blocking(keeper.park, s, shared())
        return Response(status_code=204)

    @app.post(f"{v1}/sessions/{{sid}}/unpark", status_code=201, responses=_ERRORS)
    async def unpark(sid: str, tenant: Tenant) -> SessionOut:
        folder = shared()

        def take() -> Session | None:
            return keeper.unpark(tenant, sid, folder)

        try:
            s = await blocking(take)
        except QuotaExceeded as exc:
            raise ApiError(429, "quota", str(exc), headers={"Retry-After": "1"}) from None
        if s is None:
            raise ApiError(404, "not_found", f"no parked session {sid!r}")
        return out(s)

    @app.post(f"{v1}/sessions/{{sid}}/checkpoints", status_code=201, responses=_ERRORS)
    async def checkpoint(sid: str, tenant: Tenant) -> CheckpointOut:
        s = session_of(tenant, sid)
        cp = await blocking(on(s, lambda sb: sb.checkpoint()))
        return CheckpointOut(checkpoint=table.hold(tenant, cp))

    @app.post(f"{v1}/sessions/{{sid}}/restore", status_code=204, responses=_ERRORS)
    async def restore(sid: str, body: RestoreIn, tenant: Tenant) -> Response:
        s = session_of(tenant, sid)
        cp = table.checkpoint(tenant.name, body.checkpoint)
        if cp is None:
            raise ApiError(404, "not_found", f"no checkpoint {body.checkpoint!r} (unknown, "
                           "released, or past the tenant's max_checkpoints)")

        def put_back(sb: SandboxAPI[Any]) -> None:
            sb.restore(cp)
            keeper.changed(s)

        await blocking(on(s, put_back))
        return Response(status_code=204)

    @app.delete(f"{v1}/checkpoints/{{cid}}", status_code=204, responses=_ERRORS)
    async def drop_checkpoint(cid: str, tenant: Tenant) -> Response:
        if not table.drop_checkpoint(tenant.name, cid):
            raise ApiError(404, "not_found", f"no checkpoint {cid!r}")
        return Response(status_code=204)

    @app.get(f"{v1}/sessions/{{sid}}/files", responses=_ERRORS)
    async def read_file(sid: str, path: Annotated[str, Query()], tenant: Tenant) -> Response:
        s = session_of(tenant, sid)
        data = await blocking(on(s, lambda sb: sb.read_file(path)))
        if len(data) > config.max_body_bytes:
            raise ApiError(413, "too_large", f"{path} is {len(data)} bytes; responses are "
                           f"capped at {config.max_body_bytes}")
        return Response(data, media_type="application/octet-stream")

    @app.get(f"{v1}/sessions/{{sid}}/files/list", responses=_ERRORS)
    async def list_files(sid: str, tenant: Tenant, path: Annotated[str, Query()] = "/tmp",
                         limit: Annotated[int, Query(ge=1, le=100_000)] = 10_000
                         ) -> FileList:
        s = session_of(tenant, sid)

        def listing(sb: SandboxAPI[Any]) -> list[GuestFile]:
            if not isinstance(sb, Sandbox | ProcessSandbox):
                raise SandboxError(f"the {the_backend().name} backend cannot list files")
            return sb.list_files(path, limit=limit)

        found: list[GuestFile] = await blocking(on(s, listing))
        return FileList(files=[FileOut(name=f.name, path=f.path, kind=f.kind, size=f.size)
                               for f in found])

    @app.put(f"{v1}/sessions/{{sid}}/files", status_code=204, responses=_ERRORS)
    async def write_file(sid: str, request: Request, path: Annotated[str, Query()],
                         tenant: Tenant) -> Response:
        s = session_of(tenant, sid)
        data = await request.body()
        await blocking(on(s, lambda sb: sb.write_file(path, data)))
        return Response(status_code=204)

    # ---- the door -----------------------------------------------------------------------
    @app.websocket(f"{v1}/sessions/{{sid}}/door")
    async def door(ws: WebSocket, sid: str) -> None:
        tenant = keys.lookup(_key_of(ws.headers))
        s = table.get(tenant.name, sid) if tenant is not None else None
        if s is None:
            await ws.close(code=4401 if tenant is None else 4404)
            return
        await ws.accept()
        token = s.door.attach(ws.send_bytes, asyncio.get_running_loop())
        try:
            await ws.send_bytes(b"\x91\xa5ready")  # msgpack ["ready"]
            while True:
                data = await ws.receive_bytes()
                if not s.door.answer(data):
                    await ws.close(code=1003)
                    break
        except (WebSocketDisconnect, RuntimeError, KeyError):
            pass
        finally:
            s.door.detach(token)

    return app



