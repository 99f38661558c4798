"""The sandbox: a live, capped CPython-on-WASI kernel per rollout.

This layer imports no other MemEx layer: its door to the host carries frames of bytes. Its
public surface has three parts: the sandbox and its records (``Sandbox``, ``Limits``,
``TurnResult``...); the door (``Door`` and what a handler may raise or ask: ``DoorError``,
``GuestKilled``, ``DoorContext``, ``serving_door``) with the thread pool handlers run on
(``Workers``); and the seams other layers build on: ``SandboxAPI`` (what every backend's
sandbox offers), the checkpoint transfer functions backends use to move a guest between
processes, ``prepare`` (the one-time precompile), ``dirty_tracking`` (whether this host's
checkpoints cost what a turn wrote or the whole memory), ``unpack_bounded`` with its
``DecodeCost`` (msgpack from outside the process, decoded under a cost cap) and
``remove_tree`` (deleting a folder a guest built: iterative, bounded, never raising). The
defaults live here, once: ``SANDBOX_LIMITS``, ``AGENT_LIMITS`` and ``KERNEL_LIMITS``, with the
one grammar for sizes and durations (``parse_size``, ``parse_seconds``) that
``Limits.from_mapping`` and every config reader use.
"""

from ._bounded import DecodeCost, unpack_bounded
from ._diskcache import CACHE_PARTS, cache_report, clean_cache
from ._door import Door, DoorCall, DoorContext, DoorError, serving_door
from ._handle import SandboxHandle
from ._instance import GuestKilled
from ._output import OutputListener
from ._packages import (
    PackageSet,
    Wheel,
    bundled_packages,
    cancel_resolutions,
    checked_requirements,
    resolve_packages,
    script_dependencies,
)
from ._prepare import prepare
from ._protocol import SandboxAPI, fork_count, fork_each
from ._records import (
    AGENT_LIMITS,
    KERNEL_LIMITS,
    LIMIT_FIELDS,
    SANDBOX_LIMITS,
    GuestException,
    GuestFile,
    LimitField,
    Limits,
    Mount,
    TurnResult,
    TurnStatus,
)
from ._sandbox import Checkpoint, Sandbox
from ._transfer import (
    checkpoint_from_bytes,
    checkpoint_from_fds,
    checkpoint_to_bytes,
    checkpoint_to_fds,
    open_from_checkpoint,
    scratch_dir,
)
from ._units import parse_seconds, parse_size, retry_after, size_text
from ._workers import Job, Workers
from .engine._artifacts import INTERPRETER, Artifacts, InterpreterRelease, find_artifacts
from .engine._cache import atomic_write, cache_dir, private_dir, state_dir
from .engine._engine import compile_module, load_module, module_path
from .engine._runner import GUEST_NICE_ENV, guest_nice, set_guest_nice
from .engine._support import EngineSupport, engine_support
from .files._tree import remove as remove_tree
from .images._dirty import dirty_tracking

__all__ = [
    "AGENT_LIMITS",
    "CACHE_PARTS",
    "GUEST_NICE_ENV",
    "INTERPRETER",
    "KERNEL_LIMITS",
    "LIMIT_FIELDS",
    "SANDBOX_LIMITS",
    "Artifacts",
    "Checkpoint",
    "DecodeCost",
    "Door",
    "DoorCall",
    "DoorContext",
    "DoorError",
    "EngineSupport",
    "GuestException",
    "GuestFile",
    "GuestKilled",
    "InterpreterRelease",
    "Job",
    "LimitField",
    "Limits",
    "Mount",
    "OutputListener",
    "PackageSet",
    "Sandbox",
    "SandboxAPI",
    "SandboxHandle",
    "TurnResult",
    "TurnStatus",
    "Wheel",
    "Workers",
    "atomic_write",
    "bundled_packages",
    "cache_dir",
    "cache_report",
    "cancel_resolutions",
    "checked_requirements",
    "checkpoint_from_bytes",
    "checkpoint_from_fds",
    "checkpoint_to_bytes",
    "checkpoint_to_fds",
    "clean_cache",
    "compile_module",
    "dirty_tracking",
    "engine_support",
    "find_artifacts",
    "fork_count",
    "fork_each",
    "guest_nice",
    "load_module",
    "module_path",
    "open_from_checkpoint",
    "parse_seconds",
    "parse_size",
    "prepare",
    "private_dir",
    "remove_tree",
    "resolve_packages",
    "retry_after",
    "scratch_dir",
    "script_dependencies",
    "serving_door",
    "set_guest_nice",
    "size_text",
    "state_dir",
    "unpack_bounded",
]
