"""A front's running slots of its ``max_running`` tenants (issue 47: each such turn asked the
control actor to begin and again to end it, 1-2 ms of Ray a call, and waited on the actor:
while it restarted, no turn of the tenant ran). A slot is the room for one turn at once of
the tenant across the cluster; the front takes slots from the control actor
(``Control.take_slots``: ``_turns``) and keeps them, one turn in each at a time, so a
tenant's turns through a front that holds enough ask the actor nothing.

A slot goes back to the control actor when no turn of the front used it since the last poll
(about a second), at once when the poll says another front waits for one of the tenant
(``wanted``: then each turn that ends gives its slot back too, so the slots move to where
turns wait), or when the front falls silent for its lease. Every slot is one of the
tenant's ``max_running``, so its turns across the fronts never run more than that at once;
what it costs is a slot kept idle on one front for up to a poll while a turn on another
waits (measured in docs/scaling.md).

The asks go through ``ask(want)``, an awaitable call of the control actor (a Ray call on a
front; the actor itself in tests)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ._replies import Slots, Wait

__all__ = ["POLL", "AskSlots", "RunningSlots"]

AskSlots = Callable[[int], Awaitable[Slots | Wait]]
"""``ask(want)``: up to ``want`` slots of the tenant, or :class:`Wait`."""
POLL = (0.002, 0.05)
"""Seconds between asks while every slot is held elsewhere: the first, then the most (each
wait twice the last)."""


@dataclass
class _Pool:
    held: int = 0  # slots this front holds
    busy: int = 0  # of them, running a turn now
    peak: int = 0  # the most busy at once since the last poll
    bound: int = 0  # the tenant's max_running, as last asked
    wanted: bool = False  # another front waits for a slot (said by the last poll)


class RunningSlots:
    """The slots one front holds, by tenant (used on the front's event loop)."""

    def __init__(self) -> None:
        self._pools: dict[str, _Pool] = {}
        self.asks = 0  # asks sent (what keeping slots saves is turns minus these)

    async def take(self, tenant: str, bound: int, ask: AskSlots, patience: float) -> bool:
        """A slot of ``tenant`` for one turn: True once it runs in one, False when none came
        within ``patience`` seconds (every one held by turns elsewhere: a 429)."""
        p = self._pools.setdefault(tenant, _Pool())
        p.bound = bound
        wait, waited = POLL[0], 0.0
        while True:
            if p.busy < min(p.held, bound):
                p.busy += 1
                p.peak = max(p.peak, p.busy)
                return True
            self.asks += 1
            asking = asyncio.ensure_future(ask(1))
            try:
                out = await asyncio.shield(asking)
            except asyncio.CancelledError:  # the turn's caller left: what the ask brings is
                asking.add_done_callback(lambda done: self._keep(p, done))  # held here, so
                raise  # it goes back at a poll (dropped, the actor would count it for good)
            if isinstance(out, Slots):
                p.held += out.n
                continue
            if waited >= patience:
                return False
            await asyncio.sleep(wait)
            waited += wait
            wait = min(wait * 2, POLL[1])

    @staticmethod
    def _keep(p: _Pool, done: asyncio.Future[Slots | Wait]) -> None:
        """The slots an abandoned ask was granted, held (idle) by the pool."""
        if not done.cancelled() and done.exception() is None:
            out = done.result()
            if isinstance(out, Slots):
                p.held += out.n

    def release(self, tenant: str) -> int:
        """A turn of ``tenant`` ended: its slot stays for the front's next turn, unless
        another front waits for one or the tenant's bound fell below what is held; the
        slots to give back now."""
        p = self._pools[tenant]
        p.busy -= 1
        keep = p.busy if p.wanted else max(p.busy, min(p.held, p.bound))
        give = p.held - keep
        p.held = keep
        return give

    def poll(self, wanted: tuple[str, ...]) -> list[tuple[str, int]]:
        """(each config poll) ``(tenant, n)`` slots to give back: those no turn used since
        the last poll, and every idle one of a tenant ``wanted`` elsewhere."""
        out = []
        wants = set(wanted)
        for tenant, p in self._pools.items():
            p.wanted = tenant in wants
            keep = p.busy if p.wanted else max(p.peak, p.busy)
            if p.held > keep:
                out.append((tenant, p.held - keep))
                p.held = keep
            p.peak = p.busy  # (a pool stays: a turn may be waiting on an ask for it)
        return out

    def held(self) -> list[list[object]]:
        """``[tenant, n]`` of every slot this front holds: said with each poll, so a
        restarted control actor counts them again."""
        return [[tenant, p.held] for tenant, p in self._pools.items() if p.held]
