"""What each front of a cluster holds at its control actor, under a lease (issue 47: a front
killed mid-turn left its turn counted for good). A front renews its lease with every word
(its config poll each second); silent for ``FRONT_LEASE`` seconds, what it held is given
back. What a front holds: running slots of ``max_running`` tenants (each the room for one
turn at once, which the front spends itself: ``_slots``), and the sessions it said have a
turn running through it. This module keeps the leases and their holdings; the control
actor applies what they mean to its tenants' accounts and its sessions (``_turns``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FRONT_LEASE", "MAX_ADOPTED", "Front", "FrontLeases"]

FRONT_LEASE = 5.0
"""Seconds a front's holds last without a word from it (it speaks every second)."""
MAX_ADOPTED = 10_000
"""At most this many slots taken from one front's word (a front is the cluster's own, but
its word is bounded all the same)."""


@dataclass(eq=False)
class Front:
    """A front's lease and what it holds under it."""

    seen: float  # monotonic: its last word
    slots: dict[str, int] = field(default_factory=dict)  # tenant -> running slots held
    reported: set[str] = field(default_factory=set)  # sessions it said have turns running
    synced: bool = False  # the slots it holds were taken from its word (config)


class FrontLeases:
    """The fronts by the id each names itself with (used under the control actor's lock)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.fronts: dict[str, Front] = {}
        self._clock = clock

    def renew(self, front: str) -> Front:
        """The front's record, its lease renewed (a new one for a front not heard before:
        after this actor's restart, or its lease ran out)."""
        f = self.fronts.get(front)
        if f is None:
            f = self.fronts[front] = Front(self._clock())
        else:
            f.seen = self._clock()
        return f

    def hold(self, front: str, tenant: str, n: int) -> None:
        """``n`` running slots of ``tenant``, held under the front's lease until it gives
        them back."""
        f = self.renew(front)
        f.slots[tenant] = f.slots.get(tenant, 0) + n

    def release(self, front: str, tenant: str, n: int) -> int:
        """The front gives back ``n`` slots of ``tenant``: how many it held of them (not
        those its lease gave back already when it ran out: nothing is given back twice)."""
        f = self.renew(front)
        held = f.slots.get(tenant, 0)
        given = min(max(0, n), held)
        if held - given > 0:
            f.slots[tenant] = held - given
        else:
            f.slots.pop(tenant, None)
        return given

    def running(self, front: str, sid: str, running: bool) -> None:
        """The front said whether a turn of ``sid`` runs through it now."""
        f = self.renew(front)
        if running:
            f.reported.add(sid)
        else:
            f.reported.discard(sid)

    def adopt(self, front: str, held: list[Any]) -> Iterator[tuple[str, int]]:
        """The slots a front says it holds, ``[tenant, n]`` each, taken once (the first word
        of a front this actor has no record of: after a restart of the actor, or the
        front's lease ran out): those it does not hold here already (taken since); each
        ``(tenant, more)`` is held here and yielded for the caller to count."""
        f = self.renew(front)
        if f.synced:
            return
        f.synced = True
        left = MAX_ADOPTED
        for item in held[:MAX_ADOPTED]:
            if not (isinstance(item, list) and len(item) == 2):
                continue
            tenant, n = item
            if not (isinstance(tenant, str) and isinstance(n, int)) or isinstance(n, bool):
                continue
            more = min(max(0, n - f.slots.get(tenant, 0)), left)
            if more:
                left -= more
                f.slots[tenant] = f.slots.get(tenant, 0) + more
                yield tenant, more

    def expire(self) -> list[tuple[str, Front]]:
        """The fronts silent for ``FRONT_LEASE``, dropped, with what they held (for the
        caller to give back)."""
        now = self._clock()
        gone = [front for front, f in self.fronts.items() if now - f.seen > FRONT_LEASE]
        return [(front, self.fronts.pop(front)) for front in gone]
