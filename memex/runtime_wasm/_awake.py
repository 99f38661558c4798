"""How many idle sandboxes keep a live instance: the rest sleep as an image.

A live instance holds what a process has little of: five descriptors (its WASI folders and
the disk ledger's view of its /tmp), two memory mappings and an engine store. On a machine
whose descriptor limit is 20,000, that alone stops one process at about 4,000 sandboxes.
An idle sandbox's whole guest state is in its memory image (the rollback image it keeps
anyway), so the least recently used idle sandboxes past :func:`awake_limit` give their
instance up and keep only that image (one descriptor, its written pages); the next call
that needs the guest opens a new instance on it (about a millisecond) without the caller
seeing a difference. A guest that holds a file open between turns keeps its instance: a
new instance would not have that file open.

``MEMEX_AWAKE_SANDBOXES`` sets the limit (default: the descriptor limit / 16, at least 32).
"""

from __future__ import annotations

import collections
import os
import resource
import threading
import weakref
from typing import Protocol

from ..errors import ConfigError

__all__ = ["AWAKE", "Awake", "awake_limit"]


class Sleeper(Protocol):
    def _doze(self) -> None:
        """Queue, on the sandbox's own runner, giving its instance up if it is still idle."""


def awake_limit() -> int:
    """The default: ``MEMEX_AWAKE_SANDBOXES``, else a sixteenth of the descriptor limit."""
    raw = os.environ.get("MEMEX_AWAKE_SANDBOXES", "").strip()
    if raw:
        try:
            n = int(raw)
        except ValueError:
            n = -1
        if n < 1:
            raise ConfigError(f"MEMEX_AWAKE_SANDBOXES must be a whole number >= 1, got {raw!r}")
        return n
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(32, int(soft) // 16)


class Awake:
    """Sandboxes with a live instance, least recently used first."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit if limit is not None else awake_limit()
        self._lock = threading.Lock()
        self._order: collections.OrderedDict[int, weakref.ref[Sleeper]] = (
            collections.OrderedDict())

    def __len__(self) -> int:
        with self._lock:
            return len(self._order)

    def used(self, sb: Sleeper) -> None:
        """``sb`` holds a live instance and was just used: the least recently used past the
        limit are asked to sleep."""
        key = id(sb)
        with self._lock:
            self._order[key] = weakref.ref(sb)
            self._order.move_to_end(key)
            over = len(self._order) - self.limit
            victims: list[Sleeper] = []
            while over > 0:
                k, ref = self._order.popitem(last=False)
                over -= 1
                other = ref()
                if other is not None and k != key:
                    victims.append(other)
        for other in victims:
            other._doze()

    def forget(self, sb: Sleeper) -> None:
        """``sb`` no longer holds a live instance (asleep or closed)."""
        with self._lock:
            self._order.pop(id(sb), None)


AWAKE = Awake()
