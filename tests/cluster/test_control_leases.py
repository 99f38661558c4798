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
    Admitted,
    Control,
    RateTokens,
    Refused,
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


def test_a_silent_fronts_running_turn_is_given_back(control: Control) -> None:
    assert control.turn_begin("one", "s-1", 1, None, 1, "front-dead").__class__ is Admitted
    assert control.turn_begin("one", "s-2", 1, None, 1, "front-live") == Wait()
    control.config(0, "front-live")
    control._watch(1.0)  # the control: within its lease the turn still counts
    assert control.turn_begin("one", "s-2", 1, None, 1, "front-live") == Wait()
    _silent(control, "front-dead")
    control.config(0, "front-live")
    control._watch(1.0)
    assert "front-dead" not in control.fronts
    assert control.ledger.held("one")["running_turns"] == 0
    assert control.sessions["s-1"].running == 0
    assert control.turn_begin("one", "s-2", 1, None, 1, "front-live").__class__ is Admitted


def test_a_front_back_after_its_lease_gives_nothing_back_twice(control: Control) -> None:
    """Its late turn_end finds nothing held by it: the turn another front runs now stays
    counted (else the tenant could run two turns under max_running = 1)."""
    assert control.turn_begin("one", "s-1", 1, None, 1, "front-a").__class__ is Admitted
    _silent(control, "front-a")
    control._watch(1.0)
    assert control.turn_begin("one", "s-2", 1, None, 1, "front-b").__class__ is Admitted
    control.turn_end("one", "s-1", 3, True, "front-a")  # the cut-off front, back
    assert control.ledger.held("one")["running_turns"] == 1
    assert control.turn_begin("one", "s-1", 1, None, 1, "front-a") == Wait()
    control.turn_end("one", "s-2", 1, True, "front-b")  # the control: a held turn ends
    assert control.ledger.held("one")["running_turns"] == 0


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


def test_a_restarted_control_counts_the_turns_a_front_says_it_admitted(
        control: Control, tmp_path: Path) -> None:
    """A ``max_running = 1`` tenant's turn runs through front-a when the control actor
    restarts: the restarted actor takes the turn from front-a's next config poll, so
    another front's turn waits until front-a ends it. Said again, it is not counted twice.
    The control: a restarted actor that has not heard front-a yet admits a second turn
    (what it forgot before fronts said what they hold)."""
    assert control.turn_begin("one", "s-1", 1, None, 1, "front-a").__class__ is Admitted
    forgot = _restarted(tmp_path)
    # the control: not heard from front-a yet, it admits a second turn
    assert forgot.turn_begin("one", "s-2", 1, None, 1, "front-b").__class__ is Admitted

    c = _restarted(tmp_path)
    c.config(0, "front-a", [["one", "s-1", 1]])
    assert c.ledger.held("one")["running_turns"] == 1
    assert c.turn_begin("one", "s-2", 1, None, 1, "front-b") == Wait()
    c.config(0, "front-a", [["one", "s-1", 1]])  # every second: taken once
    assert c.ledger.held("one")["running_turns"] == 1
    c.turn_end("one", "s-1", 2, True, "front-a")
    assert c.ledger.held("one")["running_turns"] == 0
    assert c.turn_begin("one", "s-2", 1, None, 1, "front-b").__class__ is Admitted


def test_a_fronts_word_counts_only_what_the_actor_does_not_hold_already(
        tmp_path: Path) -> None:
    """Turns the restarted actor admitted itself before the front's first poll are in the
    front's word too: only the rest are taken. A word naming a session the actor does not
    have, or another tenant's session, or not of the shape, takes nothing."""
    c = _restarted(tmp_path)
    # admitted since the restart
    assert c.turn_begin("one", "s-1", 5, None, 1, "front-a").__class__ is Admitted
    c.config(0, "front-a", [["one", "s-1", 2], ["one", "s-gone", 1], ["two", "s-2", 1],
                            ["one", "s-2", "1"], "junk"])
    assert c.ledger.held("one")["running_turns"] == 2  # s-1's one from before, not three
    assert c.sessions["s-2"].running == 0


def test_the_leases_alone_on_a_clock_of_their_own() -> None:
    """The leases without a control actor: a hold is released once (a second release says
    it was not held), a front's word is adopted once, and a front is dropped with what it
    held only once it has been silent past FRONT_LEASE (the control: just within it, it
    stays)."""
    from memex.cluster._leases import FrontLeases

    now = [100.0]
    leases = FrontLeases(clock=lambda: now[0])
    leases.hold("a", "one", "s-1")
    assert leases.release("a", "one", "s-1") is True
    assert leases.release("a", "one", "s-1") is False  # not given back twice
    taken = list(leases.adopt("b", [["one", "s-1", 2], ["one", "s-x", 1]],
                              lambda _t, sid: sid == "s-1"))
    assert taken == [("one", "s-1", 2)]
    assert list(leases.adopt("b", [["one", "s-1", 2]], lambda _t, _s: True)) == []  # once
    leases.running("b", "s-1", True)
    now[0] += FRONT_LEASE  # the control: at the lease's end, still held
    assert leases.expire() == []
    now[0] += 0.01
    gone = dict(leases.expire())
    assert set(gone) == {"a", "b"} and gone["b"].turns == {("one", "s-1"): 2}
    assert gone["b"].reported == {"s-1"} and leases.fronts == {}


def test_a_restarted_control_fills_rate_buckets_from_its_start_not_full(
        tmp_path: Path) -> None:
    """A tenant of 2 turns a second (burst 2) spends its burst; the control actor restarts
    (a config was published: it had a predecessor): the tenant's next turn is refused
    (429 with Retry-After) rather than given a second burst, and the bucket fills from the
    restart at the tenant's rate. The control: a control actor with no predecessor (no
    config in its storage) admits a tenant's first turns at once."""
    c = _restarted(tmp_path)
    assert c.turn_begin("one", "s-1", None, 2.0, 2, "front-a").__class__ is Admitted
    second = c.turn_begin("one", "s-1", None, 2.0, 2, "front-a")
    assert second.__class__ is Admitted  # a full bucket of 2: the positive control
    assert c.turn_begin("one", "s-1", None, 2.0, 2, "front-a").__class__ is Refused
    c.publish(1, "[server]\n")  # what every front does as it joins

    restarted = _restarted(tmp_path)
    started = time.monotonic()
    refused = restarted.turn_begin("one", "s-2", None, 2.0, 2, "front-b")
    assert isinstance(refused, Refused) and refused.code == "quota", refused
    assert refused.retry_after >= 1
    while restarted.turn_begin("one", "s-2", None, 2.0, 2, "front-b").__class__ is Refused:
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
