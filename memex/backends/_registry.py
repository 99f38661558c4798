"""Choosing a backend is one argument (``get_backend("pool", workers=4)``) and a ready
instance is accepted wherever a name is.

Backends: ``inprocess`` (``memex.Sandbox`` itself: fastest, no isolation from the caller's
process), ``subprocess`` (sandboxes in worker processes; host tools stay in the caller),
``pool`` (pre-warmed sandboxes in N workers with admission control and tenant quotas) and
``ray`` (sandboxes in Ray actors, for more than one machine; optional extra, imported only
when a Ray backend is made) and ``remote`` (sandboxes on a ``memex serve`` service:
``get_backend("remote", url=..., api_key=...)``; its HTTP and WebSocket clients are imported
only when one is made).
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from ._contract import Backend
from ._inprocess import InProcessBackend
from ._pool import PoolBackend
from ._ray import RayBackend
from ._subprocess import SubprocessBackend

__all__ = ["BACKENDS", "get_backend"]

BACKENDS = ("inprocess", "subprocess", "pool", "ray", "remote")


def get_backend(backend: str | Backend = "inprocess", **options: Any) -> Backend:
    """The backend called ``backend`` built with ``options``, or ``backend`` itself when it is
    already a :class:`Backend` (then no options may be given)."""
    if isinstance(backend, Backend):
        if options:
            raise ConfigError(f"options {sorted(options)} given with a ready backend instance")
        return backend
    if backend == "inprocess":
        return InProcessBackend(**options)
    if backend == "subprocess":
        return SubprocessBackend(**options)
    if backend == "pool":
        return PoolBackend(**options)
    if backend == "ray":
        return RayBackend(**options)
    if backend == "remote":
        from ._remote import RemoteBackend  # httpx/websockets only when used

        return RemoteBackend(**options)
    raise ConfigError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)} "
                      "or pass a Backend instance")
