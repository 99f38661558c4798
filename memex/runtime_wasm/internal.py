"""What MemEx's other layers use of the runtime and an application does not: the checkpoint
transfer functions the backends move a guest between processes with, the door's thread pool,
the guests' CPU priority, the package resolver's checks, the cache's and state folder's file
helpers, the bounded msgpack decoder, the one TLS context every HTTP client shares
(``http_tls``) and the one grammar of sizes and durations (``parse_size``,
``parse_seconds``, ``size_text``, ``retry_after``) that every config reader uses. Not a
public surface: names here may change in any release. They are pinned in
tests/test_public_api.py (``INTERNAL``) so that a change is still deliberate."""

from ._bounded import DecodeCost, unpack_bounded
from ._diskcache import CACHE_PARTS, cache_report, clean_cache
from ._handle import SandboxHandle
from ._packages import cancel_resolutions, checked_requirements, script_dependencies
from ._protocol import fork_count, fork_each
from ._records import LIMIT_FIELDS, LimitField
from ._tls import http_tls
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
from .engine._artifacts import Artifacts, InterpreterRelease, find_artifacts
from .engine._cache import atomic_write, private_dir, state_dir
from .engine._engine import compile_module, load_module, module_path
from .engine._runner import GUEST_NICE_ENV, guest_nice, set_guest_nice
from .files._tree import remove as remove_tree

__all__ = [
    "CACHE_PARTS",
    "GUEST_NICE_ENV",
    "LIMIT_FIELDS",
    "Artifacts",
    "DecodeCost",
    "InterpreterRelease",
    "Job",
    "LimitField",
    "SandboxHandle",
    "Workers",
    "atomic_write",
    "cache_report",
    "cancel_resolutions",
    "checked_requirements",
    "checkpoint_from_bytes",
    "checkpoint_from_fds",
    "checkpoint_to_bytes",
    "checkpoint_to_fds",
    "clean_cache",
    "compile_module",
    "find_artifacts",
    "fork_count",
    "fork_each",
    "guest_nice",
    "http_tls",
    "load_module",
    "module_path",
    "open_from_checkpoint",
    "parse_seconds",
    "parse_size",
    "private_dir",
    "remove_tree",
    "retry_after",
    "scratch_dir",
    "script_dependencies",
    "set_guest_nice",
    "size_text",
    "state_dir",
    "unpack_bounded",
]
