# Runs inside the guest. Imports nothing from the host packages.
"""An asyncio event loop for the guest (no threads, sockets or selectors), batching tool calls.

The guest's default event loop cannot start (its self-pipe needs ``socket.socketpair``).
``EventLoop`` is a ``BaseEventLoop`` whose "selector" never watches a file descriptor: when
the loop would wait, it

* sends every tool call made since the last wait (``memex_guest.tools.call`` returns a
  ``ToolCall``, an awaitable already queued, inside this loop) as ONE ``tools.batch`` door
  request (a single call goes as ``tools.call``), and resolves each call with its value or
  its ToolError; the host runs a batch's calls concurrently;
* otherwise sleeps until the next timer (``asyncio.sleep``, timeouts);
* and with nothing left that could ever wake it (no calls, no timers, no ready callbacks),
  raises RuntimeError instead of hanging until the turn's deadline.

Calls are collected while any task can still run: a batch goes out when every task is waiting
(or after a few loop iterations of tasks that only spin on ``asyncio.sleep(0)``). A call
cancelled before its batch is sent never reaches the host; a batch is never interrupted: a
timer that falls due during one (``asyncio.wait_for``, ``asyncio.timeout``) fires after it.
``run_in_executor``/``asyncio.to_thread`` run the function right away on the loop's thread
(there are no other threads), with tool calls in it blocking as outside a loop.

``install()`` makes ``asyncio.run``, ``asyncio.new_event_loop``, ``asyncio.Runner`` and the
default policy use this loop (``import memex_guest`` arranges it when asyncio is imported).
``run(coro)`` is ``asyncio.run`` on a fresh loop; ``run_cell(coro)`` runs a top-level-await
cell's coroutine on one loop kept across cells, so tasks a cell leaves running go on
during later cells' awaits.
"""

import asyncio
import asyncio.base_events as _base_events
import collections.abc as _abc
import asyncio.events as _events
import time as _time

from . import tools as _tools

__all__ = ["EventLoop", "ToolCall", "ToolFuture", "install", "run", "run_cell"]

# Calls pending while tasks keep being ready (a task spinning on sleep(0)) go out after this
# many loop iterations anyway.
_MAX_DEFER = 16
_SLEEP_SLICE = 0.05  # sleeps are cut in slices so that the turn's deadline can interrupt them


class ToolFuture(asyncio.Future):
    """The pending result of a tool call made inside the MemEx event loop: await it.
    ``result()`` on a pending one sends the pending calls now and waits for them."""

    _memex_tool = None

    def result(self):
        if not self.done():
            loop = self.get_loop()
            if isinstance(loop, EventLoop):
                loop.memex_flush()
        return super().result()

    def __repr__(self):
        state = "pending" if not self.done() else (
            "cancelled" if self.cancelled() else "finished")
        return "<ToolFuture %s(...) %s: await it for the value>" % (self._memex_tool, state)


class ToolCall(_abc.Coroutine):
    """What ``tools.call`` returns inside the MemEx event loop: the call is already queued
    for the next batch; ``await`` it for the value (or ToolError). It is a coroutine, so
    ``asyncio.create_task``, ``TaskGroup.create_task``, ``gather``, ``as_completed`` and
    ``wait_for`` take it like any coroutine, and it may be awaited more than once.
    ``result()`` sends the pending calls now and returns the value without awaiting."""

    __slots__ = ("_it", "future")

    def __init__(self, future):
        self.future = future
        self._it = None

    def __await__(self):
        return self.future.__await__()

    def send(self, value):
        if self._it is None:
            self._it = self.future.__await__()
        return self._it.send(value)

    def throw(self, typ, val=None, tb=None):
        if self._it is None:
            # thrown into before it ever ran (a task cancelled before its first step):
            # the call is withdrawn if it has not been sent yet
            if isinstance(typ, asyncio.CancelledError) or (
                    isinstance(typ, type) and issubclass(typ, asyncio.CancelledError)):
                self.future.cancel()
            self._it = self.future.__await__()
        if val is None and tb is None:
            return self._it.throw(typ)
        return self._it.throw(typ, val, tb)

    def close(self):
        if self._it is not None:
            self._it.close()

    def result(self):
        return self.future.result()

    def exception(self):
        if not self.future.done():
            self.future.result()  # sends it and waits
        return self.future.exception()

    def done(self):
        return self.future.done()

    def cancel(self, msg=None):
        return self.future.cancel(msg)

    def cancelled(self):
        return self.future.cancelled()

    def __repr__(self):
        return repr(self.future)


class _Selector:
    __slots__ = ("_loop",)

    def __init__(self, loop):
        self._loop = loop

    def select(self, timeout=None):
        return self._loop._memex_wait(timeout)

    def close(self):
        pass

    def get_map(self):
        return {}


