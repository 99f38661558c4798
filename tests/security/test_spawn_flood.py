"""Spawn flooding (SECURITY.md): a guest that calls ``spawn_agent`` in a tight loop gets at most
``TreeBudget.max_children`` sub-agents, never more than ``max_live`` at once, and a clear
``SpawnError`` for every other request, fast — on every local backend."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from memex import Limits
from memex.executor import MemexAgent, SandboxSpec, TreeBudget
from memex.executor.llm import LLMClient, ScriptedLLM, ScriptedReply
from memex.runtime_wasm._sandbox import _LIVE  # the live-sandbox registry: nothing may leak


class Count(BaseModel):
    started: int
    refused: int


FLOOD = """\
started, refused, kinds = [], 0, set()
for i in range(1000):
    try:
        started.append(spawn_agent("child"))
    except SpawnError as e:
        refused += 1
        kinds.add(e.kind)
print(len(started), refused, sorted(kinds))"""


def _py(code: str) -> ScriptedReply:
    return ScriptedReply(content=f"Flooding.\n```python\n{code}\n```", prompt_tokens=20,
                         completion_tokens=10)


def _router(req: dict[str, Any]) -> ScriptedReply:
    msgs = req["messages"]
    task = str(msgs[1]["content"]).removeprefix("Task: ")
    turn = sum(1 for m in msgs if m["role"] == "assistant")
    if task == "child":
        return _py("import time\ntime.sleep(20)")
    return [_py(FLOOD), _py("submit(started=len(started), refused=refused)")][turn]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["inprocess", "subprocess", "pool"])
def test_a_spawn_flood_is_refused_fast_and_bounded(backend: str) -> None:
    before = len(_LIVE)
    with ScriptedLLM(_router) as srv:
        llm = LLMClient("scripted", base_url=srv.base_url, max_retries=0, timeout=30)
        agent = MemexAgent(model=llm, submit=Count,
                           sandbox=SandboxSpec(backend=backend, limits=Limits(timeout=30)),
                           spawn=TreeBudget(max_live=2, max_children=4))
        with agent:
            r = agent.run("root")
    assert r.answer == Count(started=2, refused=998), r.trajectory.steps[0].observation
    obs = r.trajectory.steps[0].observation
    assert "2 998 ['max_live']" in obs or "2 998 ['max_children', 'max_live']" in obs, obs
    assert r.trajectory.steps[0].exec_seconds < 20  # refusals are immediate, not waits
    kids = [k for s in r.trajectory.steps for k in s.children]
    assert len(kids) == 2 and all(k.end_reason == "cancelled" for k in kids)
    assert len(_LIVE) == before  # every child sandbox closed
