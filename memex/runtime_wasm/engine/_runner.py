"""A dedicated thread with a large native stack that owns one sandbox's guest.

wasmtime runs wasm on the calling thread's stack; an 8 MiB wasm stack needs a thread with
more than that, and a Store must be used by one thread at a time. Every guest operation of a
sandbox is a job on its runner; jobs run in order, and background work (the checkpoint after
a good turn) simply occupies the runner until the next job.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["NATIVE_STACK", "Runner"]

NATIVE_STACK = 32 << 20
_STACK_LOCK = threading.Lock()
T = TypeVar("T")


class _Box:
    __slots__ = ("done", "error", "value")

    def __init__(self) -> None:
        self.done = threading.Lock()
        self.done.acquire()
        self.value: Any = None
        self.error: BaseException | None = None


class Runner:
    def __init__(self, name: str) -> None:
        self._q: queue.SimpleQueue[tuple[Callable[[], Any], _Box | None] | None] = (
            queue.SimpleQueue()
        )
        with _STACK_LOCK:
            old = threading.stack_size(NATIVE_STACK)
            try:
                self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
                self._thread.start()
            finally:
                threading.stack_size(old)

    def _loop(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            fn, box = item
            try:
                if box is not None:
                    box.value = fn()
                else:
                    fn()
            except BaseException as exc:
                if box is not None:
                    box.error = exc
            finally:
                if box is not None:
                    box.done.release()
                # Drop the job now: a bound method kept here while waiting would keep its
                # sandbox alive (and never collected) after the caller dropped it.
                del item, fn, box

    def on_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the runner and return its value (or raise its exception)."""
        if self.on_thread():
            return fn()
        box = _Box()
        self._q.put((fn, box))
        box.done.acquire()
        if box.error is not None:
            raise box.error
        return box.value  # type: ignore[no-any-return]

    def post(self, fn: Callable[[], object]) -> None:
        """Queue background work; its exceptions are swallowed (it must handle its own)."""
        self._q.put((fn, None))

    def stop(self, timeout: float | None = None) -> bool:
        """Finish queued jobs, then end the thread. True if it ended within ``timeout``."""
        if self.on_thread():
            self._q.put(None)
            return False
        self._q.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()
