"""One ledger per server (memex.serving.Ledger): the session table, the shares and the
package gate of one server keep a principal's holdings in its one account, so what it holds
is read in one place; another principal's account is untouched."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

import pytest

from memex.backends.internal import Ledger
from memex.runtime_wasm import Limits
from memex.serving import Bounds, PackageGate, QuotaExceeded, SessionTable, Shares


class _Checkpoint:
    size = 4096


def test_a_principals_holdings_are_in_its_one_account() -> None:
    ledger = Ledger(tenant_threads=4)
    table: SessionTable[Any] = SessionTable(ledger=ledger)
    shares = Shares(threads=8, tenant_threads=4, running_turns=2, ledger=ledger)
    limits = Limits(memory=64 << 20)

    async def turn_held() -> dict[str, Any]:
        async with shares.turn("a", None, queued=4):
            return ledger.held("a")

    with table.reserved("a", Bounds(), limits):
        table.hold("a", Bounds(), _Checkpoint(), "c-1")
        during = asyncio.run(turn_held())
    assert during["sessions_being_made"] == 1 and during["running_turns"] == 1
    assert during["checkpoints"] == 1 and during["checkpoint_bytes"] == 4096
    assert ledger.account("a").reserved_memory == 0  # released with the block
    assert table.memory("a") == 4096  # the table reads the same account
    assert ledger.held("a")["running_turns"] == 0  # the turn ended
    assert ledger.held("b") == {}  # positive control: another principal holds nothing
    assert table.memory("b") == 0


def test_a_package_resolution_in_flight_is_the_principals() -> None:
    ledger = Ledger()
    started, go = threading.Event(), threading.Event()

    def resolve(reqs: list[str], **kw: Any) -> Any:
        started.set()
        go.wait(10)
        raise RuntimeError("stop here")  # what it resolves does not matter to the ledger

    gate = PackageGate(resolve=resolve, ledger=ledger)
    th = threading.Thread(target=lambda: _quiet(gate.pins, "a", None, ["humanize"]))
    th.start()
    assert started.wait(10)
    assert ledger.held("a")["resolving_packages"] is True
    assert ledger.find("b") is None  # positive control
    go.set()
    th.join(10)
    assert ledger.held("a")["resolving_packages"] is False


def _quiet(fn: Any, *args: Any) -> None:
    with contextlib.suppress(RuntimeError):
        fn(*args)


def test_a_rate_bucket_refuses_past_its_burst_and_reserves_nothing_then() -> None:
    """The cluster's control actor admits a tenant's rate with its account's bucket:
    ``burst`` turns at once, then refused at once (most=0) without taking a token."""
    a = Ledger().account("a")
    assert [a.take(0.001, 0.0, burst=3) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert a.take(0.001, 0.0, burst=3) == -1.0  # past its burst: refused
    assert 0.0 <= a.tokens < 1.0  # nothing was reserved by the refusal
    b = Ledger().account("b")
    assert b.take(0.001, 0.0) == 0.0 and b.take(0.001, 0.0) == -1.0  # default burst: 1
    assert b.take(1000.0, 0.0, burst=1) == 0.0  # positive control: a new rate, a full bucket


def test_held_reads_a_clusters_checkpoint_meta_too() -> None:
    ledger = Ledger()
    ledger.account("a").checkpoints["c-1"] = {"size": 512, "session": "s"}
    ledger.account("a").checkpoints["c-2"] = _Checkpoint()
    assert ledger.held("a")["checkpoint_bytes"] == 512 + 4096


def test_live_sessions_are_counted_in_the_account_a_create_reads() -> None:
    """A create checks the owner's sessions, memory and disk from its account, which the
    table keeps as sessions come and go (added again under the same id: counted once;
    drained: none), so the check costs the same beside 10 sessions or 100,000. The control:
    another owner's account holds nothing."""
    from memex.serving._table import CoreSession

    ledger = Ledger()
    table: SessionTable[CoreSession] = SessionTable(ledger=ledger)
    lim = Limits(memory=64 << 20, disk_bytes=1 << 20)
    for i in range(3):
        table.add(CoreSession(id=f"s-{i}", owner="a", limits=lim))
    table.add(CoreSession(id="s-0", owner="a", limits=lim))  # the same session again
    held = ledger.held("a")
    assert (held["sessions"], held["session_memory"], held["session_disk"]) == (
        3, 3 * (64 << 20), 3 << 20)
    assert table.memory("a") == 3 * (64 << 20)
    with pytest.raises(QuotaExceeded, match="holds 3 sessions"):
        table.reserve("a", Bounds(max_sessions=3), lim)
    assert table.pop("a", "s-1") is not None
    table.reserve("a", Bounds(max_sessions=3), lim)  # its place came back
    table.release("a", lim)
    table.drain()
    assert ledger.held("a")["sessions"] == 0 and ledger.held("a")["session_memory"] == 0
    assert ledger.held("b") == {}
