"""The pool backend: N worker processes keep sandboxes ready (made from the warm image, with
``preload`` already imported), so ``open`` hands one out in microseconds; admission control
shares the pool between tenants.

* Warm sandboxes are made by background threads, spread over the workers, to keep ``warm``
  ready at all times. A sandbox is never reused: ``close`` destroys it, and the next rollout
  gets a fresh one from the warm image. ``open`` with other limits, mounts or env than the
  pool's profile makes a sandbox on demand (the same admission rules apply).
* Admission: at most ``max_sandboxes`` handed out at once. A request that cannot be admitted
  waits in its tenant's queue (bounded per tenant by ``TenantQuota.queued`` and in total by
  ``queue_size``: past either it fails at once with ``BackendBusy("queue_full")``, which is
  the back-pressure) for at most ``acquire_timeout`` (``BackendBusy("timeout")``). Freed
  slots go to the waiting tenants in turn (round robin), so a tenant that floods the pool
  waits behind its own requests, not in front of other tenants'.
* Quotas per tenant (:class:`TenantQuota`): live sandboxes, memory (the sum of the
  ``Limits.memory`` its live sandboxes may use) and turns per second (a token bucket; a turn
  waits for its token). What a tenant holds is kept in its account of a
  :class:`~memex.backends.internal.Ledger` (a server's own when it hands one in).
* Workers are recycled (no new sandboxes, closed once their last sandbox closes, replaced at
  once) after ``recycle_after`` sandboxes or when their RSS passes ``max_worker_rss``.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import BackendBusy, ConfigError, MemexError, SandboxClosed
from ..runtime_wasm import Door, Limits, Mount
from ._ledger import Account, Ledger
from ._subprocess import ProcessSandbox, SubprocessBackend
from .worker._client import WorkerClient, WorkerDied

__all__ = ["PoolBackend", "PoolStats", "TenantQuota"]

DEFAULT_TENANT = "default"


@dataclass(frozen=True, kw_only=True)
class TenantQuota:
    """What one tenant may hold in a pool at once (None: no bound of that kind).

    Attributes:
        sandboxes: live sandboxes.
        memory: bytes: the sum of ``Limits.memory`` over its live sandboxes.
        turns_per_second: sustained turn rate over all its sandboxes (token bucket of
            ``burst`` tokens); a turn waits for a token, or fails with BackendBusy when the
            wait would exceed the pool's ``acquire_timeout``.
        burst: tokens the bucket holds.
        queued: its open requests waiting at once; more fail with ``queue_full``.
    """

    sandboxes: int | None = None
    memory: int | None = None
    turns_per_second: float | None = None
    burst: int = 1
    queued: int = 16

    def __post_init__(self) -> None:
        for name in ("sandboxes", "memory"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v < 0):
                raise ConfigError(f"TenantQuota.{name} must be an int >= 0 or None, got {v!r}")
        if self.turns_per_second is not None and not self.turns_per_second > 0:
            raise ConfigError("TenantQuota.turns_per_second must be > 0 or None")
        if not isinstance(self.burst, int) or self.burst < 1:
            raise ConfigError("TenantQuota.burst must be an int >= 1")
        if not isinstance(self.queued, int) or self.queued < 0:
            raise ConfigError("TenantQuota.queued must be an int >= 0")


@dataclass(frozen=True, kw_only=True)
class PoolStats:
    """A snapshot of a pool, for monitoring and tests."""

    workers: int
    ready: int  # warm sandboxes waiting to be handed out
    live: int  # handed out, not closed
    waiting: int  # open requests waiting for admission
    live_by_tenant: dict[str, int] = field(default_factory=dict)
    waiting_by_tenant: dict[str, int] = field(default_factory=dict)
    handed_out: int = 0  # since the start: warm sandboxes handed out
    made_on_demand: int = 0  # since the start: sandboxes made at open (no warm one fitted)
    workers_recycled: int = 0
    # tenants in the order they were admitted (the last 1000)
    admissions: tuple[str, ...] = field(default=(), repr=False)


class _Ticket:
    __slots__ = ("admitted", "memory", "tenant")

    def __init__(self, tenant: str, memory: int) -> None:
        self.tenant, self.memory, self.admitted = tenant, memory, False


class _Admission:
    """Slots, tenant quotas and the fair (round-robin) wait queue. What each tenant holds
    (sandboxes, their memory, its opens waiting) is in its account of the ledger, kept here
    under ``cond``."""

    def __init__(self, capacity: int, queue_size: int, quotas: Mapping[str, TenantQuota],
                 default: TenantQuota, ledger: Ledger, own: bool) -> None:
        self.capacity, self.queue_size = capacity, queue_size
        self.quotas, self.default = dict(quotas), default
        self.ledger = ledger
        self.own = own  # the pool's own ledger: an account that holds nothing is dropped
        self.cond = threading.Condition()
        self.live = 0  # sandboxes handed out, all tenants together
        self.waiting = 0  # opens waiting, all tenants together
        self.order: list[Account] = []  # accounts that ever waited, in round-robin order
        self.last: Account | None = None  # the account granted last
        self.history: collections.deque[str] = collections.deque(maxlen=1000)
        self.closed = False

    def quota(self, tenant: str) -> TenantQuota:
        return self.quotas.get(tenant, self.default)

    def _fits(self, a: Account, memory: int) -> bool:
        q = self.quota(a.name)
        return (self.live < self.capacity
                and (q.sandboxes is None or a.sandboxes < q.sandboxes)
                and (q.memory is None or a.sandbox_memory + memory <= q.memory))

    def _grant(self, a: Account, memory: int) -> None:
        a.sandboxes += 1
        a.sandbox_memory += memory
        self.live += 1
        self.history.append(a.name)
        self.last = a

    def acquire(self, tenant: str, memory: int, timeout: float) -> None:
        q = self.quota(tenant)
        if (q.sandboxes == 0) or (q.memory is not None and memory > q.memory):
            raise BackendBusy("quota", f"tenant {tenant!r} can never be admitted: its quota "
                              f"({q.sandboxes} sandboxes, {q.memory} bytes) is below one "
                              f"sandbox of {memory} bytes")
        with self.cond:  # accounts are taken and forgotten under it
            a = self.ledger.account(tenant)
            if self.closed:
                raise BackendBusy("closed", "the pool was closed")
            if not a.sandbox_line and self._fits(a, memory):
                self._grant(a, memory)
                return
            queued = a.sandbox_line
            if len(queued) >= q.queued or self.waiting >= self.queue_size:
                raise BackendBusy("queue_full", f"the pool's admission queue is full "
                                  f"({len(queued)} waiting for tenant {tenant!r}, "
                                  f"{self.waiting} in all): try again later")
            if a not in self.order:
                self.order.append(a)
            ticket = _Ticket(tenant, memory)
            queued.append(ticket)
            self.waiting += 1
            end = time.monotonic() + timeout
            while not ticket.admitted and not self.closed:
                left = end - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(left)
            if ticket.admitted:
                return
            queued.remove(ticket)
            self.waiting -= 1
            self._forget(a)
            if self.closed:
                raise BackendBusy("closed", "the pool was closed")
            raise BackendBusy("timeout", f"no sandbox for tenant {tenant!r} within "
                              f"{timeout:g}s (the pool or the tenant's quota is full)")

    def release(self, tenant: str, memory: int) -> None:
        with self.cond:
            a = self.ledger.account(tenant)
            a.sandboxes -= 1
            a.sandbox_memory -= memory
            self.live -= 1
            self._dispatch()
            self._forget(a)

    def _forget(self, a: Account) -> None:
        """(under cond) Drop an account of the pool's own ledger that holds nothing (no
        sandbox, no open waiting, no rate bucket to keep)."""
        if self.own and not a.sandboxes and not a.sandbox_line and a.rate is None:
            self.ledger.forget(a.name)
            if a in self.order:
                self.order.remove(a)

    def _dispatch(self) -> None:
        """Admit waiting heads while anything fits, in round-robin order starting after the
        account granted last."""
        granted = True
        while granted and self.waiting:
            granted = False
            n = len(self.order)
            start = self.order.index(self.last) + 1 if self.last in self.order else 0
            for i in range(n):
                a = self.order[(start + i) % n]
                queued = a.sandbox_line
                if queued and self._fits(a, queued[0].memory):
                    ticket = queued.popleft()
                    self.waiting -= 1
                    ticket.admitted = True
                    self._grant(a, ticket.memory)
                    granted = True
                    break
        self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()


class PoolBackend(SubprocessBackend):
    """Pre-warmed sandboxes in ``workers`` processes, shared fairly between tenants.

    Args:
        workers: worker processes.
        warm: sandboxes kept ready (default two per worker).
        limits, mounts, preload, env: the profile of the warm sandboxes (``preload`` e.g.
            ``["numpy", "pandas"]``); ``open`` with the same (or no) limits, the same mounts
            and env and a subset of ``preload`` gets a warm one.
        max_sandboxes: sandboxes handed out at once (default 8 per worker).
        queue_size: open requests waiting at once, all tenants together.
        acquire_timeout: seconds an ``open`` (or a turn waiting for its rate token) may wait.
        quotas: per-tenant quotas; ``default_quota`` for tenants not named (and for
            ``tenant=None``, counted as ``"default"``).
        recycle_after: sandboxes a worker makes before it is recycled.
        max_worker_rss: resident bytes past which a worker is recycled (None: no bound).
        resume: as for ``SubprocessBackend`` (default False: a rollout whose worker dies gets
            ``SandboxLost`` and is simply run again; resuming costs a copy per turn).
        ledger: the principals' ledger the pool keeps each tenant's sandboxes, their memory
            and its waiting opens in (a server hands in its own, so one account says all a
            principal holds; default: one of the pool's own).
        Other keyword arguments go to :class:`SubprocessBackend`.
    """

    name = "pool"

    def __init__(self, *, workers: int = 2, warm: int | None = None,
                 limits: Limits | None = None, mounts: Sequence[Mount] = (),
                 preload: Iterable[str] = (), env: dict[str, str] | None = None,
                 max_sandboxes: int | None = None, queue_size: int = 64,
                 acquire_timeout: float = 30.0, quotas: Mapping[str, TenantQuota] | None = None,
                 default_quota: TenantQuota | None = None, recycle_after: int | None = 1000,
                 max_worker_rss: int | None = None, resume: bool = False,
                 ledger: Ledger | None = None, **options: Any) -> None:
        super().__init__(workers=workers, resume=resume, **options)
        self.warm = 2 * workers if warm is None else warm
        self.max_sandboxes = 8 * workers if max_sandboxes is None else max_sandboxes
        if self.warm < 0 or self.max_sandboxes < 1 or queue_size < 0 or not acquire_timeout > 0:
            raise ConfigError("warm >= 0, max_sandboxes >= 1, queue_size >= 0 and "
                              "acquire_timeout > 0 are required")
        if recycle_after is not None and recycle_after < 1:
            raise ConfigError("recycle_after must be >= 1 or None")
        for name, q in (quotas or {}).items():
            if not isinstance(q, TenantQuota):
                raise ConfigError(f"quota for {name!r} must be a TenantQuota")
        self.acquire_timeout = acquire_timeout
        self.recycle_after = recycle_after
        self.max_worker_rss = max_worker_rss
        self._profile_limits, self._profile = self._spec(limits, mounts, preload, env)
        self.ledger = ledger if ledger is not None else Ledger()
        self._admission = _Admission(self.max_sandboxes, queue_size, quotas or {},
                                     default_quota or TenantQuota(), self.ledger,
                                     own=ledger is None)
        self._ready: collections.deque[ProcessSandbox] = collections.deque()
        self._warming = 0
        self._warm_cond = threading.Condition(self._lock)
        self._counts = {"handed_out": 0, "made_on_demand": 0, "workers_recycled": 0}
        self._failures = 0
        self._last_error: BaseException | None = None
        self._threads = [threading.Thread(target=self._keep_warm, name=f"memex-pool-warm-{i}",
                                          daemon=True) for i in range(max(1, workers))]
        self._threads.append(threading.Thread(target=self._watch_rss, name="memex-pool-rss",
                                              daemon=True))
        for t in self._threads:
            t.start()
        if not self.wait_ready(self.op_timeout) and self._last_error is not None:
            err = self._last_error
            self.close()
            raise err

    # ---- warm sandboxes -----------------------------------------------------------------------
    def wait_ready(self, timeout: float) -> bool:
        """Wait until ``warm`` sandboxes are ready (True) or ``timeout`` passes (False)."""
        end = time.monotonic() + timeout
        with self._warm_cond:
            while len(self._ready) < self.warm and not self._closed:
                left = end - time.monotonic()
                if left <= 0 or self._failures >= 3:
                    return False
                self._warm_cond.wait(left)
            return not self._closed

    def _keep_warm(self) -> None:
        while True:
            with self._warm_cond:
                while not self._closed and len(self._ready) + self._warming >= self.warm:
                    self._warm_cond.wait()
                if self._closed:
                    return
                self._warming += 1
            h: ProcessSandbox | None = None
            try:
                worker = self._pick_worker()
                h = self._open_in(worker, self._profile_limits, self._profile, Door(), None)
            except (MemexError, WorkerDied, OSError) as exc:
                self._last_error = exc
                time.sleep(0.2 * min(self._failures + 1, 10))
            with self._warm_cond:
                self._warming -= 1
                if h is not None and self._usable(h._worker) and not self._closed:
                    self._ready.append(h)
                    self._failures = 0
                    h = None
                elif h is None:
                    self._failures += 1
                self._warm_cond.notify_all()
            if h is not None:
                h.close()
            self._after_make()

    def _take_ready(self, timeout: float) -> ProcessSandbox:
        end = time.monotonic() + timeout
        with self._warm_cond:
            while True:
                if self._closed:
                    raise BackendBusy("closed", "the pool was closed")
                while self._ready:
                    h = self._ready.popleft()
                    if h._worker.alive and not h.closed:
                        self._warm_cond.notify_all()
                        return h
                left = end - time.monotonic()
                if left <= 0:
                    raise BackendBusy("timeout", f"no warm sandbox became ready within "
                                      f"{timeout:g}s")
                self._warm_cond.wait(left)

    def _fits_profile(self, limits: Limits | None, mounts: Sequence[Mount],
                      preload: Iterable[str], env: dict[str, str] | None) -> bool:
        p = self._profile
        return ((limits is None or limits == self._profile_limits)
                and list(mounts) == list(self._profile_mounts())
                and set(preload) <= set(p["preload"])
                and (env or None) == (p["env"] or None))

    def _profile_mounts(self) -> list[Mount]:
        return [Mount(host_path=h, guest_path=g, writable=w) for h, g, w in
                self._profile["mounts"]]

    # ---- the contract -------------------------------------------------------------------------
    def open(self, *, limits: Limits | None = None, mounts: Sequence[Mount] = (),
             preload: Iterable[str] = (), door: Door | None = None,
             env: dict[str, str] | None = None, tenant: str | None = None,
             packages: Sequence[str] = ()) -> ProcessSandbox:
        """A sandbox for ``tenant``: a warm one when it fits the pool's profile, else one
        made now. Waits for admission (see the class docstring); BackendBusy past it."""
        if self._closed:
            raise SandboxClosed("the backend was closed")
        preload = list(preload)
        warm = not packages and self._fits_profile(limits, mounts, preload, env)
        if warm:
            use_limits, spec = self._profile_limits, self._profile
        else:
            use_limits, spec = self._spec(limits, mounts, preload, env, packages)
        who = tenant if tenant is not None else DEFAULT_TENANT
        start = time.monotonic()
        self._admission.acquire(who, use_limits.memory, self.acquire_timeout)
        try:
            if warm:
                left = max(self.acquire_timeout - (time.monotonic() - start), 0.001)
                h = self._take_ready(left)
                h.door = door if door is not None else Door()
                if h._door_server is not None:
                    h._door_server.door = h.door
                self._counts["handed_out"] += 1
            else:
                h = self._open_in(self._pick_worker(), use_limits, spec, door or Door(), tenant)
                self._counts["made_on_demand"] += 1
                self._after_make()
        except BaseException:
            self._admission.release(who, use_limits.memory)
            raise
        h.tenant = tenant
        h._admitted = who
        return h

    # ---- hooks --------------------------------------------------------------------------------
    def _admit(self, h: ProcessSandbox) -> None:
        who = h.tenant if h.tenant is not None else DEFAULT_TENANT
        self._admission.acquire(who, h.limits.memory, self.acquire_timeout)
        h._admitted = who

    def _released(self, h: ProcessSandbox) -> None:
        who, h._admitted = h._admitted, None
        if who is not None:
            self._admission.release(who, h.limits.memory)
        w = h._worker
        if w.retiring and not w.live and not w.closing:
            threading.Thread(target=w.close, name="memex-pool-recycle", daemon=True).start()

    def _before_turn(self, h: ProcessSandbox) -> None:
        who = h.tenant if h.tenant is not None else DEFAULT_TENANT
        q = self._admission.quota(who)
        if q.turns_per_second is None:
            return
        with self._admission.cond:  # the keeper of the account's pool fields
            a = self.ledger.account(who)
            wait = a.take(q.turns_per_second, self.acquire_timeout, q.burst)
        if wait < 0:
            raise BackendBusy("timeout", f"tenant {who!r} is over its rate of "
                              f"{q.turns_per_second:g} turns/s")
        if wait:
            time.sleep(wait)

    # ---- workers ------------------------------------------------------------------------------
    def _after_make(self) -> None:
        """Recycle workers that made ``recycle_after`` sandboxes."""
        if self.recycle_after is None:
            return
        with self._lock:
            due = [w for w in self._workers if self._usable(w)
                   and w.created >= self.recycle_after]
        for w in due:
            self._retire(w)

    def _retire(self, w: WorkerClient) -> None:
        with self._warm_cond:
            if w.retiring or w.closing:
                return
            w.retiring = True
            self._counts["workers_recycled"] += 1
            stale = [h for h in self._ready if h._worker is w]
            for h in stale:
                self._ready.remove(h)
            self._warm_cond.notify_all()
        for h in stale:
            h.close()  # never handed out: its worker's last sandboxes may be these
        if not w.live:
            w.close()

    def _watch_rss(self) -> None:
        while not self._closed:
            time.sleep(1.0)
            if self.max_worker_rss is None:
                continue
            with self._lock:
                workers = [w for w in self._workers if self._usable(w)]
            for w in workers:
                if w.rss() > self.max_worker_rss:
                    self._retire(w)

    def _on_death(self, worker: WorkerClient) -> None:
        with self._warm_cond:
            stale = [h for h in self._ready if h._worker is worker]
            for h in stale:
                self._ready.remove(h)
            self._warm_cond.notify_all()
        super()._on_death(worker)
        for h in stale:
            with contextlib.suppress(Exception):
                h.close()

    # ---- state --------------------------------------------------------------------------------
    def stats(self) -> PoolStats:
        adm = self._admission
        with adm.cond:
            accounts = self.ledger.accounts()
            live = {a.name: a.sandboxes for a in accounts if a.sandboxes}
            waiting = {a.name: len(a.sandbox_line) for a in accounts if a.sandbox_line}
            history = tuple(adm.history)
        with self._lock:
            workers = sum(1 for w in self._workers if self._usable(w))
            ready = len(self._ready)
        return PoolStats(workers=workers, ready=ready, live=sum(live.values()),
                         waiting=sum(waiting.values()), live_by_tenant=live,
                         waiting_by_tenant=waiting, admissions=history, **self._counts)

    def close(self) -> None:
        self._admission.close()
        with self._warm_cond:
            self._warm_cond.notify_all()
        super().close()
        with self._warm_cond:
            self._ready.clear()
            self._warm_cond.notify_all()
