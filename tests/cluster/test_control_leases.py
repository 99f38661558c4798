"""A cluster front's holds at the control actor last while the front speaks (issue 47: a
front killed mid-turn left its turn counted for good, so a ``max_running = 1`` tenant was
answered 429 forever, and its session outlived its lifetime). The control actor is made
here in this process (no Ray cluster: its directory gets one session by hand) and its
monitor round is run by the test; a front's silence is its lease set back in time.
tests/service/test_cluster.py kills a real front mid-turn on a real cluster."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray")
pytest.importorskip("fsspec")

from memex import Limits
from memex.backends.internal import limits_to_wire
from memex.cluster._directory import Entry
from memex.cluster.internal import (
    FRONT_LEASE,
    Control,
    Heard,
    RateTokens,
    Refused,
    RunningSlots,
    Slots,
    Storage,
    Tokens,
    Wait,
)


@pytest.fixture
def control(tmp_path: Path) -> Iterator[Control]:
    c = Control(Storage(str(tmp_path / "storage")), namespace="t", slab_memory=1 << 30,
                slab_cpus=1, save_interval=0, monitor=3600)  # its rounds run by the test
    for sid in ("s-1", "s-2"):  # sessions on a slab the directory names (never reached)
        c.directory.put(Entry(id=sid, tenant="one", memory=64, disk=8, slab="slab-x",
                      spec={"limits": limits_to_wire(Limits(lifetime=60))}))
    yield c


def _silent(c: Control, front: str) -> None:
    c.fronts[front].seen -= FRONT_LEASE + 1  # as if it had said nothing since


def test_a_silent_fronts_running_slot_is_given_back(control: Control) -> None:
    assert control.take_slots("one", 1, 1, "front-dead") == Slots(1)
    assert control.take_slots("one", 1, 1, "front-live") == Wait()
    control.config(0, "front-live")
    control._watch(1.0)  # the control: within its lease the slot still counts
    assert control.take_slots("one", 1, 1, "front-live") == Wait()
    _silent(control, "front-dead")
    control.config(0, "front-live")
    control._watch(1.0)
    assert "front-dead" not in control.fronts
    assert control.ledger.held("one")["running_turns"] == 0
    assert control.take_slots("one", 1, 1, "front-live") == Slots(1)


def test_a_front_back_after_its_lease_gives_nothing_back_twice(control: Control) -> None:
    """Its late give-back finds nothing held by it: the slot another front holds now stays
    counted (else the tenant could run two turns under max_running = 1)."""
    assert control.take_slots("one", 1, 1, "front-a") == Slots(1)
    _silent(control, "front-a")
    control._watch(1.0)
    assert control.take_slots("one", 1, 1, "front-b") == Slots(1)
    control.give_back_slots("one", 1, "front-a")  # the cut-off front, back
    assert control.ledger.held("one")["running_turns"] == 1
    assert control.take_slots("one", 1, 1, "front-a") == Wait()
    control.give_back_slots("one", 1, "front-b")  # the control: a held slot comes back
    assert control.ledger.held("one")["running_turns"] == 0


def test_slots_are_taken_within_the_bound_and_a_waiting_tenant_is_wanted(
        control: Control) -> None:
    """Slots come out of the tenant's max_running across the fronts (a take gets what is
    free, never more); a front answered Wait makes the tenant wanted in every front's next
    poll, for WANTED_FOR seconds; a front gives back only what it holds."""
    from memex.cluster._turns import WANTED_FOR

    assert control.take_slots("one", 3, 2, "front-a") == Slots(2)
    assert control.take_slots("one", 3, 5, "front-b") == Slots(1)  # what is left
    assert control.config(0, "front-a") == Heard(None, ())  # the control: none waits
    assert control.take_slots("one", 3, 1, "front-b") == Wait()
    assert control.config(0, "front-a").wanted == ("one",)
    control.give_back_slots("one", 5, "front-b")  # holds 1: gives back 1
    assert control.ledger.held("one")["running_turns"] == 2
    assert control.take_slots("one", 3, 1, "front-b") == Slots(1)
    control.turns._wanted["one"] -= WANTED_FOR  # as if long ago
    assert control.config(0, "front-a").wanted == ()
    assert control.stats()["counts"]["slot_batches"] == 3


def test_turns_a_silent_front_said_were_running_no_longer_hold_the_session(
        control: Control) -> None:
    """A session a front said has a turn running is not ended by its limits; once that
    front is silent for its lease, the session's limits apply again."""
    e = control.sessions["s-1"]
    e.created -= 3600  # its lifetime (from its limits) is over
    control.report([["s-1", 1, 1, 0.0]], "front-dead")
    assert e.why_ended(time.time()) is None  # a turn runs through front-dead
    _silent(control, "front-dead")
    control.turns.expire_fronts()
    assert e.running_at == {}
    assert e.why_ended(time.time()) == "its lifetime ended"


