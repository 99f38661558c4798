"""One contract for every backend: ``open`` a sandbox handle (a :class:`SandboxAPI`), close
the backend. Turn results, errors and limits are the same on all of them (one contract suite,
tests/backends/test_contract.py, runs against each)."""

from __future__ import annotations

import abc
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

from ..runtime_wasm import Door, Limits, Mount, SandboxAPI

__all__ = ["Backend"]


class Backend(abc.ABC):
    """Where sandboxes live. ``open`` hands out a live sandbox; ``close`` closes every sandbox
    the backend still holds and releases its processes (idempotent). A context manager."""

    name: ClassVar[str]

    @abc.abstractmethod
    def open(self, *, limits: Limits | None = None, mounts: Sequence[Mount] = (),
             preload: Iterable[str] = (), door: Door | None = None,
             env: dict[str, str] | None = None, tenant: str | None = None,
             packages: Sequence[str] = ()
             ) -> SandboxAPI[Any]:
        """A new sandbox (arguments as for ``memex.Sandbox``). ``tenant`` names who it is
        for, for backends that share capacity between tenants (the pool's quotas).
        ``packages``: pure-Python requirements for the guest (``Sandbox(packages=...)``),
        resolved on the machine that runs it (a service resolves them, within what the
        tenant is allowed)."""

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
