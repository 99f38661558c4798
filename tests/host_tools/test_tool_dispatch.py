"""Host dispatch through a real sandbox's door: ``tools.call``, ``tools.batch`` and
``tools.list`` driven by frames the guest builds with plain msgpack over ``_host.call`` (the
ABI's bytes; no guest tool client involved)."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import pandas as pd
from pydantic import BaseModel

from memex import Sandbox
from memex.host_tools import Tool, ToolHost, ToolSet, tool

Serve = Callable[..., ToolHost]
Eval = Callable[[Sandbox, str], Any]


class Forecast(BaseModel):
    """One day of weather."""

    day: str
    high: float


@dataclasses.dataclass
class Box:
    label: str
    grid: np.ndarray


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def forecast(city: str, days: int = 2) -> list[Forecast]:
    """The forecast."""
    return [Forecast(day=f"d{i}", high=20.5 + i) for i in range(days)]


@tool
def boom(message: str) -> None:
    """Always fails."""
    raise KeyError(message)


@tool
def liar() -> int:
    """Claims an int, returns a string."""
    return "not an int"  # type: ignore[return-value]


def test_small_call_round_trip(tool_sandbox: Sandbox, serve: Serve, guest_eval: Eval) -> None:
    host = serve([add])
    assert guest_eval(tool_sandbox, "tcall('add', {'a': 2, 'b': 40})") == ("ok", 42)
    rec = host.calls[-1]
    assert (rec.tool, rec.outcome, rec.ran, rec.batch) == ("add", "ok", True, False)
    assert rec.arguments == "a=2, b=40" and rec.request_bytes > 0 and rec.reply_bytes == 1
    assert rec.turn == tool_sandbox.turns


def test_records_come_back_as_ext_records(
        tool_sandbox: Sandbox, serve: Serve, guest_eval: Eval) -> None:
    serve([forecast])
    got = guest_eval(tool_sandbox, "tcall('forecast', {'city': 'Oslo'})")
    assert got == ("ok", [("ext", 5, ["Forecast", {"day": "d0", "high": 20.5}]),
                          ("ext", 5, ["Forecast", {"day": "d1", "high": 21.5}])])


def test_typed_arguments_and_returns(tool_sandbox: Sandbox, serve: Serve, guest_eval: Eval) -> None:
    seen: dict[str, Any] = {}

    @tool
    def take(box: Box, when: Any, pair: tuple[int, int], tags: set[str]) -> pd.DataFrame:
        """Takes typed values."""
        seen.update(box=box, when=when, pair=pair, tags=tags)
        return pd.DataFrame({"x": box.grid.sum(axis=0)})

    serve([take])
    got = guest_eval(tool_sandbox, (
        "grid = ext(1, ['<i4', [2, 2], bytes([1,0,0,0, 2,0,0,0, 3,0,0,0, 4,0,0,0])])\n"
        "r = tcall('take', {'box': ext(5, ['Box', {'label': 'b', 'grid': grid}]),\n"
        "    'when': ext(4, ['date', '2024-05-06']), 'pair': ext(7, [1, 2]),\n"
        "    'tags': ext(8, ['set', ['a', 'b']])})\n"
        "r"))
    assert isinstance(seen["box"], Box) and seen["box"].grid.tolist() == [[1, 2], [3, 4]]
    assert str(seen["when"]) == "2024-05-06" and seen["pair"] == (1, 2)
    assert seen["tags"] == {"a", "b"}
    kind, (_, code, payload) = got
    assert (kind, code, payload["names"]) == ("ok", 2, ["x"])
    col = payload["columns"][0]
    assert col == {"kind": "numpy", "dtype": "<i8",
                   "data": np.array([4, 6], dtype="<i8").tobytes()}


def test_validation_errors_reach_the_guest_with_paths(
        tool_sandbox: Sandbox, serve: Serve, guest_eval: Eval) -> None:
    serve([add, forecast])
    kind, err = guest_eval(tool_sandbox, "tcall('add', {'a': 'x', 'c': 3})")
    assert kind == "error" and err["kind"] == "invalid_arguments"
    assert "a: Input should be a valid integer" in err["message"]
    assert "b: Field required" in err["message"]
    assert [e["path"] for e in err["errors"]] == [["a"], ["b"], ["c"]]
    _, err = guest_eval(tool_sandbox, "tcall('add', [1, 2])")
    assert err["kind"] == "invalid_arguments"


def test_unknown_tool_suggests_names(tool_sandbox: Sandbox, serve: Serve, guest_eval: Eval) -> None:
    host = serve([add, forecast])
    _, err = guest_eval(tool_sandbox, "tcall('forcast', {})")
    assert err["kind"] == "unknown_tool" and "did you mean forecast" in err["message"]
    assert host.calls[-1].outcome == "unknown_tool" and not host.calls[-1].ran


def test_tool_raising_shows_only_its_message(
        tool_sandbox: Sandbox, serve: Serve, guest_eval: Eval) -> None:
    host = serve([boom])
    _, err = guest_eval(tool_sandbox, "tcall('boom', {'message': 'secret path'})")
    assert err == {"kind": "tool_failed", "message": "'secret path'"} or (
        err["kind"] == "tool_failed" and err["message"] == "'secret path'")
    rec = host.calls[-1]
    assert rec.outcome == "tool_failed" and rec.ran
    assert rec.traceback is not None and "KeyError" in rec.traceback and "boom" in rec.traceback


def test_wrong_return_type_is_an_error(
        tool_sandbox: Sandbox, serve: Serve, guest_eval: Eval) -> None:
    host = serve([liar])
    _, err = guest_eval(tool_sandbox, "tcall('liar', {})")
    assert err["kind"] == "invalid_return" and "valid integer" in err["message"]
    assert host.calls[-1].ran

    @tool
    def unsendable() -> Any:
        """Returns a lock."""
        return threading.Lock()

    @tool
    def error_shaped() -> dict[str, Any]:
        """Returns a map that looks like an error: it is just a value (errors are door
        errors, never values)."""
        return {"__tool_error__": {"kind": "denied", "message": "forged"}}

    serve([unsendable, error_shaped])
    _, err = guest_eval(tool_sandbox, "tcall('unsendable', {})")
    assert err["kind"] == "invalid_return" and "cannot be sent" in err["message"]
    assert guest_eval(tool_sandbox, "tcall('error_shaped', {})") == (
        "ok", {"__tool_error__": {"kind": "denied", "message": "forged"}})


def test_openai_tool_through_the_door(
        tool_sandbox: Sandbox, serve: Serve, guest_eval: Eval) -> None:
    calls: list[dict[str, Any]] = []

    def handler(**kw: Any) -> dict[str, Any]:
        calls.append(kw)
        return {"ok": True, **kw}

    t = Tool.from_openai({"type": "function", "function": {
        "name": "lookup-user", "description": "Find a user.",
        "parameters": {"type": "object", "properties": {
            "id": {"type": "integer"}, "fields": {"type": "array", "items": {"type": "string"}}},
            "required": ["id"], "additionalProperties": False}}}, handler)
    serve([t])
    assert guest_eval(tool_sandbox, "tcall('lookup-user', {'id': 7})") == (
        "ok", {"ok": True, "id": 7})
    _, err = guest_eval(tool_sandbox, "tcall('lookup-user', {'id': 'x', 'fields': [1]})")
    assert err["kind"] == "invalid_arguments"
    assert "'x' is not of type 'integer'" in err["message"]
    assert "fields.0: 1 is not of type 'string'" in err["message"]
    assert calls == [{"id": 7}]


def test_async_tools_run_on_the_hosts_loop(
        tool_sandbox: Sandbox, serve: Serve, guest_eval: Eval) -> None:
    loops: list[Any] = []

    @tool
    async def slow_double(x: int) -> int:
        """Doubles after a pause."""
        loops.append(asyncio.get_running_loop())
        await asyncio.sleep(0.01)
        return 2 * x

    serve([slow_double])
    assert guest_eval(tool_sandbox, "tcall('slow_double', {'x': 21})") == ("ok", 42)
    assert guest_eval(tool_sandbox, "tcall('slow_double', {'x': 1})") == ("ok", 2)
    assert loops[0] is loops[1]


def test_batch_runs_concurrently_in_request_order(
        tool_sandbox: Sandbox, serve: Serve, guest_eval: Eval, together: Any) -> None:
    # all 8 calls must be running at once (sync ones on threads, async ones on the loop)

    @tool
    def nap(x: int) -> int:
        """Waits for the others on a worker thread, then echoes."""
        together.meet()
        return x

    @tool
    async def anap(x: int) -> int:
        """Waits for the others on the host's loop, then echoes."""
        await together.ameet()
        return x

    host = serve([nap, anap, boom])
    together.arm(8)
    got = guest_eval(tool_sandbox, (
        "tbatch([[i, 'nap' if i % 2 else 'anap', {'x': i}] for i in range(8)]"
        " + [['bad', 'boom', {'message': 'm'}], ['u', 'nope', {}]])"))
    assert [c[:2] for c in got] == [[i, True] for i in range(8)] + [["bad", False],
                                                                     ["u", False]]
    assert [c[2] for c in got[:8]] == list(range(8))
    assert got[8][2]["kind"] == "tool_failed" and got[9][2]["kind"] == "unknown_tool"
    recs = host.calls[-10:]
    assert all(r.batch for r in recs) and [r.call_id for r in recs[:3]] == [0, 1, 2]


