"""The wasmtime C API, bound with ctypes: the library MemEx's host runs guests on.

wasmtime-py ships the engine as a shared library and binds all of its ~1,000 C functions in
Python at import, plus a layer of wrapper objects; that import alone was a quarter of a
``memex run -c pass``, and the wrappers' per-call checks were a third of creating an instance.
MemEx uses about sixty of those functions, so it loads the library that wasmtime-py's wheel
installs (the version pinned in pyproject.toml; checked below) without importing wasmtime-py
and binds just those, with handles as plain integers and ownership kept by the callers
(``_engine`` holds engines and modules for the process, ``_instance`` one store per guest).

Short calls go through a ``PyDLL`` view of the library, which keeps the GIL (releasing it for a
sub-microsecond call invites a switch to another thread); calls that compile, load or run wasm
go through a ``CDLL`` view, which releases it. Errors and traps are taken over from the C API
(read, then freed) and raised as :class:`WasmError`.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "CDLL",
    "EXTERN_FUNC",
    "EXTERN_MEMORY",
    "PYDLL",
    "WASM_I32",
    "WASM_I64",
    "Extern",
    "TrapCode",
    "WasmError",
    "compile_module",
    "define_wasi",
    "deserialize_module",
    "export",
    "fn",
    "functype",
    "functype_delete",
    "increment_epoch",
    "instance_new",
    "instantiate",
    "instantiate_pre",
    "library_path",
    "linker_get",
    "memory_grow",
    "module_delete",
    "new_engine",
    "new_linker",
    "new_store",
    "serialize_module",
    "store_delete",
    "take_error",
    "take_trap",
    "wasi_config",
    "wasmtime_version",
    "wat_to_wasm",
]

WASMTIME_MAJOR = "51"  # the C API bound here; pyproject.toml pins the same wasmtime

_vp = ctypes.c_void_p
_sz = ctypes.c_size_t
_u8 = ctypes.c_uint8
_u64 = ctypes.c_uint64
_i64 = ctypes.c_int64
_cp = ctypes.c_char_p
_bool = ctypes.c_bool

WASM_I32 = 0
WASM_I64 = 1


class TrapCode:
    """The trap codes MemEx tells apart (``wasmtime_trap_code_enum``)."""

    STACK_OVERFLOW = 0
    INTERRUPT = 10
    OUT_OF_FUEL = 11


def _package_dir() -> Path:
    # find_spec locates the installed package without running its __init__ (which is the
    # binding of every C function this module exists to avoid)
    spec = importlib.util.find_spec("wasmtime")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"memex needs the wasmtime package (pip install "
                          f"'wasmtime=={WASMTIME_MAJOR}.*'): "
                          "its wheel carries the engine library")
    return Path(next(iter(spec.submodule_search_locations)))


def library_path() -> Path:
    """Where wasmtime-py's wheel put the engine's shared library."""
    machine = os.uname().machine if hasattr(os, "uname") else "AMD64"  # no uname: Windows
    machine = {"AMD64": "x86_64", "arm64": "aarch64", "ARM64": "aarch64"}.get(machine, machine)
    names = {"linux": "_libwasmtime.so", "darwin": "_libwasmtime.dylib",
             "win32": "_wasmtime.dll"}
    if sys.platform not in names:
        raise ImportError(f"wasmtime has no engine library for {sys.platform}")
    return _package_dir() / f"{sys.platform}-{machine}" / names[sys.platform]


def wasmtime_version() -> str:
    """The installed wasmtime's version, from its dist-info folder's name (importlib.metadata
    costs ~40 ms of import time, which ``memex run`` cannot afford)."""
    site = _package_dir().parent
    found = sorted(p.name for p in site.glob("wasmtime-*.dist-info"))
    if len(found) == 1:
        return found[0].removeprefix("wasmtime-").removesuffix(".dist-info")
    from importlib.metadata import version

    return version("wasmtime")


def _load() -> tuple[ctypes.CDLL, ctypes.PyDLL]:
    have = wasmtime_version()
    if have.split(".")[0] != WASMTIME_MAJOR:
        raise ImportError(f"memex binds wasmtime {WASMTIME_MAJOR}.x's C API; wasmtime {have} "
                          f"is installed (pip install 'wasmtime=={WASMTIME_MAJOR}.*')")
    path = str(library_path())
    cdll = ctypes.CDLL(path)
    return cdll, ctypes.PyDLL(path, handle=cdll._handle)


CDLL, PYDLL = _load()
"""Views of the engine library: ``CDLL`` releases the GIL around a call, ``PYDLL`` keeps it."""


def fn(name: str, restype: Any, *argtypes: Any, gil: bool = True) -> Any:
    """A prototype of the C function ``name``; ``gil=False`` releases the GIL during calls
    (for calls that run wasm, compile or load)."""
    f = (PYDLL if gil else CDLL)[name]
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


class _ByteVec(ctypes.Structure):
    _fields_ = [("size", _sz), ("data", _vp)]


class Extern(ctypes.Structure):
    """``wasmtime_extern_t``: a kind byte and, 8 bytes in, the item (a function or memory
    handle: its store's id and an index). ``item`` is the address the C API takes for a
    ``wasmtime_func_t*`` or ``wasmtime_memory_t*``; keep the Extern alive while it is used."""

    _fields_ = [("kind", _u8), ("_pad", _u8 * 7), ("of", _u64 * 3)]

    @property
    def item(self) -> int:
        return ctypes.addressof(self) + 8


EXTERN_FUNC = 0
EXTERN_MEMORY = 3


class _Instance(ctypes.Structure):
    _fields_ = [("store_id", _u64), ("index", _sz)]


# ---- errors ---------------------------------------------------------------------------------
class WasmError(Exception):
    """An error or trap the engine reported. ``trap_code`` (a :class:`TrapCode` value) when
    the guest trapped with a known code, ``exit_code`` when it called WASI ``proc_exit``."""

    def __init__(self, message: str, *, trap_code: int | None = None,
                 exit_code: int | None = None) -> None:
        super().__init__(message)
        self.trap_code = trap_code
        self.exit_code = exit_code


_error_message = fn("wasmtime_error_message", None, _vp, _vp)
_error_exit_status = fn("wasmtime_error_exit_status", _bool, _vp, _vp)
_error_delete = fn("wasmtime_error_delete", None, _vp)
_trap_message = fn("wasm_trap_message", None, _vp, _vp)
_trap_code = fn("wasmtime_trap_code", _bool, _vp, _vp)
_trap_delete = fn("wasm_trap_delete", None, _vp)
_byte_vec_delete = fn("wasm_byte_vec_delete", None, _vp)


def _take_vec(vec: _ByteVec) -> bytes:
    try:
        return ctypes.string_at(vec.data, vec.size) if vec.size else b""
    finally:
        _byte_vec_delete(ctypes.byref(vec))


def take_error(err: int) -> WasmError:
    """The :class:`WasmError` for an owned ``wasmtime_error_t*`` (which this frees)."""
    try:
        vec = _ByteVec()
        _error_message(err, ctypes.byref(vec))
        message = _take_vec(vec).decode("utf-8", "replace")
        status = ctypes.c_int(0)
        exit_code = status.value if _error_exit_status(err, ctypes.byref(status)) else None
    finally:
        _error_delete(err)
    return WasmError(message, exit_code=exit_code)


def take_trap(trap: int) -> WasmError:
    """The :class:`WasmError` for an owned ``wasm_trap_t*`` (which this frees)."""
    try:
        vec = _ByteVec()
        _trap_message(trap, ctypes.byref(vec))
        message = _take_vec(vec).rstrip(b"\0").decode("utf-8", "replace")
        code = _u8(0)
        trap_code = code.value if _trap_code(trap, ctypes.byref(code)) else None
    finally:
        _trap_delete(trap)
    return WasmError(message, trap_code=trap_code)


def _check(err: int | None, what: str) -> None:
    if err:
        exc = take_error(err)
        raise WasmError(f"{what}: {exc}", exit_code=exc.exit_code) from None


# ---- engines and modules --------------------------------------------------------------------
_config_new = fn("wasm_config_new", _vp)
_config_fuel = fn("wasmtime_config_consume_fuel_set", None, _vp, _bool)
_config_epochs = fn("wasmtime_config_epoch_interruption_set", None, _vp, _bool)
_config_exceptions = fn("wasmtime_config_wasm_exceptions_set", None, _vp, _bool)
_config_async_stack = fn("wasmtime_config_async_stack_size_set", None, _vp, _sz)
_config_max_stack = fn("wasmtime_config_max_wasm_stack_set", None, _vp, _sz)
_engine_new = fn("wasm_engine_new_with_config", _vp, _vp)
increment_epoch = fn("wasmtime_engine_increment_epoch", None, _vp)
_module_deserialize_file = fn("wasmtime_module_deserialize_file", _vp, _vp, _cp, _vp,
                              gil=False)
_module_new = fn("wasmtime_module_new", _vp, _vp, _vp, _sz, _vp, gil=False)
_module_serialize = fn("wasmtime_module_serialize", _vp, _vp, _vp, gil=False)
module_delete = fn("wasmtime_module_delete", None, _vp)
_wat2wasm = fn("wasmtime_wat2wasm", _vp, _cp, _sz, _vp)


def new_engine(*, fuel: bool, epochs: bool, exceptions: bool, max_wasm_stack: int,
               async_stack: int) -> int:
    """An engine (never freed: engines live as long as the process). The async stack size
    must be set before ``max_wasm_stack`` and be at least as large, or wasmtime aborts."""
    cfg = _config_new()
    _config_fuel(cfg, fuel)
    _config_epochs(cfg, epochs)
    _config_exceptions(cfg, exceptions)
    _config_async_stack(cfg, async_stack)
    _config_max_stack(cfg, max_wasm_stack)
    engine = _engine_new(cfg)  # takes the config
    if not engine:
        raise WasmError("wasmtime could not create an engine with this configuration")
    return int(engine)


def deserialize_module(engine: int, path: str | os.PathLike[str]) -> int:
    """A module from a precompiled file (mapped, not read)."""
    out = _vp()
    _check(_module_deserialize_file(engine, os.fsencode(path), ctypes.byref(out)),
           f"cannot load {path}")
    return int(out.value or 0)


def compile_module(engine: int, wasm: bytes) -> int:
    out = _vp()
    _check(_module_new(engine, wasm, len(wasm), ctypes.byref(out)), "cannot compile")
    return int(out.value or 0)


def serialize_module(module: int) -> bytes:
    vec = _ByteVec()
    _check(_module_serialize(module, ctypes.byref(vec)), "cannot serialize")
    return _take_vec(vec)


def wat_to_wasm(wat: str) -> bytes:
    text = wat.encode()
    vec = _ByteVec()
    _check(_wat2wasm(text, len(text), ctypes.byref(vec)), "invalid WAT")
    return _take_vec(vec)


# ---- linking --------------------------------------------------------------------------------
_linker_new = fn("wasmtime_linker_new", _vp, _vp)
_linker_shadowing = fn("wasmtime_linker_allow_shadowing", None, _vp, _bool)
_linker_define_wasi = fn("wasmtime_linker_define_wasi", _vp, _vp)
_linker_get = fn("wasmtime_linker_get", _bool, _vp, _vp, _cp, _sz, _cp, _sz, _vp)
_linker_instantiate_pre = fn("wasmtime_linker_instantiate_pre", _vp, _vp, _vp, _vp)
_valtype_new = fn("wasm_valtype_new", _vp, _u8)
_valtype_vec_new = fn("wasm_valtype_vec_new", None, _vp, _sz, _vp)
_functype_new = fn("wasm_functype_new", _vp, _vp, _vp)
functype_delete = fn("wasm_functype_delete", None, _vp)


def new_linker(engine: int, *, shadowing: bool = False) -> int:
    """A linker (MemEx keeps one per module for the process)."""
    linker = int(_linker_new(engine))
    _linker_shadowing(linker, shadowing)
    return linker


def define_wasi(linker: int) -> None:
    _check(_linker_define_wasi(linker), "cannot define WASI")


def functype(params: Sequence[int], results: Sequence[int]) -> int:
    """A ``wasm_functype_t*`` of value kinds (``WASM_I32``...); free it with
    :func:`functype_delete` once it has been used."""
    vecs = []
    for kinds in (params, results):
        arr = (_vp * max(len(kinds), 1))(*[_valtype_new(k) for k in kinds])
        vec = _ByteVec()  # wasm_valtype_vec_t has the same layout: size, data
        _valtype_vec_new(ctypes.byref(vec), len(kinds), arr)
        vecs.append(vec)
    return int(_functype_new(ctypes.byref(vecs[0]), ctypes.byref(vecs[1])))  # takes both


def instantiate_pre(linker: int, module: int) -> int:
    out = _vp()
    _check(_linker_instantiate_pre(linker, module, ctypes.byref(out)), "cannot link")
    return int(out.value or 0)


def linker_get(linker: int, ctx: int, module: str, name: str) -> Extern:
    item = Extern()
    m, n = module.encode(), name.encode()
    if not _linker_get(linker, ctx, m, len(m), n, len(n), ctypes.byref(item)):
        raise WasmError(f"the linker defines no {module}.{name}")
    return item


# ---- stores and instances -------------------------------------------------------------------
_store_new = fn("wasmtime_store_new", _vp, _vp, _vp, _vp)
_store_context = fn("wasmtime_store_context", _vp, _vp)
_store_limiter = fn("wasmtime_store_limiter", None, _vp, _i64, _i64, _i64, _i64, _i64)
store_delete = fn("wasmtime_store_delete", None, _vp)
_set_wasi = fn("wasmtime_context_set_wasi", _vp, _vp, _vp)
_wasi_new = fn("wasi_config_new", _vp)
_wasi_delete = fn("wasi_config_delete", None, _vp)
_wasi_argv = fn("wasi_config_set_argv", _bool, _vp, _sz, _vp)
_wasi_env = fn("wasi_config_set_env", _bool, _vp, _sz, _vp, _vp)
_wasi_preopen = fn("wasi_config_preopen_dir", _bool, _vp, _cp, _cp, _bool)
_wasi_stdout = fn("wasi_config_set_stdout_custom", None, _vp, _vp, _vp, _vp)
_wasi_stderr = fn("wasi_config_set_stderr_custom", None, _vp, _vp, _vp, _vp)
_pre_instantiate = fn("wasmtime_instance_pre_instantiate", _vp, _vp, _vp, _vp, _vp, gil=False)
_instance_new = fn("wasmtime_instance_new", _vp, _vp, _vp, _vp, _sz, _vp, _vp, gil=False)
_export_get = fn("wasmtime_instance_export_get", _bool, _vp, _vp, _cp, _sz, _vp)
_memory_grow = fn("wasmtime_memory_grow", _vp, _vp, _vp, _u64, _vp)


def new_store(engine: int, *, memory_limit: int) -> tuple[int, int]:
    """A store whose memories may not grow past ``memory_limit`` bytes: (store, its
    context). Free it with :func:`store_delete`."""
    store = int(_store_new(engine, None, None))
    _store_limiter(store, memory_limit, -1, -1, -1, -1)
    return store, int(_store_context(store))


def _strings(items: Sequence[str]) -> Any:
    return (_cp * max(len(items), 1))(*[s.encode() for s in items])


def wasi_config(ctx: int, *, argv: Sequence[str], env: Sequence[tuple[str, str]],
                preopens: Sequence[tuple[str, str, bool]], stdout: tuple[int, int, int],
                stderr: tuple[int, int, int]) -> None:
    """Give the store ``ctx`` its WASI context: ``argv``, ``env``, directories (host path,
    guest path, writable) and the two output callbacks, each as the addresses of a
    ``ssize_t (*)(void *data, const unsigned char *buf, size_t n)``, its data and a
    finalizer of the data (0 for none). The engine calls both on threads of its own async
    runtime, which Python did not start (see ``_ffi.output_callback``). No stdin: the guest
    reads end-of-file."""
    cfg = _wasi_new()
    try:
        ok = _wasi_argv(cfg, len(argv), _strings(argv)) and _wasi_env(
            cfg, len(env), _strings([k for k, _ in env]), _strings([v for _, v in env]))
        for host, guest, writable in preopens:
            ok = ok and _wasi_preopen(cfg, os.fsencode(host), guest.encode(), writable)
        if not ok:
            raise WasmError("wasmtime refused the guest's WASI configuration (argv, env or a "
                            "preopened directory)")
        _wasi_stdout(cfg, *stdout)
        _wasi_stderr(cfg, *stderr)
    except BaseException:
        _wasi_delete(cfg)
        raise
    _check(_set_wasi(ctx, cfg), "cannot configure WASI")  # takes the config


def instantiate(pre: int, ctx: int) -> _Instance:
    inst = _Instance()
    trap = _vp()
    err = _pre_instantiate(pre, ctx, ctypes.byref(inst), ctypes.byref(trap))
    if trap.value:
        raise take_trap(trap.value)
    _check(err, "cannot instantiate")
    return inst


def instance_new(ctx: int, module: int, imports: Sequence[Extern]) -> _Instance:
    """Instantiate ``module`` with ``imports`` in the module's import order."""
    arr = (Extern * max(len(imports), 1))(*imports)
    inst = _Instance()
    trap = _vp()
    err = _instance_new(ctx, module, arr, len(imports), ctypes.byref(inst), ctypes.byref(trap))
    if trap.value:
        raise take_trap(trap.value)
    _check(err, "cannot instantiate")
    return inst


def export(ctx: int, inst: _Instance, name: str, kind: int) -> Extern:
    """The export ``name`` of an instance, which must be of ``kind`` (EXTERN_FUNC...)."""
    item = Extern()
    n = name.encode()
    if not _export_get(ctx, ctypes.byref(inst), n, len(n), ctypes.byref(item)) \
            or item.kind != kind:
        raise WasmError(f"the guest exports no {name!r} of the expected kind")
    return item


def memory_grow(ctx: int, memory: int, pages: int) -> int:
    """Grow a memory (the address of its ``wasmtime_memory_t``) by ``pages`` wasm pages;
    returns its previous size in pages."""
    prev = _u64(0)
    _check(_memory_grow(ctx, memory, pages, ctypes.byref(prev)), "cannot grow memory")
    return int(prev.value)
