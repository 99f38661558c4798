"""The one-time preparation of a machine (``memex prepare``, ``./build.sh``): fetch the guest
interpreter (once, by its pinned hash) and check it, lay out the guest's files, precompile each
engine flavour (minutes, ~3 GB), the guest bundle's bytecode and each flavour's warm image (a
bootstrapped guest that the first sandbox of every later process maps instead of
bootstrapping). Everything it makes lives in the cache and is reused by every later process;
running it again does only what is missing."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from ._records import Limits
from ._sandbox import Sandbox
from ._warm import precompile_bundle, warm_image
from .engine import _engine
from .engine._artifacts import INTERPRETER, find_artifacts
from .engine._engine import FLAVOURS, Flavour, load_module, module_path
from .engine._files import bundle_dir, mpl_data_dir, stdlib_dir
from .engine._support import engine_support
from .images._dirty import dirty_tracking

__all__ = ["prepare"]


def prepare(flavours: Sequence[Flavour] = FLAVOURS, *,
            step: Callable[[str], None] = lambda _msg: None,
            compiling: Callable[[Flavour], contextlib.AbstractContextManager[Any]] | None = None
            ) -> None:
    """Make this machine ready to start sandboxes of ``flavours``. ``step`` hears one line per
    step; ``compiling(flavour)`` wraps each module compilation (e.g. a progress spinner)."""
    support = engine_support()
    step(support.describe() if support.supported else f"warning: {support.describe()}")
    from ._interpreter import fetch_interpreter  # its index reader only when preparing

    home = fetch_interpreter(step=step)
    step(f"checking the guest interpreter ({INTERPRETER.label}) in {home} against SHA256SUMS")
    arts = find_artifacts()
    step(f"stdlib folder {stdlib_dir(arts)}")
    step(f"matplotlib data {mpl_data_dir(arts)}")
    step(f"guest bundle {bundle_dir()}")
    for fl in flavours:
        path = module_path(fl, arts)
        if path.is_file():
            step(f"{fl} module already compiled: {path}")
            continue
        step(f"compiling the {fl} guest module (a few minutes, ~3 GB of memory)")
        with compiling(fl) if compiling is not None else contextlib.nullcontext():
            # through the module, so that one patch of _engine.compile_module stops every
            # path to a compilation (the test suite's tripwire)
            path, _ = _engine.compile_module(fl)
        step(f"{fl} module ready: {path}")
    bundle = bundle_dir()
    if flavours and not any(bundle.rglob("*.pyc")):
        step("compiling the guest bundle to guest bytecode")
        precompile_bundle(load_module(flavours[0]), bundle, stdlib_dir(arts))
    mode = dirty_tracking()
    step(f"checkpoints on this host: {mode} ("
         + ("each costs what a turn wrote" if not mode.startswith("off") else
            "each copies the whole memory") + ")")
    for fl in flavours:
        with Sandbox(limits=Limits(fuel=10**9) if fl == "metered" else None,
                     rollback=False) as sb:
            if warm_image(sb._loaded, sb._spec, (), build=False) is not None:
                step(f"{fl} warm image already built")
                continue
            step(f"building the {fl} warm image")
            warm_image(sb._loaded, sb._spec, ())
