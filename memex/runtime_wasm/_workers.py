"""The one thread pool that host handlers run on: door handlers (``Door``) and tool handlers
(``memex.host_tools``). Persistent daemon threads, created on demand up to a bound; a job is
answered through a lock (one wake-up each way, ~100 us cheaper per call than a Future or a
Condition). A waiter gives up at its bound; a Python thread cannot be killed, so a job past
its bound may still be running (its ``started`` flag says whether it ever began).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["Job", "Workers"]


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
