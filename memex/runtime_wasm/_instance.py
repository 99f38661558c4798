"""One live guest: a wasmtime Store + instance of the snapshot binary, its WASI wiring, the
door import and the shadowed clock/poll functions that keep blocking waits inside deadlines.

Deadlines and cancellation: the store's epoch deadline is set at most ``EPOCH_CHUNK`` ticks
ahead, and reaching it calls :meth:`Instance.epoch_deadline` on the guest's thread (through
``_ffi.watch_epochs``), which stops the guest when ``cancel`` is set (a sandbox closing from
another thread) or the turn's wall-clock deadline has passed, and otherwise lets it run for
another chunk. A CPU-bound guest therefore notices a cancellation within one chunk (~50 ms).

An ``Instance`` is not thread-safe: the owning sandbox drives it from one runner thread.
A trap leaves it dead (``alive`` False); the sandbox replaces it and restores an image.

Everything that crosses into wasmtime on a turn goes through the seam ``_ffi`` (raw calls on
reused buffers, host imports dispatched straight to this object, raw memory access): a trivial
turn is one ``host_alloc`` call, one ``turn`` call and, for a cell that returns a value or
fails, one control request. The cell itself travels inside the turn's source (see
``_inline_turn`` and guest/_driver.py); drivers of older images still pull it with a JSON
control request, which stays supported.
"""

from __future__ import annotations

import json
import struct
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import GuestStartError
from ._bounded import json_loads
from ._output import StreamCapture
from .engine import _capi, _ffi, _signals
from .engine._capi import EXTERN_FUNC, EXTERN_MEMORY, TrapCode, WasmError
from .engine._engine import (
    TICK_SECONDS,
    LoadedModule,
    engine,
    ticks_for,
    turn_ended,
    turn_started,
)
from .files._disk import DiskLedger, DiskUse, GuestFiles

__all__ = ["DoorFn", "GuestKilled", "Instance", "InstanceSpec", "TurnOutcome"]

CONTROL = b"\x00MX"
TURN_CALL = "__memex_turn__()"
_INLINE = TURN_CALL + "\n#"  # the cell rides in a comment line (see guest/_driver.py)
_ERRNO_INVAL = 28
_ERRNO_FAULT = 21
_SUB = struct.Struct("<QB")
_CLOCK = struct.Struct("<I4xQQH")
_EVENT = struct.Struct("<QHB5xQH6x")
_U32 = struct.Struct("<I")
_U32X2 = struct.Struct("<II")
_U64 = struct.Struct("<Q")

EPOCH_CHUNK_SECONDS = 0.05
"""How long a guest runs between two checks of its cancel event and deadline (at most)."""
EPOCH_CHUNK = ticks_for(EPOCH_CHUNK_SECONDS)
_CHUNK_SPAN = EPOCH_CHUNK * TICK_SECONDS
_HALF_TICK = TICK_SECONDS / 2
_CANCELLED_RUN = "turn cancelled: the sandbox was closed while the guest was running"
_CANCELLED_SLEEP = "turn cancelled: the sandbox was closed while the guest slept"

DoorFn = Callable[[bytes, float], bytes]
"""The host side of the door: (request bytes, turn deadline on time.monotonic) -> reply."""


class GuestKilled(Exception):
    """Raised inside a host function to trap the running turn (the instance dies)."""

    def __init__(self, limit: str, detail: str) -> None:
        super().__init__(detail)
        self.limit = limit
        self.detail = detail


@dataclass(frozen=True, kw_only=True)
class InstanceSpec:
    """Everything needed to build identical instances (rollback and fork rebuild from it)."""

    preopens: tuple[tuple[str, str, bool], ...]  # (host dir, guest dir, writable)
    env: tuple[tuple[str, str], ...]
    memory_limit: int
    argv0: str = "/usr/local/bin/python.wasm"
    guard_files: bool = True  # False only to measure the cost of the file shadows (_disk)


@dataclass(kw_only=True)
class TurnOutcome:
    """What happened when the guest ran one turn; the sandbox turns it into a TurnResult."""

    report: dict[str, object] | None = None
    trap: str | None = None  # None when the guest returned normally
    limit: str | None = None  # deadline | fuel | stack | memory | exit | door ...
    exit_code: int | None = None
    raw_rc: int | None = None
    fuel_used: int | None = None
    extra: dict[str, object] = field(default_factory=dict)


