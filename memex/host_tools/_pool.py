"""Where tool handlers run: a pool of daemon threads for sync handlers (a lock hand-off each
way, like the door's own pool: cheaper than futures) and one asyncio loop thread per tool host
for async ones. A waiter gives up at its bound; a Python thread cannot be killed, so a job
past its bound may still be running (its ``started`` flag says whether it ever began)."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

__all__ = ["AsyncJob", "Job", "LoopThread", "Workers"]


class Job:
    """One call handed to a worker, answered through a lock."""

    __slots__ = ("done", "ended", "error", "fn", "started", "value")

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.done = threading.Lock()
        self.done.acquire()
        self.value: Any = None
        self.error: BaseException | None = None
        self.started = False
        self.ended: float | None = None

    def wait(self, timeout: float) -> bool:
        """True when finished within ``timeout`` seconds."""
        if self.done.acquire(timeout=max(timeout, 0.0)):
            self.done.release()
            return True
        return False

    def run(self, before_release: Callable[[], None] | None = None) -> None:
        self.started = True
        try:
            self.value = self.fn()
        except BaseException as exc:
            self.error = exc
        self.ended = time.monotonic()
        if before_release is not None:
            before_release()
        self.done.release()


class Workers:
    """At most ``size`` persistent daemon threads, created on demand. Each runs its jobs
    inside ``wrap()`` (entered once per thread: e.g. marking it as serving a door)."""

    def __init__(self, size: int, name: str,
                 wrap: Callable[[], contextlib.AbstractContextManager[Any]] | None = None
                 ) -> None:
        self._q: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._idle = 0
        self._n = 0
        self._max = size
        self._name = name
        self._wrap = wrap or contextlib.nullcontext
        self._lock = threading.Lock()

    def submit(self, fn: Callable[[], Any]) -> Job:
        job = Job(fn)
        with self._lock:
            spawn = self._idle == 0 and self._n < self._max
            if spawn:
                self._n += 1
            elif self._idle:
                self._idle -= 1
        if spawn:
            threading.Thread(target=self._work, daemon=True, name=self._name).start()
        self._q.put(job)
        return job

    def _work(self) -> None:
        with self._wrap():
            while True:
                job = self._q.get()
                if job is None:
                    return
                job.run(self._idle_again)  # idle before the waiter wakes: no GIL convoy
                del job

    def _idle_again(self) -> None:
        with self._lock:
            self._idle += 1

    def close(self) -> None:
        with self._lock:
            n, self._n = self._n, 0
        for _ in range(n):
            self._q.put(None)


class AsyncJob:
    """A coroutine scheduled on the loop thread; same interface as :class:`Job`."""

    __slots__ = ("_future", "ended", "started")

    def __init__(self, loop: asyncio.AbstractEventLoop,
                 make: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        self.started = False
        self.ended: float | None = None

        async def runner() -> Any:
            self.started = True
            try:
                return await make()
            finally:
                self.ended = time.monotonic()

        self._future = asyncio.run_coroutine_threadsafe(runner(), loop)

    def wait(self, timeout: float) -> bool:
        try:
            self._future.result(timeout=max(timeout, 0.0))
        except TimeoutError:
            return self._future.done()
        except BaseException:
            pass
        return True

    def result(self) -> Any:
        """Block until done; the value or the coroutine's exception."""
        return self._future.result()

    @property
    def value(self) -> Any:
        return self._future.result(timeout=0)

    @property
    def error(self) -> BaseException | None:
        if self._future.cancelled():
            return asyncio.CancelledError()
        return self._future.exception(timeout=0)

    def cancel(self) -> None:
        self._future.cancel()


class LoopThread:
    """One asyncio event loop on a daemon thread, started on first use."""

    def __init__(self, name: str, wrap: Callable[[], contextlib.AbstractContextManager[Any]]
                 ) -> None:
        self._name = name
        self._wrap = wrap
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def run() -> None:
                    asyncio.set_event_loop(loop)
                    with self._wrap():
                        loop.call_soon(ready.set)
                        loop.run_forever()
                    loop.close()

                threading.Thread(target=run, daemon=True, name=self._name).start()
                ready.wait()
                self._loop = loop
            return self._loop

    def submit(self, make: Callable[[], Coroutine[Any, Any, Any]]) -> AsyncJob:
        return AsyncJob(self.loop(), make)

    def close(self) -> None:
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
