"""The sandbox: a live, capped CPython-on-WASI kernel per rollout.

This layer imports no other MemEx layer: its door to the host carries frames of bytes. Its
public surface is what an application touches: the sandbox and its records (``Sandbox``,
``Limits``, ``TurnResult``...); the door (``Door`` and what a handler may raise or ask:
``DoorError``, ``GuestKilled``, ``DoorContext``, ``serving_door``); ``SandboxAPI`` (what every
backend's sandbox offers); guest packages (``PackageSet``, ``resolve_packages``); ``prepare``
(the one-time precompile) and what this host supports (``engine_support``,
``dirty_tracking``). The defaults live here, once: ``SANDBOX_LIMITS``, ``AGENT_LIMITS`` and
``KERNEL_LIMITS``. What the other layers build on and an application does not (checkpoint
transfer between processes, the door's thread pool, guest priority, the cache's and state
folder's files, bounded decoding, the one grammar of sizes and durations) is in
``internal``.
"""

from ._door import Door, DoorCall, DoorContext, DoorError, serving_door
from ._instance import GuestKilled
from ._output import OutputListener
from ._packages import PackageSet, Wheel, bundled_packages, resolve_packages
from ._prepare import prepare
from ._protocol import SandboxAPI
from ._records import (
    AGENT_LIMITS,
    KERNEL_LIMITS,
    SANDBOX_LIMITS,
    GuestException,
    GuestFile,
    Limits,
    Mount,
    TurnResult,
    TurnStatus,
)
from ._sandbox import Checkpoint, Sandbox
from .engine._artifacts import INTERPRETER
from .engine._cache import cache_dir
from .engine._support import EngineSupport, engine_support
from .images._dirty import dirty_tracking

__all__ = [
    "AGENT_LIMITS",
    "INTERPRETER",
    "KERNEL_LIMITS",
    "SANDBOX_LIMITS",
    "Checkpoint",
    "Door",
    "DoorCall",
    "DoorContext",
    "DoorError",
    "EngineSupport",
    "GuestException",
    "GuestFile",
    "GuestKilled",
    "Limits",
    "Mount",
    "OutputListener",
    "PackageSet",
    "Sandbox",
    "SandboxAPI",
    "TurnResult",
    "TurnStatus",
    "Wheel",
    "bundled_packages",
    "cache_dir",
    "dirty_tracking",
    "engine_support",
    "prepare",
    "resolve_packages",
    "serving_door",
]
