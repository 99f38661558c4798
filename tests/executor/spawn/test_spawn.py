"""Sub-agents (spawn_agent): real parallel rollouts on real sandboxes, driven by a scripted
chat-completions server on 127.0.0.1 that answers each agent by its task."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from memex.executor import (
    Hooks,
    MemexAgent,
    Rollout,
    SandboxSpec,
    Trajectory,
    TreeBudget,
    load_trajectories,
)
from memex.executor.llm import LLMClient, ScriptedError, ScriptedLLM, ScriptedReply
from memex.host_tools import tool
from memex.runtime_wasm import Limits

Script = list[str] | Callable[[int, dict[str, Any]], Any]


class Answer(BaseModel):
    total: int
    label: str


@tool
def numbers(n: int) -> list[int]:
    """The first n squares.

    Args:
        n: how many.
    """
    return [i * i for i in range(n)]


@tool
def shout(text: str) -> str:
    """Upper-case text.

    Args:
        text: the text.
    """
    return text.upper()


def py(code: str) -> str:
    return f"Running.\n```python\n{code}\n```"


class Router:
    """A scripted model for a tree of agents: each agent is answered from the script of its
    task (a list of replies, one per turn, or ``fn(turn, request)``)."""

    def __init__(self, scripts: Mapping[str, Script]) -> None:
        self.scripts = dict(scripts)
        self.lock = threading.Lock()
        self.seen: list[tuple[str, int, str]] = []  # (task, turn, model)

    def __call__(self, req: dict[str, Any]) -> Any:
        msgs = req["messages"]
        task = str(msgs[1]["content"]).removeprefix("Task: ")
        turn = sum(1 for m in msgs if m["role"] == "assistant")
        with self.lock:
            self.seen.append((task, turn, str(req.get("model"))))
        script = self.scripts[task]
        if callable(script):
            return script(turn, req)
        if turn >= len(script):
            raise AssertionError(f"agent {task!r} asked for turn {turn + 1}")
        return script[turn]


def make_agent(srv: ScriptedLLM, *, tree: TreeBudget | None = None, **kw: Any) -> MemexAgent:
    llm = LLMClient("scripted", base_url=srv.base_url, max_retries=kw.pop("retries", 0),
                    backoff=0.01, timeout=30, prices=kw.pop("prices", None))
    kw.setdefault("sandbox", SandboxSpec(limits=Limits(timeout=30)))
    kw.setdefault("tools", [numbers, shout])
    return MemexAgent(model=llm, spawn=tree or TreeBudget(), **kw)


def run_tree(scripts: Mapping[str, Script], task: str = "root", *,
             inputs: Mapping[str, Any] | None = None, **kw: Any) -> tuple[Rollout, Router]:
    router = Router(scripts)
    with ScriptedLLM(router) as srv:
        r = make_agent(srv, **kw).run(task, inputs=inputs)
    return r, router


def obs(r: Rollout, i: int) -> str:
    return r.trajectory.steps[i].observation


# ---- objects in, typed answers out -------------------------------------------------------
PARENT_OBJECTS = """\
import numpy as np, pandas as pd
from dataclasses import dataclass
df = pd.DataFrame({"n": np.array([1, 2, 3], dtype="int16"), "x": [0.5, 1.5, None],
                   "when": pd.to_datetime(["2026-01-01", "2026-02-01", "2026-03-01"]),
                   "seg": pd.Categorical(["a", "b", "a"])})
arr = np.linspace(0, 1, 6, dtype="float32").reshape(2, 3)
scale = 10
def scaled(v, offset=1):
    return v * scale + offset
@dataclass
class Point:
    x: int
    y: int
    def norm1(self):
        return abs(self.x) + abs(self.y)
h = spawn_agent("check objects", submit=Answer,
                inputs={"df": df, "arr": arr, "fn": scaled, "P": Point, "p": Point(3, -4),
                        "nested": {"pair": (1, "a"), "s": {2, 3}, "fns": [len, scaled]}})
