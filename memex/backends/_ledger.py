"""One ledger per server: what each principal holds of it now, in one record per principal
(:class:`Account`). Both front ends (``memex serve``, ``memex mcp``) make one :class:`Ledger`
and hand it to every part that admits a shared resource, each of which acquires and releases
through the principal's account:

* :class:`~memex.serving.SessionTable` (under its lock): its live sessions and sessions
  being made, their memory and disk, and the checkpoints the principal holds;
* :class:`~memex.serving.Shares` (on the event loop): running turns, turns waiting, the
  turn-rate bucket and the principal's share of the blocking threads;
* the server's sockets (on the event loop): its open WebSockets;
* :class:`~memex.serving.PackageGate` (under its lock): its package resolution in flight;
* the pool backend's admission (:class:`~memex.backends.PoolBackend`, under its lock): the
  pool's sandboxes it holds, their memory, and its requests waiting for one (and the
  turn-rate bucket when the pool is used on its own, with ``TenantQuota.turns_per_second``).

A cluster's control actor (:class:`~memex.serving.Control`) keeps each tenant's live
sessions, sessions being made, checkpoints, running turns and rate bucket across the cluster
in accounts of this class too (under its own lock).

It lives in ``backends``, the lowest layer that knows principals, so the pool below the
serving core and the core itself write to the same accounts. Before, each of these kept a
dictionary of its own keyed by the principal's name (seven ledgers in one server), so a new
resource was an eighth, and nothing could say what one principal held. Each field has one
keeper (named above) that changes it under that keeper's lock or loop; :meth:`Ledger.held`
reads every field at once for metrics and reports.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import anyio

__all__ = ["Account", "Ledger"]


@dataclass(eq=False)
class Account:
    """What one principal holds of one server now (module docstring: who keeps which)."""

    name: str
    thread_share: int = 16  # how many of the server's blocking threads it may hold at once
    # live sessions and the sum of their memory and disk limits (a server's SessionTable;
    # a cluster's Control): a create's check in constant time, not a walk of every session
    sessions: int = 0
    session_memory: int = 0
    session_disk: int = 0
    # sessions (SessionTable)
    reserved: int = 0  # sessions being made or brought in
    reserved_memory: int = 0
    reserved_disk: int = 0
    checkpoints: collections.OrderedDict[str, Any] = field(
        default_factory=collections.OrderedDict)  # cid -> held checkpoint, oldest first
    # turns (Shares)
    running: int = 0
    line: collections.deque[Any] = field(default_factory=collections.deque)  # waiting
    pausing: int = 0  # turns waiting for a token of its rate
    bound: int | None = None  # its own max_running, as last asked
    last: float = -float("inf")  # when its last turn was asked for (Shares' clock)
    rate: float | None = None
    tokens: float = 0.0
    stamp: float = 0.0
    refill_from: float | None = None  # its ledger's (see Ledger): a new bucket's start
    # connections (the server's WebSockets)
    sockets: int = 0
    # package resolutions (PackageGate)
    resolving: bool = False
    # a pool backend's sandboxes (PoolBackend's admission)
    sandboxes: int = 0
    sandbox_memory: int = 0  # the sum of their Limits.memory
    sandbox_line: collections.deque[Any] = field(
        default_factory=collections.deque)  # its opens waiting for a slot
    _threads: Any = field(default=None, repr=False)

    @property
    def threads(self) -> anyio.CapacityLimiter:
        """Its share of the server's blocking threads (Shares), made on first use: a pool
        used without a server never needs one."""
        if self._threads is None:
            import anyio

            self._threads = anyio.CapacityLimiter(self.thread_share)
        return self._threads  # type: ignore[no-any-return]

    def take(self, rate: float, most: float, burst: float | None = None) -> float:
        """A turn's token of ``rate`` turns a second (a bucket of ``burst`` tokens, by
        default ``max(1, int(rate))``): the seconds to wait for it (it is reserved), or -1
        when that would be more than ``most`` (nothing reserved)."""
        self._refill(rate, burst)
        wait = 0.0 if self.tokens >= 1.0 else (1.0 - self.tokens) / rate
        if wait > most:
            return -1.0
        self.tokens -= 1.0
        return wait

    def take_up_to(self, rate: float, burst: float, want: int) -> int:
        """Up to ``want`` whole tokens of the bucket, taken now (none to wait for): how
        many, 0 when it has none (a cluster front's batch, which it spends itself)."""
        self._refill(rate, burst)
        n = max(0, min(int(want), int(self.tokens)))
        self.tokens -= n
        return n

    def give_back(self, rate: float, burst: float, n: int) -> None:
        """Tokens taken and not spent (a front's batch it did not use in time), back in the
        bucket, never past ``burst``; dropped when the bound changed since they were taken
        (a reloaded rate has a bucket of its own)."""
        if self.rate != rate:
            return
        self._refill(rate, burst)
        self.tokens = min(float(burst), self.tokens + max(0, int(n)))

    def _refill(self, rate: float, burst: float | None) -> None:
        burst = max(1.0, float(int(rate))) if burst is None else float(burst)
        now = time.monotonic()
        if self.rate != rate:  # a new or reloaded bound: a full bucket, or one filling
            # since the ledger's refill_from (a ledger that may have had a predecessor)
            full = burst if self.refill_from is None else \
                min(burst, max(0.0, now - self.refill_from) * rate)
            self.rate, self.tokens, self.stamp = rate, full, now
        self.tokens = min(burst, self.tokens + (now - self.stamp) * rate)
        self.stamp = now


class Ledger:
    """The accounts of one server's principals (thread-safe to look up)."""

    def __init__(self, *, tenant_threads: int = 16) -> None:
        self.tenant_threads = tenant_threads
        # None: a principal's first rate bucket starts full. Else the monotonic time its
        # buckets fill from, empty then: a ledger that takes over from one that may have
        # emptied them (a restarted cluster control actor), so that a restart never hands
        # a principal a second burst (its turns stay within burst + rate x seconds across)
        self.refill_from: float | None = None
        self._lock = threading.Lock()
        self._accounts: dict[str, Account] = {}

    def account(self, name: str) -> Account:
        """The principal's account, opened on its first use."""
        a = self._accounts.get(name)
        if a is None:
            with self._lock:
                a = self._accounts.get(name)
                if a is None:
                    a = self._accounts[name] = Account(name, self.tenant_threads,
                                                       refill_from=self.refill_from)
        return a

    def find(self, name: str) -> Account | None:
        """The principal's account if it has used anything yet."""
        return self._accounts.get(name)

    def forget(self, name: str) -> None:
        """Drop the principal's account: only for a keeper that is the ledger's one user,
        once the account holds nothing (a pool of its own, whose tenants may be one per
        rollout, would otherwise keep an account per name it ever saw)."""
        with self._lock:
            self._accounts.pop(name, None)

    def accounts(self) -> list[Account]:
        with self._lock:
            return list(self._accounts.values())

    def held(self, name: str) -> dict[str, Any]:
        """What the principal holds now, field by field (read without the keepers' locks:
        a report, not an admission)."""
        a = self._accounts.get(name)
        if a is None:
            return {}
        return {"sessions": a.sessions, "session_memory": a.session_memory,
                "session_disk": a.session_disk,
                "sessions_being_made": a.reserved, "checkpoints": len(a.checkpoints),
                "checkpoint_bytes": sum(_size(h) for h in list(a.checkpoints.values())),
                "running_turns": a.running, "waiting_turns": len(a.line) + a.pausing,
                "threads": int(a._threads.borrowed_tokens) if a._threads else 0,
                "sockets": a.sockets, "resolving_packages": a.resolving,
                "pool_sandboxes": a.sandboxes, "pool_sandbox_memory": a.sandbox_memory,
                "waiting_for_sandbox": len(a.sandbox_line)}


def _size(held: Any) -> int:
    """A held checkpoint's bytes: a server's record, or a cluster's meta (a dict)."""
    return int(held["size"] if isinstance(held, dict) else held.size)