def _restarted(tmp_path: Path) -> Control:
    """A control actor made again (what Ray's restart does): the sessions are back in its
    directory (a live slab says what it holds), the turns it had admitted are not."""
    c = Control(Storage(str(tmp_path / "storage")), namespace="t", slab_memory=1 << 30,
                slab_cpus=1, save_interval=0, monitor=3600)
    for sid in ("s-1", "s-2"):
        c.directory.put(Entry(id=sid, tenant="one", memory=64, disk=8, slab="slab-x",
                      spec={"limits": limits_to_wire(Limits(lifetime=60))}))
    return c


def test_a_restarted_control_counts_the_slots_a_front_says_it_holds(
        control: Control, tmp_path: Path) -> None:
    """A ``max_running = 1`` tenant's slot is held by front-a when the control actor
    restarts: the restarted actor takes it from front-a's next config poll, so another
    front's turn waits until front-a gives it back. Said again, it is not counted twice.
    The control: a restarted actor that has not heard front-a yet grants a second slot
    (what it forgot before fronts said what they hold)."""
    assert control.take_slots("one", 1, 1, "front-a") == Slots(1)
    forgot = _restarted(tmp_path)
    # the control: not heard from front-a yet, it grants a second slot
    assert forgot.take_slots("one", 1, 1, "front-b") == Slots(1)

    c = _restarted(tmp_path)
    c.config(0, "front-a", [["one", 1]])
    assert c.ledger.held("one")["running_turns"] == 1
    assert c.take_slots("one", 1, 1, "front-b") == Wait()
    c.config(0, "front-a", [["one", 1]])  # every second: taken once
    assert c.ledger.held("one")["running_turns"] == 1
    c.give_back_slots("one", 1, "front-a")
    assert c.ledger.held("one")["running_turns"] == 0
    assert c.take_slots("one", 1, 1, "front-b") == Slots(1)


def test_a_fronts_word_counts_only_what_the_actor_does_not_hold_already(
        tmp_path: Path) -> None:
    """Slots the restarted actor granted itself before the front's first poll are in the
    front's word too: only the rest are taken. A word not of the shape takes nothing."""
    c = _restarted(tmp_path)
    assert c.take_slots("one", 5, 1, "front-a") == Slots(1)  # granted since the restart
    c.config(0, "front-a", [["one", 2], ["two", "1"], ["two", True], ["three"], "junk"])
    assert c.ledger.held("one")["running_turns"] == 2  # the one from before, not three
    assert c.ledger.held("two").get("running_turns", 0) == 0


def test_the_leases_alone_on_a_clock_of_their_own() -> None:
    """The leases without a control actor: slots are given back once (a second give-back
    finds none held), a front's word is adopted once, and a front is dropped with what it
    held only once it has been silent past FRONT_LEASE (the control: just within it, it
    stays)."""
    from memex.cluster._leases import FrontLeases

    now = [100.0]
    leases = FrontLeases(clock=lambda: now[0])
    leases.hold("a", "one", 2)
    assert leases.release("a", "one", 1) == 1
    assert leases.release("a", "one", 5) == 1  # what it held, not what it said
    assert leases.release("a", "one", 1) == 0  # not given back twice
    taken = list(leases.adopt("b", [["one", 2], ["x", "1"]]))
    assert taken == [("one", 2)]
    assert list(leases.adopt("b", [["one", 2]])) == []  # once
    leases.running("b", "s-1", True)
    now[0] += FRONT_LEASE  # the control: at the lease's end, still held
    assert leases.expire() == []
    now[0] += 0.01
    gone = dict(leases.expire())
    assert set(gone) == {"a", "b"} and gone["b"].slots == {"one": 2}
    assert gone["b"].reported == {"s-1"} and leases.fronts == {}


