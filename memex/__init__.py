"""MemEx: a programmable scratchpad for LLM agents, run in a WebAssembly sandbox.

The runtime's names are imported with the package; heavier layers (``memex.host_tools``
pulls in pydantic, ~300 ms) are imported on first use of one of their names: see
``_LAZY`` (name -> submodule), the one table to extend when a layer adds public names.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .errors import (
    ArtifactsError,
    ConfigError,
    GuestFileError,
    GuestStartError,
    ImageError,
    MemexError,
    ModuleCacheMissing,
    SandboxClosed,
    SandboxError,
    SetupError,
)
from .runtime_wasm import (
    Checkpoint,
    Door,
    DoorCall,
    DoorContext,
    DoorError,
    GuestException,
    Limits,
    Mount,
    Sandbox,
    TurnResult,
    TurnStatus,
)

if TYPE_CHECKING:  # what _LAZY resolves to, for type checkers
    from .host_tools import (
        GateDecision,
        Tool,
        ToolBudget,
        ToolCallRecord,
        ToolHost,
        ToolParam,
        ToolRequest,
        ToolSet,
        tool,
    )

__version__ = "0.1.0"

# Public names imported on first access: name -> the submodule that defines it.
_LAZY: dict[str, str] = {
    "GateDecision": "memex.host_tools",
    "Tool": "memex.host_tools",
    "ToolBudget": "memex.host_tools",
    "ToolCallRecord": "memex.host_tools",
    "ToolHost": "memex.host_tools",
    "ToolParam": "memex.host_tools",
    "ToolRequest": "memex.host_tools",
    "ToolSet": "memex.host_tools",
    "tool": "memex.host_tools",
}

__all__ = [
    "ArtifactsError",
    "Checkpoint",
    "ConfigError",
    "Door",
    "DoorCall",
    "DoorContext",
    "DoorError",
    "GateDecision",
    "GuestException",
    "GuestFileError",
    "GuestStartError",
    "ImageError",
    "Limits",
    "MemexError",
    "ModuleCacheMissing",
    "Mount",
    "Sandbox",
    "SandboxClosed",
    "SandboxError",
    "SetupError",
    "Tool",
    "ToolBudget",
    "ToolCallRecord",
    "ToolHost",
    "ToolParam",
    "ToolRequest",
    "ToolSet",
    "TurnResult",
    "TurnStatus",
    "__version__",
    "tool",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'memex' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
