"""The session core's fair shares (memex.serving.Shares), which both front ends admit every
operation through: a session's operations in arrival order, an owner's running turns and
its queue, and its share of the threads, given back when the work ends (also work whose
caller went away)."""

from __future__ import annotations

import functools
import threading
import time

import anyio
import pytest

from memex.errors import BackendBusy
from memex.serving import Shares


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
        t = shares._tenants["a"]
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
        assert shares._tenants["b"].threads.borrowed_tokens == 0
        assert ran == []  # it never ran once its caller left

    anyio.run(go)
