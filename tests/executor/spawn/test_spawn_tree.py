"""The agent tree's budget, refused spawn requests, and nothing left behind: no sandbox and no
thread of a tree outlives its root."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from test_spawn import Answer, Router, py, run_tree

from memex.errors import ConfigError
from memex.executor import Budget, MemexAgent, TreeBudget, load_trajectories
from memex.executor.llm import LLMClient, ScriptedLLM, ScriptedReply, ScriptedToolCall
from memex.runtime_wasm._sandbox import _LIVE  # the live-sandbox registry: nothing may leak

# process-wide pools: the door's, the epoch ticker, the reaper, the guests' elastic runner pool
# (its idle threads end after POOL.keep_alive)
SHARED_THREADS = ("memex-door", "memex-epoch", "memex-reaper", "memex-runner")


def loop_forever(turn: int, _req: dict[str, Any]) -> ScriptedReply:
    return ScriptedReply(content=py(f"import time\ntime.sleep(0.25)\nprint({turn})"),
                         prompt_tokens=50, completion_tokens=10)


FAN_OUT = """\
hs = [spawn_agent("loop") for _ in range(2)]
print([(e.kind, h.status) for e, h in zip(wait_all(hs), hs)])
print(hs[0].exception().reason)"""


@pytest.mark.parametrize("budget,what", [
    (TreeBudget(max_turns=7), "max_turns"),
    (TreeBudget(max_tokens=600), "max_tokens"),
    (TreeBudget(max_cost=0.004), "max_cost"),
    (TreeBudget(max_seconds=2.0), "max_seconds"),
])
@pytest.mark.slow
def test_each_tree_budget_ends_the_whole_tree(budget: TreeBudget, what: str) -> None:
    root = [ScriptedReply(content=py(FAN_OUT), prompt_tokens=50, completion_tokens=10),
            py("submit(total=0, label='never')")]
    r, router = run_tree({"root": root, "loop": loop_forever}, tree=budget, submit=Answer,
                         prices={"scripted": (10.0, 10.0)})
    assert r.end_reason == f"tree_{what}" and not r.submitted
    text = r.trajectory.steps[0].observation
    assert "[('budget', 'failed'), ('budget', 'failed')]" in text
    assert f"the agent tree's {what} budget ran out" in text
    kids = r.trajectory.steps[0].children
    assert [k.end_reason for k in kids] == [f"tree_{what}"] * 2
    calls = len(router.seen)
    if what == "max_turns":
        assert calls == 7  # every model call of the tree was counted before it was made
    tokens = r.trajectory.total_tokens + sum(k.total_tokens for k in kids)
    if what == "max_tokens":
        assert 600 <= tokens <= 600 + 3 * 60  # at most one call in flight per rollout


REFUSALS = """\
import time
def attempt(**kw):
    try:
        return spawn_agent(kw.pop("task", "wait"), **kw)
    except SpawnError as e:
        print(e.kind, "|", e)
attempt(task="")
attempt(tools=["numbers", "nope"])
attempt(inputs={"g": (i for i in range(3))})
attempt(inputs={"_hidden": 1})
attempt(inputs={"numbers": 1})
attempt(submit=object)
import memex_guest.tools as mt
class Mine(mt.Record):
    __fields__ = ("a",)
attempt(submit=Mine)
attempt(limits={"max_turns": 99})
attempt(limits={"turns": 1})
attempt(limits={"timeout": -1})
attempt(model="big-model")
attempt(inputs=[1])"""


def test_bad_spawn_requests_are_clear_guest_errors() -> None:
    r, _ = run_tree({"root": [py(REFUSALS), py("submit(total=0, label='x')")]},
                    tree=TreeBudget(models=("small-model",)), submit=Answer)
    lines = [ln for ln in r.trajectory.steps[0].observation.splitlines() if " | " in ln]
    kinds = [ln.split(" | ")[0] for ln in lines]
    assert kinds == ["task", "tools", "input", "inputs", "inputs", "submit", "submit",
                     "limits", "limits", "limits", "model", "inputs"]
    text = "\n".join(lines)
    assert "no tool named 'nope' (this agent's tools: numbers, shout)" in text
    assert "inputs['g'] (generator object) cannot be copied to a sub-agent" in text
    assert "would hide the tool of that name" in text
    assert "the host knows no record class of that name (known: Answer)" in text
    assert "limits['max_turns']=99 is above this agent's own 12" in text
    assert "unknown limit 'turns'" in text
    assert "model 'big-model' is not allowed here; allowed: small-model" in text
    assert r.trajectory.steps[0].children == ()  # nothing was started


LIVE_AND_TOTAL = """\
import time
def attempt(task):
    try:
        return spawn_agent(task)
    except SpawnError as e:
        print(e.kind, "|", e)
def group(n):
    try:
        return spawn_agents(n, "wait")
    except SpawnError as e:
        print(e.kind, "|", e)
group(3)  # past max_live: none of the three starts
a, b = group(2)
attempt("wait")
a.cancel()
group(2)  # room for one more running, not two
c = attempt("wait")
b.cancel(); c.cancel()
group(2)  # max_children: 3 started, none left
attempt("wait")
print([h.status for h in (a, b, c)])
try:
    spawn_agents(0, "wait")
except SpawnError as e:
    print(e.kind, "|", e)
