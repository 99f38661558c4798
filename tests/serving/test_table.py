"""The session core's table (memex.serving): each bound both front ends rely on, built and
checked here once: capacity, sessions and memory per owner, checkpoints counted, released
and expired, owners kept apart, idle sessions, and one use of a sandbox at a time."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import pytest

from memex import Limits, Sandbox
from memex.serving import Bounds, QuotaExceeded, SessionTable
from memex.serving._table import CoreSession

GIB = 1 << 30


@dataclass
class Held:
    """A checkpoint as the table sees one: a size, and descriptors to close."""

    size: int
    closed: int = 0

    def close(self) -> None:
        self.closed += 1


def _session(table: SessionTable[CoreSession], owner: str, bounds: Bounds, sid: str,
             memory: int = GIB) -> CoreSession:
    limits = Limits(memory=memory)
    with table.reserved(owner, bounds, limits):
        s = CoreSession(id=sid, owner=owner, limits=limits)
        table.add(s)
    return s


def test_capacity_is_the_servers_and_a_reservation_holds_a_place() -> None:
    table: SessionTable[CoreSession] = SessionTable(capacity=2)
    free = Bounds()
    _session(table, "a", free, "s1")
    table.reserve("b", free, Limits())  # a create in flight holds the last place
    with pytest.raises(QuotaExceeded, match="maximum of 2 sessions"):
        table.reserve("c", free, Limits())
    table.release("b", Limits())
    _session(table, "c", free, "s2")  # the place is free again
    assert table.counts() == {"a": 1, "c": 1}
    table.pop("a", "s1")
    _session(table, "b", free, "s3")


def test_one_owner_at_its_bound_leaves_the_others_admitted() -> None:
    table: SessionTable[CoreSession] = SessionTable(capacity=10)
    two = Bounds(max_sessions=2)
    _session(table, "a", two, "a1")
    _session(table, "a", two, "a2")
    with pytest.raises(QuotaExceeded, match="holds 2 sessions, its bound is 2"):
        _session(table, "a", two, "a3")
    assert table.get("a", "a3") is None  # nothing was added
    _session(table, "b", two, "b1")  # positive control: another owner is admitted
    assert len(table) == 3


def test_memory_counts_sessions_and_checkpoints_and_a_refusal_keeps_nothing() -> None:
    table: SessionTable[CoreSession] = SessionTable()
    bounds = Bounds(max_memory=3 * GIB)
    _session(table, "a", bounds, "a1")
    _session(table, "a", bounds, "a2")
    small, big = Held(GIB // 2), Held(GIB + 1)
    table.hold("a", bounds, small, "c1", session="a1")
    assert table.memory("a") == 2 * GIB + GIB // 2
    with pytest.raises(QuotaExceeded, match="its bound is 3221225472"):
        table.hold("a", bounds, big, "c2", session="a1")
    assert table.checkpoint("a", "c2") is None and big.closed == 0  # the caller's to close
    # replacing a checkpoint counts the difference, not both
    table.hold("a", bounds, Held(GIB), "c1", session="a1")
    assert small.closed == 1 and table.memory("a") == 3 * GIB
    with pytest.raises(QuotaExceeded, match="session memory and checkpoints"):
        _session(table, "a", bounds, "a3", memory=64 << 20)  # a session counts against it too
    table.drop_checkpoint("a", "c1")
    _session(table, "a", bounds, "a3")  # positive control: room again


def test_a_real_checkpoint_counts_its_guest_memory() -> None:
    table: SessionTable[CoreSession] = SessionTable()
    with Sandbox(limits=Limits(memory=256 << 20)) as sb:
        sb.run("x = bytearray(32 << 20)")
        cp = sb.checkpoint()
        assert cp.size >= 32 << 20
        with pytest.raises(QuotaExceeded):
            table.hold("a", Bounds(max_memory=cp.size - 1), cp, "c")
        table.hold("a", Bounds(max_memory=cp.size), cp, "c")
        assert table.held_bytes() == {"a": cp.size}


def test_past_max_checkpoints_the_oldest_is_released() -> None:
    table: SessionTable[CoreSession] = SessionTable()
    bounds = Bounds(max_checkpoints=2)
    held = [Held(1) for _ in range(3)]
    for i, h in enumerate(held):
        table.hold("a", bounds, h, f"c{i}")
    assert [h.closed for h in held] == [1, 0, 0]
    assert table.checkpoint("a", "c0") is None and table.checkpoint("a", "c2") is held[2]
    assert table.checkpoints_of("a", "nobody") == []


def test_a_closed_sessions_checkpoints_expire() -> None:
    table: SessionTable[CoreSession] = SessionTable()
    bounds = Bounds()
    kept, soon, now = Held(1), Held(1), Held(1)
    table.hold("a", bounds, kept, "k", session="other")
    table.hold("a", bounds, soon, "s", session="s1")
    table.hold("a", bounds, now, "n", session="s2")
    table.orphan_checkpoints("s2", 0)  # at once (mcp: names no one else can use)
    assert now.closed == 1 and table.checkpoint("a", "n") is None
    table.orphan_checkpoints("s1", 0.2)
    assert table.checkpoint("a", "s") is soon  # restorable until its time is out
    time.sleep(0.3)
    assert table.checkpoint("a", "s") is None
    assert table.expire() == 1 and soon.closed == 1
    assert kept.closed == 0 and table.checkpoint("a", "k") is kept


def test_another_owners_name_finds_nothing() -> None:
    table: SessionTable[CoreSession] = SessionTable()
    _session(table, "a", Bounds(), "s1")
    table.hold("a", Bounds(), Held(1), "c1", session="s1")
    assert table.get("b", "s1") is None and table.pop("b", "s1") is None
    assert table.checkpoint("b", "c1") is None and not table.drop_checkpoint("b", "c1")
    assert table.get("a", "s1") is not None  # positive control


def test_idle_lists_only_sessions_unused_and_not_in_use() -> None:
    table: SessionTable[CoreSession] = SessionTable()
    old = _session(table, "a", Bounds(), "old")
    busy = _session(table, "a", Bounds(), "busy")
    _session(table, "a", Bounds(), "fresh")
    old.last_used = busy.last_used = time.time() - 100
    busy.running = 1
    assert [s.id for s in table.idle(50)] == ["old"]
    busy.running = 0
    assert sorted(s.id for s in table.idle(50)) == ["busy", "old"]


def test_a_sandbox_held_alone_waits_for_its_use_and_holds_new_uses() -> None:
    s = CoreSession(id="s", owner="a", limits=Limits())
    opened: list[Sandbox] = []

    def open_() -> Sandbox:
        opened.append(Sandbox())
        return opened[-1]

    try:
        order: list[str] = []
        in_use = threading.Event()
        release = threading.Event()

        def user() -> None:
            with s.use(open_) as sb:
                in_use.set()
                release.wait(10)
                order.append("use ends")
                assert sb is opened[0]

        t = threading.Thread(target=user)
        t.start()
        assert in_use.wait(60)
        with s.alone(0.1) as alone:
            assert not alone  # a use is running: not within 0.1 s
        threading.Timer(0.2, release.set).start()
        with s.alone(10) as alone:
            assert alone
            order.append("alone")
            kept: list[Any] = []  # the later use, entered and held open

            def later_use() -> None:
                cm = s.use(open_)
                cm.__enter__()
                kept.append(cm)

            later = threading.Thread(target=later_use)
            later.start()
            later.join(0.2)
            assert later.is_alive()  # a new use waits while the sandbox is held alone
        later.join(10)
        assert not later.is_alive() and s.running == 1
        kept[0].__exit__(None, None, None)
        assert s.running == 0
        t.join(10)
        assert order == ["use ends", "alone"] and len(opened) == 1
    finally:
        for sb in opened:
            sb.close()