def test_a_restarted_control_fills_rate_buckets_from_its_start_not_full(
        tmp_path: Path) -> None:
    """A tenant of 2 turns a second (burst 2) spends its burst; the control actor restarts
    (a config was published: it had a predecessor): the tenant's next turn is refused
    (429 with Retry-After) rather than given a second burst, and the bucket fills from the
    restart at the tenant's rate. The control: a control actor with no predecessor (no
    config in its storage) admits a tenant's first turns at once."""
    c = _restarted(tmp_path)
    assert c.take_tokens("one", 2.0, 2, 1) == Tokens(1)
    assert c.take_tokens("one", 2.0, 2, 1) == Tokens(1)  # a full bucket of 2: the control
    assert c.take_tokens("one", 2.0, 2, 1).__class__ is Refused
    c.publish(1, "[server]\n")  # what every front does as it joins

    restarted = _restarted(tmp_path)
    started = time.monotonic()
    refused = restarted.take_tokens("one", 2.0, 2, 1)
    assert isinstance(refused, Refused) and refused.code == "quota", refused
    assert refused.retry_after >= 1
    while restarted.take_tokens("one", 2.0, 2, 1).__class__ is Refused:
        time.sleep(0.05)  # bounded by the suite's hang guard; the bucket fills at 2 a second
    assert time.monotonic() - started >= 0.5 - 0.05  # one token at 2 a second: half a second


def test_rate_tokens_are_taken_in_batches_from_the_one_bucket(tmp_path: Path) -> None:
    """A front takes a tenant's rate tokens in batches (a tenant with a rate and no
    ``max_running``): each batch comes out of the one bucket (burst 4, at a rate slow enough
    that nothing refills during the test), so two fronts' batches never add up to more; a
    batch is never more than the burst; an empty bucket is a 429 with Retry-After; tokens a
    front did not spend go back first when it asks again, and tokens taken under another
    bound (a reloaded rate) are dropped, not added."""
    c = _restarted(tmp_path)
    rate = 0.001
    assert c.take_tokens("one", rate, 4, 3) == Tokens(3)  # front-a
    assert c.take_tokens("one", rate, 4, 3) == Tokens(1)  # front-b: what is left
    refused = c.take_tokens("one", rate, 4, 1)
    assert isinstance(refused, Refused) and refused.code == "quota", refused
    assert refused.retry_after >= 1
    assert c.take_tokens("one", rate, 4, 5, returned=2) == Tokens(2)  # 2 unspent, back first
    c.give_back_tokens("one", 0.002, 4, 3)  # taken under another bound: dropped
    assert isinstance(c.take_tokens("one", rate, 4, 1), Refused)
    c.give_back_tokens("one", rate, 4, 9)  # never past the burst
    assert c.take_tokens("one", rate, 4, 100) == Tokens(4)
    assert c.stats()["counts"]["token_batches"] == 4  # the batches granted


