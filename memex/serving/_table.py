"""The session core both front ends use (``memex serve``, ``memex mcp``): the sessions of one
server, each owned by one principal (a tenant, a bearer token, the stdio process), the
checkpoints they hold, and the bounds that admit or refuse them. Each bound is built and
tested here once (``tests/serving/``); a front end only says what its principals' bounds are
(:class:`Bounds`) and what it answers for a refusal (:class:`QuotaExceeded`).

* Sessions: at most ``capacity`` in all and each owner's ``max_sessions``; a session being
  made holds its place from :meth:`SessionTable.reserve` on (two racing creates cannot both
  take the last one).
* Memory: an owner's live sessions' ``Limits.memory``, plus every checkpoint it holds (its
  guest memory's size: what its images may hold at most), stay within ``max_memory``. A
  checkpoint past it is refused and not kept.
* Checkpoints: at most ``max_checkpoints`` per owner (the oldest released past it); those of a
  closed session expire after a time-to-live (:meth:`SessionTable.orphan_checkpoints`).
* Idle sessions: :meth:`SessionTable.idle` lists those unused for a while and not in use, for
  the front end's sweep (serve saves and evicts them, mcp ends them).

A lookup with another owner's name finds nothing: a front end answers it as it answers an id
that never existed.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from ..backends.internal import Ledger
from ..errors import MemexError
from ..runtime_wasm import Limits, SandboxAPI

__all__ = ["ID_PATTERN", "Bounds", "CoreSession", "QuotaExceeded", "SessionTable"]

ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
"""What a session or checkpoint id may be (what ``secrets.token_urlsafe`` makes, with a
prefix): a name, never a path. It becomes a file name in a state or shared folder and a key
in a cluster's storage, so ``.``, ``..`` and anything with a separator are refused where a
request names one (422), not found later as a path."""


@dataclass(frozen=True)
class Bounds:
    """What one owner may hold of a server at once (None: no bound of that kind)."""

    max_sessions: int | None = None
    max_memory: int | None = None  # bytes: live sessions' memory limits plus held checkpoints
    max_disk: int | None = None  # bytes: live sessions' disk limits
    max_checkpoints: int = 64  # held at once; the oldest is released past it


class QuotaExceeded(MemexError):
    """An owner (or the server) is at one of its bounds: serve answers 429 with
    Retry-After, mcp a tool error."""

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass(kw_only=True, eq=False)
class CoreSession:
    """What the core knows of a session: its owner, its limits, its sandbox (None until it
    is opened, or while a front end has it saved away) and its uses. A front end's session
    record extends it."""

    id: str
    owner: str
    limits: Limits
    sandbox: SandboxAPI[Any] | None = None
    created: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.time)
    running: int = 0  # uses of the sandbox now (a sweep or a save waits for none)
    saving: bool = False  # someone holds the sandbox alone (a save, a reset): uses wait
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.cond = threading.Condition(self.lock)  # running and saving change under it

    def why_ended(self, now: float | None = None) -> str | None:
        """Why its own limits ended this session, if they did: past ``Limits.lifetime``
        since created, past ``Limits.idle_timeout`` since last used, or its sandbox closed
        (a trap it could not recover from). Counted from the core's clock, not the
        sandbox's, so a session in a worker process, or saved away, ends on time too; one in
        use now is left to finish (its sandbox's own timer stops it)."""
        if self.running or self.saving:
            return None
        now = time.time() if now is None else now
        lim = self.limits
        if lim.lifetime is not None and now - self.created >= lim.lifetime:
            return "its lifetime ended"
        if lim.idle_timeout is not None and now - self.last_used >= lim.idle_timeout:
            return "its idle timeout passed"
        if self.sandbox is not None and self.sandbox.closed:
            return "its sandbox closed"
        return None

    @contextlib.contextmanager
    def use(self, open_: Callable[[], SandboxAPI[Any]]) -> Iterator[SandboxAPI[Any]]:
        """The session's sandbox for one operation (``open_()`` makes it, under the
        session's lock, when there is none); counted as running until the block ends."""
        with self.cond:
            self.cond.wait_for(lambda: not self.saving)
            if self.sandbox is None:
                self.sandbox = open_()
            self.running += 1
            sb = self.sandbox
        try:
            yield sb
        finally:
            with self.cond:
                self.running -= 1
                self.cond.notify_all()
            self.last_used = time.time()

    @contextlib.contextmanager
    def alone(self, wait: float) -> Iterator[bool]:
        """Whether the session's sandbox is ours alone (no use running, none starting)
        within ``wait`` seconds; while it is, new uses wait."""
        with self.cond:
            if not self.cond.wait_for(lambda: self.running == 0 and not self.saving, wait):
                yield False
                return
            self.saving = True
        try:
            yield True
        finally:
            with self.cond:
                self.saving = False
                self.cond.notify_all()


S = TypeVar("S", bound=CoreSession)


@dataclass(eq=False)
class _Held:
    checkpoint: Any
    session: str | None
    size: int
    expires: float | None = None


class SessionTable(Generic[S]):
    """Sessions and held checkpoints per owner, behind one lock (thread-safe)."""

    def __init__(self, *, capacity: int | None = None, ledger: Ledger | None = None) -> None:
        self.capacity = capacity
        # the owners' accounts (the server's one ledger, its Shares' too): sessions being
        # made and checkpoints held are kept there, changed under this table's lock
        self.ledger = ledger if ledger is not None else Ledger()
        self._lock = threading.Lock()
        self._sessions: dict[str, S] = {}

    def _helds(self) -> list[collections.OrderedDict[str, _Held]]:
        return [a.checkpoints for a in self.ledger.accounts()]

    # ---- admission ----------------------------------------------------------------------
    def reserve(self, owner: str, bounds: Bounds, limits: Limits) -> None:
        """Count a session about to be made (or brought in) against the owner's bounds and
        the table's capacity, or refuse it (QuotaExceeded); ``release`` once it is in the
        table or failed."""
        with self._lock:
            if self.capacity is not None and len(self._sessions) + sum(
                    a.reserved for a in self.ledger.accounts()) >= self.capacity:
                raise QuotaExceeded(f"this server holds its maximum of {self.capacity} "
                                    "sessions; end one first, or retry later")
            acct = self.ledger.account(owner)
            count = acct.sessions + acct.reserved
            if bounds.max_sessions is not None and count >= bounds.max_sessions:
                raise QuotaExceeded(f"{owner!r} holds {count} sessions, its bound is "
                                    f"{bounds.max_sessions}: close one first")
            for what, bound, used, more in (
                    ("session memory and checkpoints", bounds.max_memory,
                     self._memory_locked(owner), limits.memory),
                    ("disk", bounds.max_disk,
                     acct.session_disk + acct.reserved_disk,
                     limits.disk_bytes)):
                if bound is not None and used + more > bound:
                    raise QuotaExceeded(f"{owner!r} would hold {used + more} bytes of "
                                        f"{what}, its bound is {bound}")
            acct.reserved += 1
            acct.reserved_memory += limits.memory
            acct.reserved_disk += limits.disk_bytes

    def release(self, owner: str, limits: Limits) -> None:
        acct = self.ledger.account(owner)
        with self._lock:
            acct.reserved -= 1
            acct.reserved_memory -= limits.memory
            acct.reserved_disk -= limits.disk_bytes

    @contextlib.contextmanager
    def reserved(self, owner: str, bounds: Bounds, limits: Limits) -> Iterator[None]:
        """:meth:`reserve` for the block (add the session inside it)."""
        self.reserve(owner, bounds, limits)
        try:
            yield
        finally:
            self.release(owner, limits)

    # ---- sessions -----------------------------------------------------------------------
    def add(self, session: S) -> None:
        with self._lock:
            old = self._sessions.get(session.id)
            if old is not None:
                self._count(old, -1)
            self._sessions[session.id] = session
            self._count(session, 1)

    def _count(self, s: S, sign: int) -> None:
        """(under the lock) The owner's live sessions and their limits, in its account."""
        acct = self.ledger.account(s.owner)
        acct.sessions += sign
        acct.session_memory += sign * s.limits.memory
        acct.session_disk += sign * s.limits.disk_bytes

    def get(self, owner: str, sid: str) -> S | None:
        with self._lock:
            s = self._sessions.get(sid)
        return s if s is not None and s.owner == owner else None

    def pop(self, owner: str, sid: str) -> S | None:
        with self._lock:
            s = self._sessions.get(sid)
            if s is None or s.owner != owner:
                return None
            self._count(s, -1)
            return self._sessions.pop(sid)

    def of(self, owner: str) -> list[S]:
        with self._lock:
            return [s for s in self._sessions.values() if s.owner == owner]

    def all(self) -> list[S]:
        with self._lock:
            return list(self._sessions.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    def victim(self, owner: str, bounds: Bounds) -> S | None:
        """The session to take away so that ``owner`` can have a new one, or None: its own
        least recently used idle session when it holds its ``max_sessions``; else, when
        the table is at capacity, the least recently used idle session of whoever holds
        the most sessions, if that is more than ``owner`` holds (a principal at its own
        bound loses its own, never another's place; one that filled the server gives way
        to one that holds fewer). In use (running, saving) is never idle."""
        with self._lock:
            counts = collections.Counter({a.name: a.sessions + a.reserved
                                          for a in self.ledger.accounts()
                                          if a.sessions + a.reserved})

            def lru(of: str) -> S | None:
                free = [s for s in self._sessions.values()
                        if s.owner == of and not s.running and not s.saving]
                return min(free, key=lambda s: s.last_used, default=None)

            mine = counts[owner]
            if bounds.max_sessions is not None and mine >= bounds.max_sessions:
                return lru(owner)
            if self.capacity is None or sum(counts.values()) < self.capacity:
                return None
            for other, n in counts.most_common():
                if n <= mine:
                    break
                found = lru(other)
                if found is not None:
                    return found
            return None

    def idle(self, seconds: float, now: float | None = None) -> list[S]:
        """The sessions unused for more than ``seconds`` and not in use now."""
        now = time.time() if now is None else now
        with self._lock:
            return [s for s in self._sessions.values()
                    if now - s.last_used > seconds and not s.running and not s.saving]

    def ended(self, owner: str | None = None, now: float | None = None) -> list[tuple[S, str]]:
        """The sessions (of ``owner``, or all) whose own limits ended them, with why
        (:meth:`CoreSession.why_ended`)."""
        now = time.time() if now is None else now
        with self._lock:
            sessions = [s for s in self._sessions.values()
                        if owner is None or s.owner == owner]
        return [(s, why) for s in sessions if (why := s.why_ended(now)) is not None]

    def drain(self) -> list[S]:
        """Every session, removed from the table, and every checkpoint released (the server
        stops)."""
        with self._lock:
            out = list(self._sessions.values())
            for s in out:
                self._count(s, -1)
            self._sessions.clear()
            held = [e.checkpoint for h in self._helds() for e in h.values()]
            for h in self._helds():
                h.clear()
        _release(held)
        return out

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(collections.Counter(s.owner for s in self._sessions.values()))

    # ---- checkpoints --------------------------------------------------------------------
    def hold(self, owner: str, bounds: Bounds, checkpoint: object, cid: str, *,
             session: str | None = None) -> str:
        """Keep a checkpoint for the owner under ``cid`` (replacing one of that id); ``cid``.
        Its guest memory's size counts against ``max_memory`` with the owner's live sessions:
        past it, QuotaExceeded and nothing is kept or replaced (the caller releases the
        checkpoint). Past ``max_checkpoints`` the oldest is released."""
        size = int(getattr(checkpoint, "size", 0) or 0)
        released: list[Any] = []
        with self._lock:
            released += self._expire_locked(time.monotonic())
            held = self.ledger.account(owner).checkpoints
            if bounds.max_memory is not None:
                old = held[cid].size if cid in held else 0
                used = self._memory_locked(owner) - old
                if used + size > bounds.max_memory:
                    raise QuotaExceeded(
                        f"{owner!r} would hold {used + size} bytes of session memory and "
                        f"checkpoints, its bound is {bounds.max_memory}: release a "
                        "checkpoint or close a session")
            if cid in held:
                released.append(held.pop(cid).checkpoint)
            held[cid] = _Held(checkpoint, session, size)
            while len(held) > max(1, bounds.max_checkpoints):
                released.append(held.popitem(last=False)[1].checkpoint)
        _release([c for c in released if c is not checkpoint])
        return cid

    def _memory_locked(self, owner: str) -> int:
        acct = self.ledger.find(owner)
        if acct is None:
            return 0
        return acct.session_memory + sum(int(h.size) for h in acct.checkpoints.values()) + \
            acct.reserved_memory

    def memory(self, owner: str) -> int:
        """Bytes the owner holds: its live sessions' memory limits and its checkpoints."""
        with self._lock:
            return self._memory_locked(owner)

    def _held_of(self, owner: str) -> collections.OrderedDict[str, _Held] | None:
        acct = self.ledger.find(owner)
        return acct.checkpoints if acct is not None else None

    def checkpoint(self, owner: str, cid: str) -> Any | None:
        with self._lock:
            held = self._held_of(owner)
            if held is None or cid not in held:
                return None
            entry = held[cid]
            if entry.expires is not None and entry.expires <= time.monotonic():
                return None
            held.move_to_end(cid)
            return entry.checkpoint

    def checkpoints_of(self, owner: str, session: str) -> list[str]:
        """The ids of the checkpoints the owner's session took (oldest first)."""
        with self._lock:
            held = self._held_of(owner)
            return [c for c, e in (held or {}).items() if e.session == session]

    def drop_checkpoint(self, owner: str, cid: str) -> bool:
        with self._lock:
            held = self._held_of(owner)
            entry = held.pop(cid, None) if held is not None else None
        if entry is not None:
            _release([entry.checkpoint])
        return entry is not None

    def orphan_checkpoints(self, session: str, ttl: float) -> None:
        """The session closed: its checkpoints are released after ``ttl`` seconds (at once
        when ``ttl`` is 0; until then a fork or another session of the owner may still
        restore one)."""
        if ttl <= 0:
            with self._lock:
                gone = [held.pop(c).checkpoint for held in self._helds()
                        for c in [c for c, e in held.items() if e.session == session]]
            _release(gone)
            return
        expires = time.monotonic() + ttl
        with self._lock:
            for held in self._helds():
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
        for held in self._helds():
            for cid in [c for c, e in held.items() if e.expires is not None and
                        e.expires <= now]:
                gone.append(held.pop(cid).checkpoint)
        return gone

    def held_bytes(self) -> dict[str, int]:
        with self._lock:
            return {a.name: sum(e.size for e in a.checkpoints.values())
                    for a in self.ledger.accounts() if a.checkpoints}


def _release(checkpoints: list[Any]) -> None:
    """Close checkpoints that hold descriptors (a process backend's); the others go with
    their last reference."""
    for cp in checkpoints:
        close = getattr(cp, "close", None)
        if callable(close):
            with contextlib.suppress(Exception):
                close()
