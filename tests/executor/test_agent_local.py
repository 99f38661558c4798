"""End to end against the real local model (llama.cpp on 127.0.0.1): real code ran, the loop
ended properly, the trajectory is complete. Tolerant of wrong answers: the model is small.

Skipped (with the reason) when llama-cpp-python or the model file is absent; `.ci/run`
provides both (`./build.sh test` installs the `local` extra and fetches the model)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from memex.executor import Aids, Budget, Hooks, MemexAgent, SandboxSpec, load_trajectories
from memex.executor.internal import local_model_unavailable
from memex.executor.llm import LocalModel
from memex.runtime_wasm import Limits

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from funnel_data import TASK, FunnelAnswer, build_warehouse, sql_tool

MODEL = os.environ.get("MEMEX_TEST_LOCAL_MODEL", "qwen-1.5b")


def _skip_reason() -> str | None:
    return local_model_unavailable(MODEL)


pytestmark = [pytest.mark.local_llm, pytest.mark.slow]


@pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))
def test_funnel_rollout_with_the_local_model(tmp_path: Path) -> None:
    db = build_warehouse(tmp_path / "w.db", seed=0)
    path = tmp_path / "t.jsonl"
    with LocalModel(MODEL, fetch=False) as lm:
        # Bounded so a slow machine ends the rollout rather than the CI job: at most three
        # turns (a reply repeating an earlier one is asked again once), no model call started
        # after 15 minutes, each at most 15 minutes (an idle 2-core machine answers in 10-50
        # s; one shared with heavy work, far slower).
        agent = MemexAgent(model=lm.client(max_reply_tokens=320, timeout=900, max_retries=0),
                           tools=[sql_tool(db)], submit=FunnelAnswer,
                           sandbox=SandboxSpec(limits=Limits(timeout=60),
                                               preload=("pandas",)),
                           budget=Budget(max_turns=3, max_seconds=900),
                           aids=Aids(resample_tries=1),
                           hooks=Hooks(trajectory_path=str(path)))
        r = agent.run(TASK)
    t = r.trajectory
    assert r.end_reason in ("submitted", "max_turns", "max_seconds"), (r.end_reason, r.error)
    assert 1 <= len(t.steps) <= 3 and all(0 <= s.resampled <= 1 for s in t.steps)
    assert t.llm_calls == len(t.steps) + sum(s.resampled for s in t.steps)
    assert t.prompt_tokens > 500 and t.completion_tokens > 0  # real usage from the server
    ran = [s for s in t.steps if s.code]
    assert ran, "the model wrote no code block in any turn"
    assert all(s.observation for s in t.steps)
    if r.submitted:
        assert isinstance(r.answer, FunnelAnswer)
    [loaded] = load_trajectories(path)
    assert loaded == t
