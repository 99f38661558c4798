"""The engine seam: calls into guests, their memory, and the host imports they call, on the
wasmtime C API that ``_capi`` binds. A turn crosses this boundary several times, so every
crossing is a raw call on reused buffers:

* exports are called with ``wasmtime_func_call_unchecked`` on a reused ``wasmtime_val_raw_t``
  buffer (only i32 arguments and results are needed);
* the guest's imports (``host.call``, the shadowed WASI ``poll_oneoff``/``clock_time_get`` and
  the shadowed WASI file functions of ``_disk``, which call the engine's own through a relay
  instance) are defined once per engine with ``wasmtime_linker_define_func_unchecked`` on a
  shared linker, pre-instantiated per module (``InstancePre``), and dispatched to the owning
  :class:`HostTarget` by the calling store's context address; an exception raised by a
  target is parked on that target (``pending``) and the call traps;
* linear memory is read and written through ``wasmtime_memory_data``/``_data_size`` and
  ``ctypes`` (``string_at``/``memmove``), re-reading the base and length at every access (a
  memory may grow between two host calls);
* stdout/stderr go to per-store callbacks keyed by an integer (no shared, unlocked table);
* reaching a store's epoch deadline calls back into its :class:`HostTarget`
  (``wasmtime_store_epoch_deadline_callback``), which extends the deadline or stops the guest:
  that is how a turn is cancelled from another thread and how its wall-clock deadline is kept.

Short accessor calls keep the GIL (releasing it for a sub-microsecond call invites a switch to
another thread); calls that run wasm release it.
"""

from __future__ import annotations

import ctypes
import itertools
import struct
import threading
import weakref
from collections.abc import Callable
from typing import Any, Protocol

from . import _capi
from ._capi import EXTERN_FUNC, Extern, WasmError, fn

__all__ = [
    "WASI_FILE_IMPORTS",
    "HostTarget",
    "MemoryRef",
    "RawFunc",
    "WasiCall",
    "WasmError",
    "bind_target",
    "enter",
    "get_fuel",
    "instance_pre",
    "leave",
    "new_output_key",
    "output_callback",
    "release_output_keys",
    "set_epoch_deadline",
    "set_fuel",
    "unbind_target",
    "wasi_calls",
    "watch_epochs",
]

_c_void_p = ctypes.c_void_p
_c_size_t = ctypes.c_size_t
_string_at = ctypes.string_at
_memmove = ctypes.memmove

# ---- raw prototypes -------------------------------------------------------------------------
_func_call_unchecked = fn("wasmtime_func_call_unchecked", _c_void_p, _c_void_p, _c_void_p,
                          _c_void_p, _c_size_t, _c_void_p, gil=False)
# The same entry point keeping the GIL: for the engine's quick WASI calls made from a host
# import (fd_tell, fd_close...: releasing and retaking the GIL would cost more than the call).
_func_call_unchecked_gil = fn("wasmtime_func_call_unchecked", _c_void_p, _c_void_p, _c_void_p,
                              _c_void_p, _c_size_t, _c_void_p)
_memory_data = fn("wasmtime_memory_data", _c_void_p, _c_void_p, _c_void_p)
_memory_data_size = fn("wasmtime_memory_data_size", _c_size_t, _c_void_p, _c_void_p)
_caller_context = fn("wasmtime_caller_context", _c_void_p, _c_void_p)
_set_epoch_deadline = fn("wasmtime_context_set_epoch_deadline", None, _c_void_p,
                         ctypes.c_uint64)
_set_fuel = fn("wasmtime_context_set_fuel", _c_void_p, _c_void_p, ctypes.c_uint64)
_get_fuel = fn("wasmtime_context_get_fuel", _c_void_p, _c_void_p, _c_void_p)
_trap_new = fn("wasmtime_trap_new", _c_void_p, ctypes.c_char_p, _c_size_t)
_error_new = fn("wasmtime_error_new", _c_void_p, ctypes.c_char_p)
_store_epoch_callback = fn("wasmtime_store_epoch_deadline_callback", None,
                           _c_void_p, _c_void_p, _c_void_p, _c_void_p)
