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
    BackendBusy,
    ConfigError,
    GuestFileError,
    GuestStartError,
    ImageError,
    LLMConnectionError,
    LLMError,
    LLMResponseError,
    LLMTimeoutError,
    LocalModelError,
    MemexError,
    ModelFileError,
    ModuleCacheMissing,
    PolicyError,
    SandboxClosed,
    SandboxError,
    SandboxLost,
    SetupError,
    ToolDefinitionError,
    ToolInstallError,
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
    from .executor import (
        Aids,
        Budget,
        LLMClient,
        LocalModel,
        MemexAgent,
        Rollout,
        ScriptedLLM,
        Step,
        Trajectory,
        TreeBudget,
        get_backend,
        load_trajectories,
    )
    from .host_tools import (
        Egress,
        EgressDecision,
        EgressLimits,
        EgressPolicy,
        EgressRecord,
        EgressRule,
        EgressSecret,
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
    "Egress": "memex.host_tools",
    "EgressDecision": "memex.host_tools",
    "EgressLimits": "memex.host_tools",
    "EgressPolicy": "memex.host_tools",
    "EgressRecord": "memex.host_tools",
    "EgressRule": "memex.host_tools",
    "EgressSecret": "memex.host_tools",
    "Aids": "memex.executor",
    "Budget": "memex.executor",
    "LLMClient": "memex.executor",
    "LocalModel": "memex.executor",
    "MemexAgent": "memex.executor",
    "Rollout": "memex.executor",
    "ScriptedLLM": "memex.executor",
    "Step": "memex.executor",
    "Trajectory": "memex.executor",
    "TreeBudget": "memex.executor",
    "get_backend": "memex.executor",
    "load_trajectories": "memex.executor",
}

__all__ = [
    "Aids",
    "ArtifactsError",
    "BackendBusy",
    "Budget",
    "Checkpoint",
    "ConfigError",
    "Door",
    "DoorCall",
    "DoorContext",
    "DoorError",
    "Egress",
    "EgressDecision",
    "EgressLimits",
    "EgressPolicy",
    "EgressRecord",
    "EgressRule",
    "EgressSecret",
    "GateDecision",
    "GuestException",
    "GuestFileError",
    "GuestStartError",
    "ImageError",
    "LLMClient",
    "LLMConnectionError",
    "LLMError",
    "LLMResponseError",
    "LLMTimeoutError",
    "Limits",
    "LocalModel",
    "LocalModelError",
    "MemexAgent",
    "MemexError",
    "ModelFileError",
    "ModuleCacheMissing",
    "Mount",
    "PolicyError",
    "Rollout",
    "Sandbox",
    "SandboxClosed",
    "SandboxError",
    "SandboxLost",
    "ScriptedLLM",
    "SetupError",
    "Step",
    "Tool",
    "ToolBudget",
    "ToolCallRecord",
    "ToolDefinitionError",
    "ToolHost",
    "ToolInstallError",
    "ToolParam",
    "ToolRequest",
    "ToolSet",
    "Trajectory",
    "TreeBudget",
    "TurnResult",
    "TurnStatus",
    "__version__",
    "get_backend",
    "load_trajectories",
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