def _unlimited() -> DiskUse:
    return DiskUse(DiskLedger((), max_bytes=1 << 62, max_entries=1 << 62, max_open=1 << 30))


# The driver's control frames are small (a report holds a value's repr cut at 64 KiB and a
# traceback cut at 64 KiB); a guest forging bigger ones gets no report, not host memory.
MAX_CONTROL_BYTES = 1 << 20
_MAX_CONTROL_CONTAINERS = 1 << 16


class Instance:
    def __init__(self, loaded: LoadedModule, spec: InstanceSpec, door: DoorFn,
                 disk: DiskUse | None = None, *,
                 frame_cap: Callable[[], int] | None = None,
                 too_large: Callable[[int], bytes] | None = None) -> None:
        """``frame_cap()`` is the door's request cap: a request longer than it is answered
        ``too_large(n)`` without being copied out of the guest's memory."""
        self.loaded = loaded
        self.spec = spec
        self._door = door
        self._frame_cap = frame_cap
        self._too_large = too_large
        self.stdout = StreamCapture("stdout", 1 << 20)
        self.stderr = StreamCapture("stderr", 1 << 20)
        self.deadline = float("inf")
        self._budget = 0.0  # the running turn's deadline, in seconds from its start
        self.cancel = threading.Event()
        self.cancel_detail: str | None = None  # why ``cancel`` was set, when not a close
        self.alive = True
        self.pending: BaseException | None = None  # raised by a host import; traps the turn
        self._metered = loaded.flavour == "metered"
        self._cell: dict[str, object] = {}
        self._report: dict[str, object] | None = None
        self._closed = False
        self._ctx = 0
        self._out_keys = (
            _ffi.new_output_key(self.stdout.write),
            _ffi.new_output_key(self.stderr.write),
        )
        weakref.finalize(self, _ffi.release_output_keys, self._out_keys)
        eng = engine(loaded.flavour)
        self._store = 0
        try:
            pre = _ffi.instance_pre(eng, loaded.module, guard_files=spec.guard_files)
            self._store, self._ctx = _capi.new_store(eng, memory_limit=spec.memory_limit)
            ctx = self._ctx
            if self._metered:
                _ffi.set_fuel(ctx, 1 << 62)
            _ffi.set_epoch_deadline(ctx, 1 << 40)
            _capi.wasi_config(ctx, argv=[spec.argv0], env=spec.env, preopens=spec.preopens,
                              stdout=_ffi.output_callback(self._out_keys[0]),
                              stderr=_ffi.output_callback(self._out_keys[1]))
            self.files = GuestFiles(disk if disk is not None else _unlimited(), spec.preopens,
                                    lambda: self._mem,
                                    lambda: _ffi.wasi_calls(eng, ctx, self.memory), ctx,
                                    stdio={1: self.stdout.write, 2: self.stderr.write})
            for name in _ffi.WASI_FILE_IMPORTS:  # the trampolines look them up by name
                setattr(self, name, getattr(self.files, name))
            _ffi.bind_target(ctx, self)
            _ffi.watch_epochs(self._store, ctx)
            instance = _capi.instantiate(pre, ctx)
            self.memory = _capi.export(ctx, instance, "memory", EXTERN_MEMORY)
            self._mem = _ffi.MemoryRef(self.memory, ctx)
            alloc = _capi.export(ctx, instance, "host_alloc", EXTERN_FUNC)
            self._turn_fn = _ffi.RawFunc(_capi.export(ctx, instance, "turn", EXTERN_FUNC), 2)
            self._alloc = _ffi.RawFunc(alloc, 1)
            self._alloc_nested = _ffi.RawFunc(alloc, 1)
        except WasmError as exc:
            self.close()
            raise GuestStartError(f"could not instantiate the guest: {exc}") from exc
        except BaseException:
            self.close()
            raise

    # ---- memory -------------------------------------------------------------------------
    def memory_size(self) -> int:
        return self._mem.current_size()

    def memory_address(self) -> int:
        self._mem.refresh()
        return self._mem.base

    def grow_to(self, size: int) -> None:
        have = self.memory_size()
        if size > have:
            pages = (size - have + 65535) // 65536
            try:
                _capi.memory_grow(self._ctx, self.memory.item, pages)
            except WasmError as exc:
                raise GuestStartError(f"could not grow the guest memory: {exc}") from exc

    # ---- running ------------------------------------------------------------------------
    def run_raw(
        self, source: str, *, deadline: float, fuel: int | None, cell: dict[str, object],
        said: float | None = None,
    ) -> TurnOutcome:
        """Run ``source`` with the snapshot's ``turn`` export. ``cell`` (``code``,
        ``filename``) is the user's cell for a ``__memex_turn__()`` source: it is sent inline
        with the source, or answers the driver's ``begin`` control request. ``said``: the
        deadline the turn was given, in seconds, as its trap names it (the time left when
        this call starts is less by the turn's set-up, more so on a loaded machine)."""
        if not self.alive:
            raise GuestStartError("instance is dead")
        _signals.ensure()  # a guest's trap must not kill the host (see _signals)
        self._cell = cell
        self._report = None
        self.pending = None
        self.deadline = deadline
        out = TurnOutcome()
        inline = False
        if source == TURN_CALL:
            source, inline = _inline_turn(cell)
        data = source.encode("utf-8", "surrogatepass")
        ctx = self._ctx
        start_wall = time.monotonic()
        span = deadline - start_wall
        self._budget = span if said is None else said
        # The first epoch check comes after at most one chunk (see epoch_deadline).
        _ffi.set_epoch_deadline(ctx, min(ticks_for(max(span, 0.0)), EPOCH_CHUNK))
        budget = fuel if fuel is not None else (1 << 62)
        metered = self._metered
        prev = _ffi.enter(self)
        turn_started()  # the epoch ticker ticks while a guest runs (engine._engine)
        try:
            if metered:
                _ffi.set_fuel(ctx, budget)
            ptr = self._alloc.call1(ctx, len(data))
            if ptr == 0 or not self._mem.write(ptr, data):
                raise GuestKilled("memory", "the guest could not allocate the cell's source")
            out.raw_rc = self._turn_fn.call2(ctx, ptr, len(data))
        except GuestKilled as exc:
            self.alive = False
            out.trap, out.limit = exc.detail, exc.limit
        except WasmError as exc:
            self.alive = False
            self._trapped(out, exc, self._budget)
        finally:
            turn_ended()
            _ffi.leave(prev)
            self.pending = None
            if metered:
                try:
                    out.fuel_used = budget - _ffi.get_fuel(ctx)
                except WasmError:
                    out.fuel_used = None
            self.deadline = float("inf")
        if out.limit == "deadline" and time.monotonic() < deadline and self.cancel.is_set():
            out.limit = "cancelled"
        report: dict[str, object] | None = self._report
        if report is None and inline and out.raw_rc is not None and out.raw_rc & 0xFF == 0:
            # The driver's silent "ok, no value" (bit 8 of the code only says that exit() or
            # quit() was called in some earlier turn).
            report = {"status": "ok", "value": None}
        out.report = report
        return out

    def _trapped(self, out: TurnOutcome, exc: BaseException, budget: float) -> None:
        """Fill ``out`` for a turn that trapped with ``exc``; an exception a host import raised
        (parked in ``pending``) is the real cause and wins, as in wasmtime-py."""
        cause = self.pending if self.pending is not None else exc
        if isinstance(cause, GuestKilled):
            out.trap, out.limit = cause.detail, cause.limit
        elif isinstance(cause, WasmError) and cause.exit_code is not None:
            code = cause.exit_code
            out.trap, out.limit, out.exit_code = f"process exit {code}", "exit", code
        elif isinstance(cause, WasmError):
            out.limit = _classify(cause)
            out.trap = _describe(cause, out.limit, budget)
        elif isinstance(cause, Exception):
            out.limit = "trap"
            out.trap = f"host function failed: {type(cause).__name__}: {cause}"
        else:  # KeyboardInterrupt and the like: the turn is dead, the signal goes on
            raise cause

    # ---- host imports (called through _ffi with the calling store's context) ------------
    def epoch_deadline(self) -> int:
        """The store reached its epoch deadline (on the guest's thread, every chunk of a
        running guest): stop the guest if the sandbox is closing or the turn's deadline has
        passed (within half a tick), else return how many ticks it may run until the next
        check."""
        if self.cancel.is_set():
            raise GuestKilled("cancelled", self.cancel_detail or _CANCELLED_RUN)
        left = self.deadline - time.monotonic()
        if left >= _CHUNK_SPAN:
            return EPOCH_CHUNK
        if left <= _HALF_TICK:
            raise GuestKilled("deadline", _MESSAGES["deadline"].format(budget=self._budget))
        return ticks_for(left)

    def host_call(self, req_ptr: int, req_len: int, out_ptr: int, out_len: int) -> int:
        mem = self._mem
        cap = self._frame_cap() if self._frame_cap is not None else None
        if cap is not None and req_len > max(cap, MAX_CONTROL_BYTES + 3):
            # Refused unread: a guest asking the host to copy a gigabyte gets an answer.
            if mem.read(req_ptr, 3) == CONTROL:
                reply = b""
            else:
                reply = self._too_large(req_len) if self._too_large is not None else b""
        else:
            request = mem.read(req_ptr, req_len)
            if request is None:
                return -2
            if request[:3] == CONTROL:
                reply = self._control(request[3:])
            else:
                reply = self._door(request, self.deadline)  # may raise GuestKilled
        n = len(reply)
        ptr = 0
        if n:
            ptr = self._alloc_nested.call1(self._ctx, n)
            if ptr == 0 or not mem.write(ptr, reply):
                return -2  # the guest is out of memory: OSError in the guest
        if out_len == out_ptr - 4:  # the guest's two out-words are usually adjacent
            ok = mem.write(out_len, _U32X2.pack(n, ptr))
        elif out_len == out_ptr + 4:
            ok = mem.write(out_ptr, _U32X2.pack(ptr, n))
        else:
            ok = mem.write(out_ptr, _U32.pack(ptr)) and mem.write(out_len, _U32.pack(n))
        return 0 if ok else -2

    def _control(self, body: bytes) -> bytes:
        """The driver's control channel. Current frames: ``B`` (begin: reply u32 length of
        the filename, the filename, then the code, UTF-8) and ``E`` + report (end: ``o`` ok
        without value, ``v`` + the value's repr, ``j`` + a JSON record). JSON frames from
        drivers in older images are still understood."""
        if len(body) > MAX_CONTROL_BYTES:
            self._report = None
            return b""
        op = body[:1]
        if op == b"B":
            code = self._cell.get("code")
            if not isinstance(code, str):
                return b""
            name = self._cell.get("filename")
            fn = (name if isinstance(name, str) else "").encode("utf-8", "surrogatepass")
            return _U32.pack(len(fn)) + fn + code.encode("utf-8", "surrogatepass")
        if op == b"E":
            kind, rest = body[1:2], body[2:]
            try:
                if kind == b"o":
                    self._report = {"status": "ok", "value": None}
                elif kind == b"v":
                    self._report = {"status": "ok",
                                    "value": rest.decode("utf-8", "surrogatepass")}
                else:
                    rep = json_loads(rest, max_bytes=MAX_CONTROL_BYTES,
                                     max_containers=_MAX_CONTROL_CONTAINERS)
                    self._report = rep if isinstance(rep, dict) else None
            except ValueError:  # DecodeLimit included
                self._report = None
            return b""
        try:
            msg = json_loads(body, max_bytes=MAX_CONTROL_BYTES,
                             max_containers=_MAX_CONTROL_CONTAINERS)
        except ValueError:
            return b'{"error":"bad control frame"}'
        op_name = msg.get("op") if isinstance(msg, dict) else None
        if op_name == "begin":
            return json.dumps(self._cell).encode()
        if op_name == "end":
            report = msg.get("report")
            self._report = report if isinstance(report, dict) else None
            return b"{}"
        return b'{"error":"unknown control op"}'

    def clock_time_get(self, clock_id: int, _precision: int, out: int) -> int:
        if clock_id == 0:
            now = time.time_ns()
        elif clock_id == 1:
            now = time.monotonic_ns()
        elif clock_id in (2, 3):
            now = time.thread_time_ns()
        else:
            return _ERRNO_INVAL
        return 0 if self._mem.write(out, _U64.pack(now)) else _ERRNO_FAULT

    def poll_oneoff(self, in_ptr: int, out_ptr: int, nsubs: int, nevents_ptr: int) -> int:
        """WASI poll_oneoff, shadowed so that guest sleeps end at the turn's deadline (a plain
        wasmtime sleep outlives epoch interruption) and a closing sandbox can interrupt them."""
        if nsubs <= 0 or nsubs > 1 << 16:
            return _ERRNO_INVAL
        mem = self._mem
        data = mem.read(in_ptr, 48 * nsubs)
        if data is None:
            return _ERRNO_FAULT
        now_mono, now_real = time.monotonic_ns(), time.time_ns()
        ready: list[bytes] = []
        clocks: list[tuple[int, int]] = []
        for i in range(nsubs):
            userdata, tag = _SUB.unpack_from(data, 48 * i)
            if tag == 0:
                clock_id, timeout, _precision, flags = _CLOCK.unpack_from(data, 48 * i + 16)
                if flags & 1:  # absolute time
                    now = now_real if clock_id == 0 else now_mono
                    timeout = max(0, timeout - now)
                clocks.append((userdata, timeout))
            elif tag in (1, 2):  # fd read/write: stdin is empty, stdout/err never block
                ready.append(_EVENT.pack(userdata, 0, tag, 0, 0))
            else:
                ready.append(_EVENT.pack(userdata, _ERRNO_INVAL, tag, 0, 0))
        if not ready and clocks:
            wait_ns = min(t for _, t in clocks)
            wake = time.monotonic() + wait_ns / 1e9
            if wake > self.deadline:
                if self.cancel.wait(max(0.0, self.deadline - time.monotonic())):
                    raise GuestKilled("cancelled", self.cancel_detail or _CANCELLED_SLEEP)
                raise GuestKilled("deadline", "wall-clock deadline reached while sleeping")
            if self.cancel.wait(wait_ns / 1e9):
                raise GuestKilled("cancelled", self.cancel_detail or _CANCELLED_SLEEP)
            ready = [_EVENT.pack(u, 0, 0, 0, 0) for u, t in clocks if t <= wait_ns]
        if not mem.write(out_ptr, b"".join(ready)) or not mem.write(
            nevents_ptr, _U32.pack(len(ready))
        ):
            return _ERRNO_FAULT
        return 0

    # ---- lifecycle ----------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.alive = False
        if self._ctx:
            _ffi.unbind_target(self._ctx)
        files = self.__dict__.pop("files", None)
        if files is not None:
            files.close_all()
        for name in ("_turn_fn", "_alloc", "_alloc_nested", "_mem", "memory"):
            self.__dict__.pop(name, None)
        store, self._store = self._store, 0
        if store:
            _capi.store_delete(store)
        _ffi.release_output_keys(self._out_keys)


