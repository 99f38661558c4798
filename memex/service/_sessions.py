"""The server's sessions and checkpoints, each owned by one tenant: a lookup with another
tenant's name finds nothing (the API answers 404, the same as for an id that never existed)."""

from __future__ import annotations

import collections
import contextlib
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..runtime_wasm import Limits, Mount, SandboxAPI
from ._config import TenantConfig
from ._door import ClientDoor

__all__ = ["Session", "SessionTable"]


@dataclass(kw_only=True, eq=False)
class Session:
    """One session on the server: its sandbox (None while it is saved and evicted, or after a
    restart until its next use), its door, what is needed to open it again, and the
    bookkeeping of its saves (``_durable``)."""

    id: str
    tenant: str
    door: ClientDoor
    limits: Limits
    mounts: tuple[Mount, ...] = ()
    preload: tuple[str, ...] = ()
    env: dict[str, str] | None = None
    sandbox: SandboxAPI[Any] | None = None
    created: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.time)
    parent: str | None = None
    turn_base: int = 0  # turns run before the current sandbox was opened (a restore)
    gen: int = 0  # changes of the guest state (turns, restores)
    saved_gen: int = -1
    saved_turns: int | None = None
    saved_at: float | None = None
    files_kept: bool = False  # its last save holds its /tmp files too
    running: int = 0  # operations using the sandbox now (eviction waits for none)
    notice: dict[str, Any] | None = None  # how much a restore lost, for the next answer
    lost: str | None = None  # why the session cannot be brought back
    egress: Any = None  # the tenant's Egress serving this session's door (shared by forks)
    tools: Any = None  # the ToolHost of the tenant's operator tools on that door (shared too)
    lock: threading.Lock = field(default_factory=threading.Lock)
    saving: bool = False  # a save is reading the sandbox: uses wait for it to end

    def __post_init__(self) -> None:
        self.cond = threading.Condition(self.lock)  # running and saving change under it

    @property
    def turns(self) -> int:
        return self.turn_base + (self.sandbox.turns if self.sandbox is not None else 0)

    def info(self) -> dict[str, Any]:
        return {"id": self.id, "turns": self.turns, "created": self.created,
                "last_used": self.last_used, "parent": self.parent,
                "memory": self.limits.memory, "door_attached": self.door.attached,
                "live": self.sandbox is not None, "saved_turns": self.saved_turns,
                "restored": self.notice}


