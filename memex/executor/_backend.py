"""One contract for every backend: ``open`` a sandbox handle (a :class:`SandboxAPI`), close
the backend. Choosing a backend is one argument (``get_backend("pool", workers=4)``) and a
ready instance is accepted wherever a name is.

Backends: ``inprocess`` (``memex.Sandbox`` itself: fastest, no isolation from the caller's
process), ``subprocess`` (sandboxes in worker processes; host tools stay in the caller),
``pool`` (pre-warmed sandboxes in N workers with admission control and tenant quotas) and
``ray`` (sandboxes in Ray actors, for more than one machine; optional extra). Turn results,
errors and limits are the same on all of them.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

from ..errors import ConfigError
from ..runtime_wasm import Door, Limits, Mount, SandboxAPI

__all__ = ["BACKENDS", "Backend", "get_backend"]

BACKENDS = ("inprocess", "subprocess", "pool", "ray")


class Backend(abc.ABC):
    """Where sandboxes live. ``open`` hands out a live sandbox; ``close`` closes every sandbox
    the backend still holds and releases its processes (idempotent). A context manager."""

    name: ClassVar[str]

    @abc.abstractmethod
    def open(self, *, limits: Limits | None = None, mounts: Sequence[Mount] = (),
             preload: Iterable[str] = (), door: Door | None = None,
             env: dict[str, str] | None = None, tenant: str | None = None
             ) -> SandboxAPI[Any]:
        """A new sandbox (arguments as for ``memex.Sandbox``). ``tenant`` names who it is
        for, for backends that share capacity between tenants (the pool's quotas)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close every sandbox still open and stop the backend's processes."""

    @property
    @abc.abstractmethod
    def closed(self) -> bool: ...

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def get_backend(backend: str | Backend = "inprocess", **options: Any) -> Backend:
    """The backend called ``backend`` built with ``options``, or ``backend`` itself when it is
    already a :class:`Backend` (then no options may be given)."""
    if isinstance(backend, Backend):
        if options:
            raise ConfigError(f"options {sorted(options)} given with a ready backend instance")
        return backend
    if backend == "inprocess":
        from ._backend_inprocess import InProcessBackend

        return InProcessBackend(**options)
    if backend == "subprocess":
        from ._backend_subprocess import SubprocessBackend

        return SubprocessBackend(**options)
    if backend == "pool":
        from ._backend_pool import PoolBackend

        return PoolBackend(**options)
    if backend == "ray":
        from ._backend_ray import RayBackend

        return RayBackend(**options)
    raise ConfigError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)} "
                      "or pass a Backend instance")