import memex_guest.door as door
print(door.request("agent.spawn_many", [{"task": "wait", "fork": False}, True], {}, True))"""


def test_max_live_and_max_children_refuse_new_spawns() -> None:
    sleepy = [py("import time\ntime.sleep(20)")] * 3
    r, _ = run_tree({"root": [py(LIVE_AND_TOTAL), py("submit(total=0, label='x')")],
                     "wait": sleepy}, tree=TreeBudget(max_live=2, max_children=3),
                    submit=Answer)
    text = r.trajectory.steps[0].observation
    assert "max_live | 0 sub-agents are running in this agent tree (max_live=2), no room " \
        "for 3 sub-agents: start fewer, or wait for some" in text
    assert "max_live | 2 sub-agents are running in this agent tree (max_live=2), no room " \
        "for sub-agent: wait for one first" in text
    assert "max_live | 1 sub-agents are running in this agent tree (max_live=2), no room " \
        "for 2 sub-agents" in text
    assert "max_children | this agent tree has started 3 of its 3 sub-agents (max_children)" \
        ", no room for 2 sub-agents" in text
    assert "max_children | this agent tree has started 3 of its 3 sub-agents (max_children)" \
        ", no room for sub-agent" in text
    assert "['cancelled', 'cancelled', 'cancelled']" in text
    assert "n | spawn_agents(n, task, ...) needs n as an int >= 1, not 0" in text
    assert "{'error': 'n', 'message': 'spawn_agents needs n as an int >= 1, not True'}" in text
    assert len(r.trajectory.steps[0].children) == 3  # the refused groups started none


def test_depth_zero_disables_spawning_and_no_prompt() -> None:
    code = "try:\n    spawn_agent('x')\nexcept SpawnError as e:\n    print(e.kind)"
    r, _ = run_tree({"root": [py(code), py("submit(total=0, label='x')")]},
                    tree=TreeBudget(max_depth=0), submit=Answer)
    assert "depth" in r.trajectory.steps[0].observation
    assert "Sub-agents:" not in r.trajectory.messages[0]["content"]


def _our_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate()
                  if t.name.startswith("memex-") and not t.name.startswith(SHARED_THREADS))


@pytest.mark.slow
def test_no_sandbox_or_thread_survives_100_spawns() -> None:
    before_live = len(_LIVE)
    before_threads = _our_threads()
    batch = ("hs = [spawn_agent('quick', inputs={'i': i}, submit=int) for i in range(10)]\n"
             "total = total + sum(wait_all(hs))")
    root = [py("total = 0")] + [py(batch)] * 9 + [
        py("late = [spawn_agent('sleep') for i in range(10)]\nprint(total)"),
        py("submit(total=total, label='end')")]
    r, _ = run_tree({"root": root, "quick": [py("submit(i)")],
                     "sleep": [py("import time\ntime.sleep(30)")]},
                         tree=TreeBudget(max_live=10, max_children=100), submit=Answer,
                         budget=Budget(max_turns=12))
    assert r.answer == Answer(total=9 * 45, label="end")
    kids = [k for s in r.trajectory.steps for k in s.children]
    assert len(kids) == 100
    assert sum(k.end_reason == "cancelled" for k in kids) == 10  # stopped when the root ended
    assert len(_LIVE) == before_live
    assert _our_threads() == before_threads


def test_trajectory_children_survive_save_and_bad_files_are_refused(tmp_path: Path) -> None:
    r, _ = run_tree({"root": [py("h = spawn_agent('kid', submit=int)\nv = h.result()"),
                              py("submit(total=v, label='s')")],
                     "kid": [py("submit(4)")]}, submit=Answer)
    path = tmp_path / "t.jsonl"
    r.trajectory.save(path)
    assert load_trajectories(path) == [r.trajectory]
    events = [json.loads(line) for line in path.read_text().splitlines()]
    assert all(not e["step"]["children"] for e in events if e["event"] == "step")
    assert events[-1]["children"]["0"][0]["task"] == "kid"
    events[-1]["children"] = {"zero": [{"task": 1}]}
    path.write_text("\n".join(json.dumps(e) for e in events))
    with pytest.raises(ConfigError, match="children of trajectory"):
        load_trajectories(path)


def test_tool_calling_action_space_can_spawn_from_python_exec() -> None:
    code = "h = spawn_agent('kid', submit=int)\nprint(h.result() * 2)"
    root = [ScriptedReply(tool_calls=(ScriptedToolCall(name="python_exec",
                                                       arguments={"code": code}),)),
            ScriptedReply(tool_calls=(ScriptedToolCall(
                name="submit", arguments={"answer": {"total": 8, "label": "t"}}),))]
    kid = [ScriptedReply(tool_calls=(ScriptedToolCall(name="submit",
                                                      arguments={"answer": 4}),))]
    r, _ = run_tree({"root": root, "kid": kid}, submit=Answer, action_space="tools")
    assert "8" in r.trajectory.steps[0].observation
    assert r.trajectory.steps[0].children[0].action_space == "tools"
    assert r.answer == Answer(total=8, label="t")


def test_bad_configuration_raises() -> None:
    for bad in ({"max_depth": -1}, {"max_live": 1.5}, {"max_tokens": 0},
                {"max_seconds": float("inf")}, {"models": "gpt"}):
        with pytest.raises(ConfigError):
            TreeBudget(**bad)
    with ScriptedLLM([]) as srv:
        llm = LLMClient("x", base_url=srv.base_url)
        with pytest.raises(ConfigError, match="spawn takes a TreeBudget"):
            MemexAgent(model=llm, spawn="yes")
        assert MemexAgent(model=llm, spawn=True).spec.spawn == TreeBudget()
    assert Router({})  # the shared test helper is importable here
