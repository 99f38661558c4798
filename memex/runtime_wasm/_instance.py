"""One live guest: a wasmtime Store + instance of the snapshot binary, its WASI wiring, the
door import and the shadowed clock/poll functions that keep blocking waits inside deadlines.

An ``Instance`` is not thread-safe: the owning sandbox drives it from one runner thread.
A trap leaves it dead (``alive`` False); the sandbox replaces it and restores an image.
"""

from __future__ import annotations

import ctypes
import json
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import wasmtime

from ..errors import GuestStartError
from ._engine import LoadedModule, engine, ticks_for
from ._output import StreamCapture

__all__ = ["DoorFn", "GuestKilled", "Instance", "InstanceSpec", "TurnOutcome"]

CONTROL = b"\x00MX"
_ERRNO_INVAL = 28
_SUB = struct.Struct("<QB")
_CLOCK = struct.Struct("<I4xQQH")
_EVENT = struct.Struct("<QHB5xQH6x")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

# wasmtime-py's table behind stdout_custom/stderr_custom has no lock.
_WASI_LOCK = threading.Lock()

DoorFn = Callable[[bytes, float], bytes]
"""The host side of the door: (request bytes, turn deadline on time.monotonic) -> reply."""


class GuestKilled(Exception):  # noqa: N818 - internal control flow, never escapes the package
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