print(h)"""

CHILD_CHECKS = """\
checks = [str(df.n.dtype), str(df.when.dtype), str(df.seg.dtype), str(df.x.isna().sum()),
          str(arr.dtype), str(arr.shape), str(fn(2)), str(fn(2, offset=0)), P.__name__,
          str(p.norm1()), type(p).__name__, str(nested['pair']), str(nested['s']),
          str(nested['fns'][0]([1, 2])), str(nested['fns'][1](1))]
print(checks)
submit(total=len(checks), label="|".join(checks))"""


@pytest.mark.slow
def test_objects_arrive_intact_and_the_answer_comes_back_typed() -> None:
    r, _ = run_tree({
        "root": [py(PARENT_OBJECTS),
                 py("a = h.result()\nprint(type(a).__name__, a.total)\nprint(a.label)"),
                 py("submit(a)")],
        "check objects": [py(CHILD_CHECKS)],
    }, submit=Answer)
    assert r.submitted, r.trajectory.steps[-1].observation
    label = r.answer.label.split("|")
    assert label == ["int16", "datetime64[us]", "category", "1", "float32", "(2, 3)", "21",
                     "20", "Point", "7", "Point", "(1, 'a')", "{2, 3}", "2", "11"]
    assert "Answer 15" in obs(r, 1)  # the parent's guest got an Answer record, not a dict
    [child] = r.trajectory.steps[0].children
    assert child.submitted and child.task == "check objects"
    # the child's prompt described the inputs; functions by their signature
    assert "fn: function scaled(v, offset)" in child.messages[0]["content"]
    assert "DataFrame, 3 rows x 4 columns" in child.messages[0]["content"]


def test_functions_and_objects_come_back_as_answers() -> None:
    r, _ = run_tree({
        "root": [py("h = spawn_agent('make a function')\nf = h.result()\nprint(f(4), f.__name__)"),
                 py("submit(total=f(4), label=f.__name__)")],
        "make a function": [py("k = 3\ndef triple(x):\n    return x * k\nsubmit(triple)")],
    }, submit=Answer)
    assert "12 triple" in obs(r, 0)
    assert r.answer == Answer(total=12, label="triple")


@pytest.mark.slow
def test_parallelism_is_real_tool_calls_overlap() -> None:
    """Four children each make one tool call that takes 1 s: the four calls overlap."""
    intervals: list[tuple[float, float]] = []
    lock = threading.Lock()

    @tool
    def slow(i: int) -> int:
        """A slow lookup.

        Args:
            i: which.
        """
        start = time.monotonic()
        time.sleep(1.0)
        with lock:
            intervals.append((start, time.monotonic()))
        return i * 10

    spawn = ("hs = [spawn_agent(f'part {i}', inputs={'i': i}, submit=int, tools=['slow']) "
             "for i in range(4)]\nvals = wait_all(hs)\nprint(vals)")
    scripts: dict[str, Script] = {"root": [py(spawn), py("submit(total=sum(vals), label='x')")]}
    for i in range(4):
        scripts[f"part {i}"] = [py("submit(slow(i))")]
    r, _ = run_tree(scripts, tools=[slow], submit=Answer)
    assert r.answer == Answer(total=60, label="x")
    assert len(intervals) == 4
    # all four calls were in progress at one moment: the latest start precedes the first end
    latest_start = max(s for s, _ in intervals)
    first_end = min(e for _, e in intervals)
    assert latest_start < first_end
    assert [s.tool_calls[0].name for t in r.trajectory.steps[0].children for s in t.steps] \
        == ["slow"] * 4


@pytest.mark.slow
def test_await_gather_and_as_completed() -> None:
    fast_done = threading.Event()

    @tool
    def mark() -> None:
        """Say the fast one is done."""
        fast_done.set()

    @tool
    def after_fast() -> None:
        """Wait until the fast one is done."""
        fast_done.wait(20)
        time.sleep(0.5)

    code = ("import asyncio\nhs = [spawn_agent(f'n{i}', inputs={'i': i}, submit=int) "
            "for i in range(3)]\nvals = await asyncio.gather(*hs)\nlast = await hs[0]\n"
            "order = [h.id for h in as_completed([spawn_agent('slow'), spawn_agent('fast')])]\n"
            "print(vals, last, order)")
    scripts: dict[str, Script] = {
        "root": [py(code), py("submit(total=sum(vals), label=','.join(order))")],
        "slow": [py("after_fast()\nsubmit(1)")],
        "fast": [py("mark()\nsubmit(2)")],
    }
    for i in range(3):
        scripts[f"n{i}"] = [py("submit(i * i)")]
    r, _ = run_tree(scripts, submit=Answer, tools=[mark, after_fast])
    assert "[0, 1, 4] 0 ['5', '4']" in obs(r, 0)
    assert r.answer == Answer(total=5, label="5,4")


def test_submit_types_tools_subset_and_model() -> None:
    code = """\
