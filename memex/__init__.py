"""MemEx: a programmable scratchpad for LLM agents, run in a WebAssembly sandbox."""

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
    GuestException,
    Limits,
    Mount,
    Sandbox,
    TurnResult,
    TurnStatus,
)

__version__ = "0.1.0"

__all__ = [
    "ArtifactsError",
    "Checkpoint",
    "ConfigError",
    "Door",
    "DoorCall",
    "DoorContext",
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
    "TurnResult",
    "TurnStatus",
    "__version__",
]
