"""AsyncJob: a coroutine run on a loop thread, waited for from another thread through a lock."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

import pytest

from memex.host_tools._loop import AsyncJob, LoopThread


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    lt = LoopThread("test-loop", contextlib.nullcontext)
    yield lt.loop()
    lt.close()


def test_the_waiter_gets_the_value_or_the_exception(loop: asyncio.AbstractEventLoop) -> None:
    async def seven() -> int:
        await asyncio.sleep(0)
        return 7

    async def boom() -> int:
        raise ValueError("no")

    ok = AsyncJob(loop, seven)
    assert ok.wait(10) and ok.started and ok.ended is not None
    assert ok.value == 7 and ok.error is None and ok.result() == 7
    bad = AsyncJob(loop, boom)
    assert bad.wait(10) and isinstance(bad.error, ValueError)
    with pytest.raises(ValueError, match="no"):
        bad.result()


def test_an_unfinished_job_is_not_done_within_its_wait(loop: asyncio.AbstractEventLoop) -> None:
    release = threading.Event()

    async def held() -> str:
        while not release.is_set():
            await asyncio.sleep(0.005)
        return "out"

    job = AsyncJob(loop, held)
    assert not job.wait(0.05) and job.ended is None
    release.set()
    assert job.wait(10) and job.value == "out"


def test_cancel_stops_a_running_coroutine(loop: asyncio.AbstractEventLoop) -> None:
    running, seen = threading.Event(), threading.Event()

    async def forever() -> None:
        running.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            seen.set()
            raise

    job = AsyncJob(loop, forever)
    assert running.wait(10)
    job.cancel()
    assert job.wait(10) and seen.is_set()
    assert isinstance(job.error, asyncio.CancelledError)


def test_a_job_cancelled_before_it_starts_never_runs() -> None:
    lt = LoopThread("test-loop", contextlib.nullcontext)
    loop = lt.loop()
    gate, ran = threading.Event(), threading.Event()
    loop.call_soon_threadsafe(gate.wait, 10)  # the loop is busy until the gate opens

    async def body() -> None:
        ran.set()

    job = AsyncJob(loop, body)
    job.cancel()
    gate.set()
    assert job.wait(10) and not job.started and not ran.is_set()
    assert isinstance(job.error, asyncio.CancelledError)
    # positive control: the same job not cancelled runs
    again = AsyncJob(loop, body)
    assert again.wait(10) and again.started and ran.is_set()
    lt.close()
    again.cancel()  # cancelling after the loop stopped is harmless


def test_a_coroutine_raising_systemexit_fails_its_job_and_the_loop_goes_on(
        loop: asyncio.AbstractEventLoop) -> None:
    # Through run_coroutine_threadsafe, SystemExit (a library calling sys.exit) ended the
    # loop thread: that job never finished and every later async tool of the host hung.
    async def exits() -> None:
        raise SystemExit(3)

    async def fine() -> str:
        return "still here"

    job = AsyncJob(loop, exits)
    assert job.wait(10) and isinstance(job.error, SystemExit)
    later = AsyncJob(loop, fine)
    assert later.wait(10) and later.value == "still here"
