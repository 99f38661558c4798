"""One ledger per server (memex.serving.Ledger): the session table, the shares and the
package gate of one server keep a principal's holdings in its one account, so what it holds
is read in one place; another principal's account is untouched."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

from memex.runtime_wasm import Limits
from memex.serving import Bounds, Ledger, PackageGate, SessionTable, Shares


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
