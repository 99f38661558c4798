"""``ToolHost``: a ToolSet served to one sandbox through its door (docs/abi.md, Layer 3).

A call goes: look up the tool, bound and decode its arguments, charge the budget, validate,
ask the gate, run the handler (sync ones on worker threads, async ones on the host's event-loop
thread; ``inline`` tools on the guest's own thread; a bridged MCP server's tools on its
session's loop), validate and encode the return. Every
failure is an error map for the guest and a :class:`ToolCallRecord` for the host; nothing a
guest sends raises here. Waits are bounded by the tool's timeout, the door's call bound and the
turn's deadline; a handler past its bound is abandoned (threads cannot be killed: the record
says it may still be running; an async one is cancelled).
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
import math
import reprlib
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import msgpack

from ..errors import ConfigError, ToolInstallError
from ..runtime_wasm import Door, DoorContext, DoorError, SandboxAPI, TurnStatus
from ..runtime_wasm.internal import Job, Workers
from ._codec import DecodeError, EncodeError, TooDeep, decode, encode
from ._loop import AsyncJob, LoopThread
from ._params import ArgumentsInvalid, ReturnInvalid
from ._tool import Tool
from ._toolset import ToolSet

__all__ = ["GateDecision", "ToolBudget", "ToolCallRecord", "ToolHost", "ToolRequest"]

MAX_MESSAGE = 4000  # characters of an error message the guest is shown
MAX_ERRORS = 50  # validation entries the guest is shown (the message counts all of them)


@dataclass(frozen=True, kw_only=True)
class ToolBudget:
    """Bounds on what a guest may ask: calls per turn and per sandbox (None: unlimited),
    nesting depth of arguments, bytes of one call's arguments (the door caps whole frames)."""

    calls_per_turn: int | None = None
    calls_per_sandbox: int | None = None
    max_depth: int = 64
    max_argument_bytes: int | None = None

    def __post_init__(self) -> None:
        for name in ("calls_per_turn", "calls_per_sandbox", "max_argument_bytes"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v < 0):
                raise ConfigError(f"ToolBudget.{name} must be an int >= 0 or None, got {v!r}")
        if not isinstance(self.max_depth, int) or self.max_depth < 1:
            raise ConfigError(f"ToolBudget.max_depth must be an int >= 1, got {self.max_depth!r}")


@dataclass(frozen=True, kw_only=True)
class ToolRequest:
    """What a gate sees: the tool and its validated arguments, before the handler runs."""

    tool: Tool
    arguments: Mapping[str, Any]
    turn: int | None
    call_id: Any = None  # the batch element's id; None for tools.call


@dataclass(frozen=True, kw_only=True)
class GateDecision:
    """A gate's answer: approve, deny (the reason reaches the guest) or rewrite the arguments
    (validated again before the handler runs). A gate may also return True/None (approve) or
    False (deny)."""

    action: Literal["approve", "deny", "rewrite"]
    reason: str = ""
    arguments: Mapping[str, Any] | None = None

    @classmethod
    def approve(cls) -> GateDecision:
        return cls(action="approve")

    @classmethod
    def deny(cls, reason: str = "the call was refused") -> GateDecision:
        return cls(action="deny", reason=reason)

    @classmethod
    def rewrite(cls, arguments: Mapping[str, Any]) -> GateDecision:
        return cls(action="rewrite", arguments=dict(arguments))


Gate = Callable[[ToolRequest], "GateDecision | bool | None"]


@dataclass(frozen=True, kw_only=True)
class ToolCallRecord:
    """One tool call as the host saw it. ``ran``: the handler started (a timed-out call may
    still be running: ``may_still_run``). ``traceback`` keeps what the guest is not shown.
    ``request_bytes`` is the request frame of a ``tools.call`` (the call's encoded arguments
    in a batch); ``reply_bytes`` the encoded value or error map."""

    tool: str
    turn: int | None
    call_id: Any = None
    batch: bool = False
    arguments: str = ""
    outcome: str = "ok"  # "ok" or a tool error kind (docs/abi.md)
    message: str | None = None
    duration: float = 0.0
    request_bytes: int = 0
    reply_bytes: int = 0
    ran: bool = False
    may_still_run: bool = False
    gate: str | None = None  # approve | deny | rewrite, when a gate was asked
    traceback: str | None = None


