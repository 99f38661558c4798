"""Where sandboxes live: one :class:`Backend` contract (``open`` a sandbox handle that is a
:class:`~memex.runtime_wasm.SandboxAPI`, ``close``), chosen by one argument
(``get_backend("pool", workers=4)``). In-process, worker processes (subprocess, pool with
admission control and tenant quotas) and Ray actors; see docs/backends.md.

This layer imports only ``memex.runtime_wasm`` and ``memex.errors``: host tools and the agent
reach a sandbox through the door it is opened with, whichever backend holds it.
"""

from ._contract import Backend
from ._inprocess import InProcessBackend
from ._pool import PoolBackend, PoolStats, TenantQuota
from ._ray import RayBackend, RayCheckpoint, RaySandbox
from ._registry import BACKENDS, get_backend
from ._subprocess import ProcessCheckpoint, ProcessSandbox, SubprocessBackend

__all__ = [
    "BACKENDS",
    "Backend",
    "InProcessBackend",
    "PoolBackend",
    "PoolStats",
    "ProcessCheckpoint",
    "ProcessSandbox",
    "RayBackend",
    "RayCheckpoint",
    "RaySandbox",
    "SubprocessBackend",
    "TenantQuota",
    "get_backend",
]