class Instance:
    def __init__(self, loaded: LoadedModule, spec: InstanceSpec, door: DoorFn) -> None:
        self.loaded = loaded
        self.spec = spec
        self._door = door
        self.stdout = StreamCapture("stdout", 1 << 20)
        self.stderr = StreamCapture("stderr", 1 << 20)
        self.deadline = float("inf")
        self.cancel = threading.Event()
        self.alive = True
        self._cell: dict[str, object] = {}
        self._report: dict[str, object] | None = None
        self._closed = False
        eng = engine(loaded.flavour)
        try:
            self.store = wasmtime.Store(eng)
            self.store.set_limits(memory_size=spec.memory_limit)
            if loaded.flavour == "metered":
                self.store.set_fuel(1 << 62)
            self.store.set_epoch_deadline(1 << 40)
            wasi = wasmtime.WasiConfig()
            wasi.argv = [spec.argv0]
            wasi.env = [list(kv) for kv in spec.env]
            for host, guest, writable in spec.preopens:
                wasi.preopen_dir(host, guest, writable)
            with _WASI_LOCK:
                wasi.stdout_custom = self.stdout.write
                wasi.stderr_custom = self.stderr.write
                self.store.set_wasi(wasi)
            linker = wasmtime.Linker(eng)
            linker.allow_shadowing = True
            linker.define_wasi()
            i32 = wasmtime.ValType.i32()
            i64 = wasmtime.ValType.i64()
            linker.define_func(
                "wasi_snapshot_preview1", "poll_oneoff",
                wasmtime.FuncType([i32, i32, i32, i32], [i32]), self._poll_oneoff,
                access_caller=True,
            )
            linker.define_func(
                "wasi_snapshot_preview1", "clock_time_get",
                wasmtime.FuncType([i32, i64, i32], [i32]), self._clock_time_get,
                access_caller=True,
            )
            linker.define_func(
                "host", "call", wasmtime.FuncType([i32, i32, i32, i32], [i32]), self._host_call,
                access_caller=True,
            )
            self.instance = linker.instantiate(self.store, loaded.module)
            exports = self.instance.exports(self.store)
            self.memory: wasmtime.Memory = exports["memory"]
            self._turn_fn: wasmtime.Func = exports["turn"]
            self._alloc: wasmtime.Func = exports["host_alloc"]
        except wasmtime.WasmtimeError as exc:
            self.close()
            raise GuestStartError(f"could not instantiate the guest: {exc}") from exc

    # ---- memory -------------------------------------------------------------------------
    def memory_size(self) -> int:
        return int(self.memory.data_len(self.store))

    def memory_address(self) -> int:
        return ctypes.addressof(self.memory.data_ptr(self.store).contents)

    def grow_to(self, size: int) -> None:
        have = self.memory_size()
        if size > have:
            pages = (size - have + 65535) // 65536
            self.memory.grow(self.store, pages)

    # ---- running ------------------------------------------------------------------------
    def run_raw(
        self, source: str, *, deadline: float, fuel: int | None, cell: dict[str, object]
    ) -> TurnOutcome:
        """Run ``source`` with the snapshot's ``turn`` export. ``cell`` is what the driver's
        ``begin`` control request returns (the user's code travels that way)."""
        if not self.alive:
            raise GuestStartError("instance is dead")
        self._cell = cell
        self._report = None
        self.deadline = deadline
        out = TurnOutcome()
        data = source.encode("utf-8")
        store = self.store
        start_wall = time.monotonic()
        remaining = deadline - time.monotonic()
        store.set_epoch_deadline(ticks_for(max(remaining, 0.0)))
        budget = fuel if fuel is not None else (1 << 62)
        if self.loaded.flavour == "metered":
            store.set_fuel(budget)
        try:
            ptr = self._alloc(store, len(data))
            if ptr == 0:
                raise GuestKilled("memory", "the guest could not allocate the cell's source")
            self.memory.write(store, data, ptr)
            rc = self._turn_fn(store, ptr, len(data))
            out.raw_rc = int(rc)
        except GuestKilled as exc:
            self.alive = False
            out.trap, out.limit = exc.detail, exc.limit
        except wasmtime.ExitTrap as exc:
            self.alive = False
            out.trap, out.limit, out.exit_code = f"process exit {exc.code}", "exit", exc.code
        except (wasmtime.Trap, wasmtime.WasmtimeError) as exc:
            self.alive = False
            out.limit = _classify(exc)
            out.trap = _describe(exc, out.limit, deadline - start_wall)
        finally:
            if self.loaded.flavour == "metered":
                try:
                    left = store.get_fuel()
                    out.fuel_used = budget - int(left)
                except wasmtime.WasmtimeError:
                    out.fuel_used = None
            self.deadline = float("inf")
        if out.limit == "deadline" and time.monotonic() < deadline and self.cancel.is_set():
            out.limit = "cancelled"
        out.report = self._report
        return out

    # ---- host functions -----------------------------------------------------------------
    def _host_call(
        self, caller: wasmtime.Caller, req_ptr: int, req_len: int, out_ptr: int, out_len: int
    ) -> int:
        mem = self.memory
        try:
            request = bytes(mem.read(caller, req_ptr, req_ptr + req_len))
        except (ValueError, IndexError, wasmtime.WasmtimeError):
            return -2
        if request.startswith(CONTROL):
            reply = self._control(request[len(CONTROL):])
        else:
            reply = self._door(request, self.deadline)  # may raise GuestKilled
        n = len(reply)
        ptr = self._alloc(caller, n) if n else 0
        if n and ptr == 0:
            return -2  # the guest is out of memory: OSError in the guest
        if n:
            mem.write(caller, reply, ptr)
        mem.write(caller, _U32.pack(ptr), out_ptr)
        mem.write(caller, _U32.pack(n), out_len)
        return 0

    def _control(self, body: bytes) -> bytes:
        try:
            msg = json.loads(body)
        except ValueError:
            return b'{"error":"bad control frame"}'
        op = msg.get("op") if isinstance(msg, dict) else None
        if op == "begin":
            return json.dumps(self._cell).encode()
        if op == "end":
            report = msg.get("report")
            self._report = report if isinstance(report, dict) else None
            return b"{}"
        return b'{"error":"unknown control op"}'

    def _clock_time_get(self, caller: wasmtime.Caller, clock_id: int, _prec: int, out: int) -> int:
        if clock_id == 0:
            now = time.time_ns()
        elif clock_id == 1:
            now = time.monotonic_ns()
        elif clock_id in (2, 3):
            now = time.thread_time_ns()
        else:
            return _ERRNO_INVAL
        self.memory.write(caller, _U64.pack(now), out)
        return 0

    def _poll_oneoff(
        self, caller: wasmtime.Caller, in_ptr: int, out_ptr: int, nsubs: int, nevents_ptr: int
    ) -> int:
        """WASI poll_oneoff, shadowed so that guest sleeps end at the turn's deadline (a plain
        wasmtime sleep outlives epoch interruption) and a closing sandbox can interrupt them."""
        if nsubs <= 0:
            return _ERRNO_INVAL
        mem = self.memory
        data = bytes(mem.read(caller, in_ptr, in_ptr + 48 * nsubs))
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
                self.cancel.wait(max(0.0, self.deadline - time.monotonic()))
                raise GuestKilled("deadline", "wall-clock deadline reached while sleeping")
            if self.cancel.wait(wait_ns / 1e9):
                raise GuestKilled("cancelled", "sandbox closed while the guest slept")
            ready = [_EVENT.pack(u, 0, 0, 0, 0) for u, t in clocks if t <= wait_ns]
        mem.write(caller, b"".join(ready), out_ptr)
        mem.write(caller, _U32.pack(len(ready)), nevents_ptr)
        return 0

    # ---- lifecycle ----------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.alive = False
        for name in ("instance", "_turn_fn", "_alloc", "memory"):
            self.__dict__.pop(name, None)
        store = self.__dict__.pop("store", None)
        if store is not None:
            store.close()


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
        if "wasm trap" in ln or "trap" in ln.lower() and "backtrace" not in ln:
            return ln
    return lines[0] if lines else type(exc).__name__


def _classify(exc: Exception) -> str:
    code = getattr(exc, "trap_code", None)
    text = str(exc).lower()
    if code == wasmtime.TrapCode.INTERRUPT or "interrupt" in text:
        return "deadline"
    if code == wasmtime.TrapCode.OUT_OF_FUEL or "fuel" in text:
        return "fuel"
    if code == wasmtime.TrapCode.STACK_OVERFLOW or "stack overflow" in text:
        return "stack"
    if "memory" in text and ("grow" in text or "limit" in text):
        return "memory"
    return "trap"
