"""The sandbox: a live, capped CPython-on-WASI kernel per rollout.

This layer imports neither ``memex.host_tools`` nor ``memex.executor``: its door to the host
carries frames of bytes.
"""

from ._api import SandboxAPI
from ._door import Door, DoorCall, DoorContext, DoorError
from ._engine import compile_module, load_module, module_path
from ._records import GuestException, Limits, Mount, TurnResult, TurnStatus
from ._sandbox import Checkpoint, Sandbox

__all__ = [
    "Checkpoint",
    "Door",
    "DoorCall",
    "DoorContext",
    "DoorError",
    "GuestException",
    "Limits",
    "Mount",
    "Sandbox",
    "SandboxAPI",
    "TurnResult",
    "TurnStatus",
    "compile_module",
    "load_module",
    "module_path",
]
