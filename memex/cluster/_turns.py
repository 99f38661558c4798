"""The control actor's admission of turns: each tenant's running turns and turn rate across
the cluster, kept in its account of the one ``Ledger``, handed to the fronts in leases they
spend themselves, so a turn on a healthy slab never waits on the control actor.

* A tenant with ``max_running`` has that many running *slots* across the cluster; a front
  takes some (:meth:`Turns.take_slots`, answered :class:`Slots` or :class:`Wait` when every
  slot is held) and runs a turn in each, one at a time, for as long as it keeps them; it
  gives them back when they go unused for a poll, at once when another front waits for one
  (:meth:`Turns.wanted`, said in each poll's answer), or by falling silent for
  ``FRONT_LEASE`` seconds (the leases: ``_leases``).
* A tenant with a rate takes batches of its rate tokens (:meth:`Turns.take_tokens`), every
  token out of the one bucket here, so its turns across the fronts stay within its burst
  plus its rate times the seconds.
* What a front says of its sessions each second (:meth:`Turns.report`) keeps their turns
  and last use, and the turns running through it (a session with one is not ended by its
  limits).

Every method takes the control actor's lock itself."""

from __future__ import annotations

import threading
import time
from typing import Any

from ._directory import Directory
from ._leases import FrontLeases
from ._replies import ControlRefusal, Refused, Slots, Tokens, Wait

__all__ = ["MAX_SLOTS", "MAX_TOKENS", "TOKEN_LEASE", "WANTED_FOR", "Turns"]

TOKEN_LEASE = 1.0
"""Seconds a front may spend a batch of rate tokens (:meth:`Turns.take_tokens`) before it
gives back what it did not spend."""
MAX_TOKENS = 10_000
"""At most this many tokens in one batch or one give-back (a front's word is bounded)."""
MAX_SLOTS = 10_000
"""At most this many slots in one take or one give-back."""
WANTED_FOR = 2.0
"""Seconds a tenant counts as wanted after a front was answered :class:`Wait` for it (a
waiting front asks again within 50 ms, so a tenant still short of slots stays wanted)."""


