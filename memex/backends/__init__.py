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

from ._contract import Backend
from ._inprocess import InProcessBackend
from ._pool import PoolBackend, PoolStats
from ._ray import RayBackend
from ._raynet import LOOPBACK_NODE, init_ray, ray_on_loopback
from ._registry import BACKENDS, get_backend
from ._subprocess import SubprocessBackend

if TYPE_CHECKING:
    from ._remote import RemoteBackend

_REMOTE = ("RemoteBackend",)

__all__ = [
    "BACKENDS",
    "LOOPBACK_NODE",
    "Backend",
    "InProcessBackend",
    "PoolBackend",
    "PoolStats",
    "RayBackend",
    "RemoteBackend",
    "SubprocessBackend",
    "get_backend",
    "init_ray",
    "ray_on_loopback",
]


def __getattr__(name: str) -> Any:
    if name in _REMOTE:
        from . import _remote  # httpx and websockets only when used

        return getattr(_remote, name)
    raise AttributeError(f"module 'memex.backends' has no attribute {name!r}")
