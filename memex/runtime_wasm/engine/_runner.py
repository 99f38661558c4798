"""Each sandbox's guest operations, run in order on a shared pool of large-stack threads.

wasmtime runs wasm on the calling thread's stack (an 8 MiB wasm stack needs a thread with
more than that), and a Store must be used by one thread at a time. A :class:`Runner` is one
sandbox's queue of such jobs: they run one after another, never two at once, and background
work (the checkpoint after a good turn) simply occupies the runner until the next job.

The runners share one elastic pool of threads (:data:`POOL`) instead of owning one each: a
runner with jobs borrows a thread until its queue is empty, a new thread starts only when
every pooled thread is busy, and a thread idle for ``POOL.keep_alive`` seconds ends. So as
many turns run at once as before (one thread per busy sandbox), while an idle sandbox holds
no thread, no native stack and no signal stack, and creating a sandbox starts no thread
(10,000 idle sandboxes would otherwise be 10,000 threads and 20,000 more memory mappings).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["NATIVE_STACK", "POOL", "Runner", "RunnerPool"]

NATIVE_STACK = 32 << 20
_STACK_LOCK = threading.Lock()
_HERE = threading.local()  # .runner: the runner whose job this thread is running
T = TypeVar("T")


class _Box:
    __slots__ = ("done", "error", "value")

    def __init__(self) -> None:
        self.done = threading.Lock()
        self.done.acquire()
        self.value: Any = None
        self.error: BaseException | None = None


_Job = tuple[Callable[[], Any], "_Box | None"]


class RunnerPool:
    """Threads that run runners' queues. One is started only when no idle one is waiting,
    so a job never waits for another runner's job to finish."""

    def __init__(self, keep_alive: float = 30.0) -> None:
        self.keep_alive = keep_alive
        self._cv = threading.Condition(threading.Lock())
        self._ready: collections.deque[Runner] = collections.deque()
        self._idle = 0
        self._threads = 0
        self._started = 0

    @property
    def threads(self) -> int:
        """Threads alive in the pool (busy or idle)."""
        with self._cv:
            return self._threads

    def submit(self, runner: Runner) -> None:
        with self._cv:
            self._ready.append(runner)
            if self._idle >= len(self._ready):
                self._cv.notify()
                return
            self._threads += 1
            self._started += 1
            n = self._started
        try:
            with _STACK_LOCK:
                old = threading.stack_size(NATIVE_STACK)
                try:
                    threading.Thread(target=self._loop, name=f"memex-runner-{n}",
                                     daemon=True).start()
                finally:
                    threading.stack_size(old)
        except BaseException:
            with self._cv:
                self._threads -= 1
                self._ready.remove(runner)
            raise

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._ready:
                    self._idle += 1
                    woken = self._cv.wait(self.keep_alive)
                    self._idle -= 1
                    if not woken and not self._ready:
                        self._threads -= 1
                        return
                runner = self._ready.popleft()
            runner._drain()
            del runner  # hold no sandbox while idle


POOL = RunnerPool()


class Runner:
    """One sandbox's jobs, in order, on :data:`POOL`."""

    __slots__ = ("_drained", "_jobs", "_lock", "_pool", "_scheduled", "_stopped", "name")

    def __init__(self, name: str, pool: RunnerPool | None = None) -> None:
        self.name = name
        self._pool = pool or POOL
        self._lock = threading.Lock()
        self._jobs: collections.deque[_Job] = collections.deque()
        self._scheduled = False
        self._stopped = False
        self._drained = threading.Event()
        self._drained.set()

    def _put(self, job: _Job) -> bool:
        with self._lock:
            if self._stopped:
                return False
            self._jobs.append(job)
            if self._scheduled:
                return True
            self._scheduled = True
            self._drained.clear()
        try:
            self._pool.submit(self)
        except BaseException:
            with self._lock:
                self._jobs.clear()
                self._scheduled = False
                self._drained.set()
            raise
        return True

    def _drain(self) -> None:
        """(pool thread) Run the queued jobs until none is left."""
        _HERE.runner = self
        try:
            while True:
                with self._lock:
                    if not self._jobs:
                        self._scheduled = False
                        self._drained.set()
                        return
                    fn, box = self._jobs.popleft()
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
                    # Drop the job now: a bound method kept here while waiting would keep
                    # its sandbox alive (and never collected) after the caller dropped it.
                    del fn, box
        finally:
            _HERE.runner = None

    def on_thread(self) -> bool:
        """True inside one of this runner's jobs."""
        return getattr(_HERE, "runner", None) is self

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the runner and return its value (or raise its exception)."""
        if self.on_thread():
            return fn()
        box = _Box()
        if not self._put((fn, box)):
            raise RuntimeError(f"runner {self.name} is stopped")
        box.done.acquire()
        if box.error is not None:
            raise box.error
        return box.value  # type: ignore[no-any-return]

    def post(self, fn: Callable[[], object]) -> None:
        """Queue background work; its exceptions are swallowed (it must handle its own).
        Nothing runs once the runner is stopped."""
        self._put((fn, None))

    def stop(self, timeout: float | None = None) -> bool:
        """Take no more jobs and let the queued ones finish. True if they finished within
        ``timeout`` (from inside a job: False, as the job in progress has not)."""
        with self._lock:
            self._stopped = True
        if self.on_thread():
            return False
        return self._drained.wait(timeout)
