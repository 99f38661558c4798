"""Where sandboxes live: one :class:`Backend` contract (``open`` a sandbox handle that is a
:class:`~memex.runtime_wasm.SandboxAPI`, ``close``), chosen by one argument
(``get_backend("pool", workers=4)``). In-process, worker processes (subprocess, pool with
admission control and tenant quotas), Ray actors and a ``memex serve`` service (``remote``:
its names load httpx and websockets on first use, so ``memex run`` does not pay for them);
see docs/backends.md and docs/service.md.

This layer imports only ``memex.runtime_wasm`` and ``memex.errors``: host tools and the agent
reach a sandbox through the door it is opened with, whichever backend holds it.
"""

from typing import TYPE_CHECKING, Any

from ._clientdoor import ClientDoor
from ._cluster import SLAB_LEASE, Slab, session_key
from ._contract import Backend
from ._inprocess import InProcessBackend
from ._ledger import Account, Ledger
from ._pool import PoolBackend, PoolStats, TenantQuota
from ._ray import RayBackend, RayCheckpoint, RaySandbox
from ._raynet import LOOPBACK_NODE, init_ray, ray_on_loopback
from ._registry import BACKENDS, get_backend
from ._storage import Storage
from ._subprocess import ProcessCheckpoint, ProcessSandbox, SubprocessBackend
from ._tmpfiles import FILES_CAP, FILES_ENTRIES, tmp_files, tmp_files_from

if TYPE_CHECKING:
    from ._remote import Client, RemoteBackend, RemoteCheckpoint, RemoteSandbox

_REMOTE = ("Client", "RemoteBackend", "RemoteCheckpoint", "RemoteSandbox")

__all__ = [
    "BACKENDS",
    "FILES_CAP",
    "FILES_ENTRIES",
    "LOOPBACK_NODE",
    "SLAB_LEASE",
    "Account",
    "Backend",
    "Client",
    "ClientDoor",
    "InProcessBackend",
    "Ledger",
    "PoolBackend",
    "PoolStats",
    "ProcessCheckpoint",
    "ProcessSandbox",
    "RayBackend",
    "RayCheckpoint",
    "RaySandbox",
    "RemoteBackend",
    "RemoteCheckpoint",
    "RemoteSandbox",
    "Slab",
    "Storage",
    "SubprocessBackend",
    "TenantQuota",
    "get_backend",
    "init_ray",
    "ray_on_loopback",
    "session_key",
    "tmp_files",
    "tmp_files_from",
]


def __getattr__(name: str) -> Any:
    if name in _REMOTE:
        from . import _remote  # httpx and websockets only when used

        return getattr(_remote, name)
    raise AttributeError(f"module 'memex.backends' has no attribute {name!r}")
