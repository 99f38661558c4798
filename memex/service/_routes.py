"""The API's routes, version 1 (docs/service.md): each answers from the app's
:class:`~._service.Service` for the tenant whose key the request carries."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import AsyncIterator
from typing import Annotated, Any

import msgpack
from fastapi import (
    APIRouter,
    Depends,
    Path,
    Query,
    Request,
    Response,
    WebSocket,
    WebSocketDisconnect,
)
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError
from starlette.requests import HTTPConnection

from ..errors import SandboxError
from ..runtime_wasm import GuestFile, SandboxAPI, TurnResult
from ..runtime_wasm.internal import DecodeCost, unpack_bounded
from ..serving import ID_PATTERN, bearer_key, describe_tools, key_matches
from ._config import TenantConfig
from ._http import ApiError, actor_away, invalid_request, too_large
from ._models import (
    API_VERSION,
    CheckpointOut,
    CreateSession,
    ErrorBody,
    FileList,
    FileOut,
    ForksIn,
    RestoreIn,
    RunIn,
    RunOut,
    SessionList,
    SessionOut,
    ToolList,
    ToolOut,
)
from ._service import Service
from ._sessions import Session

__all__ = ["router"]

V1 = f"/{API_VERSION}"
_ERRORS: dict[int | str, dict[str, Any]] = {status: {"model": ErrorBody, "description": why}
                                             for status, why in (
    (401, "no valid API key"),
    (403, "a mount or a guest package the tenant was not granted"),
    (404, "no such session or checkpoint of this tenant, or no such file in the session"),
    (409, "the session is closed, or cannot do what was asked (the error's code says why)"),
    (410, "the session was lost and could not be brought back"),
    (413, "a body, a file or a frame over its cap"),
    (422, "a request the API or the tenant's grants refuse (the message names the field)"),
    (429, "a quota or a fair share of the tenant is full: retry after Retry-After"),
    (503, "the server or the cluster has no room now: retry after Retry-After"))}

async def _known_query(conn: HTTPConnection) -> None:
    """Unknown query parameters are refused (422), as unknown body keys are: a misspelt
    ``max_byte=`` would otherwise be silently ignored."""
    dependant = getattr(conn.scope.get("route"), "dependant", None)
    if dependant is None or not conn.query_params:
        return
    known: set[str] = set()
    todo = [dependant]  # the route's own parameters and its dependencies' (a small tree)
    while todo:
        d = todo.pop()
        known.update(p.alias for p in d.query_params)
        todo.extend(d.dependencies)
    unknown = sorted(set(conn.query_params) - known)
    if unknown:
        raise ApiError(422, "invalid_request", f"query: unknown parameter(s) "
                       f"{', '.join(repr(u[:40]) for u in unknown[:5])}; this route takes "
                       f"{', '.join(sorted(known)) or 'none'}", type_="ConfigError")


router = APIRouter(dependencies=[Depends(_known_query)])
# (no pattern: a relative or climbing path is the GuestFileError every backend raises)
GuestPathQuery = Annotated[str, Query(max_length=1024,
                                      description="an absolute path in the guest")]


def _key_of(headers: Any) -> str | None:
    return bearer_key(headers.get("authorization"))


# Both dependencies are coroutines: FastAPI runs a plain ``def`` dependency on its thread pool,
# which costs two thread hops on every request for a few microseconds of work.
async def _service_of(request: Request) -> Service:
    svc: Service = request.app.state.service
    return svc


async def _tenant_of(request: Request) -> TenantConfig:
    """The tenant whose API key the request carries (401 otherwise)."""
    tenant = (await _service_of(request)).keys.lookup(_key_of(request.headers))
    if tenant is None:
        raise ApiError(401, "unauthorized", "a valid API key is required "
                       "(Authorization: Bearer <key>)", headers={"WWW-Authenticate": "Bearer"})
    request.state.tenant = tenant.name
    return tenant


Svc = Annotated[Service, Depends(_service_of)]
Tenant = Annotated[TenantConfig, Depends(_tenant_of)]
# An id in a path is a name, checked before any handler sees it (422): ``.``, ``..`` and
# ``%2e%2e`` would otherwise reach the state and shared folders as paths.
SessionId = Annotated[str, Path(pattern=ID_PATTERN, description="a session id")]
CheckpointId = Annotated[str, Path(pattern=ID_PATTERN, description="a checkpoint id")]


# ---- health -------------------------------------------------------------------------------
@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"model": ErrorBody}})
async def readyz(svc: Svc) -> JSONResponse:
    # Ready or not, nothing else: this path answers anyone (sessions and a config error are
    # in /metrics and the log).
    if not svc.ready:
        return ApiError(503, "not_ready", "the backend is not running").response()
    return JSONResponse({"status": "ready"})


@router.get("/metrics", responses={401: {"model": ErrorBody}})
async def metrics(request: Request, svc: Svc) -> Response:
    if not svc.config.metrics_public and not key_matches(svc.config.metrics_keys,
                                                         _key_of(request.headers)):
        raise ApiError(401, "unauthorized", "/metrics asks for one of [server] metrics_keys "
                       "(Authorization: Bearer <key>)", headers={"WWW-Authenticate": "Bearer"})
    await svc.observe()
    svc.metrics.sessions(await svc.session_counts())
    svc.metrics.held(svc.ledger)
    svc.metrics.config_error(svc.keys.last_error)
    svc.metrics.edge(svc.edge.stats() if svc.edge is not None else {})
    return Response(svc.metrics.render(), media_type=svc.metrics.content_type)


# ---- operator tools -----------------------------------------------------------------------
@router.get(f"{V1}/tools", responses=_ERRORS)
async def tools(tenant: Tenant) -> ToolList:
    """The tools the operator serves to this tenant's guests (docs/service.md)."""
    return ToolList(tools=[ToolOut(**d) for d in describe_tools(tenant.tools)])