_define_unchecked = fn("wasmtime_linker_define_func_unchecked", _c_void_p,
                       _c_void_p, ctypes.c_char_p, _c_size_t, ctypes.c_char_p, _c_size_t,
                       _c_void_p, _c_void_p, _c_void_p, _c_void_p)


# ---- errors ---------------------------------------------------------------------------------
def _raise_from(error: int | None, trap: int | None) -> None:
    """Raise the :class:`WasmError` of ``trap`` (preferred) or ``error``; both are freed."""
    raised: WasmError | None = None
    if error:
        raised = _capi.take_error(error)
    if trap:
        raised = _capi.take_trap(trap)
    assert raised is not None
    raise raised


# ---- stores ---------------------------------------------------------------------------------
def set_epoch_deadline(ctx: int, ticks: int) -> None:
    _set_epoch_deadline(ctx, ticks)


def set_fuel(ctx: int, fuel: int) -> None:
    err = _set_fuel(ctx, fuel)
    if err:
        _raise_from(err, None)


def get_fuel(ctx: int) -> int:
    out = ctypes.c_uint64(0)
    err = _get_fuel(ctx, ctypes.addressof(out))
    if err:
        _raise_from(err, None)
    return int(out.value)


# ---- calls into the guest -------------------------------------------------------------------
class RawFunc:
    """An exported function of i32 parameters and at most one i32 result, called through the
    unchecked C entry point on a reused buffer. Not reentrant: use one object per call site
    that can nest (e.g. one for the turn, one for allocations made inside host functions)."""

    __slots__ = ("_buf", "_bufaddr", "_func", "_funcaddr", "_nslots", "_trap", "_trapaddr")

    def __init__(self, func: Extern, nparams: int) -> None:
        self._func = func  # keeps the handle alive
        self._funcaddr = func.item
        self._nslots = max(nparams, 1)
        self._buf = (ctypes.c_uint64 * (2 * self._nslots))()  # wasmtime_val_raw_t is 16 bytes
        self._bufaddr = ctypes.addressof(self._buf)
        self._trap = _c_void_p(None)
        self._trapaddr = ctypes.addressof(self._trap)

    def call1(self, ctx: int, a: int) -> int:
        """Call with one argument on the store context ``ctx`` (a store's, or a caller's
        inside a host import); returns the i32 result as a signed int. Raises
        :class:`WasmError` for a trap or an engine error."""
        buf = self._buf
        buf[0] = a & 0xFFFFFFFF
        return self._finish(ctx, buf)

    def call2(self, ctx: int, a: int, b: int) -> int:
        buf = self._buf
        buf[0] = a & 0xFFFFFFFF
        buf[2] = b & 0xFFFFFFFF
        return self._finish(ctx, buf)

    def _finish(self, ctx: int, buf: Any) -> int:
        err = _func_call_unchecked(ctx, self._funcaddr, self._bufaddr, self._nslots,
                                   self._trapaddr)
        if err or self._trap.value:
            trap = self._trap.value
            self._trap.value = None
            _raise_from(err, trap)
        r: int = buf[0] & 0xFFFFFFFF
        return r - 0x100000000 if r & 0x80000000 else r


