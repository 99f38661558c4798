"""The wasmtime C API binding (runtime_wasm/engine/_capi.py): engine errors and traps come back as
WasmError with their codes, the library is wasmtime-py's own, and nothing leaks a raw
pointer or crashes on bad input."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from memex.runtime_wasm.engine import _capi
from memex.runtime_wasm.engine._capi import EXTERN_FUNC, EXTERN_MEMORY, TrapCode, WasmError
from memex.runtime_wasm.engine._engine import engine
from memex.runtime_wasm.engine._ffi import RawFunc, set_epoch_deadline
from memex.runtime_wasm.engine._signals import ensure

TRAPS = """(module
  (memory (export "memory") 1 100)
  (func (export "unreachable") unreachable)
  (func (export "recurse") call 2)
  (func $r call $r)
  (func (export "spin") (loop br 0)))"""


def _instance(wat: str) -> tuple[int, int, Any]:
    eng = engine("plain")
    module = _capi.compile_module(eng, _capi.wat_to_wasm(wat))
    store, ctx = _capi.new_store(eng, memory_limit=4 << 20)
    linker = _capi.new_linker(eng)
    pre = _capi.instantiate_pre(linker, module)
    return store, ctx, _capi.instantiate(pre, ctx)


def _call(ctx: int, func: _capi.Extern) -> None:
    """Call on a thread with a native stack larger than the engine's 8 MiB wasm stack, as a
    sandbox's runner does (a guest overflowing its wasm stack on an 8 MiB main thread would
    overflow the native one first)."""
    failed: list[BaseException] = []

    def run() -> None:
        ensure()  # as every turn does: wasmtime's trap handlers, put back if displaced
        try:
            RawFunc(func, 0).call1(ctx, 0)
        except BaseException as exc:
            failed.append(exc)

    old = threading.stack_size(32 << 20)
    try:
        t = threading.Thread(target=run)
        t.start()
    finally:
        threading.stack_size(old)
    t.join()
    if failed:
        raise failed[0]


def test_bad_input_is_a_wasm_error_not_a_crash(tmp_path: Path) -> None:
    eng = engine("plain")
    with pytest.raises(WasmError, match="invalid WAT"):
        _capi.wat_to_wasm("(module (func")
    with pytest.raises(WasmError, match="cannot compile"):
        _capi.compile_module(eng, b"\0asm garbage")
    bad = tmp_path / "bad.cwasm"
    bad.write_bytes(b"not a precompiled module")
    with pytest.raises(WasmError, match=f"cannot load {bad}"):
        _capi.deserialize_module(eng, bad)
    with pytest.raises(WasmError, match="cannot load"):
        _capi.deserialize_module(eng, tmp_path / "missing.cwasm")


def test_traps_carry_their_codes_and_exports_their_kinds() -> None:
    store, ctx, inst = _instance(TRAPS)
    try:
        with pytest.raises(WasmError) as err:  # a new store's epoch deadline is now
            _call(ctx, _capi.export(ctx, inst, "spin", EXTERN_FUNC))
        assert err.value.trap_code == TrapCode.INTERRUPT
        set_epoch_deadline(ctx, 1 << 40)
        with pytest.raises(WasmError) as err:
            _call(ctx, _capi.export(ctx, inst, "unreachable", EXTERN_FUNC))
        assert "unreachable" in str(err.value) and err.value.exit_code is None
        with pytest.raises(WasmError) as err:
            _call(ctx, _capi.export(ctx, inst, "recurse", EXTERN_FUNC))
        assert err.value.trap_code == TrapCode.STACK_OVERFLOW
        with pytest.raises(WasmError, match="no 'nope'"):
            _capi.export(ctx, inst, "nope", EXTERN_FUNC)
        with pytest.raises(WasmError, match="no 'spin' of the expected kind"):
            _capi.export(ctx, inst, "spin", EXTERN_MEMORY)
        memory = _capi.export(ctx, inst, "memory", EXTERN_MEMORY)
        assert _capi.memory_grow(ctx, memory.item, 2) == 1
        with pytest.raises(WasmError, match="cannot grow memory"):  # past the store's 4 MiB
            _capi.memory_grow(ctx, memory.item, 200)
    finally:
        _capi.store_delete(store)


def test_the_library_is_wasmtime_pys_own_of_the_pinned_version() -> None:
    path = _capi.library_path()
    assert path.is_file() and path.parent.parent.name == "wasmtime"
    assert _capi.wasmtime_version().split(".")[0] == _capi.WASMTIME_MAJOR
    pins = Path(__file__).resolve().parents[2] / "pyproject.toml"
    assert f'"wasmtime=={_capi.WASMTIME_MAJOR}.' in pins.read_text()


def test_another_wasmtime_is_refused_with_what_to_install(tmp_path: Path) -> None:
    """A wasmtime whose C API is not the one bound here fails the import, naming both."""
    fake = tmp_path / "site"
    (fake / "wasmtime").mkdir(parents=True)
    (fake / "wasmtime" / "__init__.py").write_text("")
    (fake / "wasmtime-50.0.1.dist-info").mkdir()
    probe = (f"import sys; sys.path.insert(0, {str(fake)!r})\n"
             "try:\n    import memex.runtime_wasm\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=60, check=True)
    major = _capi.WASMTIME_MAJOR
    assert f"wasmtime {major}.x's C API; wasmtime 50.0.1 is installed" in out.stdout
    assert f"pip install 'wasmtime=={major}.*'" in out.stdout


# ---- the pinned engine's support window (docs/dependencies.md, 'The engine') -----------------
def test_release_dates_and_windows_follow_wasmtime_s_policy() -> None:
    """The upstream formula: 20.0.0 on 2024-04-20, one release a month on the 20th; a
    multiple of 12 is LTS (24 months), any other release 2 months."""
    import datetime as dt

    from memex.runtime_wasm.engine._support import released, supported_until

    assert released(20) == dt.date(2024, 4, 20)
    assert released(49) == dt.date(2026, 9, 20)  # what the review of the 49 pin found
    assert supported_until(49) == dt.date(2026, 11, 20)
    assert supported_until(48) == dt.date(2028, 8, 20)  # an LTS release
    assert released(61) == dt.date(2027, 9, 20) and supported_until(60) == dt.date(2029, 8, 20)


def test_the_engine_support_check_tells_where_the_pin_stands() -> None:
    """What ``memex prepare`` and ``memex selftest`` say: a release's window on a day inside
    it and the day after (the control both ways: 49.0.0's ended on 2026-11-20), and the
    installed wasmtime (the pinned one) by default."""
    import datetime as dt

    from memex.runtime_wasm import engine_support

    inside = engine_support("49.0.0", today=dt.date(2026, 11, 20))
    after = engine_support("49.0.0", today=dt.date(2026, 11, 21))
    assert inside.supported and "supported until 2026-11-20" in inside.describe()
    assert not after.supported
    assert "left its support window on 2026-11-20" in after.describe()
    later = engine_support("51.0.0", today=dt.date(2026, 12, 6))
    assert later.supported and later.supported_until == dt.date(2027, 1, 20)
    installed = engine_support()
    assert installed.version == _capi.wasmtime_version()
    assert installed.version.split(".")[0] == _capi.WASMTIME_MAJOR
