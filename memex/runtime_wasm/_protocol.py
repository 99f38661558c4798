"""What every backend's sandbox handle offers: :class:`SandboxAPI`.

The in-process :class:`~memex.runtime_wasm.Sandbox` satisfies the protocol as it is; the
subprocess, pool and Ray backends (``memex.backends``) return handles that satisfy it too, so
code written against ``SandboxAPI`` (``memex.host_tools.ToolHost``, the agent loop) runs on any
backend. A checkpoint is whatever the handle's ``checkpoint()`` returns and only that handle's
kind takes it back (hence the type parameter).
"""

from __future__ import annotations

from typing import Protocol, Self, TypeVar, runtime_checkable

from ._door import Door
from ._records import Limits, TurnResult

__all__ = ["SandboxAPI"]

CP = TypeVar("CP")


@runtime_checkable
class SandboxAPI(Protocol[CP]):
    """A live sandbox as every backend hands it out (``memex.Sandbox`` is one).

    Guest outcomes are data on the :class:`TurnResult`; misuse raises from the
    :class:`~memex.errors.MemexError` tree. ``checkpoint()`` returns a backend-specific
    checkpoint that ``restore`` of the same kind of handle accepts.
    """

    @property
    def limits(self) -> Limits: ...

    @property
    def door(self) -> Door: ...

    @property
    def turns(self) -> int: ...

    @property
    def closed(self) -> bool: ...

    def run(self, code: str, *, timeout: float | None = None, filename: str | None = None
            ) -> TurnResult: ...

    def checkpoint(self) -> CP: ...

    def restore(self, checkpoint: CP) -> None: ...

    def fork(self) -> SandboxAPI[CP]: ...

    def read_file(self, guest_path: str, *, max_bytes: int | None = None) -> bytes: ...

    def write_file(self, guest_path: str, data: bytes) -> None: ...

    def close(self) -> None: ...

    def __enter__(self) -> Self: ...

    def __exit__(self, *exc: object) -> None: ...