# ---- sessions -----------------------------------------------------------------------------
@router.post(f"{V1}/sessions", status_code=201, responses=_ERRORS)
async def create(body: CreateSession, tenant: Tenant, svc: Svc) -> SessionOut:
    await svc.reap(tenant.name)  # sessions its limits ended hold no quota, to the second
    return svc.out(await svc.blocking(svc.make_session, tenant, body, tenant=tenant.name))


@router.get(f"{V1}/sessions", responses=_ERRORS)
async def list_sessions(tenant: Tenant, svc: Svc) -> SessionList:
    return SessionList(sessions=[svc.out(s) for s in await svc.listed(tenant)])


@router.get(f"{V1}/sessions/{{sid}}", responses=_ERRORS)
async def get_session(sid: SessionId, tenant: Tenant, svc: Svc) -> SessionOut:
    return svc.out(await svc.session_of(tenant, sid))


@router.delete(f"{V1}/sessions/{{sid}}", status_code=204, responses=_ERRORS)
async def close(sid: SessionId, tenant: Tenant, svc: Svc) -> Response:
    s = await svc.find(tenant, sid)
    if s is None:
        raise ApiError(404, "not_found", f"no session {sid!r}")
    await svc.end(s, "closed by the client")
    return Response(status_code=204)


@router.post(f"{V1}/sessions/{{sid}}/fork", status_code=201, responses=_ERRORS)
async def fork(sid: SessionId, tenant: Tenant, svc: Svc) -> SessionOut:
    s = await svc.session_of(tenant, sid)
    return svc.out(await svc.ordered(s, tenant, svc.fork_of(s, tenant)))  # 429 past a bound


@router.post(f"{V1}/sessions/{{sid}}/forks", status_code=201, responses=_ERRORS)
async def forks(sid: SessionId, body: ForksIn, tenant: Tenant, svc: Svc) -> SessionList:
    """``count`` forks of the session in one call, all or none: they count against the
    tenant's quota together, and when one cannot be made none is kept."""
    s = await svc.session_of(tenant, sid)
    made = await svc.ordered(s, tenant, svc.forks_of(s, tenant, body.count))
    return SessionList(sessions=[svc.out(c) for c in made])


@router.post(f"{V1}/sessions/{{sid}}/park", status_code=204, responses=_ERRORS)
async def park(sid: SessionId, tenant: Tenant, svc: Svc) -> Response:
    s = await svc.session_of(tenant, sid)
    await svc.blocking(svc.keeper.park, s, svc.shared(), tenant=tenant.name)
    svc.release_door(s)
    return Response(status_code=204)


@router.post(f"{V1}/sessions/{{sid}}/unpark", status_code=201, responses=_ERRORS)
async def unpark(sid: SessionId, tenant: Tenant, svc: Svc) -> SessionOut:
    folder = svc.shared()
    s: Session | None = await svc.blocking(svc.keeper.unpark, tenant, sid, folder,
                                           tenant=tenant.name)  # 429 past a bound
    if s is None:
        raise ApiError(404, "not_found", f"no parked session {sid!r}")
    return svc.out(s)


