"""Where async tool handlers run: one asyncio loop thread per tool host. Sync handlers run on
the runtime's shared thread pool (``memex.runtime_wasm.Workers``); an :class:`AsyncJob` has
the same interface as its ``Job``, so a waiter treats both alike. A Python thread cannot be
killed, so a job past its bound may still be running (its ``started`` flag says whether it
ever began)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

from ..runtime_wasm.internal import Job

__all__ = ["AsyncJob", "LoopThread"]


class AsyncJob(Job):
    """A coroutine scheduled on the loop thread: a :class:`Job` (its lock, fields and
    ``wait``) whose task releases the lock as its last step, so a waiting thread wakes as
    soon as the result is set (a ``concurrent.futures`` future is told one loop iteration
    later, through the task's done callbacks, and then wakes its waiters with a condition)."""

    __slots__ = ("_cancelled", "_loop", "_task")

    def __init__(self, loop: asyncio.AbstractEventLoop,
                 make: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        super().__init__(make)
        self._loop = loop
        self._task: asyncio.Task[None] | None = None
        self._cancelled = False
        loop.call_soon_threadsafe(self._start)  # RuntimeError if the loop is closed

    def _start(self) -> None:
        if self._cancelled:  # cancelled before it began: it never runs
            self._end(asyncio.CancelledError())
            return
        run = self._run()
        try:
            self._task = self._loop.create_task(run)
        except BaseException as exc:  # the loop is closing: the waiter hears of it now
            run.close()
            self._end(exc)

    async def _run(self) -> None:
        self.started = True
        try:
            self.value = await self.fn()
        except BaseException as exc:  # the task's outcome is this job's, read by the waiter
            self._end(exc)
            return
        self._end(None)

    def _end(self, error: BaseException | None) -> None:
        self.error = error
        self.ended = time.monotonic()
        self.done.release()

    def result(self) -> Any:
        """Block until done; the value or the coroutine's exception."""
        self.wait(threading.TIMEOUT_MAX)
        if self.error is not None:
            raise self.error
        return self.value

    def cancel(self) -> None:
        """Cancel the task (it never starts if it has not yet)."""
        self._cancelled = True

        def cancel() -> None:
            if self._task is not None:
                self._task.cancel()

        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing runs on it
            self._loop.call_soon_threadsafe(cancel)


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
