"""Fair shares of one server between its tenants: what a tenant may hold of the server at
once, and where waiting happens. A request waits for its tenant's share *in the event loop*,
before it takes any shared resource: a thread of the blocking pool, a place in a session's
queue. (Before, a turn waited for its session's sandbox inside a pool thread: 72 concurrent
turns of one session held every thread, and another tenant's session create waited 15 s.)

* Per session, one operation on its sandbox at a time, in the order they arrived (a FIFO
  lock; ``asyncio.Lock`` wakes its waiters in order): twenty turns sent at once run as sent;
  at most the tenant's ``queued`` wait.
* Per tenant, at most ``max_running`` turns at once (:data:`DEFAULT_MAX_RUNNING` when the
  tenant sets none), at most ``queued`` waiting, each for at most ``wait`` seconds; past
  either, 429 with ``Retry-After``.
* Per tenant, at most ``turns_per_second`` turns started per second (a token bucket of
  ``max(1, int(rate))`` turns of burst), waited for here too, on every backend: the rate is
  the server's, not a backend's (the pool's own bucket was the only one, and a server on the
  subprocess or in-process backend silently had none). A turn that would wait past ``wait``
  is refused at once (429).
* Per tenant, at most ``tenant_threads`` threads of the pool at once (its turns, forks,
  checkpoints, file moves); the pool holds ``threads`` in all, so other tenants always find
  threads free.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import anyio
import anyio.to_thread

from ..errors import BackendBusy

__all__ = ["DEFAULT_MAX_RUNNING", "Shares"]

T = TypeVar("T")

DEFAULT_MAX_RUNNING = 4
"""A tenant's turns running at once when its config sets no ``max_running``."""


class _Tenant:
    def __init__(self, running: int, threads: int) -> None:
        self.running = running
        self.turns = asyncio.Semaphore(running)
        self.waiting = 0
        self.threads = anyio.CapacityLimiter(threads)
        self.rate: float | None = None
        self.tokens = 0.0
        self.stamp = 0.0

    def take(self, rate: float, most: float) -> float:
        """A turn's token of ``rate`` turns a second: the seconds to wait for it (it is
        reserved), or -1 when that would be more than ``most`` (nothing reserved)."""
        burst = max(1.0, float(int(rate)))
        now = time.monotonic()
        if self.rate != rate:  # a new or reloaded bound: a full bucket
            self.rate, self.tokens, self.stamp = rate, burst, now
        self.tokens = min(burst, self.tokens + (now - self.stamp) * rate)
        self.stamp = now
        wait = 0.0 if self.tokens >= 1.0 else (1.0 - self.tokens) / rate
        if wait > most:
            return -1.0
        self.tokens -= 1.0
        return wait


class Shares:
    """The admission of one server (used on its event loop only)."""

    def __init__(self, *, threads: int, tenant_threads: int, wait: float = 30.0) -> None:
        self.pool = anyio.CapacityLimiter(threads)
        self.tenant_threads = tenant_threads
        self.wait = wait
        self._tenants: dict[str, _Tenant] = {}
        self._orders: dict[str, list[Any]] = {}  # session -> [its lock, waiting]

    def _of(self, name: str, running: int) -> _Tenant:
        t = self._tenants.get(name)
        if t is None or t.running != running:  # a reloaded config may change the bound
            t = self._tenants[name] = _Tenant(running, self.tenant_threads)
        return t

    @contextlib.asynccontextmanager
    async def turn(self, tenant: str, max_running: int | None, queued: int,
                   rate: float | None = None) -> AsyncIterator[None]:
        """A running-turn slot of the tenant, and a token of its ``rate`` (turns a second)
        when it has one, waited for here (BackendBusy past the queue or the wait: the API
        answers 429)."""
        t = self._of(tenant, max_running or DEFAULT_MAX_RUNNING)
        if t.turns.locked() and t.waiting >= queued:
            raise BackendBusy("queue_full", f"tenant {tenant!r} has {queued} turns waiting "
                              "already")
        t.waiting += 1
        try:
            if rate is not None:
                pause = t.take(rate, self.wait)
                if pause < 0:
                    raise BackendBusy("timeout", f"tenant {tenant!r} is over its rate of "
                                      f"{rate:g} turns/s")
                if pause:
                    await asyncio.sleep(pause)
            if t.turns.locked():  # wait_for runs a task of its own: only when waiting
                await asyncio.wait_for(t.turns.acquire(), self.wait)
            else:
                await t.turns.acquire()
        except TimeoutError:
            raise BackendBusy("timeout", f"tenant {tenant!r} kept its {t.running} running "
                              f"turns for more than {self.wait:g} s") from None
        finally:
            t.waiting -= 1
        try:
            yield
        finally:
            t.turns.release()

    @contextlib.asynccontextmanager
    async def in_order(self, session: str, queued: int) -> AsyncIterator[None]:
        """The session's operations one at a time, in the order they arrived; at most
        ``queued`` waiting (BackendBusy past it)."""
        entry = self._orders.get(session)
        if entry is None:
            entry = self._orders[session] = [asyncio.Lock(), 0]
        lock: asyncio.Lock = entry[0]
        if lock.locked() and entry[1] >= queued:
            raise BackendBusy("queue_full", f"session {session!r} has {queued} operations "
                              "waiting already")
        entry[1] += 1
        try:
            await lock.acquire()
        finally:
            entry[1] -= 1
        try:
            yield
        finally:
            lock.release()
            if entry[1] == 0 and not lock.locked():
                self._orders.pop(session, None)

    async def run(self, tenant: str, fn: Callable[..., T], *args: Any,
                  abandon_on_cancel: bool = False) -> T:
        """``fn(*args)`` on a pool thread, within the tenant's thread share (waited for
        here, in the event loop). With ``abandon_on_cancel`` a cancelled caller returns at
        once (the caller stops ``fn``'s work, as mcp interrupts a cell whose client went
        away); the thread and its share are held until ``fn`` returns."""
        t = self._tenants.get(tenant)
        if t is None:
            t = self._of(tenant, DEFAULT_MAX_RUNNING)
        if not abandon_on_cancel:
            async with t.threads:
                return await anyio.to_thread.run_sync(fn, *args, limiter=self.pool)
        borrower = object()  # the share is the call's, not the task's: a thread gives it back
        await t.threads.acquire_on_behalf_of(borrower)
        lock, state = threading.Lock(), ["queued"]
        loop = asyncio.get_running_loop()

        def call() -> T:
            with lock:
                if state[0] == "abandoned":  # cancelled before a thread took it
                    raise anyio.get_cancelled_exc_class()
                state[0] = "started"
            try:
                return fn(*args)
            finally:  # the thread's end gives its share back, also for an abandoned call;
                # without waiting for the loop (queued before the result, so it runs first)
                with contextlib.suppress(RuntimeError):  # the loop is gone
                    loop.call_soon_threadsafe(t.threads.release_on_behalf_of, borrower)

        try:
            return await anyio.to_thread.run_sync(call, limiter=self.pool,
                                                  abandon_on_cancel=True)
        except BaseException:
            with lock:
                if state[0] == "queued":
                    state[0] = "abandoned"
                    t.threads.release_on_behalf_of(borrower)
            raise
