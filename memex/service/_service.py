"""The state of one ``memex serve`` process and what its routes do with it: the tenants' keys,
the session table, the backend, the keeper of saves, the tenants' fair shares, the metrics,
and the operations a route hands to the bounded thread pool (``threads``, each tenant at
most its share: ``_shares``), so the event loop only moves bytes and waits, and a session's
door WebSocket keeps answering while its turn runs."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from ..backends import Backend, get_backend
from ..backends.internal import (
    ClientDoor,
    Ledger,
    ProcessSandbox,
    TenantQuota,
    limits_to_wire,
    result_to_wire,
)
from ..errors import MemexError
from ..host_tools import Egress, EgressRecord, ToolCallRecord, ToolHost
from ..runtime_wasm import (
    SANDBOX_LIMITS,
    Limits,
    Mount,
    OutputListener,
    Sandbox,
    SandboxAPI,
    TurnResult,
)
from ..runtime_wasm.internal import set_guest_nice
from ..serving import ConnectionGuard, PackageGate, Shares
from ._config import ServiceConfig, TenantConfig, service_keys
from ._durable import ServeKeeper, session_of_meta
from ._http import ApiError, translate
from ._metrics import Metrics
from ._models import CreateSession, RunIn, SessionOut
from ._sessions import QuotaExceeded, Session, SessionTable, new_checkpoint_id, new_session_id

__all__ = ["AUDIT", "Service"]

AUDIT = logging.getLogger("memex.service.audit")


def _default_backend(config: ServiceConfig, ledger: Ledger) -> Backend:
    if config.backend == "pool":
        # the rate is the Shares' (every backend's); the pool bounds the queue
        quotas = {t.name: TenantQuota(queued=t.queued) for t in config.tenants.values()}
        return get_backend("pool", workers=config.workers, warm=config.warm,
                           limits=Limits(timeout=config.warm_timeout),
                           preload=config.preload, quotas=quotas,
                           max_sandboxes=config.max_sandboxes, acquire_timeout=10.0,
                           ledger=ledger)  # its sandboxes in the tenants' accounts
    if config.backend == "subprocess":
        return get_backend("subprocess", workers=config.workers)
    return get_backend(config.backend)


class Service:
    """Everything a route of one app needs (``request.app.state.service``)."""

    RATE_HERE = True
    """A tenant's ``turns_per_second`` is admitted by this server's Shares (a cluster's
    fronts leave it to the control actor, which counts every front's turns)."""

    def __init__(self, config: ServiceConfig, backend: Backend | None = None) -> None:
        self.config = config
        self.keys = service_keys(config)
        # one ledger: every tenant's sessions, checkpoints, turns, threads, sockets and
        # package resolution and pool sandboxes in one account (backends/_ledger.py)
        tenant_threads = config.tenant_threads or max(4, config.threads // 4)
        self.ledger = Ledger(tenant_threads=tenant_threads)
        self.table: SessionTable[Session] = SessionTable(ledger=self.ledger)
        self.metrics = Metrics()
        self.shares = Shares(threads=config.threads, tenant_threads=tenant_threads,
                             running_turns=config.running_turns or None, ledger=self.ledger)
        self.streaming: set[asyncio.Future[None]] = set()  # streamed turns, held until done
        self.edge: ConnectionGuard | None = None  # the server's connections (set by serve)
        self.packages = PackageGate(ledger=self.ledger)  # tenants' guest packages: one
        # resolution each at most
        self._given = backend
        self._backend: Backend | None = None
        self.keeper = ServeKeeper(self.table, self.backend, make=session_of_meta,
                                  state_dir=config.state_dir,
                                  save_interval=config.save_interval,
                                  idle_evict=config.idle_evict, on_open=self.serve_door,
                                  log=AUDIT)

    # ---- life -----------------------------------------------------------------------------
    def backend(self) -> Backend:
        if self._backend is None:
            self._backend = self._given if self._given is not None else \
                _default_backend(self.config, self.ledger)
        return self._backend

    @property
    def ready(self) -> bool:
        return self._backend is not None and not self._backend.closed

    async def start(self) -> None:
        set_guest_nice(self.config.guest_nice)  # before the backend starts its workers
        await anyio.to_thread.run_sync(self.backend)
        loaded = await anyio.to_thread.run_sync(self.keeper.load)
        if loaded:
            AUDIT.info(json.dumps({"event": "restart", "sessions": loaded}))
        self.keeper.start()
        self._sweeper = asyncio.ensure_future(self._sweep())

    async def _sweep(self) -> None:
        """End the sessions whose own limits ended them (their quota freed within a second),
        and release the checkpoints of closed sessions once their time is out."""
        every = min(10.0, max(0.5, self.config.checkpoint_ttl / 4))
        last = time.monotonic()
        while True:
            await asyncio.sleep(1.0)
            await self.reap()
            if time.monotonic() - last >= every:
                last = time.monotonic()
                self.table.expire()

    async def reap(self, owner: str | None = None) -> None:
        """End every session (of ``owner``) that its limits ended, as a close would."""
        for s, why in self.table.ended(owner):
            await self.end(s, why)

    async def end(self, s: Session, why: str) -> None:
        """Take ``s`` out of the table and let go of all it holds; the audit says why."""
        if self.table.pop(s.tenant, s.id) is None:
            return  # someone else ended it
        if s.sandbox is not None:
            await self.blocking(s.sandbox.close, tenant=s.tenant)
        self.table.orphan_checkpoints(s.id, self.config.checkpoint_ttl)
        self.keeper.forget(s)
        self.release_door(s)
        AUDIT.info(json.dumps({"event": "close", "tenant": s.tenant, "session": s.id,
                               "turns": s.turns, "why": why}))

    async def stop(self) -> None:
        sweeper = getattr(self, "_sweeper", None)
        if sweeper is not None:
            sweeper.cancel()
        sessions = self.table.drain()
        saved, current = await anyio.to_thread.run_sync(self.keeper.stop, sessions)
        for s in sessions:
            if s.tools is not None:
                s.tools.close()  # idempotent: forks share their parent's host
        AUDIT.info(json.dumps({"event": "shutdown", "closed": len(sessions), "saved": saved,
                               "current": current}))
        await anyio.to_thread.run_sync(self.backend().close)

    # ---- helpers for routes -----------------------------------------------------------------
    async def blocking(self, fn: Callable[..., Any], *args: Any, tenant: str | None = None
                       ) -> Any:
        """``fn(*args)`` on the bounded pool, within ``tenant``'s share of its threads
        (waited for in the event loop: ``_shares``); a MemEx error becomes its typed
        answer."""
        try:
            if tenant is None:
                return await anyio.to_thread.run_sync(fn, *args, limiter=self.shares.pool)
            return await self.shares.run(tenant, fn, *args)
        except MemexError as exc:
            raise translate(exc) from exc

    @contextlib.asynccontextmanager
    async def admitted(self, s: Session, tenant: TenantConfig, *, turn: bool
                       ) -> AsyncIterator[None]:
        """The session's turn in line (its operations in the order they arrived) and, for a
        turn, a slot among the tenant's running turns; waited for here, in the event loop,
        never in a pool thread (a refusal is the API's 429)."""
        try:
            async with contextlib.AsyncExitStack() as stack:
                await stack.enter_async_context(self.shares.in_order(s.id, tenant.queued))
                if turn:
                    await stack.enter_async_context(self.shares.turn(
                        tenant.name, tenant.max_running, tenant.queued,
                        tenant.turns_per_second if self.RATE_HERE else None))
                yield
        except MemexError as exc:
            raise translate(exc) from exc

    async def ordered(self, s: Session, tenant: TenantConfig, fn: Callable[..., Any], *,
                      turn: bool = False) -> Any:
        """``fn`` on the session's sandbox once :meth:`admitted`."""
        async with self.admitted(s, tenant, turn=turn):
            return await self.blocking(self.on(s, fn), tenant=tenant.name)

    def on(self, s: Session, fn: Callable[[SandboxAPI[Any]], Any]) -> Callable[[], Any]:
        """``fn(sandbox)`` with the session's sandbox, opened again if it was evicted."""
        def call() -> Any:
            with self.keeper.using(s) as sb:
                return fn(sb)
        return call

    def socket_share(self) -> int:
        """The WebSockets (door, turns) one tenant may hold open at once: ``tenant_sockets``,
        else a quarter of the server's connections (at least 8), so that one tenant's idle
        sockets cannot take the connections every other tenant needs."""
        if self.config.tenant_sockets:
            return self.config.tenant_sockets
        total = self.edge.max_connections if self.edge is not None else \
            self.config.edge.connections()
        return max(8, total // 4)

    def open_socket(self, tenant: str) -> bool:
        """Count one more open socket of ``tenant``; False (nothing counted) past its share.
        On the event loop only, as the matching :meth:`close_socket`."""
        acct = self.ledger.account(tenant)
        if acct.sockets >= self.socket_share():
            return False
        acct.sockets += 1
        return True

    def close_socket(self, tenant: str) -> None:
        self.ledger.account(tenant).sockets -= 1

    async def find(self, tenant: TenantConfig, sid: str) -> Session | None:
        """The tenant's session ``sid``, or None (another tenant's is None too)."""
        return self.table.get(tenant.name, sid)

    async def listed(self, tenant: TenantConfig) -> list[Session]:
        await self.reap(tenant.name)  # sessions its limits ended hold no quota, to the second
        return self.table.of(tenant.name)

    async def observe(self) -> None:
        """Bring /metrics' gauges of what lies beyond this process up to date (a
        cluster's)."""

    async def session_counts(self) -> dict[str, int]:
        """Live sessions per tenant (for /metrics)."""
        return self.table.counts()

    async def session_of(self, tenant: TenantConfig, sid: str) -> Session:
        s = await self.find(tenant, sid)
        if s is None:
            raise ApiError(404, "not_found", f"no session {sid!r}")
        why = s.why_ended()  # this session only: a lookup is on every request's path
        if why is not None:  # ended by its limits: the sweep frees it within a second
            raise ApiError(404, "not_found", f"no session {sid!r}: {why}")
        return s  # last_used moves with uses of its sandbox (Keeper.using), not lookups

    # ---- checkpoints --------------------------------------------------------------------------
    async def take_checkpoint(self, s: Session, tenant: TenantConfig) -> str:
        """A checkpoint of the session held for the tenant; its id."""
        cp = await self.ordered(s, tenant, lambda sb: sb.checkpoint())
        try:
            return self.table.hold(tenant.name, tenant.bounds(), cp, new_checkpoint_id(),
                                   session=s.id)
        except QuotaExceeded as exc:
            close = getattr(cp, "close", None)
            if callable(close):
                close()
            raise translate(exc) from None

    async def restore_checkpoint(self, s: Session, tenant: TenantConfig, cid: str) -> None:
        """The session back to the tenant's checkpoint ``cid`` (held here, or shared by
        another node)."""
        def put_back(sb: SandboxAPI[Any]) -> None:
            cp = self.table.checkpoint(tenant.name, cid)
            if cp is None:  # one another node shared, read on first use and held here
                cp = self.keeper.shared_checkpoint(tenant.name, cid, self.config.shared_dir,
                                                   max_memory=s.limits.memory)
                if cp is None:
                    raise ApiError(404, "not_found", f"no checkpoint {cid!r} (unknown, "
                                   "released, or past the tenant's max_checkpoints)")
                self.table.hold(tenant.name, tenant.bounds(), cp, cid)
            sb.restore(cp)
            self.keeper.changed(s)

        try:
            await self.ordered(s, tenant, put_back)
        except QuotaExceeded as exc:
            raise translate(exc) from None

    async def drop_checkpoint(self, tenant: TenantConfig, cid: str) -> bool:
        """Release the tenant's checkpoint ``cid`` (and its shared copy); whether there was
        one."""
        held = self.table.drop_checkpoint(tenant.name, cid)
        shared = await self.blocking(self.keeper.unshare_checkpoint, tenant.name, cid,
                                     self.config.shared_dir, tenant=tenant.name)
        return bool(held or shared)

    def shared(self) -> Path:
        if self.config.shared_dir is None:
            raise ApiError(409, "not_configured", "this server has no shared_dir to move "
                           "sessions between nodes through (docs/service.md)")
        return self.config.shared_dir

    @staticmethod
    def out(s: Session) -> SessionOut:
        return SessionOut(**s.info(), limits=limits_to_wire(s.limits))

    def serve_door(self, s: Session, sb: SandboxAPI[Any]) -> None:
        """What the server itself answers on the session's door: the tenant's egress policy
        and its operator tools (the client can stand in for neither)."""
        tenant = self.keys.principals().get(s.tenant)
        if tenant is None:
            return
        self.serve_egress(s, sb, tenant)
        self.serve_tools(s, tenant)

    def serve_tools(self, s: Session, tenant: TenantConfig) -> None:
        """The tenant's operator tools on the session's door; each call is audited."""
        if tenant.tools is None or s.tools is not None:
            return
        def record(rec: ToolCallRecord) -> None:
            AUDIT.info(json.dumps({"event": "tool", "tenant": s.tenant, "session": s.id,
                                   "tool": rec.tool, "outcome": rec.outcome,
                                   "seconds": round(rec.duration, 4)}))
        s.tools = ToolHost(tenant.tools, on_call=record)
        s.tools.register(s.door)
        s.door.serve_tools(tenant.tools.names)

    def release_door(self, s: Session) -> None:
        """Stop the session's operator-tool host once no session in the table shares its
        door (a fork shares its parent's)."""
        if s.tools is not None and not any(o.door is s.door for o in self.table.all()):
            s.tools.close()

    def serve_egress(self, s: Session, sb: SandboxAPI[Any], tenant: TenantConfig) -> None:
        """The tenant's egress policy on the session's door (server-side: the client cannot
        stand in for it); its decisions go to the audit log."""
        if tenant.egress is None:
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

    # ---- sessions ---------------------------------------------------------------------------
    def make_session(self, tenant: TenantConfig, body: CreateSession) -> Session:
        """A new session within the tenant's ceiling, grants and quotas (blocking)."""
        limits, mounts = self.granted(tenant, body)
        pins = self.packages.pins(tenant.name, tenant.packages, body.packages,
                                  max_bytes=limits.disk_bytes)
        try:
            self.table.reserve(tenant.name, tenant.bounds(), limits)
        except QuotaExceeded as exc:
            raise translate(exc) from None
        try:
            door = ClientDoor()
            sb = self.backend().open(limits=limits, mounts=mounts, preload=body.preload,
                                     door=door, env=body.env, tenant=tenant.name,
                                     packages=pins)
            s = Session(id=new_session_id(), owner=tenant.name, sandbox=sb, door=door,
                        limits=limits, mounts=tuple(mounts), preload=tuple(body.preload),
                        env=body.env, packages=pins)
            try:
                self.serve_door(s, sb)
                if s.tools is not None:  # the guest's module ``tools``, kept under the client's
                    s.tools.install(sb, pin=True)
                    s.turn_base -= 1  # that cell is not one of the client's turns
            except MemexError:
                sb.close()
                raise
            self.table.add(s)
            self.keeper.added(s)  # its row at once, saved (when durable) as it changes
        finally:
            self.table.release(tenant.name, limits)
        AUDIT.info(json.dumps({"event": "create", "tenant": tenant.name, "session": s.id,
                               "memory": limits.memory, "timeout": limits.timeout,
                               "mounts": [str(m.host_path) for m in mounts]}))
        return s

    def granted(self, tenant: TenantConfig, body: CreateSession) -> tuple[Limits, list[Mount]]:
        """What a create asks for, as the tenant may have it: its limits (unset fields: the
        service's defaults, the warm sandboxes' timeout, within the tenant's ceiling) and
        its mounts, each one the tenant was granted (ConfigError otherwise)."""
        given = body.limits.model_dump(exclude_unset=True) if body.limits is not None else {}
        limits = tenant.limits(given, dataclasses.replace(SANDBOX_LIMITS,
                                                          timeout=self.config.warm_timeout))
        mounts = []
        for m in body.mounts:
            host = Path(m.host).resolve()
            tenant.check_mount(host, m.writable)
            mounts.append(Mount(host_path=host, guest_path=m.guest, writable=m.writable,
                                links=m.links))
        return limits, mounts

    def fork_of(self, s: Session, tenant: TenantConfig) -> Callable[[SandboxAPI[Any]], Session]:
        forks = self.forks_of(s, tenant, 1)
        return lambda sb: forks(sb)[0]

    def forks_of(self, s: Session, tenant: TenantConfig, n: int
                 ) -> Callable[[SandboxAPI[Any]], list[Session]]:
        """``n`` forks of ``s``, all or none: the quota is reserved for all of them first,
        then one ``fork_many`` makes them (which keeps none when one fails)."""
        def forks(sb: SandboxAPI[Any]) -> list[Session]:
            held = 0
            try:
                for _ in range(n):
                    self.table.reserve(tenant.name, tenant.bounds(), s.limits)
                    held += 1
                made: list[Session] = []
                for child in sb.fork_many(n):  # their door is the parent's
                    c = Session(id=new_session_id(), owner=tenant.name, sandbox=child,
                                door=s.door, parent=s.id, limits=s.limits, mounts=s.mounts,
                                preload=s.preload, env=s.env, packages=s.packages,
                                turn_base=s.turns - child.turns,
                                egress=s.egress, tools=s.tools)
                    self.table.add(c)
                    self.keeper.added(c)
                    made.append(c)
                return made
            finally:
                for _ in range(held):
                    self.table.release(tenant.name, s.limits)
        return forks

    # ---- turns ------------------------------------------------------------------------------
    def turn_of(self, s: Session, tenant: TenantConfig, body: RunIn,
                emit: OutputListener | None = None) -> Callable[[SandboxAPI[Any]], TurnResult]:
        """One turn of ``body`` in the session, within the tenant's ``max_running``;
        ``emit(stream, text)`` hears its output as it is written."""
        def turn(sb: SandboxAPI[Any]) -> TurnResult:
            self.keeper.turn_begins(s)
            try:
                return _run(sb, body, emit)
            finally:
                self.keeper.changed(s)
        return turn

    async def run_turn(self, tenant: TenantConfig, sid: str, body: RunIn) -> dict[str, Any]:
        """One turn of ``body`` in the tenant's session ``sid``: the body of ``/run``'s
        answer (the turns socket sends the same)."""
        s = await self.session_of(tenant, sid)
        r: TurnResult = await self.ordered(s, tenant, self.turn_of(s, tenant, body), turn=True)
        return self.answer_of(s, tenant, body, r)

    def answer_of(self, s: Session, tenant: TenantConfig, body: RunIn, r: TurnResult
                  ) -> dict[str, Any]:
        """The body of a turn's answer; counted and audited."""
        self.metrics.turn(tenant.name, r)
        if AUDIT.isEnabledFor(logging.INFO):  # one line per turn: built only when kept
            event: dict[str, Any] = {"event": "run", "tenant": tenant.name, "session": s.id,
                                     "status": r.status.value, "limit": r.limit,
                                     "seconds": round(r.duration, 4),
                                     "code_bytes": len(body.code)}
            if self.config.log_code:
                event["code"] = body.code
            AUDIT.info(json.dumps(event))
        answer: dict[str, Any] = {"result": result_to_wire(r), "turns": s.turns}
        if s.notice is not None:  # said once, on the first answer after a restore
            answer["restored"], s.notice = s.notice, None
        return answer


def _run(sb: SandboxAPI[Any], body: RunIn, emit: OutputListener | None) -> TurnResult:
    if emit is None:
        return sb.run(body.code, timeout=body.timeout, filename=body.filename)
    if isinstance(sb, Sandbox | ProcessSandbox):  # they hear output as it is written
        return sb.run(body.code, timeout=body.timeout, filename=body.filename, on_output=emit)
    r = sb.run(body.code, timeout=body.timeout, filename=body.filename)
    for stream, text in (("stdout", r.stdout), ("stderr", r.stderr)):
        if text:
            emit(stream, text)  # a backend that cannot stream: all of it at the end
    return r