h1 = spawn_agent("ints", submit=list[int], tools=["numbers"], model="small-model")
h2 = spawn_agent("schema", submit={"type": "object", "properties": {"k": {"type": "integer"}},
                                   "required": ["k"]})
h3 = spawn_agent("tuple", submit=tuple, tools=[])
print(h1.result(), h2.result(), h3.result())"""
    r, router = run_tree({
        "root": [py(code), py("submit(total=1, label='ok')")],
        "ints": [py("print('shout' in dir(), 'numbers' in dir())\nsubmit(['1', 2])"),
                 py("submit(numbers(3))")],  # the JSON Schema refuses '1'; then a list
        "schema": [py("submit({'k': 7})")],
        "tuple": [py("print('numbers' in dir())\nsubmit((1, 'x'))")],
    }, submit=Answer)
    assert "[0, 1, 4] {'k': 7} (1, 'x')" in obs(r, 0)
    kids = {t.task: t for t in r.trajectory.steps[0].children}
    assert "False True" in kids["ints"].steps[0].observation  # only the tool it was given
    assert kids["ints"].steps[0].status == "rejected" and kids["ints"].submitted
    assert "False" in kids["tuple"].steps[0].observation
    assert ("ints", 0, "small-model") in router.seen
    assert all(m == "scripted" for t, _, m in router.seen if t != "ints")


# ---- nesting, trajectories ---------------------------------------------------------------
def nest(level: int) -> list[str]:
    child = f"level {level + 1}"
    return [py(f"h = spawn_agent({child!r}, submit=int)\nv = h.result()\nprint(v)"),
            py(f"submit(v + {level})")]


def test_nested_spawning_to_depth_3_and_trajectories_nest(tmp_path: Path) -> None:
    path = tmp_path / "tree.jsonl"
    deepest = [py("try:\n    spawn_agent('level 4')\nexcept SpawnError as e:\n"
                  "    print(e.kind, e)"), py("submit(100)")]
    r, _ = run_tree({"root": nest(0), "level 1": nest(1), "level 2": nest(2),
                     "level 3": deepest}, tree=TreeBudget(max_depth=3), submit=int,
                    hooks=Hooks(trajectory_path=str(path)))
    assert r.answer == 103 and r.end_reason == "submitted"
    t1 = r.trajectory.steps[0].children[0]
    t2 = t1.steps[0].children[0]
    t3 = t2.steps[0].children[0]
    assert (t1.task, t2.task, t3.task) == ("level 1", "level 2", "level 3")
    assert "depth" in t3.steps[0].observation and "3 level(s) deep" in t3.steps[0].observation
    assert "Sub-agents:" not in t3.messages[0]["content"]  # not offered at the last level
    assert "Sub-agents:" in t2.messages[0]["content"]
    [loaded] = load_trajectories(path)
    assert loaded == r.trajectory
    assert Trajectory.from_dict(r.trajectory.to_dict()) == r.trajectory
    from rich.console import Console

    from memex.executor import render_trajectory

    out = io.StringIO()
    render_trajectory(loaded, Console(file=out, width=200))
    text = out.getvalue()
    assert " " * 12 + "task: level 3" in text and " " * 8 + "task: level 2" in text


def test_child_trajectory_is_an_object_for_an_aggregator() -> None:
    code = """\
