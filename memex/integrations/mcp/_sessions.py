"""The sandboxes behind ``memex mcp``: one per session, created on first use, used by one call
at a time, closed after an idle timeout, on ``reset`` or when the server stops.

A session is named by a random handle. Calls that name none use their connection's default
session: the stdio process has one, a streamable-HTTP client on a handshake-era protocol has
one per ``Mcp-Session-Id``; a client on the stateless protocol (2026-07-28) gets a new session
and is told its handle, which it passes back to keep its state. A handle is bound to the
principal that made it (the bearer token, or the stdio process), so another principal cannot
use it even if it learns it. Two sessions never share a guest.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...host_tools import Egress, EgressPolicy, ToolHost, ToolSet
from ...runtime_wasm import (
    Checkpoint,
    Door,
    GuestFile,
    Limits,
    Mount,
    Sandbox,
    TurnResult,
    TurnStatus,
)
from .._display import FIGURES_CALL, MAX_FIGURES, PRELUDE
from ._config import McpConfig

__all__ = ["Session", "SessionError", "Sessions"]

MAX_FIGURE_BYTES = 8 << 20


class SessionError(Exception):
    """A call that names a session it cannot use, or asks for more than the bounds allow:
    answered as a tool error (the model can correct it), never a server fault."""


@dataclass(kw_only=True, eq=False)
class Session:
    id: str
    owner: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    order: asyncio.Lock = field(default_factory=asyncio.Lock)  # calls in arrival order
    last_used: float = field(default_factory=time.monotonic)
    sandbox: Sandbox | None = None
    host: ToolHost | None = None
    egress: Egress | None = None
    checkpoints: dict[str, Checkpoint] = field(default_factory=dict)
    figures: list[bytes] = field(default_factory=list)
    pyplot: bool = False
    calls: int = 0


class Sessions:
    """Every session of one server (thread-safe)."""

    def __init__(self, config: McpConfig, tools: ToolSet | None = None) -> None:
        self.config = config
        self._limits: Limits = config.limits.limits()
        base = config.resolve(".")
        self._mounts: list[Mount] = [m.mount(base) for m in config.mounts]
        self._preload = tuple(config.preload)
        self._policy = EgressPolicy.load(config.resolve(config.policy)) if config.policy \
            else None
        self.tools = tools if tools is not None and len(tools) else None
        self._by_id: dict[str, Session] = {}
        self._defaults: dict[str, str] = {}  # connection key -> its default session's id
        self._lock = threading.Lock()
        self._closed = False
        self._stop = threading.Event()
        self._sweeper = threading.Thread(target=self._sweep, name="memex-mcp-sessions",
                                         daemon=True)
        self._sweeper.start()

    # ---- finding a session --------------------------------------------------------------
    def resolve(self, session_id: str | None, *, key: str | None, owner: str) -> Session:
        """The session a call means: the one named (it must exist and be ``owner``'s), else
        the connection's default (``key``), else a new one."""
        with self._lock:
            if self._closed:
                raise SessionError("the server is shutting down")
            if session_id:
                s = self._by_id.get(session_id)
                if s is None or s.owner != owner:
                    raise SessionError(f"no session {session_id[:40]!r} (it ended, expired "
                                       "after being idle, or belongs to someone else); call "
                                       "without a session to start a new one")
                return s
            if key is not None and key in self._defaults:
                return self._by_id[self._defaults[key]]
            if len(self._by_id) >= self.config.sessions.max_sessions:
                raise SessionError(f"this server holds its maximum of "
                                   f"{self.config.sessions.max_sessions} sessions; pass the "
                                   "session of an earlier call, or retry later")
            s = Session(id=secrets.token_urlsafe(16), owner=owner)
            self._by_id[s.id] = s
            if key is not None:
                self._defaults[key] = s.id
            return s

    def __len__(self) -> int:
        return len(self._by_id)

    @staticmethod
    def order(s: Session) -> asyncio.Lock:
        """The session's calls, one at a time in the order they arrived (taken in the
        event loop: see ``_server._blocking``)."""
        return s.order

    # ---- the sandbox ----------------------------------------------------------------------
    def _sandbox(self, s: Session) -> Sandbox:
        """(with s.lock) The session's sandbox, created on first use or after a reset."""
        if s.sandbox is not None and not s.sandbox.closed:
            return s.sandbox
        door = Door()
        door.register("display.figure", lambda png: self._figure(s, png), inline=True)
        door.register("display.pyplot", lambda: setattr(s, "pyplot", True), inline=True)
        sb = Sandbox(limits=self._limits, mounts=self._mounts, preload=self._preload, door=door,
                     rollback=self.config.sessions.rollback)
        try:
            if self.tools is not None:
                s.host = ToolHost(self.tools).attach(sb)
            if self._policy is not None:
                s.egress = Egress(self._policy, label=f"mcp-{s.id[:8]}").attach(sb)
            r = sb.run(PRELUDE, filename="<memex-display-prelude>")
            if r.status is not TurnStatus.OK:
                raise SessionError(f"the session's guest could not be prepared: {r.exception}")
        except BaseException:
            sb.close()
            raise
        s.sandbox, s.pyplot = sb, False
        return sb

    def _figure(self, s: Session, png: Any) -> None:
        if isinstance(png, bytes) and len(png) <= MAX_FIGURE_BYTES and \
                len(s.figures) < MAX_FIGURES:
            s.figures.append(png)

    def use(self, s: Session, fn: Callable[[Sandbox], Any]) -> Any:
        """Run ``fn(sandbox)`` for the session, one call at a time."""
        with s.lock:
            if s.id not in self._by_id:
                raise SessionError(f"session {s.id[:40]!r} ended")
            try:
                return fn(self._sandbox(s))
            finally:
                s.last_used = time.monotonic()
                s.calls += 1

    def run(self, s: Session, code: str, timeout: float | None) -> tuple[TurnResult, list[bytes]]:
        """A cell, and the PNGs of the figures it left open (rendered, then closed)."""
        def go(sb: Sandbox) -> tuple[TurnResult, list[bytes]]:
            s.figures = []
            r = sb.run(code, timeout=timeout)
            if s.pyplot and r.status is not TurnStatus.KILLED:
                sb.run(FIGURES_CALL, filename="<memex-figures>")
            return r, list(s.figures)

        result: tuple[TurnResult, list[bytes]] = self.use(s, go)
        return result

    def interrupt(self, s: Session) -> None:
        """Stop the session's running cell (its client went away)."""
        sb = s.sandbox
        if sb is not None:
            sb.interrupt()

    def reset(self, s: Session) -> None:
        """A fresh guest for the session (its named checkpoints stay restorable)."""
        with s.lock:
            self._close_guest(s)

    def files(self, s: Session, path: str) -> list[GuestFile]:
        files: list[GuestFile] = self.use(s, lambda sb: sb.list_files(path))
        return files

    def checkpoint(self, s: Session, name: str) -> Checkpoint:
        def take(sb: Sandbox) -> Checkpoint:
            if name not in s.checkpoints and \
                    len(s.checkpoints) >= self.config.sessions.max_checkpoints:
                raise SessionError(f"this session holds its maximum of "
                                   f"{self.config.sessions.max_checkpoints} checkpoints "
                                   f"({', '.join(sorted(s.checkpoints))}); reuse a name")
            cp = sb.checkpoint()
            s.checkpoints[name] = cp
            return cp

        cp: Checkpoint = self.use(s, take)
        return cp

    def restore(self, s: Session, name: str) -> Checkpoint:
        def back(sb: Sandbox) -> Checkpoint:
            cp = s.checkpoints.get(name)
            if cp is None:
                known = ", ".join(sorted(s.checkpoints)) or "none yet"
                raise SessionError(f"no checkpoint {name!r} in this session ({known})")
            sb.restore(cp)
            return cp

        cp: Checkpoint = self.use(s, back)
        return cp

    # ---- ending -------------------------------------------------------------------------
    def _close_guest(self, s: Session) -> None:
        if s.host is not None:
            s.host.close()
        if s.egress is not None:
            s.egress.detach()
        if s.sandbox is not None:
            s.sandbox.close()
        s.sandbox = s.host = s.egress = None

    def end(self, s: Session) -> None:
        with self._lock:
            self._by_id.pop(s.id, None)
            for k in [k for k, v in self._defaults.items() if v == s.id]:
                del self._defaults[k]
        with s.lock:
            self._close_guest(s)
            s.checkpoints.clear()

    def end_connection(self, key: str) -> bool:
        """End the default session of a connection that has ended (an HTTP client's DELETE
        of its Mcp-Session-Id); whether there was one."""
        with self._lock:
            sid = self._defaults.pop(key, None)
            s = self._by_id.get(sid) if sid is not None else None
        if s is None:
            return False
        self.interrupt(s)
        self.end(s)
        return True

    def _sweep(self) -> None:
        idle = self.config.sessions.idle_timeout
        while not self._stop.wait(min(5.0, idle / 4)):
            now = time.monotonic()
            with self._lock:
                stale = [s for s in self._by_id.values()
                         if now - s.last_used > idle and not s.lock.locked()]
            for s in stale:
                self.end(s)

    def close(self) -> None:
        """End every session (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            sessions = list(self._by_id.values())
        self._stop.set()
        for s in sessions:
            self.interrupt(s)
            self.end(s)
        self._sweeper.join(5)
