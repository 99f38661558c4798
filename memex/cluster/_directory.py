"""The control actor's directory: which sessions the cluster holds, where, and whose, each
counted in its tenant's account of the one ``Ledger`` (``backends/_ledger.py``), so a
create's check against the tenant's cluster-wide bounds reads the account, in constant time
in the cluster's sessions (a scan of every session under the one lock cost 3.5 ms at
100,000 sessions: bench/control.py).

Every method is called under the control actor's lock (``Control.lock``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..backends.internal import Ledger, limits_from_wire
from ..runtime_wasm import Limits
from ._replies import ControlRefusal

__all__ = ["Directory", "Entry"]


@dataclass(eq=False)
class Entry:
    """A session of the cluster, as the control actor knows it."""

    id: str
    tenant: str
    spec: dict[str, Any]
    memory: int
    disk: int
    slab: str | None
    created: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.time)
    parent: str | None = None
    begun: int = 0  # turns begun (what a node's death loses is begun - saved)
    turns: int = 0  # turns its slab last reported
    notice: dict[str, Any] | None = None
    gone: str = "its slab was lost (its node died, or it stopped answering)"  # for the notice
    fence: float = 0.0  # not opened elsewhere before (monotonic): its old slab's lease ran out
    running_at: dict[str, int] = field(default_factory=dict)  # front -> turns it said run
    recovering: bool = False
    failed: str | None = None  # why its last recovery failed

    def __post_init__(self) -> None:
        self.limits: Limits = limits_from_wire(self.spec["limits"])  # its lifetime and idle

    def why_ended(self, now: float) -> str | None:
        """Why its own limits ended it (as ``CoreSession.why_ended``); a session with a turn
        running is left to finish."""
        if any(self.running_at.values()):
            return None
        lifetime, idle_timeout = self.limits.lifetime, self.limits.idle_timeout
        if lifetime is not None and now - self.created >= lifetime:
            return "its lifetime ended"
        if idle_timeout is not None and now - self.last_used >= idle_timeout:
            return "its idle timeout passed"
        return None

    def out(self) -> dict[str, Any]:
        return {"id": self.id, "tenant": self.tenant, "spec": self.spec, "slab": self.slab,
                "failed": self.failed, "moving": self.recovering,
                "created": self.created, "last_used": self.last_used, "parent": self.parent,
                "turns": max(self.turns, 0), "notice": self.notice}


class Directory:
    """The cluster's sessions by id, each counted in its tenant's account, and the
    reservations of the sessions being made (a create reserves its place first, so racing
    creates through different fronts cannot both take a tenant's last one)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.sessions: dict[str, Entry] = {}

    def get(self, sid: str) -> Entry | None:
        return self.sessions.get(sid)

    def of(self, tenant: str, sid: str) -> Entry | None:
        """``sid``'s entry if it is a session of ``tenant`` (another's is none of its)."""
        e = self.sessions.get(sid)
        return e if e is not None and e.tenant == tenant else None

    def owns(self, tenant: str, sid: str) -> bool:
        return self.of(tenant, sid) is not None

    def __contains__(self, sid: object) -> bool:
        return sid in self.sessions

    def __iter__(self) -> Iterator[Entry]:
        return iter(list(self.sessions.values()))

    def put(self, e: Entry) -> None:
        """A session into the directory, counted in its tenant's account."""
        old = self.sessions.get(e.id)
        if old is not None:
            self._count(old, -1)
        self.sessions[e.id] = e
        self._count(e, 1)

    def drop(self, sid: str) -> Entry:
        """A session out of the directory and its tenant's account."""
        e = self.sessions.pop(sid)
        self._count(e, -1)
        return e

    def _count(self, e: Entry, sign: int) -> None:
        a = self.ledger.account(e.tenant)
        a.sessions += sign
        a.session_memory += sign * e.memory
        a.session_disk += sign * e.disk

    def used(self, tenant: str) -> tuple[int, int, int]:
        """The tenant's sessions, memory (its held checkpoints too) and disk, from its
        account: in constant time in the cluster's sessions (its checkpoints are bounded by
        its max_checkpoints)."""
        a = self.ledger.account(tenant)
        held = sum(int(c["size"]) for c in a.checkpoints.values())
        return (a.sessions + a.reserved, a.session_memory + held + a.reserved_memory,
                a.session_disk + a.reserved_disk)

    def reserve(self, tenant: str, bounds: dict[str, Any], memory: int, disk: int) -> None:
        """A place for one more session of ``tenant`` within its cluster-wide ``bounds``;
        :class:`ControlRefusal` (quota) past one of them."""
        count, used_memory, used_disk = self.used(tenant)
        if bounds.get("max_sessions") is not None and count >= bounds["max_sessions"]:
            raise ControlRefusal("quota", f"{tenant!r} holds {count} sessions across the "
                                 f"cluster, its bound is {bounds['max_sessions']}: close one "
                                 "first")
        for what, bound, used, more in (
                ("session memory and checkpoints", bounds.get("max_memory"), used_memory,
                 memory), ("disk", bounds.get("max_disk"), used_disk, disk)):
            if bound is not None and used + more > bound:
                raise ControlRefusal("quota", f"{tenant!r} would hold {used + more} bytes of "
                                     f"{what} across the cluster, its bound is {bound}")
        a = self.ledger.account(tenant)
        a.reserved, a.reserved_memory, a.reserved_disk = \
            a.reserved + 1, a.reserved_memory + memory, a.reserved_disk + disk

    def unreserve(self, tenant: str, memory: int, disk: int) -> None:
        a = self.ledger.account(tenant)
        a.reserved, a.reserved_memory, a.reserved_disk = \
            a.reserved - 1, a.reserved_memory - memory, a.reserved_disk - disk

    def per_tenant(self) -> dict[str, int]:
        """Each tenant's sessions (those with any), from the accounts."""
        return {a.name: a.sessions for a in self.ledger.accounts() if a.sessions}
