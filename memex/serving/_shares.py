"""Fair shares of one server between its tenants: what a tenant may hold of the server at
once, and where waiting happens. A request waits for its tenant's share *in the event loop*,
before it takes any shared resource: a thread of the blocking pool, a place in a session's
queue. (Before, a turn waited for its session's sandbox inside a pool thread: 72 concurrent
turns of one session held every thread, and another tenant's session create waited 15 s.)

* Per session, one operation on its sandbox at a time, in the order they arrived (a FIFO
  lock; ``asyncio.Lock`` wakes its waiters in order): twenty turns sent at once run as sent;
  at most the tenant's ``queued`` wait.
* Per tenant, at most its *fair share* of the server's running turns at once, at most
  ``queued`` waiting, each for at most ``wait`` seconds; past either, 429 with
  ``Retry-After``. The server runs ``running_turns`` turns at once in all (by default one per
  core: a turn is CPU work on a core) and a tenant's share is that divided among the tenants
  active now (a turn running or waiting, or one started in the last ``ACTIVE_SECONDS``), at
  least one, at most its own ``max_running``. Alone, a tenant may use every core; beside
  another busy one, half of them. (Before, a tenant ran 4 turns at once whoever else was
  there: on 2 cores a noisy tenant's 4 turns left a quiet one's cell waiting for a core, its
  p99 5-10x its figure alone.) A share that shrinks stops new turns of the tenant until its
  running ones are within it; those running go on.
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
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import anyio
import anyio.to_thread

from ..backends.internal import Account, Ledger
from ..errors import BackendBusy

__all__ = ["ACTIVE_SECONDS", "Shares", "default_running_turns"]

T = TypeVar("T")

ACTIVE_SECONDS = 2.0
"""How long after starting a turn a tenant still counts as active (sharing the running
turns): long enough to span the gaps of a client running cells one after another, short
enough that a tenant gone quiet soon leaves the others every core."""


def default_running_turns() -> int:
    """The server's running turns when its config sets none: one per core it may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not on Linux
        return max(1, os.cpu_count() or 1)


def _expire(fut: asyncio.Future[bool]) -> None:
    if not fut.done():  # not granted yet: its wait is over
        fut.set_result(False)


class Shares:
    """The admission of one server (used on its event loop only)."""

    def __init__(self, *, threads: int, tenant_threads: int, wait: float = 30.0,
                 running_turns: int | None = None, ledger: Ledger | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.pool = anyio.CapacityLimiter(threads)
        # the principals' accounts (a server's one ledger: its SessionTable's too); a given
        # ledger keeps its own tenant_threads, the share of each account's threads
        self.ledger = ledger if ledger is not None else Ledger(tenant_threads=tenant_threads)
        self.wait = wait
        self.running_turns = running_turns or default_running_turns()
        self._clock = clock
        self._orders: dict[str, list[Any]] = {}  # session -> [its lock, waiting]

    def _of(self, name: str) -> Account:
        return self.ledger.account(name)

    def active(self) -> int:
        """The tenants sharing the running turns now (module docstring)."""
        since = self._clock() - ACTIVE_SECONDS
        return sum(1 for t in self.ledger.accounts()
                   if t.running or t.line or t.pausing or t.last >= since)

    def share(self, tenant: str) -> int:
        """The turns ``tenant`` may run at once now (its own ``max_running`` as last asked):
        the server's running turns divided among the active tenants, at least one."""
        t = self.ledger.find(tenant)
        if t is None or not (t.running or t.line or
                             t.last >= self._clock() - ACTIVE_SECONDS):
            fair = max(1, self.running_turns // (self.active() + 1))
            return fair if t is None or t.bound is None else min(fair, t.bound)
        return self._share(t)

    def _share(self, t: Account) -> int:
        fair = max(1, self.running_turns // max(1, self.active()))
        return fair if t.bound is None else min(fair, t.bound)

    def _grant(self, t: Account) -> None:
        """Start the tenant's waiting turns, first come first served, while it is within its
        share (a turn ending, or a share grown)."""
        share = self._share(t)  # one walk of the accounts: granting changes no one's activity
        while t.line:
            if t.running >= share:
                return
            fut = t.line.popleft()
            if not fut.done():  # not given up, not timed out
                t.running += 1
                fut.set_result(True)

    @contextlib.asynccontextmanager
    async def turn(self, tenant: str, max_running: int | None, queued: int,
                   rate: float | None = None) -> AsyncIterator[None]:
        """A running-turn slot of the tenant within its share, and a token of its ``rate``
        (turns a second) when it has one, waited for here (BackendBusy past the queue or the
        wait: the API answers 429)."""
        t = self._of(tenant)
        t.bound = max_running
        t.last = self._clock()
        share = self._share(t)
        waiting = len(t.line) + t.pausing
        if (t.running >= share or waiting) and waiting >= queued:
            raise BackendBusy("queue_full", f"tenant {tenant!r} has {queued} turns waiting "
                              "already")
        if rate is not None:
            pause = t.take(rate, self.wait)
            if pause < 0:
                raise BackendBusy("timeout", f"tenant {tenant!r} is over its rate of "
                                  f"{rate:g} turns/s")
            if pause:
                t.pausing += 1  # waiting too: counted in its queue
                try:
                    await asyncio.sleep(pause)
                finally:
                    t.pausing -= 1
                share = self._share(t)  # others' activity may have changed meanwhile
        if not t.line and t.running < share:
            t.running += 1
        else:
            loop = asyncio.get_running_loop()
            fut: asyncio.Future[bool] = loop.create_future()
            t.line.append(fut)
            timer = loop.call_later(self.wait, _expire, fut)
            try:
                granted = await fut  # not wait_for: it may swallow a cancel that races a grant
            except BaseException:
                if fut.done() and not fut.cancelled() and fut.result():
                    t.running -= 1  # granted as its caller left: the slot goes on
                    self._grant(t)
                else:
                    fut.cancel()
                    with contextlib.suppress(ValueError):
                        t.line.remove(fut)
                raise
            finally:
                timer.cancel()
            if not granted:
                with contextlib.suppress(ValueError):
                    t.line.remove(fut)
                raise BackendBusy("timeout", f"tenant {tenant!r} kept its {share} running "
                                  f"turns for more than {self.wait:g} s")
        try:
            yield
        finally:
            t.running -= 1
            self._grant(t)

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
        t = self._of(tenant)
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