# ---- turns --------------------------------------------------------------------------------
@router.post(f"{V1}/sessions/{{sid}}/run", response_model=RunOut, responses=_ERRORS)
async def run(sid: SessionId, body: RunIn, tenant: Tenant, svc: Svc) -> Response:
    # the hot path: encoded once, not validated again against RunOut
    return Response(json.dumps(await svc.run_turn(tenant, sid, body)),
                    media_type="application/json")


@router.post(f"{V1}/sessions/{{sid}}/run/stream", responses={
    **_ERRORS, 200: {"content": {"text/event-stream": {}}, "description":
                     "server-sent events: output {stream, text} as the guest writes, then "
                     "result (the body of /run) or error (an error body)"}})
async def run_stream(sid: SessionId, body: RunIn, tenant: Tenant, svc: Svc) -> StreamingResponse:
    s = await svc.session_of(tenant, sid)
    out = _Output(asyncio.get_running_loop())
    # admitted before the answer starts: a refusal has the status /run would give it
    admission = contextlib.AsyncExitStack()
    await admission.enter_async_context(svc.admitted(s, tenant, turn=True))

    async def drive() -> None:
        try:
            r: TurnResult = await svc.blocking(
                svc.on(s, svc.turn_of(s, tenant, body, out.emit)), tenant=tenant.name)
            out.end(("result", svc.answer_of(s, tenant, body, r)))
        except ApiError as exc:
            out.end(("error", exc.body()))
        except Exception as exc:
            logging.getLogger("memex.service").exception("streamed turn failed")
            out.end(("error", ApiError(500, "internal", "internal error "
                                       f"({type(exc).__name__})").body()))
        finally:
            await admission.aclose()

    # the turn finishes even if the client goes away (as on /run); only its events drop
    task = asyncio.ensure_future(drive())
    svc.streaming.add(task)  # held until done (the loop keeps only a weak reference)
    task.add_done_callback(svc.streaming.discard)

    async def sse() -> AsyncIterator[str]:
        while True:
            chunks, last = await out.next()
            for stream, text in chunks:
                yield f"event: output\ndata: {json.dumps({'stream': stream, 'text': text})}\n\n"
            if last is not None:
                yield f"event: {last[0]}\ndata: {json.dumps(last[1])}\n\n"
                break
        await task

    return StreamingResponse(sse(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-store"})


class _Output:
    """A streamed turn's output between the sandbox's thread and the response: what the guest
    writes is appended to one buffer per stream and taken whole by the response, so a client
    that reads slowly (or never) holds at most the turn's output (its stdout/stderr caps),
    never a queue of events; the guest never waits for the client."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._parts: dict[str, list[str]] = {}
        self._last: tuple[str, Any] | None = None
        self._woken = False
        self._ready = asyncio.Event()

    def emit(self, stream: str, text: str) -> None:  # on the sandbox's thread
        with self._lock:
            self._parts.setdefault(stream, []).append(text)
            if self._woken:
                return
            self._woken = True
        self._loop.call_soon_threadsafe(self._ready.set)

    def end(self, last: tuple[str, Any]) -> None:  # on the event loop
        with self._lock:
            self._last = last
        self._ready.set()

    async def next(self) -> tuple[list[tuple[str, str]], tuple[str, Any] | None]:
        await self._ready.wait()
        with self._lock:
            self._ready.clear()
            self._woken = False
            parts, self._parts = self._parts, {}
            last = self._last
        return [(stream, "".join(texts)) for stream, texts in parts.items()], last


# ---- checkpoints --------------------------------------------------------------------------
@router.post(f"{V1}/sessions/{{sid}}/checkpoints", status_code=201, responses=_ERRORS)
async def checkpoint(sid: SessionId, tenant: Tenant, svc: Svc) -> CheckpointOut:
    s = await svc.session_of(tenant, sid)
    return CheckpointOut(checkpoint=await svc.take_checkpoint(s, tenant))


@router.post(f"{V1}/sessions/{{sid}}/restore", status_code=204, responses=_ERRORS)
async def restore(sid: SessionId, body: RestoreIn, tenant: Tenant, svc: Svc) -> Response:
    s = await svc.session_of(tenant, sid)
    await svc.restore_checkpoint(s, tenant, body.checkpoint)
    return Response(status_code=204)


@router.delete(f"{V1}/checkpoints/{{cid}}", status_code=204, responses=_ERRORS)
async def drop_checkpoint(cid: CheckpointId, tenant: Tenant, svc: Svc) -> Response:
    if not await svc.drop_checkpoint(tenant, cid):
        raise ApiError(404, "not_found", f"no checkpoint {cid!r}")
    return Response(status_code=204)


@router.post(f"{V1}/checkpoints/{{cid}}/share", status_code=204, responses=_ERRORS)
async def share_checkpoint(cid: CheckpointId, tenant: Tenant, svc: Svc) -> Response:
    """Write a held checkpoint to the nodes' shared folder: a restore of its id on any node
    of the tenant then finds it there (docs/service.md, Scaling out)."""
    shared = svc.shared()
    cp = svc.table.checkpoint(tenant.name, cid)
    if cp is None:
        raise ApiError(404, "not_found", f"no checkpoint {cid!r} held on this node")
    await svc.blocking(svc.keeper.share_checkpoint, tenant.name, cid, cp, shared,
                       tenant=tenant.name)
    return Response(status_code=204)


# ---- files --------------------------------------------------------------------------------
@router.get(f"{V1}/sessions/{{sid}}/files", responses=_ERRORS)
async def read_file(sid: SessionId, path: GuestPathQuery, tenant: Tenant, svc: Svc,
                    max_bytes: Annotated[int | None, Query(ge=0)] = None) -> Response:
    """A file of the session, refused (413) before it is read when it is larger than the
    server's response cap or ``max_bytes``."""
    s = await svc.session_of(tenant, sid)
    cap = svc.config.max_body_bytes if max_bytes is None else min(max_bytes,
                                                                   svc.config.max_body_bytes)
    data = await svc.blocking(svc.on(s, lambda sb: sb.read_file(path, max_bytes=cap)),
                              tenant=tenant.name)
    return Response(data, media_type="application/octet-stream")


@router.get(f"{V1}/sessions/{{sid}}/files/list", responses=_ERRORS)
async def list_files(sid: SessionId, tenant: Tenant, svc: Svc,
                     path: GuestPathQuery = "/tmp",
                     limit: Annotated[int, Query(ge=1, le=100_000)] = 10_000) -> FileList:
    s = await svc.session_of(tenant, sid)

    def listing(sb: SandboxAPI[Any]) -> list[GuestFile]:
        lister = getattr(sb, "list_files", None)  # a Sandbox's, a worker's, a slab's
        if lister is None:
            raise SandboxError(f"the {svc.backend().name} backend cannot list files")
        found: list[GuestFile] = lister(path, limit=limit)
        return found

    found: list[GuestFile] = await svc.blocking(svc.on(s, listing), tenant=tenant.name)
    return FileList(files=[FileOut(name=f.name, path=f.path, kind=f.kind, size=f.size)
                           for f in found])


@router.put(f"{V1}/sessions/{{sid}}/files", status_code=204, responses=_ERRORS)
async def write_file(sid: SessionId, request: Request, path: GuestPathQuery,
                     tenant: Tenant, svc: Svc) -> Response:
    s = await svc.session_of(tenant, sid)
    data = await request.body()
    await svc.blocking(svc.on(s, lambda sb: sb.write_file(path, data)), tenant=tenant.name)
    return Response(status_code=204)


# ---- turns over a WebSocket ---------------------------------------------------------------
@router.websocket(f"{V1}/sessions/{{sid}}/turns")
async def turns(ws: WebSocket, sid: str) -> None:
    """``/run`` without HTTP's cost per turn: msgpack ``["run", {code, timeout?, filename?}]``
    in, ``["result", <the body of /run>]`` or ``["error", status, <error body>]`` out, one
    turn at a time. The key is checked again on every message, as on every request."""
    svc: Service = ws.app.state.service
    key = _key_of(ws.headers)
    tenant = svc.keys.lookup(key)
    if tenant is None or await svc.find(tenant, sid) is None:
        await ws.close(code=4401 if tenant is None else 4404)
        return
    if not svc.open_socket(tenant.name):  # past its share of the server's connections
        await ws.close(code=4429)
        return
    try:
        await ws.accept()
        watch = asyncio.ensure_future(_while_valid(_KeyWatch(svc, key, tenant.name), ws))
        try:
            while True:
                data = await ws.receive_bytes()
                await ws.send_bytes(await _turn_message(svc, key, sid, data))
        except (WebSocketDisconnect, RuntimeError, KeyError):
            pass  # a turn under way when its client left still ends, as on /run
        finally:
            watch.cancel()
    finally:
        svc.close_socket(tenant.name)


REVOKE_CHECK = 0.5
"""Seconds between two checks of an idle socket's key: a key rotated out of serve.toml (or
its tenant removed) closes every socket it opened within this; a frame in either direction
is checked as it passes (a door call is not sent, a message is not answered)."""


class _KeyWatch:
    """Whether an open socket's key still names its tenant, checked per frame: the key is
    looked up again (hashed and compared with every stored one) only when the tenants
    were read anew since the last check, else it costs a ``stat`` of serve.toml."""

    def __init__(self, svc: Service, key: str | None, tenant: str) -> None:
        self.svc, self.key, self.tenant = svc, key, tenant
        self.seen = svc.keys.generation()  # read before the lookup: a change after is seen
        found = svc.keys.lookup(key)
        self.valid = found is not None and found.name == tenant

    def still(self) -> bool:
        now = self.svc.keys.generation()
        if now != self.seen:
            found = self.svc.keys.lookup(self.key)
            self.seen, self.valid = now, found is not None and found.name == self.tenant
        return self.valid


async def _while_valid(keys: _KeyWatch, ws: WebSocket) -> None:
    """Close ``ws`` (4401) once its key no longer names its tenant: for a socket that sends
    nothing (every frame either way is checked as it passes)."""
    while True:
        await asyncio.sleep(REVOKE_CHECK)
        if not keys.still():
            with contextlib.suppress(Exception):
                await ws.close(code=4401)
            return


async def _turn_message(svc: Service, key: str | None, sid: str, data: bytes) -> bytes:
    try:
        tenant = svc.keys.lookup(key)
        if tenant is None:
            raise ApiError(401, "unauthorized", "the key of this connection is no longer valid")
        if len(data) > svc.config.max_body_bytes:
            raise too_large(svc.config.max_body_bytes)
        try:
            kind, fields = unpack_bounded(data, DecodeCost.for_bytes(len(data)))
            if kind != "run":
                raise ValueError(f"unknown message {kind!r}")
            body = RunIn.model_validate(fields)
        except ValidationError as exc:
            raise invalid_request(exc.errors()) from None
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise ApiError(422, "invalid_request", "a turn message is msgpack "
                           f"['run', {{code, timeout?, filename?}}]: {exc}") from None
        out: bytes = msgpack.packb(["result", await svc.run_turn(tenant, sid, body)],
                                   use_bin_type=True)
    except ApiError as exc:
        out = msgpack.packb(["error", exc.status, exc.body()], use_bin_type=True)
    except Exception as exc:
        # a part of the cluster restarting (the control actor the turn's slab needs, its
        # lease run out): an answer of the turn, as /run's 503, not a socket dropped
        away = actor_away(exc)
        if away is None:
            raise
        logging.getLogger("memex.service").warning("%s", away)
        out = msgpack.packb(["error", 503, ApiError(503, "unavailable", away).body()],
                            use_bin_type=True)
    return out


# ---- the door -----------------------------------------------------------------------------
@router.websocket(f"{V1}/sessions/{{sid}}/door")
async def door(ws: WebSocket, sid: str) -> None:
    svc: Service = ws.app.state.service
    key = _key_of(ws.headers)
    tenant = svc.keys.lookup(key)
    s = await svc.find(tenant, sid) if tenant is not None else None
    if s is None:
        await ws.close(code=4401 if tenant is None else 4404)
        return
    assert tenant is not None
    name = tenant.name
    if not svc.open_socket(name):  # past its share of the server's connections
        await ws.close(code=4429)
        return
    try:
        await _door(ws, svc, key, name, s)
    finally:
        svc.close_socket(name)


async def _door(ws: WebSocket, svc: Service, key: str | None, name: str, s: Session
                ) -> None:
    """The door socket of session ``s``, once admitted."""
    await ws.accept()
    keys = _KeyWatch(svc, key, name)

    async def send(frame: bytes) -> None:
        """A door call to the client, only while its key still names the tenant (checked
        for every frame), so a key rotated out gets not one more call, whatever the timer
        below has seen."""
        if not keys.still():
            with contextlib.suppress(Exception):
                await ws.close(code=4401)
            raise ConnectionError("the key of this door was rotated out")
        await ws.send_bytes(frame)

    token = s.door.attach(send, asyncio.get_running_loop())
    watch = asyncio.ensure_future(_while_valid(keys, ws))
    try:
        if not await s.door.joined(token):  # its calls would not reach this client yet
            with contextlib.suppress(Exception):
                await ws.close(code=1013)  # try again later
            return
        await ws.send_bytes(b"\x91\xa5ready")  # msgpack ["ready"]
        while True:
            data = await ws.receive_bytes()
            if watch.done() or not keys.still():  # what it sends is not answered
                with contextlib.suppress(Exception):
                    await ws.close(code=4401)
                break
            if not s.door.answer(data):
                await ws.close(code=1003)
                break
    except (WebSocketDisconnect, RuntimeError, KeyError):
        pass
    finally:
        watch.cancel()
        s.door.detach(token)