def test_list_answers_the_catalogue(tool_sandbox: Sandbox, serve: Serve, guest_eval: Eval) -> None:
    ts = ToolSet([add, forecast], prefix="w.")
    serve(ts)
    got = guest_eval(tool_sandbox, "door('tools.list')['value']")
    assert got == ts.describe()
    assert [(e["name"], e["alias"]) for e in got] == [("w.add", "w_add"),
                                                      ("w.forecast", "w_forecast")]
    assert got[0]["signature"] == "(a: int, b: int) -> int"


def test_a_tool_cannot_run_code_in_its_own_sandbox(
        tool_sandbox: Sandbox, serve: Serve, guest_eval: Eval) -> None:
    @tool
    def reenter() -> str:
        """Tries to run code in the guest that is waiting for it."""
        return str(tool_sandbox.run("1").value)

    @tool
    async def areenter() -> str:
        """The same from the event loop."""
        return str(tool_sandbox.run("1").value)

    serve([reenter, areenter])
    for name in ("reenter", "areenter"):
        _, err = guest_eval(tool_sandbox, f"tcall({name!r}, {{}})")
        assert err["kind"] == "tool_failed"
        assert "cannot run code in the sandbox" in err["message"]
    assert tool_sandbox.run("2 + 2").value == "4"


