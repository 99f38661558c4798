"""The floor under ``memex run -c pass``: what any Python host of this engine pays to start.

Run by bench/runtime.py (``_start_floor.py MODULE.cwasm WASM_STACK ASYNC_STACK``) beside
``python -c pass`` and ``memex run -c pass``, in one loop. It loads MemEx's own C API binding
(``runtime_wasm/engine/_capi.py``, by file, so the ``memex`` package is not imported), opens the
engine library, makes an engine with the runtime's settings and maps the precompiled guest
module — the steps no start can skip — and stops there: no instance, no turn, no records, no
CLI. A ``memex run`` can come down to this plus one instantiation and one turn, not below.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

CAPI = Path(__file__).resolve().parent.parent / "memex" / "runtime_wasm" / "engine" / "_capi.py"


def main(module: str, wasm_stack: int, async_stack: int) -> None:
    spec = importlib.util.spec_from_file_location("memex_floor_capi", CAPI)
    assert spec is not None and spec.loader is not None
    capi = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(capi)
    engine = capi.new_engine(fuel=False, epochs=True, exceptions=True,
                             max_wasm_stack=wasm_stack, async_stack=async_stack)
    capi.deserialize_module(engine, module)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
