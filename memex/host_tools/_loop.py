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

__all__ = ["AsyncJob", "LoopThread"]


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