class _Call:
    """One call in flight (mutable scratch of the dispatcher)."""

    __slots__ = ("arguments", "batch", "call_id", "deadline", "end", "error", "gate", "job",
                 "may_still_run", "name", "ran", "reply_bytes", "request_bytes", "start", "tb",
                 "tool", "value")

    def __init__(self, call_id: object, name: str, batch: bool, start: float) -> None:
        self.call_id, self.name, self.batch, self.start = call_id, name, batch, start
        self.tool: Tool | None = None
        self.arguments: Any = None
        self.request_bytes = 0
        self.deadline = math.inf
        self.job: Job | AsyncJob | None = None
        self.error: dict[str, Any] | None = None
        self.value: Any = None
        self.reply_bytes = 0
        self.ran = False
        self.may_still_run = False
        self.gate: str | None = None
        self.tb: str | None = None
        self.end: float | None = None  # when the handler finished

    def fail(self, kind: str, message: str, **extra: Any) -> None:
        self.error = {"kind": kind, "message": _clean(message), **extra}


def _clean(text: str, limit: int = MAX_MESSAGE) -> str:
    """A message as the guest may be shown it: bounded, and encodable as UTF-8."""
    if len(text) > limit:
        text = text[: limit - 40] + f"... [{len(text) - limit + 40} characters cut]"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def _entries(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Validation entries for the guest: at most MAX_ERRORS, messages bounded."""
    return [{"path": [p if type(p) is int else _clean(str(p), 200) for p in e["path"]],
             "message": _clean(str(e["message"]), 500)} for e in errors[:MAX_ERRORS]]


_SUMMARY = reprlib.Repr()
_SUMMARY.maxstring, _SUMMARY.maxother, _SUMMARY.maxlist, _SUMMARY.maxdict = 60, 60, 6, 6
_SUMMARY.maxlevel = 3


_SCALARS = (int, float, bool, type(None))
_I64 = 1 << 63


def _summarize(args: object, limit: int = 300) -> str:
    """A bounded one-line text of the arguments (fast for small maps of scalars)."""
    if type(args) is dict and all(
            type(v) in _SCALARS or (type(v) is str and len(v) <= 60) for v in args.values()):
        text = ", ".join(f"{k}={v!r}" for k, v in args.items())
        if len(text) <= limit:
            return text

    def short(v: object) -> Any:
        shape = getattr(v, "shape", None)
        if (shape is not None and hasattr(v, "dtype")) or type(v).__name__ == "DataFrame":
            return _Label(f"{type(v).__name__}(shape={tuple(shape or ())})")
        return v

    if isinstance(args, Mapping):
        text = ", ".join(f"{k}={_SUMMARY.repr(short(v))}" for k, v in args.items())
    else:
        text = _SUMMARY.repr(args)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Label:
    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _exc_message(exc: BaseException) -> str:
    try:
        return str(exc) or type(exc).__name__
    except Exception:  # a __str__ that raises
        return type(exc).__name__


def _size(value: object) -> int:
    try:
        return len(msgpack.packb(value, use_bin_type=True))
    except Exception:  # cannot happen for what the door unpacked; stay total anyway
        return 0


class ToolHost:
    """Serves ``tools`` to a guest: ``ToolHost(tools).attach(sandbox)`` registers the door
    ops ``tools.call``, ``tools.batch`` and ``tools.list`` and installs the guest module
    ``tools``. ``calls`` holds the last ``keep_calls`` call records; ``on_call`` sees each.

    One host per door: a fork of the sandbox shares its door, hence this host, its records
    and its per-sandbox budget. Close the host (or use it as a context manager) to stop its
    threads."""

    def __init__(self, tools: ToolSet | Iterable[Tool | Callable[..., Any]], *,
                 budget: ToolBudget | None = None, gate: Gate | None = None,
                 call_timeout: float | None = None, workers: int = 32, keep_calls: int = 1000,
                 on_call: Callable[[ToolCallRecord], None] | None = None) -> None:
        if call_timeout is not None and not call_timeout > 0:
            raise ConfigError("call_timeout must be > 0")
        if workers < 1:
            raise ConfigError("workers must be >= 1")
        self.tools = tools if isinstance(tools, ToolSet) else ToolSet(tools)
        self.budget = budget or ToolBudget()
        self.gate = gate
        self.call_timeout = call_timeout
        self.on_call = on_call
        self.calls: list[ToolCallRecord] = []
        self._keep = keep_calls
        self._door: Door | None = None
        self._sandbox: SandboxAPI[Any] | None = None
        self._lock = threading.Lock()
        self._turn_key: Any = None
        self._turn_calls = 0
        self._total_calls = 0
        self._workers = Workers(workers, "memex-tools", self._serving)
        self._loop = LoopThread("memex-tools-loop", self._serving)

    # ---- wiring -------------------------------------------------------------------------------
    def register(self, door: Door) -> None:
        """Register the door ops (without touching any guest)."""
        if self._door is not None and self._door is not door:
            raise ConfigError("this ToolHost already serves another door")
        self._door = door
        door.register("tools.call", self._op_call, inline=True, context=True)
        door.register("tools.batch", self._op_batch, inline=True, context=True)
        door.register("tools.list", self._op_list, inline=True)

    def attach(self, sandbox: SandboxAPI[Any], *, install: bool = True) -> ToolHost:
        """Serve this sandbox (its door) and install the guest module ``tools`` in it."""
        self.register(sandbox.door)
        self._sandbox = sandbox
        if install:
            self.install(sandbox)
        return self

    def install(self, sandbox: SandboxAPI[Any], *, pin: bool = False) -> None:
        """(Re)install the stub module; run again after changing the tool set. ``pin=True``:
        later installs keep these tools (:meth:`ToolSet.install_source`)."""
        r = sandbox.run(self.tools.install_source(pin=pin), filename="<memex-tools-install>")
        if r.status is not TurnStatus.OK:
            what = (f"{r.exception.type}: {r.exception.message}" if r.exception
                    else f"{r.status.value} ({r.limit})")
            raise ToolInstallError(f"installing the tools module in the guest failed: {what}")

    def close(self) -> None:
        """Stop the worker threads and the event loop (handlers still running finish)."""
        self._workers.close()
        self._loop.close()

    def __enter__(self) -> ToolHost:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _serving(self) -> contextlib.AbstractContextManager[Any]:
        if self._door is None:
            return contextlib.nullcontext()
        return DoorContext(door=self._door, op="tools", deadline=math.inf).serving()

    # ---- door ops -----------------------------------------------------------------------------
    def _op_list(self) -> list[dict[str, str]]:
        return self.tools.describe()

    def _op_call(self, ctx: DoorContext, name: object = None, arguments: object = None) -> Any:
        call = self._run(ctx, [(None, name, arguments)], batch=False)[0]
        if call.error is None:
            return call.value
        err = dict(call.error)
        raise DoorError(err.pop("kind"), err.pop("message"), **err)

    def _op_batch(self, ctx: DoorContext, calls: object = None) -> list[list[Any]]:
        if not isinstance(calls, list) or not all(
                isinstance(c, list) and len(c) == 3 for c in calls):
            raise DoorError("protocol", "tools.batch takes [[call_id, name, arguments], ...]")
        done = self._run(ctx, [(c[0], c[1], c[2]) for c in calls], batch=True)
        return [[c.call_id, c.error is None, c.value if c.error is None else c.error]
                for c in done]

    # ---- the pipeline -------------------------------------------------------------------------
    def _run(self, ctx: DoorContext, requests: list[tuple[Any, Any, Any]], batch: bool
             ) -> list[_Call]:
        turn = self._turn(ctx)
        calls = []
        for cid, name, arguments in requests:
            call = _Call(cid, name if type(name) is str else _SUMMARY.repr(name), batch,
                         time.monotonic())
            self._prepare(ctx, call, turn, name, arguments, ctx.request_bytes if not batch
                          else None)
            if call.error is None:
                self._launch(ctx, call)
            calls.append(call)
        for call in calls:
            self._finish(call)
            self._record(call, turn)
        return calls

    def _turn(self, ctx: DoorContext) -> int | None:
        turn = self._sandbox.turns if self._sandbox is not None else None
        key = (turn, ctx.deadline)
        with self._lock:
            if key != self._turn_key:
                self._turn_key, self._turn_calls = key, 0
        return turn

    def _prepare(self, ctx: DoorContext, call: _Call, turn: int | None, name: object,
                 arguments: object, frame_bytes: int | None) -> None:
        tool = self.tools.get(name) if isinstance(name, str) else None
        if tool is None:
            near = difflib.get_close_matches(call.name, self.tools.names, n=3)
            hint = f"; did you mean {', '.join(near)}?" if near else ""
            call.fail("unknown_tool", f"no tool named {call.name!r}{hint}")
            return
        call.tool = tool
        if type(arguments) is not dict or any(type(k) is not str for k in arguments):
            call.fail("invalid_arguments", "arguments must be a map of names to values",
                      errors=[{"path": [], "message": "not a map with string keys"}])
            return
        b = self.budget
        call.request_bytes = frame_bytes if frame_bytes is not None else _size(arguments)
        if b.max_argument_bytes is not None and call.request_bytes > b.max_argument_bytes and (
                frame_bytes is None or _size(arguments) > b.max_argument_bytes):
            call.fail("too_large", f"arguments of {call.request_bytes} bytes exceed the "
                      f"{b.max_argument_bytes}-byte bound")
            return
        try:
            decoded = decode(arguments, max_depth=b.max_depth, cost=ctx.cost)
        except TooDeep as exc:
            call.fail("too_deep", f"arguments nested deeper than {b.max_depth} levels at "
                      f"{list(exc.path)}")
            return
        except DecodeError as exc:
            call.fail("invalid_arguments", f"undecodable value: {exc.message}",
                      errors=_entries([{"path": list(exc.path), "message": exc.message}]))
            return
        call.arguments = decoded
        if not self._charge():
            call.fail("budget_exceeded", self._budget_message())
            return
        try:
            checked = tool.checker.arguments(decoded)
        except ArgumentsInvalid as exc:
            call.fail("invalid_arguments", f"invalid arguments for {tool.name}: {exc}",
                      errors=_entries(exc.errors))
            return
        except Exception as exc:  # a validator of a parameter's type raised something else
            call.tb = "".join(traceback.format_exception(exc))
            call.fail("invalid_arguments", f"the arguments of {tool.name} could not be "
                      f"checked: {_exc_message(exc)}")
            return
        if self.gate is not None and not self._ask_gate(call, tool, checked, turn):
            return
        call.arguments = checked
        bound = self.call_timeout if self.call_timeout is not None else ctx.door.call_timeout
        if tool.timeout is not None:
            bound = min(bound, tool.timeout)
        call.deadline = min(ctx.deadline, call.start + bound)
        if call.deadline <= time.monotonic():
            call.fail("timeout", "no time left in this turn for the call")

    def _charge(self) -> bool:
        b = self.budget
        with self._lock:
            if b.calls_per_turn is not None and self._turn_calls >= b.calls_per_turn:
                return False
            if b.calls_per_sandbox is not None and self._total_calls >= b.calls_per_sandbox:
                return False
            self._turn_calls += 1
            self._total_calls += 1
            return True

    def _budget_message(self) -> str:
        b = self.budget
        if b.calls_per_sandbox is not None and self._total_calls >= b.calls_per_sandbox:
            return f"the budget of {b.calls_per_sandbox} tool calls for this sandbox is used up"
        return f"the budget of {b.calls_per_turn} tool calls per turn is used up"

    def _ask_gate(self, call: _Call, tool: Tool, checked: dict[str, Any], turn: int | None
                  ) -> bool:
        assert self.gate is not None
        try:
            verdict = self.gate(ToolRequest(tool=tool, arguments=dict(checked), turn=turn,
                                            call_id=call.call_id))
        except Exception as exc:
            call.gate, call.tb = "deny", traceback.format_exc()
            call.fail("denied", f"the call was refused (gate failed: {type(exc).__name__})")
            return False
        if verdict is None or verdict is True:
            verdict = GateDecision.approve()
        elif verdict is False:
            verdict = GateDecision.deny()
        if not isinstance(verdict, GateDecision):
            call.gate = "deny"
            call.fail("denied", "the call was refused (gate returned "
                      f"{type(verdict).__name__})")
            return False
        call.gate = verdict.action
        if verdict.action == "deny":
            call.fail("denied", verdict.reason or "the call was refused")
            return False
        if verdict.action == "rewrite":
            try:
                checked.clear()
                checked.update(tool.checker.arguments(dict(verdict.arguments or {})))
            except ArgumentsInvalid as exc:
                call.fail("invalid_arguments", f"the gate's rewrite of {tool.name} is "
                          f"invalid: {exc}", errors=_entries(exc.errors))
                return False
            except Exception as exc:
                call.tb = traceback.format_exc()
                call.fail("invalid_arguments", f"the gate's rewrite of {tool.name} could "
                          f"not be checked: {_exc_message(exc)}")
                return False
        return True

    def _launch(self, ctx: DoorContext, call: _Call) -> None:
        tool, args = call.tool, call.arguments
        assert tool is not None
        runs_on = getattr(tool.handler, "memex_runs_on", None)
        if runs_on is not None and not runs_on[0].is_closed():
            loop, make = runs_on  # a sync handler that waits on its own loop: wait there
            call.job = AsyncJob(loop, lambda: make(**args))
        elif tool.is_async:
            call.job = self._loop.submit(lambda: tool.invoke(args))
        elif tool.inline:
            job = Job(lambda: tool.invoke(args))
            job.run()  # on the guest's thread, which the door marks as serving
            call.job = job
        else:  # on a worker thread (marked as serving this host's door)
            def run() -> Any:
                value = tool.invoke(args)
                if inspect.isawaitable(value):  # a sync function returning a coroutine
                    async def wait() -> Any:
                        return await value
                    value = self._loop.submit(wait).result()
                return value
            call.job = self._workers.submit(run)

    def _finish(self, call: _Call) -> None:
        job, tool = call.job, call.tool
        if job is None or tool is None:
            return
        finished = job.wait(call.deadline - time.monotonic())
        call.ran = job.started
        call.end = job.ended
        if not finished:
            call.may_still_run = True
            if isinstance(job, AsyncJob):
                job.cancel()
            bound = call.deadline - call.start
            call.fail("timeout", f"{tool.name} did not finish within {bound:.3g}s"
                      + ("" if call.ran else " (it never started)"), ran=call.ran)
            return
        if job.error is not None:
            exc = job.error
            call.tb = "".join(traceback.format_exception(exc))
            call.fail("tool_failed", _exc_message(exc))
            return
        try:
            value = tool.checker.returns(job.value)
        except ReturnInvalid as exc:
            call.fail("invalid_return", f"{tool.name} returned a value that violates its "
                      f"declared return type: {exc}", errors=_entries(exc.errors))
            return
        except Exception as exc:  # a validator of the declared type raised something else
            call.tb = "".join(traceback.format_exception(exc))
            call.fail("invalid_return", f"{tool.name}'s return value could not be checked: "
                      f"{_exc_message(exc)}")
            return
        try:
            if type(value) in _SCALARS and (type(value) is not int or -_I64 <= value < 2 * _I64):
                encoded = value
            else:
                encoded = encode(value, names=self.tools.record_names)
            size = len(msgpack.packb(encoded, use_bin_type=True))
        except (EncodeError, ValueError, OverflowError) as exc:
            call.fail("invalid_return", f"{tool.name} returned a value that cannot be sent: "
                      f"{_exc_message(exc)}")
            return
        except Exception as exc:  # e.g. a pandas object failing its own conversion
            call.tb = "".join(traceback.format_exception(exc))
            call.fail("invalid_return", f"{tool.name} returned a value that cannot be sent: "
                      f"{type(exc).__name__}: {_exc_message(exc)}")
            return
        cap = self._door.max_reply_bytes if self._door is not None else math.inf
        if size > cap:
            call.fail("too_large", f"{tool.name} returned {size} bytes, over the door's "
                      f"{cap}-byte reply cap")
            return
        call.value, call.reply_bytes = encoded, size

    def _record(self, call: _Call, turn: int | None) -> None:
        err = call.error
        if err is not None:
            call.reply_bytes = len(msgpack.packb(err, use_bin_type=True))
        # Every field given, set without the frozen __init__ (~4 us less per call).
        try:
            summary = _summarize(call.arguments) if call.arguments is not None else ""
        except Exception:  # a value whose repr raises
            summary = "<arguments without a repr>"
        rec = object.__new__(ToolCallRecord)
        rec.__dict__.update(
            tool=call.name, turn=turn, call_id=call.call_id, batch=call.batch,
            arguments=summary,
            outcome="ok" if err is None else err["kind"],
            message=None if err is None else err["message"],
            duration=(call.end or time.monotonic()) - call.start, request_bytes=call.request_bytes,
            reply_bytes=call.reply_bytes, ran=call.ran, may_still_run=call.may_still_run,
            gate=call.gate, traceback=call.tb)
        with self._lock:
            self.calls.append(rec)
            if len(self.calls) > self._keep:
                del self.calls[: len(self.calls) - self._keep]
        if self.on_call is not None:
            with contextlib.suppress(Exception):
                self.on_call(rec)
