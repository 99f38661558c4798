"""Engines, the precompiled-module cache and the epoch ticker.

Two engine flavours exist because fuel metering changes the generated code: ``plain`` (epoch
interruption only) and ``metered`` (epoch + fuel). Each is compiled once per machine into
``<cache>/modules/<key>.cwasm`` where the key hashes the wasmtime version, the binary's digest
and every engine setting; loading uses ``Module.deserialize_file`` (mmap, milliseconds).
Compiling never happens implicitly: a missing module raises :class:`ModuleCacheMissing`
naming ``memex prepare``.
"""

from __future__ import annotations

import hashlib
import platform
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import wasmtime

from ..errors import ModuleCacheMissing, SetupError
from . import _ffi
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
]

Flavour = Literal["plain", "metered"]
FLAVOURS: tuple[Flavour, ...] = ("plain", "metered")

WASM_STACK = 8 << 20  # deep recursion becomes RecursionError, not a stack-overflow trap
ASYNC_STACK = 16 << 20  # wasmtime requires async_stack_size >= max_wasm_stack
TICK_SECONDS = 0.005  # epoch tick: deadline precision

_LOCK = threading.Lock()
_ENGINES: dict[Flavour, wasmtime.Engine] = {}
_MODULES: dict[Flavour, LoadedModule] = {}
_TICKER: threading.Thread | None = None


def _settings(flavour: Flavour) -> dict[str, object]:
    return {
        "consume_fuel": flavour == "metered",
        "epoch_interruption": True,
        "max_wasm_stack": WASM_STACK,
        "async_stack_size": ASYNC_STACK,
        "wasm_exceptions": True,
    }


def _config(flavour: Flavour) -> wasmtime.Config:
    s = _settings(flavour)
    cfg = wasmtime.Config()
    cfg.consume_fuel = bool(s["consume_fuel"])
    cfg.epoch_interruption = True
    cfg.wasm_exceptions = True
    # Must precede max_wasm_stack: an 8 MiB wasm stack with the default async stack makes
    # Engine() abort the process. wasmtime-py exposes this setting only privately.
    _ffi.set_async_stack_size(cfg, ASYNC_STACK)
    cfg.max_wasm_stack = WASM_STACK
    return cfg


def engine(flavour: Flavour) -> wasmtime.Engine:
    with _LOCK:
        eng = _ENGINES.get(flavour)
        if eng is None:
            eng = _ENGINES[flavour] = wasmtime.Engine(_config(flavour))
        _start_ticker()
        return eng


def _tick() -> None:
    while True:
        time.sleep(TICK_SECONDS)
        for eng in tuple(_ENGINES.values()):
            eng.increment_epoch()


def _start_ticker() -> None:
    global _TICKER
    if _TICKER is None:
        _TICKER = threading.Thread(target=_tick, name="memex-epoch", daemon=True)
        _TICKER.start()


def ticks_for(seconds: float) -> int:
    return max(1, int(seconds / TICK_SECONDS + 0.999))


def _wasmtime_version() -> str:
    """wasmtime-py's version from its dist-info folder name (importlib.metadata costs ~40 ms of
    import time, which `memex run` cannot afford)."""
    site = Path(wasmtime.__file__).resolve().parent.parent
    found = sorted(p.name for p in site.glob("wasmtime-*.dist-info"))
    if len(found) == 1:
        return found[0].removeprefix("wasmtime-").removesuffix(".dist-info")
    from importlib.metadata import version

    return version("wasmtime")


def _key(flavour: Flavour, arts: Artifacts) -> str:
    parts = [
        f"wasmtime={_wasmtime_version()}",
        f"machine={platform.machine()}",
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
    module: wasmtime.Module
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
        module = wasmtime.Module.deserialize_file(eng, str(path))
    except wasmtime.WasmtimeError as exc:
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
            module = wasmtime.Module(eng, arts.snapshot.read_bytes())
            data = module.serialize()
        except wasmtime.WasmtimeError as exc:
            raise SetupError(f"compiling {arts.snapshot} failed: {exc}") from exc
        atomic_write(path, data)
        return path, True
