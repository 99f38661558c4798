"""What every backend's sandbox handle offers: :class:`SandboxAPI`.

The in-process :class:`~memex.runtime_wasm.Sandbox` satisfies the protocol as it is; the
subprocess, pool and Ray backends (``memex.backends``) return handles that satisfy it too, so
code written against ``SandboxAPI`` (``memex.host_tools.ToolHost``, the agent loop) runs on any
backend. A checkpoint is whatever the handle's ``checkpoint()`` returns and only that handle's
kind takes it back (hence the type parameter).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, Self, TypeVar, runtime_checkable

from ..errors import ConfigError
from ._door import Door
from ._records import Limits, TurnResult

__all__ = ["SandboxAPI", "fork_count", "fork_each"]

CP = TypeVar("CP")
S = TypeVar("S")


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

    def fork_many(self, n: int) -> Sequence[SandboxAPI[CP]]: ...

    def read_file(self, guest_path: str, *, max_bytes: int | None = None) -> bytes: ...

    def write_file(self, guest_path: str, data: bytes) -> None: ...

    def close(self) -> None: ...

    def __enter__(self) -> Self: ...

    def __exit__(self, *exc: object) -> None: ...


def fork_count(n: object) -> int:
    """``n`` as a count of forks (an int >= 1), else ConfigError."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"fork_many takes a count >= 1, got {n!r}")
    return n


def fork_each(fork: Callable[[], S], n: int, close: Callable[[S], object]) -> list[S]:
    """``n`` results of ``fork()``, all or none: when one fails, those made are closed and
    its error raised. For handles whose every fork is one request to where the guest lives
    (that side keeps one image of the parent for all of them)."""
    kids: list[S] = []
    try:
        for _ in range(fork_count(n)):
            kids.append(fork())
    except BaseException:
        for kid in kids:
            close(kid)
        raise
    return kids
