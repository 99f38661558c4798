"""Engines, the precompiled-module cache and the epoch ticker.

The ticker advances every engine's epoch each ``TICK_SECONDS`` while some guest runs a turn
(from :func:`turn_started` to :func:`turn_ended`) and waits on a condition while none does:
only a running guest's deadline check reads a tick, and ticking an idle process cost it
~11 ms of CPU a second (200 wake-ups, each taking the GIL from the Python code running).

Two engine flavours exist because fuel metering changes the generated code: ``plain`` (epoch
interruption only) and ``metered`` (epoch + fuel). Each is compiled once per machine into
``<cache>/modules/<key>.cwasm`` where the key hashes the wasmtime version, the binary's digest
and every engine setting; loading uses ``Module.deserialize_file`` (mmap, milliseconds).
Compiling never happens implicitly: a missing module raises :class:`ModuleCacheMissing`
naming ``memex prepare``.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ...errors import ModuleCacheMissing, SetupError
from . import _capi, _signals
from ._artifacts import Artifacts, find_artifacts
from ._cache import atomic_write, cache_dir, file_lock

__all__ = [
    "TICK_SECONDS",
    "WASM_STACK",
    "Flavour",
    "LoadedModule",
    "compile_module",
    "engine",
    "load_module",
    "module_path",
    "turn_ended",
    "turn_started",
]

Flavour = Literal["plain", "metered"]
FLAVOURS: tuple[Flavour, ...] = ("plain", "metered")

WASM_STACK = 8 << 20  # deep recursion becomes RecursionError, not a stack-overflow trap
ASYNC_STACK = 16 << 20  # wasmtime requires async_stack_size >= max_wasm_stack
TICK_SECONDS = 0.005  # epoch tick: deadline precision

_LOCK = threading.Lock()
_ENGINES: dict[Flavour, int] = {}  # engine handles, alive as long as the process
_MODULES: dict[Flavour, LoadedModule] = {}
_TICKER: threading.Thread | None = None
_RUNNING = 0  # guests running a turn now, in this process (under _WAKE)
_TICKS = 0  # ticks made so far (tests read it)
_WAKE = threading.Condition(threading.Lock())


def _settings(flavour: Flavour) -> dict[str, object]:
    return {
        "consume_fuel": flavour == "metered",
        "epoch_interruption": True,
        "max_wasm_stack": WASM_STACK,
        "async_stack_size": ASYNC_STACK,
        "wasm_exceptions": True,
    }


def engine(flavour: Flavour) -> int:
    """The engine handle of a flavour (made once per process)."""
    with _LOCK:
        eng = _ENGINES.get(flavour)
        if eng is None:
            s = _settings(flavour)
            try:
                eng = _ENGINES[flavour] = _capi.new_engine(
                    fuel=bool(s["consume_fuel"]), epochs=True, exceptions=True,
                    max_wasm_stack=WASM_STACK, async_stack=ASYNC_STACK)
            except _capi.WasmError as exc:
                raise SetupError(f"wasmtime refused the {flavour} engine: {exc}") from exc
            _signals.capture()  # the trap handlers the first engine installed
        _start_ticker()
        return eng


def _tick() -> None:
    global _TICKS
    increment = _capi.increment_epoch
    while True:
        with _WAKE:
            while not _RUNNING:
                _WAKE.wait()
        time.sleep(TICK_SECONDS)
        for eng in tuple(_ENGINES.values()):
            increment(eng)
        _TICKS += 1


def turn_started() -> None:
    """A guest starts code that epoch deadlines bound (a turn): the ticker ticks until every
    such start has its :func:`turn_ended`. The deadline the turn sets counts from the
    store's epoch as it starts, so the ticks skipped while idle change nothing."""
    global _RUNNING
    with _WAKE:
        _RUNNING += 1
        if _RUNNING == 1:
            _WAKE.notify()


def turn_ended() -> None:
    global _RUNNING
    with _WAKE:
        _RUNNING -= 1


def _start_ticker() -> None:
    global _TICKER
    if _TICKER is None:
        _TICKER = threading.Thread(target=_tick, name="memex-epoch", daemon=True)
        _TICKER.start()


def ticks_for(seconds: float) -> int:
    return max(1, int(seconds / TICK_SECONDS + 0.999))


def _key(flavour: Flavour, arts: Artifacts) -> str:
    parts = [
        f"wasmtime={_capi.wasmtime_version()}",
        f"machine={os.uname().machine}",
        f"binary={arts.snapshot_sha256}",
        *(f"{k}={v}" for k, v in sorted(_settings(flavour).items())),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def module_path(flavour: Flavour, arts: Artifacts | None = None) -> Path:
    arts = arts or find_artifacts()
    return cache_dir() / "modules" / f"{flavour}-{_key(flavour, arts)}.cwasm"


@dataclass(frozen=True, kw_only=True)
class LoadedModule:
    flavour: Flavour
    module: int  # the module handle, alive as long as the process
    artifacts: Artifacts
    path: Path


def load_module(flavour: Flavour) -> LoadedModule:
    """The compiled module of a flavour, from this process or the cache (never compiled)."""
    with _LOCK:
        hit = _MODULES.get(flavour)
    if hit is not None:
        return hit
    arts = find_artifacts()
    path = module_path(flavour, arts)
    if not path.is_file():
        raise ModuleCacheMissing(
            f"no precompiled {flavour} guest module at {path}: run `memex prepare` "
            f"(or `./build.sh`) once on this machine (it takes a few minutes and ~3 GB)"
        )
    eng = engine(flavour)
    try:
        module = _capi.deserialize_module(eng, path)
    except _capi.WasmError as exc:
        raise SetupError(
            f"the cached module {path} cannot be loaded ({exc}); delete it and run `memex prepare`"
        ) from exc
    loaded = LoadedModule(flavour=flavour, module=module, artifacts=arts, path=path)
    with _LOCK:
        return _MODULES.setdefault(flavour, loaded)


def compile_module(flavour: Flavour) -> tuple[Path, bool]:
    """Compile one flavour into the cache unless present. Returns (path, compiled_now).

    Safe when several processes race: one compiles under a file lock, the others wait and then
    find the file; the file appears atomically (temporary name + rename).
    """
    arts = find_artifacts()
    path = module_path(flavour, arts)
    if path.is_file():
        return path, False
    with file_lock(path.with_suffix(".lock")):
        if path.is_file():
            return path, False
        eng = engine(flavour)
        try:
            module = _capi.compile_module(eng, arts.snapshot.read_bytes())
            try:
                data = _capi.serialize_module(module)
            finally:
                _capi.module_delete(module)  # the machine code of a whole CPython
        except _capi.WasmError as exc:
            raise SetupError(f"compiling {arts.snapshot} failed: {exc}") from exc
        atomic_write(path, data)
        return path, True