def test_frames_from_the_guest_cannot_break_the_host(
        tool_sandbox: Sandbox, serve: Serve, guest_eval: Eval) -> None:
    serve([add])
    got = guest_eval(tool_sandbox, (
        "import _host\n"
        "out = []\n"
        "for f in [b'', b'\\xc1', msgpack.packb({'v': 1, 'id': 1, 'op': 'tools.call',"
        " 'args': [None, None], 'kwargs': {}}), msgpack.packb({'v': 1, 'id': 2,"
        " 'op': 'tools.batch', 'args': [[1, 2]], 'kwargs': {}}), msgpack.packb({'v': 1,"
        " 'id': 3, 'op': 'tools.call', 'args': ['add', {'a': msgpack.ExtType(1, b'\\xc1'),"
        " 'b': 1}], 'kwargs': {}})]:\n"
        "    r = msgpack.unpackb(_host.call(f), raw=False, strict_map_key=False)\n"
        "    out.append((r['ok'], (r.get('error') or {}).get('kind')))\n"
        "out"))
    assert got == [(False, "protocol"), (False, "protocol"), (False, "unknown_tool"),
                   (False, "protocol"), (False, "invalid_arguments")]


def test_nan_inf_and_bad_utf8(tool_sandbox: Sandbox, serve: Serve, guest_eval: Eval) -> None:
    @tool
    def half(x: float) -> float:
        """Halves."""
        return x / 2

    serve([half, add])
    got = guest_eval(tool_sandbox, (
        "r = [tcall('half', {'x': float('inf')}), tcall('half', {'x': float('nan')}),"
        " tcall('add', {'a': float('nan'), 'b': 1})]\n"
        "[repr(r[0]), repr(r[1]), r[2][1]['kind']]"))
    assert got == ["('ok', inf)", "('ok', nan)", "invalid_arguments"]
    # A str with invalid UTF-8 inside the arguments map: the frame is not msgpack text.
    frame = msgpack.packb({"v": 1, "id": 1, "op": "tools.call", "args": ["half", {"x": "AB"}],
                           "kwargs": {}}).replace(b"\xa2AB", b"\xa2\xff\xfe")
    got = guest_eval(tool_sandbox, f"door_raw = msgpack.unpackb(_host.call({frame!r}))\n"
                                   "(door_raw['ok'], door_raw['error']['kind'])")
    assert got == (False, "protocol")
