"""The session core's fair shares (memex.serving.Shares), which both front ends admit every
operation through: a session's operations in arrival order, an owner's running turns and
its queue, and its share of the threads, given back when the work ends (also work whose
caller went away)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time

import anyio
import pytest

from memex.errors import BackendBusy
from memex.serving import Shares
from memex.serving._shares import ACTIVE_SECONDS


def test_a_sessions_operations_run_in_the_order_they_arrived() -> None:
    async def go() -> list[int]:
        shares = Shares(threads=8, tenant_threads=8)
        seen: list[int] = []

        async def op(i: int) -> None:
            async with shares.in_order("s", queued=50):
                # a thread hop of varying length: without the order, later ones overtake
                await shares.run("a", time.sleep, 0.02 * ((7 * i) % 5))
                seen.append(i)

        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(op, i)
                await anyio.sleep(0)  # arrival order is start order
        return seen

    assert anyio.run(go) == list(range(20))


def test_past_its_queue_an_operation_is_refused_not_stuck() -> None:
    async def go() -> None:
        shares = Shares(threads=8, tenant_threads=8)
        release = anyio.Event()

        async def hold() -> None:
            async with shares.in_order("s", queued=1):
                await release.wait()

        async with anyio.create_task_group() as tg:
            tg.start_soon(hold)
            await anyio.sleep(0.01)
            tg.start_soon(hold)  # the one allowed to wait
            await anyio.sleep(0.01)
            with pytest.raises(BackendBusy, match="1 operations waiting"):
                async with shares.in_order("s", queued=1):
                    pass
            async with shares.in_order("other", queued=1):
                pass  # positive control: another session is not held up
            release.set()

    anyio.run(go)


def test_an_owner_runs_at_most_max_running_turns_and_others_are_not_held() -> None:
    async def go() -> tuple[int, int]:
        shares = Shares(threads=16, tenant_threads=16)
        running = peak = 0
        lock = threading.Lock()

        def work() -> None:
            nonlocal running, peak
            with lock:
                running += 1
                peak = max(peak, running)
            time.sleep(0.05)
            with lock:
                running -= 1

        async def turn(owner: str) -> None:
            async with shares.turn(owner, 2, queued=20):
                await shares.run(owner, work)

        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(turn, "noisy")
        noisy_peak = peak
        peak = 0
        with anyio.fail_after(1):  # the quiet owner's turn starts at once
            async with shares.turn("noisy", 2, queued=20), shares.turn("quiet", 2, queued=20):
                await shares.run("quiet", work)
        return noisy_peak, peak

    noisy_peak, quiet_peak = anyio.run(go)
    assert noisy_peak == 2 and quiet_peak == 1


def test_thread_shares_come_back_also_from_abandoned_calls() -> None:
    """Many calls, more than the share, each from a task of its own, some abandoned by a
    caller that went away: the share is given back as each thread ends (a share tied to the
    calling task was never given back, and the 5th call waited forever)."""
    async def go() -> None:
        shares = Shares(threads=8, tenant_threads=4)
        for _ in range(12):
            with anyio.fail_after(5):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(functools.partial(shares.run, "a", time.sleep, 0.001,
                                                    abandon_on_cancel=True))
        done = threading.Event()

        def slow() -> None:
            time.sleep(0.3)
            done.set()

        with anyio.move_on_after(0.05) as scope:
            await shares.run("a", slow, abandon_on_cancel=True)
        assert scope.cancelled_caught and not done.is_set()  # the caller left at once
        t = shares.ledger.account("a")
        assert t.threads.borrowed_tokens == 1  # the thread still holds its share
        with anyio.fail_after(5):
            while not done.is_set() or t.threads.borrowed_tokens:
                await anyio.sleep(0.01)
        for _ in range(12):
            with anyio.fail_after(5):
                await shares.run("a", time.sleep, 0.001, abandon_on_cancel=True)
        assert t.threads.borrowed_tokens == 0

    anyio.run(go)


def test_a_call_cancelled_before_a_thread_took_it_gives_its_share_back() -> None:
    async def go() -> None:
        shares = Shares(threads=1, tenant_threads=4)
        gate = threading.Event()
        ran: list[str] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(shares.run, "a", gate.wait, 10)  # holds the pool's one thread
            await anyio.sleep(0.05)
            with anyio.move_on_after(0.05):
                await shares.run("b", lambda: ran.append("b"), abandon_on_cancel=True)
            gate.set()
        assert shares.ledger.account("b").threads.borrowed_tokens == 0
        assert ran == []  # it never ran once its caller left

    anyio.run(go)


class _Clock:
    """A clock the test moves by hand (the activity window without waiting for it)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Turns:
    """Turns of one Shares held open until released: which have started, in order."""

    def __init__(self, shares: Shares) -> None:
        self.shares = shares
        self.started: list[str] = []
        self.gates: dict[str, asyncio.Event] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def send(self, owner: str, name: str, max_running: int | None = None) -> None:
        gate = self.gates[name] = asyncio.Event()

        async def turn() -> None:
            async with self.shares.turn(owner, max_running, queued=20):
                self.started.append(name)
                await gate.wait()

        self.tasks[name] = asyncio.ensure_future(turn())

    async def settle(self) -> None:
        for _ in range(5):  # every task that can start, started (no timer involved)
            await asyncio.sleep(0)

    async def end(self, name: str) -> None:
        self.gates[name].set()
        await self.tasks[name]
        await self.settle()


