"""Governance of tool calls: budgets, the gate, time bounds and the call record of every call,
through a real sandbox (frames built with plain msgpack in the guest)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from memex import ConfigError, Limits, Sandbox, TurnStatus
from memex.host_tools import (
    GateDecision,
    ToolBudget,
    ToolCallRecord,
    ToolHost,
    ToolRequest,
    tool,
)

Serve = Callable[..., ToolHost]
Eval = Callable[[Sandbox, str], Any]


@tool
def echo(value: Any = None, n: int = 0) -> Any:
    """Returns its value."""
    return value


@tool(timeout=0.3)
def sleepy(secs: float) -> str:
    """Sleeps for ``secs`` seconds."""
    time.sleep(secs)
    return "awake"


NEST = "def nest(k):\n    v = 1\n    for _ in range(k):\n        v = [v]\n    return v\n"
"""A list nested ``k`` deep, defined by each test that uses it: a test may run on another
worker than the one before it, each with its own module sandbox."""


def kinds(sb: Sandbox, guest_eval: Eval, code: str) -> list[str]:
    """Outcome kinds ('ok' or the error kind) of the tcall expressions in ``code`` (a list)."""
    return [r[0] if r[0] == "ok" else r[1]["kind"] for r in guest_eval(sb, code)]


def test_budget_per_turn_resets_each_turn(tool_sandbox: Sandbox, serve: Serve,
                                          guest_eval: Eval) -> None:
    host = serve([echo], budget=ToolBudget(calls_per_turn=3))
    code = "[tcall('echo', {'value': i}) for i in range(5)]"
    assert kinds(tool_sandbox, guest_eval, code) == ["ok"] * 3 + ["budget_exceeded"] * 2
    assert kinds(tool_sandbox, guest_eval, code) == ["ok"] * 3 + ["budget_exceeded"] * 2
    last = host.calls[-1]
    assert last.outcome == "budget_exceeded" and not last.ran
    assert "3 tool calls per turn" in (last.message or "")
    got = guest_eval(tool_sandbox, "tbatch([[i, 'echo', {'value': i}] for i in range(4)])")
    assert [ok for _, ok, _ in got] == [True, True, True, False]


def test_budget_per_sandbox(tool_sandbox: Sandbox, serve: Serve, guest_eval: Eval) -> None:
    serve([echo], budget=ToolBudget(calls_per_sandbox=4))
    assert kinds(tool_sandbox, guest_eval, "[tcall('echo', {}) for i in range(3)]") == ["ok"] * 3
    assert kinds(tool_sandbox, guest_eval, "[tcall('echo', {}) for i in range(3)]") == [
        "ok", "budget_exceeded", "budget_exceeded"]


def test_depth_and_bytes_bounds(tool_sandbox: Sandbox, serve: Serve, guest_eval: Eval) -> None:
    host = serve([echo], budget=ToolBudget(max_depth=8, max_argument_bytes=1000))
    assert kinds(tool_sandbox, guest_eval, (
        NEST + "[tcall('echo', {'value': nest(7)}), tcall('echo', {'value': nest(8)}),"
        " tcall('echo', {'value': ext(7, [nest(7)])}), tcall('echo', {'value': 'x' * 2000})]"
    )) == ["ok", "too_deep", "too_deep", "too_large"]
    assert host.calls[-1].request_bytes > 2000


def test_default_depth_bound_is_64(tool_sandbox: Sandbox, serve: Serve,
                                   guest_eval: Eval) -> None:
    serve([echo])
    assert kinds(tool_sandbox, guest_eval,
                 NEST + "[tcall('echo', {'value': nest(63)}), "
                 "tcall('echo', {'value': nest(64)})]") == ["ok", "too_deep"]


def test_gate_approves_denies_and_rewrites(tool_sandbox: Sandbox, serve: Serve,
                                           guest_eval: Eval) -> None:
    seen: list[ToolRequest] = []

    def gate(req: ToolRequest) -> GateDecision | bool | None:
        seen.append(req)
        v = req.arguments.get("value")
        if v == "secret":
            return GateDecision.deny("secrets stay home")
        if v == "loud":
            return GateDecision.rewrite({**req.arguments, "value": "quiet"})
        if v == "bad-rewrite":
            return GateDecision.rewrite({"value": 1, "n": "many"})
        if v == "no":
            return False
        if v == "crash":
            raise RuntimeError("gate bug")
        return None

    host = serve([echo], gate=gate)
    got = guest_eval(tool_sandbox, "[tcall('echo', {'value': v}) for v in "
                                   "['hi', 'secret', 'loud', 'bad-rewrite', 'no', 'crash']]")
    assert got[0] == ("ok", "hi") and got[2] == ("ok", "quiet")
    assert got[1][1] == {"kind": "denied", "message": "secrets stay home"}
    assert got[3][1]["kind"] == "invalid_arguments" and "rewrite" in got[3][1]["message"]
    assert got[4][1]["kind"] == "denied" and got[5][1]["kind"] == "denied"
    assert "gate failed" in got[5][1]["message"]
    recs = host.calls[-6:]
    assert [r.gate for r in recs] == ["approve", "deny", "rewrite", "rewrite", "deny", "deny"]
    assert [r.ran for r in recs] == [True, False, True, False, False, False]
    assert recs[2].arguments == "value='quiet'"  # the record shows what actually ran
    assert recs[5].traceback is not None and "gate bug" in recs[5].traceback
    assert seen[0].tool.name == "echo" and seen[0].turn == tool_sandbox.turns
    assert seen[0].call_id is None


def test_call_records(tool_sandbox: Sandbox, serve: Serve, guest_eval: Eval) -> None:
    seen: list[ToolCallRecord] = []
    host = serve([echo], on_call=seen.append, keep_calls=3)
    guest_eval(tool_sandbox, "[tcall('echo', {'value': list(range(1000)), 'n': i}) "
                             "for i in range(4)]")
    assert len(seen) == 4 and host.calls == seen[1:]
    rec = seen[0]
    assert rec.tool == "echo" and rec.outcome == "ok" and rec.message is None
    assert rec.ran and not rec.may_still_run and rec.duration > 0
    assert rec.request_bytes > 2000 and rec.reply_bytes > 2000
    assert rec.arguments.startswith("value=[0, 1, 2, 3, 4, 5, ...]") and len(rec.arguments) < 300


def test_records_are_complete_frozen_dataclasses(tool_sandbox: Sandbox, serve: Serve,
                                                 guest_eval: Eval) -> None:
    import dataclasses

    host = serve([echo])
    guest_eval(tool_sandbox, "[tcall('echo', {'value': 1}), tcall('nope', {})]")
    for rec in host.calls[-2:]:
        assert set(vars(rec)) == {f.name for f in dataclasses.fields(ToolCallRecord)}
        assert dataclasses.replace(rec) == rec  # every field set, equal to a rebuilt copy
        with pytest.raises(dataclasses.FrozenInstanceError):
            rec.outcome = "x"  # type: ignore[misc]


def test_tool_timeout_leaves_a_record_that_it_may_still_run(tool_sandbox: Sandbox,
                                                            serve: Serve,
                                                            guest_eval: Eval) -> None:
    release = threading.Event()
    finished: list[bool] = []

    @tool(timeout=0.3)
    def stuck() -> str:
        """Waits until released."""
        release.wait(30)
        finished.append(True)
        return "late"

    host = serve([stuck, sleepy])
    try:
        _, err = guest_eval(tool_sandbox, "tcall('stuck', {})")
        still_running = not finished  # the guest got its answer while the tool ran on
    finally:
        release.set()
    assert still_running
    assert err["kind"] == "timeout" and "0.3" in err["message"] and err["ran"] is True
    rec = host.calls[-1]
    assert rec.outcome == "timeout" and rec.ran and rec.may_still_run
    assert guest_eval(tool_sandbox, "tcall('sleepy', {'secs': 0.01})") == ("ok", "awake")


def test_async_timeout_cancels(tool_sandbox: Sandbox, serve: Serve, guest_eval: Eval) -> None:
    import asyncio

    cancelled: list[bool] = []

    @tool(timeout=0.2)
    async def stuck() -> None:
        """Never finishes."""
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    serve([stuck])
    _, err = guest_eval(tool_sandbox, "tcall('stuck', {})")
    assert err["kind"] == "timeout"
    deadline = time.monotonic() + 2
    while not cancelled and time.monotonic() < deadline:
        time.sleep(0.01)
    assert cancelled == [True]


@pytest.mark.slow
def test_a_tool_hanging_past_the_turn_deadline(make_sandbox: Callable[..., Sandbox]) -> None:
    release = threading.Event()
    finished: list[bool] = []

    @tool
    def hang() -> None:
        """Waits far past the turn."""
        release.wait(30)
        finished.append(True)

    sb = make_sandbox(limits=Limits(timeout=1.0))
    host = ToolHost([hang]).attach(sb, install=False)
    try:
        r = sb.run("import _host, msgpack\n_host.call(msgpack.packb({'v': 1, 'id': 1, "
                   "'op': 'tools.call', 'args': ['hang', {}], 'kwargs': {}}))\nx = 1")
        still_running = not finished  # the turn ended at its deadline, not the tool's end
    finally:
        release.set()
    assert still_running
    assert r.status is TurnStatus.KILLED and r.limit == "deadline" and r.rolled_back
    rec = host.calls[-1]
    assert rec.outcome == "timeout" and rec.ran and rec.may_still_run
    assert sb.run("'x' in dir()").value == "False"  # the turn was rolled back
    host.close()


def test_budget_and_host_arguments_are_checked() -> None:
    with pytest.raises(ConfigError):
        ToolBudget(calls_per_turn=-1)
    with pytest.raises(ConfigError):
        ToolBudget(max_depth=0)
    with pytest.raises(ConfigError):
        ToolHost([echo], call_timeout=0)
