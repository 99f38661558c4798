"""The control actor's admission of turns: each tenant's running turns and turn rate across
the cluster, kept in its account of the one ``Ledger``, and what each front holds of them
under its lease (``_leases``): a turn admitted through a front counts until the front ends
it or falls silent for ``FRONT_LEASE`` seconds.

* A tenant with ``max_running`` has each turn admitted here (:meth:`Turns.begin`, answered
  :class:`Admitted`, :class:`Wait` or :class:`Refused` past its rate).
* A tenant with a rate and no ``max_running`` is admitted by the fronts themselves from
  batches of its rate tokens (:meth:`Turns.take_tokens`), every token out of the one bucket
  here, so its turns across the fronts stay within its burst plus its rate times the seconds.
* What a front says of its sessions each second (:meth:`Turns.report`) keeps their turns
  and last use, and the turns running through it (a session with one is not ended by its
  limits).

Every method takes the control actor's lock itself."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

from ._directory import Directory
from ._leases import FrontLeases
from ._replies import Admitted, ControlRefusal, Refused, Tokens, Wait

__all__ = ["MAX_TOKENS", "TOKEN_LEASE", "Turns"]

TOKEN_LEASE = 1.0
"""Seconds a front may spend a batch of rate tokens (:meth:`Turns.take_tokens`) before it
gives back what it did not spend."""
MAX_TOKENS = 10_000
"""At most this many tokens in one batch or one give-back (a front's word is bounded)."""


class Turns:
    """The running turns and rates of the cluster's tenants, and the fronts' leases on
    them. ``counts``: the control actor's counters (``turns``, ``token_batches``)."""

    def __init__(self, lock: threading.RLock, directory: Directory,
                 counts: dict[str, int]) -> None:
        self.lock, self.directory, self.counts = lock, directory, counts
        self.ledger = directory.ledger
        self.leases = FrontLeases()  # what each front holds, under its lease

    def heard(self, front: str, admitted: list[list[Any]] | None) -> None:
        """``front`` spoke (its config poll): its lease renewed. ``admitted``: the turns
        this actor admitted through it that have not ended, ``[tenant, sid, n]``, taken the
        first time this actor hears the front (after a restart of this actor, or the
        front's lease ran out), so a restart does not forget the running turns of
        ``max_running`` tenants."""
        with self.lock:
            self.leases.renew(front)
            took: Iterator[tuple[str, str, int]] = iter(()) if admitted is None else \
                self.leases.adopt(front, admitted, self.directory.owns)
            for tenant, sid, more in took:
                self.ledger.account(tenant).running += more
                e = self.directory.get(sid)
                if e is not None:
                    e.running += more

    def begin(self, tenant: str, sid: str, max_running: int | None, rate: float | None,
              burst: int, front: str | None = None) -> Admitted | Wait | Refused:
        """Admit one turn of ``sid``: :class:`Admitted` (where it is now, and what a
        recovery lost, said once), or :class:`Wait` while the tenant runs ``max_running``
        turns across the cluster, or :class:`Refused` past its rate. The turn is held under
        ``front``'s lease until :meth:`end` (or the lease runs out)."""
        with self.lock:
            e = self.directory.of(tenant, sid)
            if e is None:
                return ControlRefusal("not_found", f"no session {sid!r}").reply()
            a = self.ledger.account(tenant)
            if max_running is not None and a.running >= max_running:
                return Wait()
            if rate:
                wait = a.take(rate, 0.0, burst)  # no token now: refused, nothing reserved
                if wait < 0:
                    return past_rate(tenant, rate, a.tokens)
            a.running += 1
            e.begun = max(e.begun, e.turns) + 1
            e.running += 1
            if front is not None:
                self.leases.hold(front, tenant, sid)
            e.last_used = time.time()
            self.counts["turns"] += 1
            notice, e.notice = e.notice, None
            return Admitted(e.slab, notice)

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

    def end(self, tenant: str, sid: str, turns: int | None, admitted: bool = True,
            front: str | None = None) -> None:
        """A turn of ``sid`` ended (``admitted``: one :meth:`begin` let in; else a front's
        report of a turn no bound asked to admit): the session's turns and use. A turn
        ``front`` no longer holds (its lease ran out and gave it back) is not given back
        twice."""
        with self.lock:
            e = self.directory.get(sid)
            if admitted and front is not None:
                admitted = self.leases.release(front, tenant, sid)
            if admitted:
                a = self.ledger.account(tenant)
                a.running = max(0, a.running - 1)
                if e is not None:
                    e.running = max(0, e.running - 1)
            if e is not None:
                e.last_used = time.time()
                if turns is not None:
                    e.turns = max(e.turns, turns)
                    e.begun = max(e.begun, turns)

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
        """Take back what each front silent for FRONT_LEASE held: its open turns from its
        tenants' accounts and its sessions, and the turns it said were running. The fronts
        dropped."""
        with self.lock:
            gone = self.leases.expire()
            for front, f in gone:
                for (tenant, sid), n in f.turns.items():
                    a = self.ledger.account(tenant)
                    a.running = max(0, a.running - n)
                    e = self.directory.get(sid)
                    if e is not None:
                        e.running = max(0, e.running - n)
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
