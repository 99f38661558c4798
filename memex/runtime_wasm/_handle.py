"""The lifecycle every sandbox handle shares (in-process, worker process, Ray actor, remote
session): ``closed``, an idempotent ``close()``, the context manager and, where the handle
owns something the process would otherwise leak, closing on garbage collection. Each handle
writes only ``_shutdown``: what its own close releases."""

from __future__ import annotations

import contextlib
from typing import ClassVar, Self

__all__ = ["SandboxHandle"]


class SandboxHandle:
    """Base of the sandbox handles. A subclass implements :meth:`_shutdown`, which sets
    ``_closed_reason`` once (under whatever lock its turns check it with) and releases what
    the handle holds; it returns at once when the handle is already closed."""

    _closed_reason: str | None = None  # a class default: a half-built handle is "open"
    # Whether a handle dropped without close() is closed by the garbage collector. On where
    # the handle itself owns the guest or its worker's share; a handle whose sandbox lives on
    # a service or a cluster is closed there (idle timeouts), not from a finalizer.
    close_on_collect: ClassVar[bool] = True

    @property
    def closed(self) -> bool:
        return self._closed_reason is not None

    def close(self) -> None:
        """Release the sandbox and what this handle holds. Idempotent."""
        if self._closed_reason is None:
            self._shutdown("closed")

    def _shutdown(self, reason: str) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if self.close_on_collect and self._closed_reason is None:
            with contextlib.suppress(Exception):
                self._shutdown("garbage collected")
