"""A front's batches of its tenants' rate tokens (issue 47: every turn of a tenant with a
rate asked the control actor first). A tenant with a rate and no ``max_running`` takes its
tokens from the control actor's one bucket (``Control.take_tokens``: ``_turns``) in batches
that the front spends itself: a batch is twice the last one when that was all spent, else the
size spent, at most the tenant's burst, and good for :data:`TOKEN_LEASE` seconds; what it
did not spend goes back with the next ask, or with the front's config poll. One ask at a
time per tenant: turns that find the batch spent while an ask is out wait for it.

Every token comes out of the one bucket and is held at most a lease, so a tenant's turns
across the fronts in any W seconds stay within its burst plus its rate times W plus a lease.
The asks go through ``ask(want, returned)``, an awaitable call of the control actor (a Ray
call on a front; the actor itself in tests)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ._replies import Refused, Tokens
from ._turns import TOKEN_LEASE

__all__ = ["Ask", "RateTokens"]

Ask = Callable[[int, int], Awaitable[Tokens | Refused]]
"""``ask(want, returned)``: up to ``want`` tokens from the bucket, ``returned`` put back
first."""


@dataclass
class _Batch:
    left: int = 0
    expires: float = 0.0  # the event loop's clock
    size: int = 0  # of the last batch
    spent: int = 0  # of it
    rate: float = 0.0  # the bound they were taken under
    burst: int = 1
    asking: asyncio.Future[None] | None = None  # the ask for a batch under way

    def want(self, burst: int) -> int:
        if self.size and self.spent >= self.size:
            return max(1, min(burst, 2 * self.size))
        return max(1, min(burst, self.spent))


class RateTokens:
    """The batches one front holds, by tenant (used on the front's event loop)."""

    def __init__(self) -> None:
        self._batches: dict[str, _Batch] = {}
        self.asks = 0  # asks sent (what batching saves is turns minus these)

    async def take(self, tenant: str, rate: float, burst: int, ask: Ask) -> Refused | None:
        """One token of ``tenant``'s: None when taken, else the control actor's refusal
        (its bucket is empty: a 429 with its Retry-After)."""
        b = self._batches.setdefault(tenant, _Batch())
        loop = asyncio.get_running_loop()
        while True:
            if b.left > 0 and loop.time() < b.expires:
                b.left -= 1
                b.spent += 1
                return None
            if b.asking is None:
                break
            await asyncio.shield(b.asking)  # its batch, then look again
        asking = b.asking = loop.create_future()
        try:
            # what is left of a batch past its lease goes back with this ask (one call: the
            # actor puts it back before it takes), if it was taken under this same bound
            returned = b.left if (b.rate, b.burst) == (rate, burst) else 0
            b.left = 0
            self.asks += 1
            out = await ask(b.want(burst), returned)
            if isinstance(out, Refused):
                return out
            b.left, b.size, b.spent, b.rate, b.burst = out.n - 1, out.n, 1, rate, burst
            b.expires = loop.time() + TOKEN_LEASE
            return None
        finally:
            b.asking = None
            asking.set_result(None)

    def expired(self) -> list[tuple[str, float, int, int]]:
        """The tokens of batches past their lease, taken out to give back:
        ``(tenant, rate, burst, n)`` each (the front's config poll sends them)."""
        now = asyncio.get_running_loop().time()
        out = []
        for tenant, b in self._batches.items():
            if b.left > 0 and now >= b.expires and b.asking is None:
                out.append((tenant, b.rate, b.burst, b.left))
                b.left = 0
        return out