class Turns:
    """The running turns and rates of the cluster's tenants, and the fronts' leases on
    them. ``counts``: the control actor's counters (``slot_batches``, ``token_batches``)."""

    def __init__(self, lock: threading.RLock, directory: Directory,
                 counts: dict[str, int]) -> None:
        self.lock, self.directory, self.counts = lock, directory, counts
        self.ledger = directory.ledger
        self.leases = FrontLeases()  # what each front holds, under its lease
        self._wanted: dict[str, float] = {}  # tenant -> when a front was told to Wait

    def heard(self, front: str, held: list[list[Any]] | None) -> tuple[str, ...]:
        """``front`` spoke (its config poll): its lease renewed. ``held``: the slots it
        holds, ``[tenant, n]``, taken the first time this actor hears the front (after a
        restart of this actor, or the front's lease ran out), so a restart does not forget
        the running turns of ``max_running`` tenants. The tenants wanted now
        (:meth:`wanted`)."""
        with self.lock:
            self.leases.renew(front)
            for tenant, more in self.leases.adopt(front, held) if held is not None else ():
                self.ledger.account(tenant).running += more
            return self.wanted()

    def take_slots(self, tenant: str, max_running: int, want: int, front: str
                   ) -> Slots | Wait:
        """Up to ``want`` of the tenant's ``max_running`` running slots, held under
        ``front``'s lease: :class:`Slots`, or :class:`Wait` while every slot is held (the
        tenant is then *wanted*: each front gives back its idle slots of it at once)."""
        want = max(1, min(int(want), int(max_running), MAX_SLOTS))
        with self.lock:
            a = self.ledger.account(tenant)
            free = int(max_running) - a.running
            if free <= 0:
                self._wanted[tenant] = time.monotonic()
                return Wait()
            n = min(want, free)
            a.running += n
            self.leases.hold(front, tenant, n)
            self.counts["slot_batches"] += 1
            return Slots(n)

    def give_back_slots(self, tenant: str, n: int, front: str) -> None:
        """Slots ``front`` gives back (only those it holds: one its lease gave back already
        is not given back twice)."""
        with self.lock:
            given = self.leases.release(front, tenant, min(max(0, int(n)), MAX_SLOTS))
            a = self.ledger.account(tenant)
            a.running = max(0, a.running - given)
            if given and a.running == 0:
                self._wanted.pop(tenant, None)

    def wanted(self) -> tuple[str, ...]:
        """The tenants a front was answered :class:`Wait` for within :data:`WANTED_FOR`
        seconds."""
        with self.lock:
            now = time.monotonic()
            self._wanted = {t: at for t, at in self._wanted.items() if now - at < WANTED_FOR}
            return tuple(sorted(self._wanted))

    def take_tokens(self, tenant: str, rate: float, burst: int, want: int,
                    returned: int = 0) -> Tokens | Refused:
        """Up to ``want`` of the tenant's rate tokens, taken from its bucket now, for a
        front to admit that many turns of a tenant with a rate and no ``max_running`` by
        itself (within :data:`TOKEN_LEASE` seconds, then it gives back what it did not
        spend: ``returned``, put back first, or :meth:`give_back_tokens`)."""
        want = max(1, min(int(want), int(burst), MAX_TOKENS))
        with self.lock:
            a = self.ledger.account(tenant)
            if returned:
                a.give_back(rate, burst, min(max(0, int(returned)), MAX_TOKENS))
            n = a.take_up_to(rate, burst, want)
            if n == 0:
                return past_rate(tenant, rate, a.tokens)
            self.counts["token_batches"] += 1
            return Tokens(n)

    def give_back_tokens(self, tenant: str, rate: float, burst: int, n: int) -> None:
        """Tokens a front took and did not spend within its lease, back in the bucket."""
        with self.lock:
            self.ledger.account(tenant).give_back(rate, burst, min(max(0, int(n)),
                                                                    MAX_TOKENS))

    def report(self, uses: list[list[Any]], front: str = "") -> None:
        """A front's batch of ``[sid, turns, running, last_used]``: the turns its sessions'
        slabs answered, the turns still running there, and when they were last used (sent
        about once a second, so a turn costs the control actor nothing). The running ones
        count under ``front``'s lease."""
        with self.lock:
            self.leases.renew(front)
            for sid, turns, running, last_used in uses:
                e = self.directory.get(sid)
                if e is None:
                    continue
                e.turns = max(e.turns, int(turns))
                e.begun = max(e.begun, e.turns)  # a turn running now may not have reached
                # its slab yet: one lost under it is counted by the front that lost it
                e.last_used = max(e.last_used, float(last_used))
                if int(running):
                    e.running_at[front] = int(running)
                else:
                    e.running_at.pop(front, None)
                self.leases.running(front, sid, bool(int(running)))

    def expire_fronts(self) -> list[str]:
        """Take back what each front silent for FRONT_LEASE held: its slots from its
        tenants' accounts, and the turns it said were running. The fronts dropped."""
        with self.lock:
            gone = self.leases.expire()
            for front, f in gone:
                for tenant, n in f.slots.items():
                    a = self.ledger.account(tenant)
                    a.running = max(0, a.running - n)
                for sid in f.reported:
                    e = self.directory.get(sid)
                    if e is not None:
                        e.running_at.pop(front, None)
            return [front for front, _ in gone]

    def running(self) -> dict[str, int]:
        """Every tenant with an account, at 0 too (a gauge must come back down)."""
        return {a.name: a.running for a in self.ledger.accounts()}


def past_rate(tenant: str, rate: float, tokens: float) -> Refused:
    """A tenant's turn past its rate across the cluster: 429, and the seconds until its
    bucket holds a token again."""
    return ControlRefusal("quota", f"{tenant!r} runs at most {rate:g} turns per second "
                          "across the cluster",
                          retry_after=max(1, int((1 - tokens) / rate + 1))).reply()
