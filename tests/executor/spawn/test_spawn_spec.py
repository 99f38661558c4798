"""Checking a guest's spawn request on the host (no sandbox): any request is either a checked
spec or a clear refusal, and pickled values stay opaque bytes."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lanes import examples
from pydantic import BaseModel

from memex.executor import Budget, Trajectory
from memex.executor.spawn._spec import (
    GuestObject,
    SpawnRefused,
    describe_input,
    from_guest,
    parse_spec,
)
from memex.host_tools import RecordFields, ToolSet, decode, encode, tool
from memex.host_tools._codec import EXT_RECORD  # the ABI's record code, on purpose
from memex.runtime_wasm import Limits


class Answer(BaseModel):
    total: int


@tool
def numbers(n: int) -> list[int]:
    """Squares.

    Args:
        n: how many.
    """
    return [i * i for i in range(n)]


TOOLS = ToolSet([numbers])
RECORDS: dict[str, type] = {"Answer": Answer}


def parse(spec: Any, **kw: Any) -> Any:
    return parse_spec(spec, tools=TOOLS, records=RECORDS, budget=kw.get("budget", Budget()),
                      limits=kw.get("limits", Limits(timeout=30)),
                      allowed_models=kw.get("models"))


def record(name: str, fields: dict[str, Any]) -> msgpack.ExtType:
    return msgpack.ExtType(EXT_RECORD, msgpack.packb([name, fields], use_bin_type=True))


def refused(spec: Any, kind: str, **kw: Any) -> str:
    with pytest.raises(SpawnRefused) as info:
        parse(spec, **kw)
    assert info.value.kind == kind, info.value.message
    return info.value.message


leaves = st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1) | st.floats() | \
    st.text(max_size=20) | st.binary(max_size=20)
values = st.recursive(leaves, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=20)
keys = st.sampled_from(["task", "inputs", "submit", "tools", "model", "limits", "fork",
                        "instructions", "other"])


@pytest.mark.slow
@settings(max_examples=examples(300), deadline=None)
@given(st.dictionaries(keys, values, max_size=6) | values)
def test_any_request_is_a_spec_or_a_clear_refusal(spec: Any) -> None:
    try:
        parse(spec)
    except SpawnRefused as exc:
        assert exc.kind and exc.message


def test_a_good_request() -> None:
    spec = parse({"task": "t", "inputs": {"xs": [1, 2], "a": record("Answer", {"total": 3})},
                  "submit": {"record": "Answer"}, "tools": ["numbers"], "model": "m",
                  "limits": {"max_turns": 3, "timeout": 5.0}, "fork": True,
                  "instructions": "be brief"})
    assert spec.task == "t" and spec.fork and spec.model == "m"
    assert spec.inputs["xs"] == [1, 2] and spec.pickled == ()
    assert isinstance(spec.inputs["a"], RecordFields) and spec.inputs["a"].type_name == "Answer"
    assert spec.submit is Answer and spec.tools.names == ("numbers",)
    assert spec.budget.max_turns == 3 and spec.limits.timeout == 5.0
    assert describe_input(spec.inputs["a"]) == "Answer record with fields: total"


def test_refusals_say_what_is_wrong() -> None:
    assert "non-empty" in refused({"task": " "}, "task")
    assert "at most" in refused({"task": "x" * 100_001}, "task")
    assert "unknown spawn fields ['extra']" in refused({"task": "t", "extra": 1}, "protocol")
    assert "no tool named 'nope'" in refused({"task": "t", "tools": ["nope"]}, "tools")
    assert "public identifiers" in refused({"task": "t", "inputs": {"_x": 1}}, "inputs")
    assert "would hide" in refused({"task": "t", "inputs": {"submit": 1}}, "inputs")
    assert "knows no record class" in refused({"task": "t", "submit": {"record": "X"}},
                                              "submit")
    assert "cannot be used" in refused({"task": "t", "submit": {"schema": {"type": "nope"}}},
                                       "submit")
    assert "only be tighter" in refused({"task": "t", "limits": {"max_turns": 13}}, "limits")
    assert "only be tighter" in refused({"task": "t", "limits": {"timeout": 31}}, "limits")
    assert "positive int" in refused({"task": "t", "limits": {"max_turns": 1.5}}, "limits")
    assert "positive number" in refused({"task": "t", "limits": {"max_cost": float("nan")}},
                                        "limits")
    assert "not allowed here; allowed: a, b" in refused({"task": "t", "model": "c"}, "model",
                                                        models=("a", "b"))
    bad_record = record("GuestObject", {"what": "f", "data": "not bytes"})
    assert "inputs['f'] is malformed" in refused({"task": "t", "inputs": {"f": bad_record}},
                                                 "input")
    assert "malformed" in refused({"task": "t", "inputs": {"x": msgpack.ExtType(1, b"\x00")}},
                                  "input")


class _Touch:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        return Path.touch, (self.path,)


def test_pickled_values_stay_opaque_on_the_host(tmp_path: Path) -> None:
    target = tmp_path / "would-be-created-by-unpickling"
    data = pickle.dumps(_Touch(target))
    enc = {"f": record("GuestObject", {"what": "function f(x)", "data": data}),
           "nested": [1, {"g": record("GuestObject", {"what": "class G", "data": data})}]}
    spec = parse({"task": "t", "inputs": enc})
    f = spec.inputs["f"]
    assert isinstance(f, GuestObject) and f.data == data and f.what == "function f(x)"
    assert isinstance(spec.inputs["nested"][1]["g"], GuestObject)
    assert spec.pickled == ("f", "nested")
    assert describe_input(f) == "function f(x)"
    assert not target.exists()  # nothing was unpickled
    # and a GuestObject goes on to the child as the same record
    assert encode(f).code == EXT_RECORD


def test_trajectory_records_become_trajectories() -> None:
    t = Trajectory(id="x", task="t", model="m", action_space="code", started=1.0)
    rec = encode(t)
    back = from_guest(decode(rec), [])
    assert back == t


def test_tree_close_is_idempotent_and_stops_its_timer() -> None:
    import threading

    from memex.executor import TreeBudget
    from memex.executor.spawn._tree import SpawnTree

    def timers() -> int:
        return sum(t.name == "memex-agent-tree-timer" for t in threading.enumerate())

    before = timers()
    def never(*_a: Any) -> Any:
        raise AssertionError("no child is started here")

    tree = SpawnTree(TreeBudget(max_seconds=30), start=never)
    assert timers() == before + 1
    tree.close()
    tree.close()
    assert timers() == before


def test_fork_in_turn_runs_only_inside_the_turn_and_has_its_own_door() -> None:
    from memex.errors import SandboxError
    from memex.runtime_wasm import Door, Sandbox

    door = Door()
    forks: list[Any] = []
    with Sandbox(door=door) as sb:
        door.register("fork", lambda: forks.append(sb.fork_in_turn(door=Door())) or 1,
                      inline=True)
        sb.run("x = 1")
        assert sb.run("y = 2\nimport memex_guest\nmemex_guest.call('fork')").ok
        with pytest.raises(SandboxError, match="inside this sandbox's turn"):
            sb.fork_in_turn()
        [child] = forks
        with child:
            assert child.door is not door
            assert child.run("print(x, 'y' in dir())").stdout == "1 False\n"  # last good turn
        child.close()  # closing twice is harmless
    with Sandbox(door=Door(), rollback=False) as sb2:
        errors: list[str] = []

        def try_fork() -> int:
            try:
                sb2.fork_in_turn()
            except SandboxError as exc:
                errors.append(str(exc))
            return 1

        sb2.door.register("fork", try_fork, inline=True)
        assert sb2.run("import memex_guest\nmemex_guest.call('fork')").ok
        assert errors and "rollback=True" in errors[0]