hs = [spawn_agent(f"attempt {i}", submit=int) for i in range(2)]
wait_all(hs)
runs = [h.trajectory() for h in hs]
agg = spawn_agent("aggregate", inputs={"runs": runs}, submit=int)
print(type(runs[0]).__name__, runs[0].steps[0].code[0].strip(), agg.result())"""
    r, _ = run_tree({
        "root": [py(code), py("submit(agg.result())")],
        "attempt 0": [py("submit(3)")], "attempt 1": [py("submit(5)")],
        "aggregate": [py("print(type(runs[0]).__name__, [t.answer for t in runs])\n"
                         "submit(max(t.answer for t in runs))")],
    }, submit=int)
    assert "Trajectory submit(3) 5" in obs(r, 0)
    agg = r.trajectory.steps[0].children[-1]
    assert "Trajectory [3, 5]" in agg.steps[0].observation
    assert "runs: list of 2 items; first: Trajectory" in agg.messages[0]["content"]
    assert r.answer == 5


def test_fork_sees_the_state_of_the_previous_block() -> None:
    r, _ = run_tree({
        "root": [py("import json\nbase = {'k': 41}\ndef helper(v):\n    return v + 1"),
                 py("late = 1\nh = spawn_agent('forked', fork=True, inputs={'extra': 2})\n"
                    "print(h.result())"),
                 py("submit(total=h.result(), label=str(base))")],
        "forked": [py("print('late' in dir(), json.dumps(base))\n"
                      "submit(helper(base['k']) + extra)")],
    }, submit=Answer)
    child = r.trajectory.steps[1].children[0]
    assert 'False {"k": 41}' in child.steps[0].observation
    assert "44" in obs(r, 1)
    assert r.answer == Answer(total=44, label="{'k': 41}")


def test_a_group_forked_from_one_state_is_independent() -> None:
    """spawn_agents(3, fork=True): three children from the same image of the parent's
    session, each changing its copy alone; the parent's own state is untouched."""
    r, _ = run_tree({
        "root": [py("base = {'k': 40}\nlog = []"),
                 py("hs = spawn_agents(3, 'forked', fork=True, inputs={'extra': 2})\n"
                    "print([h.id for h in hs], wait_all(hs), base, log)"),
                 py("submit(total=sum(wait_all(hs)), label=str(base))")],
        "forked": [py("base['k'] += extra\nlog.append(base['k'])\nsubmit(sum(log))")],
    }, submit=Answer)
    assert "['1', '2', '3'] [42, 42, 42] {'k': 40} []" in obs(r, 1)
    kids = r.trajectory.steps[1].children
    assert len(kids) == 3 and all(k.answer == 42 for k in kids)
    assert r.answer == Answer(total=126, label="{'k': 40}")


# ---- failures are data -------------------------------------------------------------------
def loop_forever(turn: int, _req: dict[str, Any]) -> ScriptedReply:
    return ScriptedReply(content=py(f"import time\ntime.sleep(0.05)\nprint({turn})"),
                         prompt_tokens=50, completion_tokens=10)


FAILURES = """\
class Unloadable:  # pickles here, cannot be rebuilt in the sub-agent
    def __reduce__(self):
        return int, ("not a number",)
out = {}
for task, kw in [("llm fails", {}), ("slow", {"limits": {"max_seconds": 1.0}}),
                 ("no answer", {"limits": {"max_turns": 2}}),
                 ("no memory", {"limits": {"memory": 50 << 20}}), ("raises", {}),
                 ("bad input", {"inputs": {"x": Unloadable()}})]:
    h = spawn_agent(task, **kw)
    try:
        h.result()
    except AgentFailed as e:
        out[task] = (e.kind, h.status, e.agent_id)
print(out)"""