def _inline_turn(cell: dict[str, object]) -> tuple[str, bool]:
    """``__memex_turn__()`` with the cell appended as a comment line the driver reads directly
    (older drivers ignore it and ask for the cell with a control request instead); and whether
    the cell went inline."""
    code, name = cell.get("code"), cell.get("filename", "")
    if not isinstance(code, str) or not isinstance(name, str):
        return TURN_CALL, False
    return (_INLINE + name.encode("unicode_escape").decode("ascii") + "\t"
            + code.encode("unicode_escape").decode("ascii")), True


_MESSAGES = {
    "deadline": "wall-clock deadline of {budget:.3g}s reached",
    "fuel": "fuel (instruction) budget exhausted",
    "stack": "wasm stack overflow",
    "memory": "out of memory",
}


def _describe(exc: Exception, limit: str, budget: float) -> str:
    """A one-line trap description (the engine's message carries a whole wasm backtrace)."""
    if limit in _MESSAGES:
        return _MESSAGES[limit].format(budget=budget)
    text = str(exc).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if "wasm trap" in ln or ("trap" in ln.lower() and "backtrace" not in ln):
            return ln
    return lines[0] if lines else type(exc).__name__


def _classify(exc: WasmError) -> str:
    code = exc.trap_code
    text = str(exc).lower()
    if code == TrapCode.INTERRUPT or "interrupt" in text:
        return "deadline"
    if code == TrapCode.OUT_OF_FUEL or "fuel" in text:
        return "fuel"
    if code == TrapCode.STACK_OVERFLOW or "stack overflow" in text:
        return "stack"
    if "memory" in text and ("grow" in text or "limit" in text):
        return "memory"
    return "trap"