def test_a_fronts_turns_spend_batches_of_tokens_and_ask_once_a_batch(tmp_path: Path) -> None:
    """A front's 48 turns of a tenant within its rate, four at once (RateTokens against the
    control actor made here; the Ray call replaced by a direct one): the batches double
    while each is spent (1, 2, 4, 8, 16, 32) and turns at once wait for the one ask under
    way, so the actor is asked 6 times, not 48; every token came out of its bucket (a
    burst of 1,000 at a rate too slow to refill during the test: 63 taken, 15 of them left
    unspent here). A tenant past its rate gets the actor's refusal."""
    c = _restarted(tmp_path)

    def asker(rate: float, burst: int) -> Any:
        async def ask(want: int, returned: int) -> Any:
            await asyncio.sleep(0)  # an ask takes a round trip: turns at once pile up
            return c.take_tokens("one", rate, burst, want, returned)
        return ask

    async def turns(tokens: RateTokens, n: int, rate: float, burst: int) -> list[Any]:
        ask = asker(rate, burst)

        async def worker(k: int) -> list[Any]:
            return [await tokens.take("one", rate, burst, ask) for _ in range(k)]

        done = await asyncio.gather(*(worker(n // 4) for _ in range(4)))
        return [x for d in done for x in d]

    front = RateTokens()
    assert asyncio.run(turns(front, 48, 0.001, 1000)) == [None] * 48
    assert front.asks == 6, front.asks
    assert c.stats()["counts"]["token_batches"] == 6
    assert 1000 - c.ledger.account("one").tokens == pytest.approx(63)  # 1+2+4+...+32

    slow = RateTokens()  # a burst of 2, refilling too slowly to matter: two turns, refused
    out = asyncio.run(turns(slow, 8, 0.002, 2))
    assert out.count(None) == 2 and all(isinstance(x, Refused) for x in out if x), out


def test_a_fronts_turns_keep_their_slots_and_ask_only_for_more(tmp_path: Path) -> None:
    """A front's 48 turns of a ``max_running = 4`` tenant, four at once (RunningSlots
    against the control actor made here; the Ray call replaced by a direct one): each of
    the four first turns takes a slot, and every later turn runs in one of them, so the
    actor is asked 4 times, not 96 (a begin and an end a turn, before). Then a second
    front's turn waits while every slot is held (the tenant is wanted): the first front's
    next poll gives back its idle slots, the second front's turn runs, and the first
    front's running turn gives its slot back as it ends. Slots no turn used since the last
    poll go back at the poll."""
    c = _restarted(tmp_path)

    def asker(front: str) -> Any:
        async def ask(want: int) -> Any:
            await asyncio.sleep(0)  # an ask takes a round trip
            return c.take_slots("one", 4, want, front)
        return ask

    async def turns(slots: RunningSlots, front: str, n: int) -> int:
        ask, ran = asker(front), 0

        async def worker(k: int) -> None:
            nonlocal ran
            for _ in range(k):
                assert await slots.take("one", 4, ask, 5.0)
                await asyncio.sleep(0)  # the turn
                ran += 1
                assert slots.release("one") == 0  # kept: nobody else waits
        await asyncio.gather(*(worker(n // 4) for _ in range(4)))
        return ran

    a = RunningSlots()
    assert asyncio.run(turns(a, "front-a", 48)) == 48
    assert a.asks == 4, a.asks
    assert c.stats()["counts"]["slot_batches"] == 4
    assert c.ledger.held("one")["running_turns"] == 4  # all four held by front-a, idle
    assert a.held() == [["one", 4]]

    async def handover() -> None:
        assert await a.take("one", 4, asker("front-a"), 5.0)  # front-a's turn runs...
        b = RunningSlots()
        waiting = asyncio.ensure_future(b.take("one", 4, asker("front-b"), 5.0))
        await asyncio.sleep(0.01)
        assert not waiting.done()  # every slot held by front-a
        heard = c.config(0, "front-a")  # ...through front-a's poll
        assert heard.wanted == ("one",)
        back = a.poll(heard.wanted)
        assert back == [("one", 3)], back  # its idle slots, at once
        for tenant, n in back:
            c.give_back_slots(tenant, n, "front-a")
        assert await asyncio.wait_for(waiting, 5.0)  # front-b's turn runs
        assert a.release("one") == 1  # front-a's turn ends: wanted, its slot goes too
        c.give_back_slots("one", 1, "front-a")
        assert a.held() == [] and b.held() == [["one", 1]]
        assert c.ledger.held("one")["running_turns"] == 1

    asyncio.run(handover())
    idle = RunningSlots()

    async def one_turn_then_polls() -> list[list[tuple[str, int]]]:
        assert await idle.take("one", 4, asker("front-c"), 5.0)
        idle.release("one")
        return [idle.poll(()), idle.poll(())]  # used since the first poll: kept once

    assert asyncio.run(one_turn_then_polls()) == [[], [("one", 1)]]


def test_a_slot_granted_to_a_turn_whose_caller_left_is_held_and_given_back(
        tmp_path: Path) -> None:
    """A turn waiting on its ask for a slot is cancelled (its client left) while the ask is
    under way: the slot the actor grants is held by the front (idle), and its next poll
    gives it back, so the tenant's slots at the actor come back to none. Dropped with the
    turn, the actor would count it held by the front for as long as the front lives (the
    control: the grant itself reached the actor)."""
    c = _restarted(tmp_path)
    gate: asyncio.Event | None = None

    async def ask(want: int) -> Any:
        assert gate is not None
        await gate.wait()  # the actor's answer, on its way back
        return c.take_slots("one", 1, want, "front-a")

    async def go() -> list[tuple[str, int]]:
        nonlocal gate
        gate = asyncio.Event()
        front = RunningSlots()
        turn = asyncio.ensure_future(front.take("one", 1, ask, 5.0))
        await asyncio.sleep(0.01)
        turn.cancel()
        with pytest.raises(asyncio.CancelledError):
            await turn
        gate.set()
        await asyncio.sleep(0.01)
        assert c.ledger.held("one")["running_turns"] == 1  # granted: the control
        assert front.held() == [["one", 1]]
        return front.poll(())

    assert asyncio.run(go()) == [("one", 1)]