@pytest.mark.slow
def test_child_failure_kinds() -> None:
    r, _ = run_tree({
        "root": [py(FAILURES), py("submit(total=len(out), label='f')")],
        "llm fails": lambda _t, _r: ScriptedError(status=500, message="boom"),
        "slow": [py("import time\ntime.sleep(3)"), py("print(1)")],
        "no answer": loop_forever,
        "no memory": [py("print(1)")],
        "raises": [py("raise ValueError('x')"), py("1/0"), py("submit(1)")],
        "bad input": [py("print(x)")],
    }, sandbox=SandboxSpec(limits=Limits(timeout=30), preload=("pandas",)), submit=Answer)
    text = obs(r, 0)
    assert "'llm fails': ('error', 'failed', '1')" in text
    assert "'slow': ('timeout', 'failed', '2')" in text
    assert "'no answer': ('budget', 'failed', '3')" in text
    assert "'no memory': ('trap', 'failed', '4')" in text
    assert "raises" not in text  # guest exceptions are observations, not failures
    assert "'bad input': ('trap', 'failed', '6')" in text
    kids = {t.task: t for t in r.trajectory.steps[0].children}
    assert kids["slow"].end_reason == "max_seconds"
    assert kids["no memory"].end_reason == "sandbox_error"
    assert kids["raises"].submitted
    assert "invalid literal for int()" in str(kids["bad input"].error)
    assert r.submitted


def test_cancel_and_parent_end_stop_children() -> None:
    code = ("h = spawn_agent('sleepy')\nh2 = spawn_agent('left running')\n"
            "import time\ntime.sleep(0.3)\nprint(h.cancel(), h.cancel())\n"
            "try:\n    h.result()\nexcept AgentFailed as e:\n    print(e.kind, h.status, e)")
    sleepy: Script = lambda _t, _r: py("import time\ntime.sleep(20)")  # noqa: E731
    r, _ = run_tree({"root": [py(code), py("submit(total=1, label='done')")],
                     "sleepy": sleepy, "left running": sleepy}, submit=Answer)
    assert "True False" in obs(r, 0)
    assert "cancelled cancelled sub-agent 1 failed (cancelled): cancelled by its parent" \
        in obs(r, 0)
    kids = {t.task: t for t in r.trajectory.steps[0].children}
    assert kids["sleepy"].end_reason == "cancelled"
    assert kids["left running"].end_reason == "cancelled"  # stopped when the root ended
    assert r.submitted


@pytest.mark.slow
def test_waits_end_before_the_block_deadline() -> None:
    code = ("h = spawn_agent('takes a while', submit=int)\n"
            "try:\n    h.result(timeout=0.2)\nexcept TimeoutError as e:\n    print('T1', e)\n"
            "h.result()")
    released = threading.Event()

    def root(turn: int, req: dict[str, Any]) -> str:
        if turn == 0:
            return py(code)
        released.set()  # the first block has ended: the sub-agent may finish now
        if "\n9" in str(req["messages"][-1]["content"]):  # the answer was printed
            return py("submit(total=h.result(), label='w')")
        return py("print(h.result())")

    def takes_a_while(turn: int, req: dict[str, Any]) -> str:
        assert released.wait(25), "the root's first block never ended"  # its model: 30 s
        return py("submit(9)")

    # a block of 5 s: at 2 s, beside a CPU hog the block was killed at its limit before its
    # wait gave up (the sub-agent's sandbox opens and its first reply comes beside it)
    r, _ = run_tree({"root": root, "takes a while": takes_a_while},
                    sandbox=SandboxSpec(limits=Limits(timeout=5)), submit=Answer)
    first = r.trajectory.steps[0]
    assert "T1 sub-agent(s) 1 did not finish within 0.2s" in first.observation
    assert first.status == "error" and first.error == "TimeoutError"  # not killed
    assert "near its time limit" in first.observation
    assert r.answer == Answer(total=9, label="w")
