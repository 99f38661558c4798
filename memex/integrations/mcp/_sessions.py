"""The sandboxes behind ``memex mcp``: one per session, created on first use, closed after an
idle timeout, on ``reset`` or when the server stops. Sessions, their named checkpoints, the
bounds that admit them and the order of their calls are the session core's
(``memex.serving``: the table and fair shares ``memex serve`` uses too); this module adds what
MCP means by a session.

A session is named by a random handle. Calls that name none use their connection's default
session: the stdio process has one, a streamable-HTTP client on a handshake-era protocol has
one per ``Mcp-Session-Id``; a client on the stateless protocol (2026-07-28) gets a new session
and is told its handle, which it passes back to keep its state. A handle is bound to the
principal that made it (its bearer token, or the stdio process), so another principal cannot
use it even if it learns it. Two sessions never share a guest.

Per principal: at most ``max_sessions_per_token`` sessions, ``max_memory_per_token`` bytes of
session memory and checkpoints, its fair share of the server's ``running_cells`` (at most
``max_running_per_token``) running at once and ``queued`` calls waiting, unless its
``[principals.NAME]`` table sets its own bounds (the schema of serve's tenants:
``memex.serving.PrincipalTable``); per session, calls one at a time in the order they
arrived.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import anyio

from ...backends.internal import Ledger
from ...errors import ConfigError, MemexError, SandboxLost
from ...host_tools import Egress, EgressPolicy, ToolHost, ToolSet
from ...runtime_wasm import (
    Checkpoint,
    Door,
    GuestFile,
    Limits,
    Mount,
    OutputListener,
    Sandbox,
    SandboxAPI,
    TurnResult,
    TurnStatus,
)
from ...runtime_wasm.internal import script_dependencies, set_guest_nice
from ...serving import (
    DurableSession,
    Keeper,
    PackageGate,
    QuotaExceeded,
    SessionTable,
    Shares,
    allowed_packages,
    session_fields,
)
from .._display import FIGURES_CALL, MAX_FIGURES, PRELUDE
from ._config import McpConfig, Own

__all__ = ["Session", "SessionError", "Sessions"]

LOG = logging.getLogger("memex.mcp")

T = TypeVar("T")
MAX_FIGURE_BYTES = 8 << 20
THREADS = 40
"""Worker threads of one server (anyio's default); a principal uses at most a quarter."""


def _no_backend() -> Any:
    raise RuntimeError("memex mcp opens its sandboxes itself (the keeper's opener)")


class SessionError(MemexError):
    """A call that names a session it cannot use, or asks for more than the bounds allow:
    answered as a tool error (the model can correct it), never a server fault."""


@dataclass(kw_only=True, eq=False)
class Session(DurableSession):
    """One MCP session (``owner``: its principal) on the core's record."""

    host: ToolHost | None = None
    egress: Egress | None = None
    names: dict[str, str] = field(default_factory=dict)  # checkpoint name -> the core's id
    figures: list[bytes] = field(default_factory=list)
    pyplot: bool = False
    calls: int = 0
    ended: bool = False
    started_over: str | None = None  # said on the next answer: new packages, a fresh guest


class Sessions:
    """Every session of one server (thread-safe; :meth:`call` runs on the server's event
    loop)."""

    def __init__(self, config: McpConfig, tools: ToolSet | None = None) -> None:
        self.config = config
        cfg = config.sessions
        self._limits: Limits = config.limits.limits()
        base = config.resolve(".")
        self._mounts: list[Mount] = [m.mount(base) for m in config.mounts]
        self._preload = tuple(config.preload)
        self._allowed = allowed_packages(config.packages, "packages")
        # one ledger: each principal's sessions, checkpoints, cells, threads and package
        # resolution in one account (memex.backends' Ledger)
        self.ledger = Ledger(tenant_threads=max(4, THREADS // 4))
        self.gate = PackageGate(ledger=self.ledger)  # cells' PEP 723 dependencies
        self._policy = EgressPolicy.load(config.resolve(config.policy)) if config.policy \
            else None
        self.tools = tools if tools is not None and len(tools) else None
        self._anyone = config.own(None)
        self.bounds = self._anyone.bounds
        self._own = {name: config.own(name) for name in config.principals}
        self.table: SessionTable[Session] = SessionTable(capacity=cfg.total_sessions,
                                                         ledger=self.ledger)
        self.shares = Shares(threads=THREADS, tenant_threads=max(4, THREADS // 4),
                             running_turns=cfg.running_cells, ledger=self.ledger)
        set_guest_nice(cfg.guest_nice)  # its guests below its protocol's threads
        self._defaults: dict[str, str] = {}  # connection key -> its default session's id
        # session put away in the store -> (its principal, when), oldest first
        self._away: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._stop = threading.Event()
        state_dir = config.resolve(cfg.state_dir) if cfg.state_dir else None
        self.keeper: Keeper[Session] = Keeper(
            self.table, _no_backend, make=self._from_meta, state_dir=state_dir,
            save_interval=cfg.save_interval, idle_evict=None, on_open=self._prepare,
            opener=self._new_sandbox, log=LOG)
        self.restored = self.keeper.load()  # saved sessions, opened on their first call
        self.keeper.start()
        self._sweeper = threading.Thread(target=self._sweep, name="memex-mcp-sessions",
                                         daemon=True)
        self._sweeper.start()

    # ---- a principal's bounds -------------------------------------------------------------
    def reconfigure(self, config: McpConfig) -> list[str]:
        """Take the principals and bounds of ``config`` (SIGHUP): each principal's table,
        [sessions]' per-token bounds and [limits], for the next session, turn or checkpoint
        (sessions already open keep their limits). Returns what else differs, which needs
        a restart."""
        own = {name: config.own(name) for name in config.principals}
        anyone = config.own(None)
        with self._lock:
            self._own, self._anyone, self.bounds = own, anyone, anyone.bounds
        applied = {"principals", "limits", "sessions"}
        old, new = self.config.model_dump(), config.model_dump()
        rest = [k for k in new if k not in applied and new[k] != old.get(k)]
        per_token = {"max_sessions_per_token", "max_memory_per_token",
                     "max_running_per_token", "queued", "max_checkpoints"}
        rest += [f"sessions.{k}" for k, v in new["sessions"].items()
                 if k not in per_token and v != old["sessions"].get(k)]
        self.config = self.config.model_copy(update={
            "principals": config.principals, "limits": config.limits,
            "sessions": self.config.sessions.model_copy(
                update={k: getattr(config.sessions, k) for k in per_token})})
        return rest

    def own(self, owner: str) -> Own:
        """What ``owner`` may hold and use: its [principals.NAME] table's, else the
        per-token bounds every principal gets."""
        return self._own.get(owner, self._anyone)

    # ---- finding a session --------------------------------------------------------------
    def existing(self, session_id: str | None, *, key: str | None, owner: str
                 ) -> Session | None:
        """The session a call means when it is in the table already (the named one, else
        the connection's default), else None: :meth:`resolve`'s fast path, which touches
        nothing but the table (the event loop may call it)."""
        with self._lock:
            if session_id:
                return self.table.get(owner, session_id)
            if key is not None and key in self._defaults:
                return self.table.get(owner, self._defaults[key])
            return None

    def resolve(self, session_id: str | None, *, key: str | None, owner: str) -> Session:
        """The session a call means: the one named (it must be ``owner``'s: in the table,
        or put away in the store to make room, then brought back), else the connection's
        default (``key``), else a new one (within the bounds). A principal at its own
        ``max_sessions_per_token`` has its least recently used idle session put away for
        the new one (saved first when the server keeps state, else ended), and a server
        full of one principal's sessions makes room for another the same way
        (``SessionTable.victim``): no principal is refused a session while another holds
        idle ones past its share. It may save a session and read the store: call it off the
        event loop (the server runs it within the principal's share of the threads)."""
        victim: Session | None = None
        for _ in range(2):
            if victim is not None:
                self._put_away(victim)
            with self._lock:
                if self._closed:
                    raise SessionError("the server is shutting down")
                wanted = session_id
                if wanted:
                    s = self.table.get(owner, wanted)
                    if s is not None:
                        return s
                    back = self.keeper.saved(owner, wanted)
                    if back is None:
                        raise SessionError(f"no session {wanted[:40]!r} (it ended, expired "
                                           "after being idle, or belongs to someone else); "
                                           "call without a session to start a new one")
                elif key is not None and key in self._defaults:
                    found = self.table.get(owner, self._defaults[key])
                    if found is not None:
                        return found
                    back = self.keeper.saved(owner, self._defaults[key])
                else:
                    back = None
                try:
                    own = self.own(owner)
                    with self.table.reserved(owner, own.bounds, own.limits):
                        if back is not None:
                            self._away.pop(back.id, None)
                        s = back if back is not None else self._wired(Session(
                            id=secrets.token_urlsafe(16), owner=owner, limits=own.limits,
                            door=Door(), mounts=tuple(self._mounts), preload=self._preload,
                            fresh=True))
                        self.table.add(s)
                except QuotaExceeded as exc:
                    victim = self.table.victim(owner, own.bounds)
                    if victim is None:
                        raise SessionError(f"{exc} (pass the session of an earlier call)"
                                           ) from None
                    continue
                if back is None:
                    self.keeper.added(s)  # its row at once, when the server keeps state
                    if key is not None:
                        self._defaults[key] = s.id
                return s
        raise SessionError("no room for a session: the sessions that made room were taken "
                           "first; try again")

    def _put_away(self, s: Session) -> None:
        """Take an idle session out of the table for another: saved first and kept in the
        store when the server keeps state (a call naming it brings it back), else ended.
        Its guest and held checkpoints are released either way."""
        if not self.keeper.durable:
            LOG.info(json.dumps({"event": "session_ended_for_room", "session": s.id}))
            self.end(s)
            return
        self.keeper.save(s, wait=self._limits.timeout + 30)
        with self._lock:
            if self.table.pop(s.owner, s.id) is None:
                return  # ended meanwhile
        with contextlib.suppress(SessionError):
            self._close_guest(s)
        self.table.orphan_checkpoints(s.id, 0)
        s.names.clear()
        with self._lock:
            self._away[s.id] = (s.owner, time.time())
            # a principal keeps at most its session bound of them in the store too: one
            # that keeps making sessions cannot fill the disk with put-away ones
            mine = [sid for sid, (who, _) in self._away.items() if who == s.owner]
            over = mine[:max(0, len(mine) - (self.own(s.owner).bounds.max_sessions or
                                             self.config.sessions.total_sessions))]
            for sid in over:
                del self._away[sid]
        for sid in over:
            with contextlib.suppress(Exception):
                self.keeper.store().forget(sid)
        LOG.info(json.dumps({"event": "session_put_away", "session": s.id,
                             "turns": s.saved_turns}))

    def __len__(self) -> int:
        return len(self.table)

    async def call(self, s: Session, fn: Callable[[], T], *, turn: bool = False,
                   on_cancel: Callable[[], None] | None = None) -> T:
        """``fn()`` on a worker thread once admitted (in the event loop, holding no thread):
        after the session's earlier calls (its calls run in the order they arrived), for a
        cell within its principal's running cells, and within its principal's share of the
        threads. If the call is cancelled (its client went away), ``on_cancel()`` stops the
        guest's work and the call ends at once."""
        cfg, own = self.config.sessions, self.own(s.owner)
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(self.shares.in_order(s.id, cfg.queued))
            if turn:
                await stack.enter_async_context(
                    self.shares.turn(s.owner, own.running, own.queued, own.rate))
            try:
                return await self.shares.run(s.owner, fn, abandon_on_cancel=True)
            except anyio.get_cancelled_exc_class():
                if on_cancel is not None:
                    on_cancel()
                raise

    # ---- the sandbox ----------------------------------------------------------------------
    def _wired(self, s: Session) -> Session:
        """The session with its door's display calls answered (its figures)."""
        s.door.register("display.figure", lambda png: self._figure(s, png), inline=True)
        s.door.register("display.pyplot", lambda: setattr(s, "pyplot", True), inline=True)
        return s

    def _from_meta(self, meta: dict[str, Any]) -> Session:
        """A saved session, listed again after a restart (opened on its first call)."""
        return self._wired(Session(**session_fields(meta), door=Door()))

    def _new_sandbox(self, s: Session) -> Sandbox:
        """(the keeper's opener, under s.lock) A sandbox for the session."""
        if s.ended:
            raise SessionError(f"session {s.id[:40]!r} ended")
        return Sandbox(limits=s.limits, mounts=s.mounts, preload=s.preload, door=s.door,
                       rollback=self.config.sessions.rollback,
                       packages=list(s.packages) or None)

    def _prepare(self, s: Session, sb: SandboxAPI[Any]) -> None:
        """(the keeper's on_open) The operator's tools and egress on a sandbox just opened,
        and the display prelude in an empty guest (a guest brought back holds it)."""
        assert isinstance(sb, Sandbox)
        if self.tools is not None:
            s.host = ToolHost(self.tools).attach(sb)
        if self._policy is not None:
            s.egress = Egress(self._policy, label=f"mcp-{s.id[:8]}").attach(sb)
        if sb.turns == 0:
            r = sb.run(PRELUDE, filename="<memex-display-prelude>")
            if r.status is not TurnStatus.OK:
                raise SessionError(f"the session's guest could not be prepared: {r.exception}")
            s.pyplot = False

    def _figure(self, s: Session, png: object) -> None:
        if isinstance(png, bytes) and len(png) <= MAX_FIGURE_BYTES and \
                len(s.figures) < MAX_FIGURES:
            s.figures.append(png)

    def use(self, s: Session, fn: Callable[[Sandbox], Any], *, changes: bool = True) -> Any:
        """``fn(sandbox)`` for the session (blocking; :meth:`call` orders the calls): its
        sandbox opened first when it has none (new, reset, or saved before a restart);
        ``changes``: the call may change the guest (the keeper saves it)."""
        if s.ended:
            raise SessionError(f"session {s.id[:40]!r} ended")
        try:
            with self.keeper.using(s) as sb:
                assert isinstance(sb, Sandbox)
                return fn(sb)
        except SandboxLost as exc:
            raise SessionError(f"session {s.id[:40]!r} cannot be brought back: {exc}") \
                from None
        finally:
            s.calls += 1
            if changes:
                self.keeper.changed(s)

    def run(self, s: Session, code: str, timeout: float | None,
            on_output: OutputListener | None = None) -> tuple[TurnResult, list[bytes]]:
        """A cell, and the PNGs of the figures it left open (rendered, then closed). A cell
        whose PEP 723 block needs packages the session lacks starts the session over with
        them (said in ``started_over``): a live guest cannot gain a folder. ``on_output``
        hears the cell's output as it is written (``Sandbox.run``)."""
        self._packages_for(s, code)
        def go(sb: Sandbox) -> tuple[TurnResult, list[bytes]]:
            s.figures = []
            self.keeper.turn_begins(s)
            r = sb.run(code, timeout=timeout, on_output=on_output)
            if s.pyplot and r.status is not TurnStatus.KILLED:
                sb.run(FIGURES_CALL, filename="<memex-figures>")
            return r, list(s.figures)

        result: tuple[TurnResult, list[bytes]] = self.use(s, go)
        return result

    def _packages_for(self, s: Session, code: str) -> None:
        try:
            deps = script_dependencies(code)
        except ConfigError as exc:
            raise SessionError(str(exc)) from None
        if not deps:
            return
        pins = self.gate.pins(s.owner, self._allowed, deps)
        if set(pins) <= set(s.packages):
            return
        by_name = {p.split("==")[0]: p for p in (*s.packages, *pins)}  # the new pin wins
        had = bool(s.calls) or not s.fresh
        s.packages = tuple(sorted(by_name.values()))
        self.reset(s)  # a fresh guest with them (its row saved with them)
        if had:
            added = ", ".join(p.split(" ")[0] for p in pins)  # without their hashes
            s.started_over = (f"the session started over to add {added}: a fresh "
                              "interpreter and an empty /tmp (its earlier variables are gone)")

    def interrupt(self, s: Session) -> None:
        """Stop the session's running cell (its client went away)."""
        sb = s.sandbox
        if isinstance(sb, Sandbox):
            sb.interrupt()

    def reset(self, s: Session) -> None:
        """A fresh guest for the session (its named checkpoints stay restorable)."""
        self._close_guest(s)
        s.fresh, s.turn_base, s.saved_turns, s.notice = True, 0, None, None
        self.keeper.added(s)  # its saved image is gone with it

    def files(self, s: Session, path: str) -> list[GuestFile]:
        files: list[GuestFile] = self.use(s, lambda sb: sb.list_files(path), changes=False)
        return files

    def checkpoint(self, s: Session, name: str) -> Checkpoint:
        """The session's state under ``name``, held by the core: its size counts against
        the principal's ``max_memory_per_token`` (refused past it, the old one kept)."""
        def take(sb: Sandbox) -> Checkpoint:
            if name not in s.names and len(s.names) >= self.config.sessions.max_checkpoints:
                raise SessionError(f"this session holds its maximum of "
                                   f"{self.config.sessions.max_checkpoints} checkpoints "
                                   f"({', '.join(sorted(s.names))}); reuse a name")
            cp = sb.checkpoint()
            cid = f"{s.id}/{name}"
            try:
                self.table.hold(s.owner, self.own(s.owner).bounds, cp, cid, session=s.id)
            except QuotaExceeded as exc:
                raise SessionError(f"checkpoint {name!r} not kept: {exc}") from None
            s.names[name] = cid
            return cp

        cp: Checkpoint = self.use(s, take, changes=False)
        return cp

    def restore(self, s: Session, name: str) -> Checkpoint:
        def back(sb: Sandbox) -> Checkpoint:
            cid = s.names.get(name)
            cp = self.table.checkpoint(s.owner, cid) if cid is not None else None
            if cp is None:
                s.names.pop(name, None)
                known = ", ".join(sorted(s.names)) or "none yet"
                raise SessionError(f"no checkpoint {name!r} in this session ({known})")
            sb.restore(cp)
            return cast(Checkpoint, cp)

        cp: Checkpoint = self.use(s, back)
        return cp

    def has_checkpoint(self, s: Session, name: str) -> bool:
        return name in s.names

    # ---- ending -------------------------------------------------------------------------
    def _close_guest(self, s: Session) -> None:
        """Close the session's guest once no call uses it (waiting for a running one to
        end: it was interrupted, or is within its time limit)."""
        with s.alone(self._limits.timeout + 30) as alone:
            if not alone:
                raise SessionError("the session stayed in use; try again")
            if s.host is not None:
                s.host.close()
            if s.egress is not None:
                s.egress.detach()
            if s.sandbox is not None:
                s.sandbox.close()
            s.sandbox = s.host = s.egress = None

    def end(self, s: Session) -> None:
        """End the session: out of the table (no new call finds it), its cell interrupted,
        its guest closed, its checkpoints released."""
        with self._lock:
            self.table.pop(s.owner, s.id)
            for k in [k for k, v in self._defaults.items() if v == s.id]:
                del self._defaults[k]
        s.ended = True
        self.interrupt(s)
        with contextlib.suppress(SessionError):
            self._close_guest(s)
        self.table.orphan_checkpoints(s.id, 0)
        s.names.clear()
        self.keeper.forget(s)

    def end_connection(self, key: str) -> bool:
        """End the default session of a connection that has ended (an HTTP client's DELETE
        of its Mcp-Session-Id); whether there was one."""
        with self._lock:
            sid = self._defaults.pop(key, None)
        s = next((x for x in self.table.all() if x.id == sid), None) if sid else None
        if s is None:
            return False
        self.end(s)
        return True

    def _sweep(self) -> None:
        """End the sessions idle past ``idle_timeout`` and those their own limits ended (a
        sandbox that closed itself), so neither holds a token's quota."""
        idle = self.config.sessions.idle_timeout
        while not self._stop.wait(min(5.0, idle / 4)):
            for s in self.table.idle(idle):
                self.end(s)
            for s, _why in self.table.ended():
                self.end(s)
            with self._lock:  # put away and not called for since: ended as idle ones are
                gone = [sid for sid, (_, at) in self._away.items()
                        if time.time() - at > idle]
                for sid in gone:
                    del self._away[sid]
            for sid in gone:
                with contextlib.suppress(Exception):
                    self.keeper.store().forget(sid)

    def close(self) -> None:
        """End every session; with a state_dir, save each first and keep it for the next
        start (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        if self.keeper.durable:
            sessions = self.table.all()
            for s in sessions:
                self.interrupt(s)
            saved, current = self.keeper.stop(sessions)  # saves, then closes the sandboxes
            for s in sessions:
                s.ended = True
                with contextlib.suppress(Exception):
                    if s.host is not None:
                        s.host.close()
                    if s.egress is not None:
                        s.egress.detach()
            LOG.info(json.dumps({"event": "shutdown", "sessions": len(sessions),
                                 "saved": saved, "current": current}))
        else:
            for s in self.table.all():
                self.end(s)
            self.keeper.stop([])
        self.table.drain()
        self._sweeper.join(5)
