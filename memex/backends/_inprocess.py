"""The in-process backend: ``memex.Sandbox`` itself, in the caller's process (the fastest;
a crash of the engine takes the caller with it)."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Sequence

from ..errors import SandboxClosed
from ..runtime_wasm import Door, Limits, Mount, Sandbox
from ._contract import Backend

__all__ = ["InProcessBackend"]


class InProcessBackend(Backend):
    """Sandboxes in this process. ``tenant`` is accepted and ignored (no shared capacity)."""

    name = "inprocess"

    def __init__(self) -> None:
        self._live: weakref.WeakSet[Sandbox] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._closed = False

    def open(self, *, limits: Limits | None = None, mounts: Sequence[Mount] = (),
             preload: Iterable[str] = (), door: Door | None = None,
             env: dict[str, str] | None = None, tenant: str | None = None,
             packages: Sequence[str] = ()) -> Sandbox:
        if self._closed:
            raise SandboxClosed("the backend was closed")
        sb = Sandbox(limits=limits, mounts=mounts, preload=preload, door=door, env=env,
                     packages=list(packages) or None)
        with self._lock:
            self._live.add(sb)
        return sb

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        self._closed = True
        with self._lock:
            live = list(self._live)
            self._live.clear()
        for sb in live:
            sb.close()

    def __repr__(self) -> str:
        return f"<InProcessBackend live={len(self._live)}{' closed' if self._closed else ''}>"