# ---- linear memory --------------------------------------------------------------------------
class MemoryRef:
    """Raw access to the exported memory of one store.

    The base address and length are cached: wasmtime reserves the whole 4 GiB a 32-bit memory
    can reach, so growing never moves it (verified in bench/runtime.py's sanity check), and an
    access past the cached length re-reads both before failing. ``refresh`` re-reads them
    unconditionally (done at each turn start and after every call into the guest from a host
    import)."""

    __slots__ = ("_addr", "_ctx", "_mem", "base", "size")

    def __init__(self, memory: Extern, ctx: int) -> None:
        self._mem = memory
        self._ctx = ctx
        self._addr = memory.item
        self.base = 0
        self.size = 0
        self.refresh()

    def refresh(self) -> None:
        self.base = int(_memory_data(self._ctx, self._addr) or 0)
        self.size = int(_memory_data_size(self._ctx, self._addr))

    def current_size(self) -> int:
        """The memory's length now (re-read; the guest may have grown it)."""
        self.size = size = int(_memory_data_size(self._ctx, self._addr))
        return size

    def read(self, ptr: int, n: int) -> bytes | None:
        """``n`` bytes at ``ptr``, or None if the range is outside the memory."""
        if ptr < 0 or n < 0:
            return None
        if ptr + n > self.size:
            self.refresh()
            if ptr + n > self.size:
                return None
        return _string_at(self.base + ptr, n)

    def write(self, ptr: int, data: bytes) -> bool:
        """Write ``data`` at ``ptr``; False (nothing written) if it does not fit."""
        if ptr < 0:
            return False
        n = len(data)
        if ptr + n > self.size:
            self.refresh()
            if ptr + n > self.size:
                return False
        _memmove(self.base + ptr, data, n)
        return True


# ---- host imports ---------------------------------------------------------------------------
class HostTarget(Protocol):
    """What a store's host imports are dispatched to, with their raw arguments. Inside a call
    the store's own context is the caller's (the C API hands out the same store pointer), so
    the target uses it for memory access and nested calls. An exception a method raises is
    stored in ``pending`` (the first one wins) and traps the guest."""

    pending: BaseException | None

    def host_call(self, req_ptr: int, req_len: int, out_ptr: int, out_len: int) -> int: ...

    def poll_oneoff(self, in_ptr: int, out_ptr: int, nsubs: int, nevents_ptr: int) -> int: ...

    def clock_time_get(self, clock_id: int, precision: int, out_ptr: int) -> int: ...

    def epoch_deadline(self) -> int:
        """The store reached its epoch deadline (see :func:`watch_epochs`): return how many
        more ticks the guest may run (at least 1), or raise to stop it."""
        ...


_TARGETS: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_CURRENT = threading.local()  # the target whose guest runs on this thread (see `enter`)


def bind_target(ctx: int, target: HostTarget) -> None:
    """Route the host imports called from the store ``ctx`` to ``target`` (held weakly)."""
    _TARGETS[ctx] = target


def unbind_target(ctx: int) -> None:
    _TARGETS.pop(ctx, None)


def enter(target: HostTarget) -> HostTarget | None:
    """Mark ``target`` as the guest running on this thread (a host import then skips the
    store lookup); returns the previous one, for :func:`leave`."""
    prev: HostTarget | None = getattr(_CURRENT, "target", None)
    _CURRENT.target = target
    return prev


def leave(prev: HostTarget | None) -> None:
    _CURRENT.target = prev


_CALLBACK = ctypes.CFUNCTYPE(_c_size_t, _c_void_p, _c_void_p, _c_void_p, _c_size_t)
_P4 = struct.Struct("<I12xI12xI12xI12x")  # four i32 slots of wasmtime_val_raw_t
_CLOCK_ARGS = struct.Struct("<I12xQ8xI12x")  # (i32, i64, i32)
_I32 = struct.Struct("<i")
_TRAP_MSG = b"host function raised"
_UNKNOWN = b"host import called on an unknown store"


def _trampoline(method: str, unpack: struct.Struct) -> Any:
    size = unpack.size
    unpack_bytes = unpack.unpack
    get_target = _TARGETS.get

    current = _CURRENT

    def tramp(_env: int | None, caller: int, args: int, _n: int) -> int:
        target = None
        try:
            target = getattr(current, "target", None)
            if target is None:
                target = get_target(_caller_context(caller))
                if target is None:
                    return int(_trap_new(_UNKNOWN, len(_UNKNOWN)) or 0)
            r = getattr(target, method)(*unpack_bytes(_string_at(args, size)))
            _memmove(args, _I32.pack(r), 4)
            return 0
        except BaseException as exc:
            if target is not None and target.pending is None:
                target.pending = exc
            return int(_trap_new(_TRAP_MSG, len(_TRAP_MSG)) or 0)

    return _CALLBACK(tramp)


