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

A server runs its guests at a lower CPU priority than its own threads (:func:`set_guest_nice`:
the pool's threads take ``nice`` steps above the process's nice value, on Linux). A guest
is CPU work with a deadline of seconds; the threads that parse requests, admit turns and
carry replies are short and on every principal's path. Beside another principal's CPU-bound
turns, a quiet principal's small cell then waits for a core far less often (measured with
``bench/serve.py --only fairness``: its p99 beside long CPU turns 4.7-5.9 ms against
7.3-8.1 ms at the same priority). A library process keeps 0: its guests run as its other
threads do.
"""

from __future__ import annotations

import collections
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["GUEST_NICE_ENV", "NATIVE_STACK", "POOL", "Runner", "RunnerPool", "guest_nice",
           "set_guest_nice"]

GUEST_NICE_ENV = "MEMEX_GUEST_NICE"
"""How a worker process learns its parent's guest priority (set by the worker client)."""

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
        applied = _nice_now()  # a new thread has its creator's
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
            if applied != _NICE[0]:  # changed since this thread's last job
                applied = _renice(applied)
            runner._drain()
            del runner  # hold no sandbox while idle


POOL = RunnerPool()

_BASE: int | None
try:
    _BASE = os.getpriority(os.PRIO_PROCESS, 0)  # the importing thread's: the process's own
except (AttributeError, OSError):  # no setpriority (not a Unix)
    _BASE = None
_NICE = [0]


def guest_nice() -> int:
    """How many nice steps below this process's other threads its guests run."""
    return _NICE[0]


def set_guest_nice(steps: int) -> None:
    """Run this process's guests ``steps`` nice steps (0-19) below its other threads from
    their next job on (module docstring). Worker processes started after it inherit it."""
    if not isinstance(steps, int) or isinstance(steps, bool) or not 0 <= steps <= 19:
        raise ValueError(f"guest nice must be an int from 0 to 19, not {steps!r}")
    if steps and _BASE is None:
        raise ValueError("guest nice needs setpriority (Linux); this platform has none")
    _NICE[0] = steps


def _nice_now() -> int:
    if _BASE is None:
        return 0
    try:
        return os.getpriority(os.PRIO_PROCESS, 0) - _BASE
    except OSError:
        return 0


def _renice(applied: int) -> int:
    """(pool thread) Take the guest nice asked for; a thread that may not raise its
    priority back (no CAP_SYS_NICE) keeps the lower one, and says so by what it returns."""
    want = _NICE[0]
    if _BASE is None:
        return want
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), min(19, _BASE + want))
    except PermissionError:
        return applied if want < applied else want
    return want


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