def test_a_principal_alone_runs_every_turn_of_the_server_and_beside_another_its_share() -> None:
    """Unset max_running: a fair share of the server's running turns. Alone, all 4; once
    another principal runs a turn, its new turns wait until it runs fewer than 4 // 2 (its
    running ones go on), and the other's turn starts at once; once the other has been quiet
    for ACTIVE_SECONDS, all 4 again (positive control)."""
    async def go() -> None:
        clock = _Clock()
        shares = Shares(threads=16, tenant_threads=16, running_turns=4, clock=clock)
        turns = _Turns(shares)
        for i in range(4):
            turns.send("noisy", f"n{i}")
        await turns.settle()
        assert turns.started == ["n0", "n1", "n2", "n3"]  # alone: every running turn
        assert shares.share("noisy") == 4 and shares.share("quiet") == 2
        turns.send("quiet", "q0")
        turns.send("noisy", "n4")
        turns.send("noisy", "n5")
        await turns.settle()
        assert turns.started[4:] == ["q0"]  # at once, beside noisy's four
        assert shares.share("noisy") == 2
        await turns.end("n0")
        await turns.end("n1")
        assert turns.started[5:] == []  # noisy runs 2 still: its share
        await turns.end("n2")
        assert turns.started[5:] == ["n4"]  # first come, first served
        await turns.end("q0")
        clock.now += ACTIVE_SECONDS + 0.1  # quiet: nothing running, nothing asked since
        await turns.end("n3")
        assert turns.started[6:] == ["n5"]
        turns.send("noisy", "n6")
        turns.send("noisy", "n7")
        await turns.settle()
        assert turns.started[7:] == ["n6", "n7"]  # alone again: 4 running
        for name in ("n4", "n5", "n6", "n7"):
            await turns.end(name)

    asyncio.run(go())


def test_max_running_is_a_ceiling_below_the_fair_share() -> None:
    async def go() -> None:
        shares = Shares(threads=16, tenant_threads=16, running_turns=4, clock=_Clock())
        turns = _Turns(shares)
        for i in range(3):
            turns.send("a", f"a{i}", max_running=2)
        await turns.settle()
        assert turns.started == ["a0", "a1"]
        await turns.end("a0")
        assert turns.started == ["a0", "a1", "a2"]
        # a reloaded bound applies from the next turn; the turns running are still counted
        turns.send("a", "a3", max_running=1)
        await turns.settle()
        assert turns.started[3:] == []
        await turns.end("a1")
        assert turns.started[3:] == []  # a2 still runs: 1 running, its new bound
        await turns.end("a2")
        assert turns.started[3:] == ["a3"]
        await turns.end("a3")

    asyncio.run(go())


def test_a_turn_granted_as_its_caller_leaves_gives_its_slot_back() -> None:
    """A waiting turn is given a slot and cancelled before it resumes (its client went
    away): the slot comes back at once, not never."""
    async def go() -> None:
        shares = Shares(threads=16, tenant_threads=16, running_turns=1, clock=_Clock())
        turns = _Turns(shares)
        first = shares.turn("a", None, queued=20)
        await first.__aenter__()  # held by the test itself: its end happens in this step
        turns.send("a", "second")
        await turns.settle()
        assert turns.started == []
        await first.__aexit__(None, None, None)  # grants the slot to the second ...
        turns.tasks["second"].cancel()  # ... which is cancelled before it resumed
        with contextlib.suppress(asyncio.CancelledError):
            await turns.tasks["second"]
        assert turns.started == []
        assert shares.ledger.account("a").running == 0
        turns.send("a", "third")
        await turns.settle()
        assert turns.started == ["third"]  # positive control: the slot is free
        await turns.end("third")

    asyncio.run(go())