def _args(params: tuple[str, ...]) -> struct.Struct:
    """The layout of ``params`` in an array of ``wasmtime_val_raw_t`` (16 bytes each)."""
    return struct.Struct("<" + "".join("I12x" if p == "i32" else "Q8x" for p in params))


_WASI = "wasi_snapshot_preview1"
_I = "i32"
_L = "i64"
# The WASI file functions shadowed so that the sandbox can account for and refuse what a guest
# does to its writable places and descriptor table (see _disk.py); each shadow calls the
# engine's own implementation, fetched per store with :class:`WasiCalls`.
WASI_FILE_IMPORTS: dict[str, tuple[str, ...]] = {
    "fd_write": (_I, _I, _I, _I),
    "fd_pwrite": (_I, _I, _I, _L, _I),
    "fd_allocate": (_I, _L, _L),
    "fd_filestat_set_size": (_I, _L),
    "fd_close": (_I,),
    "fd_renumber": (_I, _I),
    "fd_fdstat_set_flags": (_I, _I),
    "path_open": (_I, _I, _I, _I, _I, _L, _L, _I, _I),
    "path_create_directory": (_I, _I, _I),
    "path_remove_directory": (_I, _I, _I),
    "path_unlink_file": (_I, _I, _I),
    "path_rename": (_I, _I, _I, _I, _I, _I),
    "path_symlink": (_I, _I, _I, _I, _I),
    "path_link": (_I, _I, _I, _I, _I, _I, _I),
    "path_filestat_set_times": (_I, _I, _I, _I, _L, _L, _I),
}
_EXTRA_ORIGINALS: dict[str, tuple[str, ...]] = {"fd_tell": (_I, _I),
                                                 "fd_filestat_get": (_I, _I)}
_SLOW_CALLS = frozenset({"fd_write", "fd_pwrite", "fd_allocate", "fd_filestat_set_size",
                         "path_open", "path_rename", "path_unlink_file", "path_remove_directory",
                         "fd_close"})

_IMPORTS = (
    ("host", "call", "host_call", _P4, ("i32", "i32", "i32", "i32")),
    (_WASI, "poll_oneoff", "poll_oneoff", _P4, ("i32", "i32", "i32", "i32")),
    (_WASI, "clock_time_get", "clock_time_get", _CLOCK_ARGS, ("i32", "i64", "i32")),
    *((_WASI, name, name, _args(params), params) for name, params in WASI_FILE_IMPORTS.items()),
)
_CALLBACKS = [_trampoline(method, unpack) for _, _, method, unpack, _ in _IMPORTS]


# ---- epoch deadlines ------------------------------------------------------------------------
# wasmtime_error_t *cb(wasmtime_context_t *, void *env, uint64_t *delta, uint8_t *kind)
_EPOCH_CALLBACK = ctypes.CFUNCTYPE(_c_size_t, _c_void_p, _c_void_p, _c_void_p, _c_void_p)
_U64 = struct.Struct("<Q")
_EPOCH_UNKNOWN = b"memex: epoch deadline reached on a store with no target"


def _on_epoch_deadline(_ctx: int | None, env: int | None, delta_ptr: int | None,
                       _kind_ptr: int | None) -> int:
    # Runs on the thread running the guest, whenever its store reaches the epoch deadline.
    # ``env`` is the store's context address (the key of ``_TARGETS``). The update kind is
    # left at its default, WASMTIME_UPDATE_DEADLINE_CONTINUE.
    target = None
    try:
        target = _TARGETS.get(env or 0)
        if target is None:
            return int(_error_new(_EPOCH_UNKNOWN) or 0)
        delta = max(1, int(target.epoch_deadline()))
        _memmove(delta_ptr or 0, _U64.pack(delta), 8)
        return 0
    except BaseException as exc:
        if target is not None and target.pending is None:
            target.pending = exc
        try:
            text = f"memex: guest stopped at an epoch check: {exc}"
        except BaseException:
            text = "memex: guest stopped at an epoch check"
        return int(_error_new(text.encode("utf-8", "replace").replace(b"\0", b"")) or 0)