class EventLoop(_base_events.BaseEventLoop):
    """The guest's event loop (see the module docstring)."""

    def __init__(self):
        super().__init__()
        self._selector = _Selector(self)
        self._memex_pending = []
        self._memex_deferred = 0
        self._memex_prev = []
        self.memex_batches = 0  # door requests this loop sent (tools.call or tools.batch)

    # -- what BaseEventLoop asks of a subclass --------------------------------------------
    def _process_events(self, event_list):
        pass

    def _write_to_self(self):
        pass  # call_soon_threadsafe: there are no other threads to wake us

    def _run_forever_setup(self):
        super()._run_forever_setup()
        self._memex_prev.append(_tools._ACTIVE[0])
        _tools._ACTIVE[0] = self

    def _run_forever_cleanup(self):
        try:
            super()._run_forever_cleanup()
        finally:
            _tools._ACTIVE[0] = self._memex_prev.pop() if self._memex_prev else None

    def run_in_executor(self, executor, func, *args):
        self._check_closed()
        fut = self.create_future()
        prev = _tools._ACTIVE[0]
        _tools._ACTIVE[0] = None  # the function is sync code: its tool calls block
        try:
            value = func(*args)
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as exc:
            fut.set_exception(exc)
        else:
            fut.set_result(value)
        finally:
            _tools._ACTIVE[0] = prev
        return fut

    def close(self):
        if not self.is_running() and not self.is_closed() and self._memex_pending:
            self.memex_flush(discard=True)
        super().close()

    # -- tool calls -----------------------------------------------------------------------
    def memex_submit(self, name, raw):
        """Queue a tool call (arguments already encoded) for the next batch."""
        fut = ToolFuture(loop=self)
        fut._memex_tool = name
        self._memex_pending.append((fut, name, raw))
        return ToolCall(fut)

    def memex_flush(self, discard=False):
        """Send the pending calls now (one door request) and resolve their futures."""
        items = [p for p in self._memex_pending if not p[0].done()]
        self._memex_pending = []
        self._memex_deferred = 0
        if not items:
            return
        self.memex_batches += 1
        try:
            if len(items) == 1:
                fut, name, raw = items[0]
                try:
                    results = [(True, _tools.call_encoded(name, raw))]
                except _tools.ToolError as exc:
                    results = [(False, exc)]
            else:
                results = _tools.call_batch([(name, raw) for _, name, raw in items])
        except Exception as exc:  # the door itself failed (OSError...): every call fails
            results = [(False, exc)] * len(items)
        for (fut, _, _), (ok, value) in zip(items, results, strict=False):
            if fut.done():
                continue
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(value)
                if discard:
                    fut.exception()  # nobody will await it: no "never retrieved" warning

    def _memex_wait(self, timeout):
        if self._memex_pending:
            if timeout != 0 or self._memex_deferred >= _MAX_DEFER:
                self.memex_flush()
                return []
            self._memex_deferred += 1
            return []
        if timeout is None:
            raise RuntimeError(
                "event loop deadlock: every task is waiting for something that can never "
                "happen (no tool call, timer or ready callback is pending; the guest has no "
                "threads, sockets or subprocesses to wake it)")
        if timeout > 0:
            end = _time.monotonic() + timeout
            while True:
                left = end - _time.monotonic()
                if left <= 0:
                    break
                _time.sleep(min(left, _SLEEP_SLICE))
        return []

    # -- no I/O in the guest --------------------------------------------------------------
    def _no_io(self, *args, **kwargs):
        raise NotImplementedError("the guest's event loop has no sockets, pipes, "
                                  "subprocesses or signals")

    add_reader = remove_reader = add_writer = remove_writer = _no_io
    add_signal_handler = remove_signal_handler = _no_io


# ---- running coroutines ------------------------------------------------------------------------
_cell_loop = [None]


def run(main, *, debug=None):
    """Run the coroutine ``main`` to completion on a fresh EventLoop and return its result
    (``asyncio.run`` semantics: remaining tasks are cancelled, the loop closed, the current
    event loop left as it was)."""
    with asyncio.Runner(debug=debug, loop_factory=EventLoop) as runner:
        return runner.run(main)


def cell_loop():
    """The loop ``run_cell`` uses (created on first use, kept across cells)."""
    loop = _cell_loop[0]
    if loop is None or loop.is_closed():
        loop = _cell_loop[0] = EventLoop()
    return loop


def run_cell(coro):
    """Run a cell's top-level-await coroutine (from code compiled with
    ``ast.PyCF_ALLOW_TOP_LEVEL_AWAIT``) to completion and return its value.

    The loop persists across cells: tasks a cell starts and leaves running go on during
    later cells' awaits. Tool calls the cell made but never awaited are sent before this
    returns. An exception from the cell is re-raised with the event loop's own frames
    removed from the front of its traceback."""
    if _events._get_running_loop() is not None:
        raise RuntimeError("run_cell() cannot be called from a running event loop")
    loop = cell_loop()
    code = getattr(coro, "cr_code", None)
    try:
        task = loop.create_task(coro)
        try:
            return loop.run_until_complete(task)
        finally:
            if loop._memex_pending:
                loop.memex_flush(discard=True)
    except BaseException as exc:
        if code is not None:
            tb = exc.__traceback__
            while tb is not None and tb.tb_frame.f_code is not code:
                tb = tb.tb_next
            if tb is not None:
                exc.__traceback__ = tb
        raise


# ---- installing -------------------------------------------------------------------------------
_installed = [False]


def install():
    """Make asyncio's defaults use EventLoop: ``asyncio.run``, ``asyncio.new_event_loop``,
    ``asyncio.Runner()``, the default policy, and the names ``asyncio.EventLoop`` and
    ``asyncio.SelectorEventLoop``. Idempotent."""
    if _installed[0]:
        return
    base_policy = getattr(_events, "_BaseDefaultEventLoopPolicy", None)
    mods = [asyncio, _events]
    try:
        import asyncio.unix_events as unix_events

        mods.append(unix_events)
    except ImportError:
        pass
    for mod in mods:
        for attr, value in list(vars(mod).items()):
            if base_policy is not None and isinstance(value, type) and issubclass(
                    value, base_policy):
                value._loop_factory = EventLoop
            elif attr in ("SelectorEventLoop", "EventLoop", "_UnixSelectorEventLoop") and \
                    isinstance(value, type):
                setattr(mod, attr, EventLoop)
    if base_policy is not None:
        base_policy._loop_factory = EventLoop
    policy = getattr(_events, "_event_loop_policy", None)
    if policy is not None and hasattr(policy, "_loop_factory"):
        try:
            policy._loop_factory = EventLoop
        except AttributeError:
            pass
    _installed[0] = True