class QuotaExceeded(Exception):
    """A tenant is at one of its bounds (the API answers 429 with Retry-After)."""

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class SessionTable:
    """Sessions and held checkpoints per tenant, behind one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sessions: dict[str, Session] = {}
        self._checkpoints: dict[str, collections.OrderedDict[str, _Held]] = {}
        self._reserved: collections.Counter[str] = collections.Counter()
        self._reserved_memory: collections.Counter[str] = collections.Counter()
        self._reserved_disk: collections.Counter[str] = collections.Counter()

    # ---- admission ----------------------------------------------------------------------
    def reserve(self, tenant: TenantConfig, limits: Limits) -> None:
        """Count a session about to be made (or taken from another node) against the
        tenant's bounds, or refuse it; ``release`` once it is in the table or failed."""
        name = tenant.name
        with self._lock:
            live = [s for s in self._sessions.values() if s.tenant == name]
            count = len(live) + self._reserved[name]
            if tenant.max_sessions is not None and count >= tenant.max_sessions:
                raise QuotaExceeded(f"tenant {name!r} holds {count} sessions, its "
                                    f"bound is {tenant.max_sessions}: close one first")
            for what, bound, used, more in (
                    ("session memory and checkpoints", tenant.max_memory,
                     self._memory_locked(name), limits.memory),
                    ("disk", tenant.max_disk,
                     sum(s.limits.disk_bytes for s in live) + self._reserved_disk[name],
                     limits.disk_bytes)):
                if bound is not None and used + more > bound:
                    raise QuotaExceeded(f"tenant {name!r} would hold {used + more} bytes of "
                                        f"{what}, its bound is {bound}")
            self._reserved[name] += 1
            self._reserved_memory[name] += limits.memory
            self._reserved_disk[name] += limits.disk_bytes

    def release(self, tenant: str, limits: Limits) -> None:
        with self._lock:
            self._reserved[tenant] -= 1
            self._reserved_memory[tenant] -= limits.memory
            self._reserved_disk[tenant] -= limits.disk_bytes

    # ---- sessions -----------------------------------------------------------------------
    def add(self, session: Session) -> None:
        with self._lock:
            self._sessions[session.id] = session

    def get(self, tenant: str, sid: str) -> Session | None:
        with self._lock:
            s = self._sessions.get(sid)
        return s if s is not None and s.tenant == tenant else None

    def pop(self, tenant: str, sid: str) -> Session | None:
        with self._lock:
            s = self._sessions.get(sid)
            if s is None or s.tenant != tenant:
                return None
            return self._sessions.pop(sid)

    def of(self, tenant: str) -> list[Session]:
        with self._lock:
            return [s for s in self._sessions.values() if s.tenant == tenant]

    def all(self) -> list[Session]:
        with self._lock:
            return list(self._sessions.values())

    def drain(self) -> list[Session]:
        """Every session, removed from the table (shutdown)."""
        with self._lock:
            out = list(self._sessions.values())
            self._sessions.clear()
            held = [e.checkpoint for h in self._checkpoints.values() for e in h.values()]
            self._checkpoints.clear()
        _release(held)
        return out

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(collections.Counter(s.tenant for s in self._sessions.values()))

    # ---- checkpoints --------------------------------------------------------------------
    def hold(self, tenant: TenantConfig, checkpoint: Any, cid: str | None = None, *,
             session: str | None = None) -> str:
        """Keep a checkpoint for the tenant (under ``cid``: one another node shared); its
        id. It counts its guest memory's size (what its images may hold at most) against the
        tenant's ``max_memory`` with its live sessions: past it, QuotaExceeded and nothing is
        kept (the caller releases it). Past ``max_checkpoints`` the oldest is released."""
        cid = cid or "c_" + secrets.token_urlsafe(12)
        size = int(getattr(checkpoint, "size", 0) or 0)
        released: list[Any] = []
        with self._lock:
            released += self._expire_locked(time.monotonic())
            held = self._checkpoints.setdefault(tenant.name, collections.OrderedDict())
            if tenant.max_memory is not None and cid not in held:
                used = self._memory_locked(tenant.name)
                if used + size > tenant.max_memory:
                    raise QuotaExceeded(
                        f"tenant {tenant.name!r} would hold {used + size} bytes of session "
                        f"memory and checkpoints, its bound is {tenant.max_memory}: release "
                        "a checkpoint (DELETE /v1/checkpoints/{id}) or close a session")
            held[cid] = _Held(checkpoint, session, size)
            held.move_to_end(cid)
            while len(held) > max(1, tenant.max_checkpoints):
                released.append(held.popitem(last=False)[1].checkpoint)
        _release(released)
        return cid

    def _memory_locked(self, tenant: str) -> int:
        live = sum(s.limits.memory for s in self._sessions.values() if s.tenant == tenant)
        held = sum(h.size for h in self._checkpoints.get(tenant, {}).values())
        return live + held + self._reserved_memory[tenant]

    def checkpoint(self, tenant: str, cid: str) -> Any | None:
        with self._lock:
            held = self._checkpoints.get(tenant)
            if held is None or cid not in held:
                return None
            entry = held[cid]
            if entry.expires is not None and entry.expires <= time.monotonic():
                return None
            held.move_to_end(cid)
            return entry.checkpoint

    def drop_checkpoint(self, tenant: str, cid: str) -> bool:
        with self._lock:
            held = self._checkpoints.get(tenant)
            entry = held.pop(cid, None) if held is not None else None
        if entry is not None:
            _release([entry.checkpoint])
        return entry is not None

    def orphan_checkpoints(self, session: str, ttl: float) -> None:
        """The session closed: its checkpoints are released after ``ttl`` seconds (a fork
        or another session of the tenant may still restore one until then)."""
        expires = time.monotonic() + ttl
        with self._lock:
            for held in self._checkpoints.values():
                for entry in held.values():
                    if entry.session == session and entry.expires is None:
                        entry.expires = expires

    def expire(self) -> int:
        """Release the checkpoints whose time ran out; how many."""
        with self._lock:
            gone = self._expire_locked(time.monotonic())
        _release(gone)
        return len(gone)

    def _expire_locked(self, now: float) -> list[Any]:
        gone = []
        for held in self._checkpoints.values():
            for cid in [c for c, e in held.items() if e.expires is not None and
                        e.expires <= now]:
                gone.append(held.pop(cid).checkpoint)
        return gone

    def held_bytes(self) -> dict[str, int]:
        with self._lock:
            return {t: sum(e.size for e in held.values())
                    for t, held in self._checkpoints.items()}


@dataclass(eq=False)
class _Held:
    checkpoint: Any
    session: str | None
    size: int
    expires: float | None = None


def _release(checkpoints: list[Any]) -> None:
    """Close checkpoints that hold descriptors (a process backend's); the others go with
    their last reference."""
    for cp in checkpoints:
        close = getattr(cp, "close", None)
        if callable(close):
            with contextlib.suppress(Exception):
                close()


def new_session_id() -> str:
    return "s_" + secrets.token_urlsafe(12)
