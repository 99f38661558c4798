"""What each front of a cluster holds at its control actor, under a lease (issue 47: a front
killed mid-turn left its turn counted for good). A front renews its lease with every word
(its config poll each second); silent for ``FRONT_LEASE`` seconds, what it held is given
back. This module keeps the leases and their holdings; the control actor applies what they
mean to its tenants' accounts and its sessions (``_turns``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FRONT_LEASE", "MAX_ADOPTED", "Front", "FrontLeases"]

FRONT_LEASE = 5.0
"""Seconds a front's holds last without a word from it (it speaks every second)."""
MAX_ADOPTED = 10_000
"""At most this many running turns taken from one front's word (a front is the cluster's own,
but its word is bounded all the same)."""


@dataclass(eq=False)
class Front:
    """A front's lease and what it holds under it."""

    seen: float  # monotonic: its last word
    turns: dict[tuple[str, str], int] = field(default_factory=dict)  # (tenant, sid) -> open
    reported: set[str] = field(default_factory=set)  # sessions it said have turns running
    synced: bool = False  # the admitted turns it holds were taken from its word (config)


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

    def hold(self, front: str, tenant: str, sid: str) -> None:
        """An admitted turn, held under the front's lease until it ends."""
        f = self.renew(front)
        f.turns[(tenant, sid)] = f.turns.get((tenant, sid), 0) + 1

    def release(self, front: str, tenant: str, sid: str) -> bool:
        """An admitted turn ended: whether the front still held it (not when its lease ran
        out and gave it back already: nothing is given back twice)."""
        f = self.renew(front)
        held = f.turns.get((tenant, sid), 0)
        if held > 1:
            f.turns[(tenant, sid)] = held - 1
        else:
            f.turns.pop((tenant, sid), None)
        return held > 0

    def running(self, front: str, sid: str, running: bool) -> None:
        """The front said whether a turn of ``sid`` runs through it now."""
        f = self.renew(front)
        if running:
            f.reported.add(sid)
        else:
            f.reported.discard(sid)

    def adopt(self, front: str, admitted: list[Any],
              known: Callable[[str, str], bool]) -> Iterator[tuple[str, str, int]]:
        """The running turns a front says this actor admitted through it, taken once (the
        first word of a front this actor has no record of): those it does not hold already
        (admitted since), of sessions ``known(tenant, sid)``; each ``(tenant, sid, more)`` is
        held here and yielded for the caller to count."""
        f = self.renew(front)
        if f.synced:
            return
        f.synced = True
        for item in admitted[:MAX_ADOPTED]:
            if not (isinstance(item, list) and len(item) == 3):
                continue
            tenant, sid, n = item
            if not (isinstance(tenant, str) and isinstance(sid, str) and isinstance(n, int)):
                continue
            if not known(tenant, sid):
                continue  # ended meanwhile
            more = min(max(0, n - f.turns.get((tenant, sid), 0)), MAX_ADOPTED)
            if more:
                f.turns[(tenant, sid)] = f.turns.get((tenant, sid), 0) + more
                yield tenant, sid, more

    def expire(self) -> list[tuple[str, Front]]:
        """The fronts silent for ``FRONT_LEASE``, dropped, with what they held (for the
        caller to give back)."""
        now = self._clock()
        gone = [front for front, f in self.fronts.items() if now - f.seen > FRONT_LEASE]
        return [(front, self.fronts.pop(front)) for front in gone]