# One process-wide callback object, never collected: stores refer to it only by address.
_epoch_callback = _EPOCH_CALLBACK(_on_epoch_deadline)
_EPOCH_CALLBACK_ADDR = ctypes.cast(_epoch_callback, _c_void_p).value


def watch_epochs(store: int, ctx: int) -> None:
    """Make reaching ``store``'s epoch deadline call ``epoch_deadline()`` on the target bound
    to ``ctx`` (its context address, see :func:`bind_target`) instead of trapping: the target
    extends the deadline or raises, which stops the guest (the exception is parked in
    ``pending``, as for the host imports). Nothing is allocated per store: the callback is
    process-wide and its data is ``ctx`` itself (no finalizer; wasmtime drops the registration
    with the store). A store reaching its deadline with no bound target (after
    :func:`unbind_target`) traps."""
    _store_epoch_callback(store, _EPOCH_CALLBACK_ADDR, ctx, None)


_PRE: dict[tuple[int, bool], int] = {}
_PRE_LOCK = threading.Lock()
_KINDS = {"i32": _capi.WASM_I32, "i64": _capi.WASM_I64}


def instance_pre(engine: int, module: int, *, guard_files: bool = True) -> int:
    """The ``wasmtime_instance_pre_t*`` of ``module`` with WASI and MemEx's host imports,
    built once per module for the process (the imports are store-independent: they dispatch
    on the caller's store). ``guard_files=False`` leaves the WASI file functions unshadowed:
    no disk quota, link rule or descriptor cap (only for measuring what they cost, in
    bench/runtime.py)."""
    with _PRE_LOCK:
        hit = _PRE.get((module, guard_files))
        if hit is not None:
            return hit
        linker = _capi.new_linker(engine, shadowing=True)
        _capi.define_wasi(linker)
        for (mod, name, _m, _u, params), cb in zip(_IMPORTS, _CALLBACKS, strict=True):
            if not guard_files and name in WASI_FILE_IMPORTS:
                continue
            ty = _capi.functype([_KINDS[p] for p in params], [_capi.WASM_I32])
            mb, nb = mod.encode(), name.encode()
            try:
                err = _define_unchecked(linker, mb, len(mb), nb, len(nb), ty,
                                        ctypes.cast(cb, _c_void_p).value, None, None)
            finally:
                _capi.functype_delete(ty)
            if err:
                _raise_from(err, None)
        pre = _PRE[(module, guard_files)] = _capi.instantiate_pre(linker, module)
        return pre


_RELAYS: dict[int, tuple[int, int]] = {}
_RELAYED = (*WASI_FILE_IMPORTS.items(), *_EXTRA_ORIGINALS.items())


def _relay_wat() -> str:
    """A module that re-exports the guest's memory and calls the engine's WASI functions from
    wasm: those functions read and write the *calling instance's* exported memory, so the host
    cannot call them directly (they fail with "missing required memory export"). Its imports
    are the functions of ``_RELAYED`` in order, then the memory."""
    imports, funcs = [], []
    for name, params in _RELAYED:
        sig = f"(param {' '.join(params)}) (result i32)"
        imports.append(f'(import "{_WASI}" "{name}" (func ${name} {sig}))')
        gets = " ".join(f"local.get {i}" for i in range(len(params)))
        funcs.append(f'(func (export "{name}") {sig} {gets} call ${name})')
    return "(module " + " ".join(imports) + ' (import "env" "memory" (memory 1))' \
        + ' (export "memory" (memory 0)) ' + " ".join(funcs) + ")"


def _relay_parts(engine: int) -> tuple[int, int]:
    """(a linker defining WASI, the relay module) of ``engine``, made once."""
    with _PRE_LOCK:
        hit = _RELAYS.get(engine)
        if hit is None:
            linker = _capi.new_linker(engine)
            _capi.define_wasi(linker)
            module = _capi.compile_module(engine, _capi.wat_to_wasm(_relay_wat()))
            hit = _RELAYS[engine] = (linker, module)
        return hit


