"""MemEx: a programmable scratchpad for LLM agents, run in a WebAssembly sandbox.

``_EXPORTS`` is the one place the package's top-level names are written: layer -> the names
taken from it. The errors and the runtime are imported with the package; the heavier layers
(``memex.host_tools`` pulls in pydantic, ``memex.executor`` the openai client, ``memex.eval``
both) on first use of
one of their names, so that ``memex run`` starts fast. Type checkers read ``__init__.pyi``,
which tests/test_public_api.py generates from ``_EXPORTS`` and keeps in step with it.
"""

from __future__ import annotations

import importlib
from typing import Any

from . import errors, runtime_wasm

__version__ = "0.1.0"

_EXPORTS: dict[str, tuple[str, ...]] = {
    "memex.errors": tuple(errors.__all__),
    "memex.runtime_wasm": (
        "Checkpoint", "Door", "DoorCall", "DoorContext", "DoorError", "GuestException",
        "Limits", "Mount", "Sandbox", "SandboxAPI", "TurnResult", "TurnStatus",
    ),
    "memex.backends": ("Backend", "RemoteBackend", "get_backend"),
    "memex.host_tools": (
        "Egress", "EgressDecision", "EgressLimits", "EgressPolicy", "EgressRecord",
        "EgressRule", "EgressSecret", "GateDecision", "Tool", "ToolBudget", "ToolCallRecord",
        "ToolHost", "ToolParam", "ToolRequest", "ToolSet", "tool",
    ),
    "memex.executor": (
        "Aids", "Budget", "EndReason", "Hooks", "MemexAgent", "ModelSettings", "Rollout",
        "SandboxSpec", "Step", "ToolPolicy", "Trajectory", "TreeBudget", "load_trajectories",
    ),
    "memex.executor.llm": ("LLMClient", "LocalModel", "ScriptedLLM"),
    "memex.eval": ("EvalTask", "Suite", "Workspace", "run_eval"),
}
_EAGER = {"memex.errors": errors, "memex.runtime_wasm": runtime_wasm}
_LAZY = {name: module for module, names in _EXPORTS.items() if module not in _EAGER
         for name in names}

globals().update({name: getattr(_EAGER[module], name)
                  for module, names in _EXPORTS.items() if module in _EAGER for name in names})

__all__ = sorted(["__version__", *(n for names in _EXPORTS.values() for n in names)])


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'memex' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