class WasiCall:
    """One of the engine's WASI functions bound to a store, called through the unchecked
    entry point with i32/i64 arguments and an i32 (errno) result. Reentrant only across
    distinct objects, as :class:`RawFunc`."""

    __slots__ = ("_buf", "_bufaddr", "_call", "_func", "_funcaddr", "_masks", "_nslots",
                 "_trap", "_trapaddr")

    def __init__(self, func: Extern, params: tuple[str, ...], *, io: bool) -> None:
        self._func = func
        # I/O that may take a while releases the GIL (holding it through a 1 MiB write cost
        # a third more in bench/runtime.py's disk rows); the rest keeps it.
        self._call = _func_call_unchecked if io else _func_call_unchecked_gil
        self._funcaddr = func.item
        self._masks = tuple(0xFFFFFFFF if p == "i32" else 0xFFFFFFFFFFFFFFFF for p in params)
        self._nslots = max(len(params), 1)
        self._buf = (ctypes.c_uint64 * (2 * self._nslots))()
        self._bufaddr = ctypes.addressof(self._buf)
        self._trap = _c_void_p(None)
        self._trapaddr = ctypes.addressof(self._trap)

    def __call__(self, ctx: int, *args: int) -> int:
        buf = self._buf
        for i, (a, m) in enumerate(zip(args, self._masks, strict=True)):
            buf[2 * i] = a & m
        err = self._call(ctx, self._funcaddr, self._bufaddr, self._nslots, self._trapaddr)
        if err or self._trap.value:
            trap = self._trap.value
            self._trap.value = None
            _raise_from(err, trap)
        return int(buf[0] & 0xFFFFFFFF)


def wasi_calls(engine: int, ctx: int, memory: Extern) -> dict[str, WasiCall]:
    """The engine's own implementations of the shadowed WASI file functions (and ``fd_tell``)
    acting on ``memory`` in the store ``ctx`` (which must have its WASI configuration),
    called through a relay instance (see :func:`_relay_wat`)."""
    linker, module = _relay_parts(engine)
    imports = [_capi.linker_get(linker, ctx, _WASI, name) for name, _ in _RELAYED]
    relay = _capi.instance_new(ctx, module, [*imports, memory])
    return {name: WasiCall(_capi.export(ctx, relay, name, EXTERN_FUNC), params,
                           io=name in _SLOW_CALLS)
            for name, params in _RELAYED}


# ---- stdout / stderr ------------------------------------------------------------------------
_OUTPUTS: dict[int, Callable[[bytes], object]] = {}
_KEYS = itertools.count(1)


def _write_output(key: int | None, buf: int | None, n: int) -> int:
    try:
        sink = _OUTPUTS.get(key or 0)
        if sink is not None and n:
            sink(_string_at(buf or 0, n))
        return n
    except BaseException:
        return -5  # EIO


_output = ctypes.CFUNCTYPE(ctypes.c_ssize_t, _c_void_p, _c_void_p, _c_size_t)(_write_output)


def new_output_key(sink: Callable[[bytes], object]) -> int:
    key = next(_KEYS)
    _OUTPUTS[key] = sink
    return key


def release_output_keys(keys: tuple[int, ...]) -> None:
    for key in keys:
        _OUTPUTS.pop(key, None)


def output_callback(key: int) -> tuple[int, int, int]:
    """(callback, data, finalizer) addresses for ``_capi.wasi_config``'s stdout or stderr:
    the guest's writes go to the sink registered under ``key``. No finalizer: the engine
    calls it where its stream is dropped, on a thread of its async runtime, and a Python
    callback there aborts the process if the interpreter is finalizing (the guest's writes
    reach their sinks on the guest's own thread, through the ``fd_write`` shadow of
    ``files``; this callback serves only instances made without the file shadows)."""
    cb = ctypes.cast(_output, _c_void_p).value
    assert cb is not None
    return cb, key, 0
