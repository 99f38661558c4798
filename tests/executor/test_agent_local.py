"""End to end against the real local model (llama.cpp on 127.0.0.1), on the demo's task
(examples/compare.py: big-outputs' ``refund_total``, which the small model finishes in one
call): real code ran, the loop ended properly, the trajectory is complete and reads back.
Tolerant of wrong answers: the model is small. The long funnel rollout is a benchmark's job
(bench/agent.py) and ``memex eval``'s (examples/funnel.py), not the suite's.

Skipped (with the reason) when llama-cpp-python or the model file is absent; `.ci/run`
provides both (`./build.sh test` installs the `local` extra and fetches the model)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from lanes import LOCAL_MODEL_CALL, LOCAL_MODEL_ROLLOUT, LOCAL_MODEL_START, LOCAL_MODEL_THREADS

from memex.eval import SUITES, grade
from memex.executor import Aids, Budget, Hooks, MemexAgent, SandboxSpec, load_trajectories
from memex.executor.internal import local_model_unavailable
from memex.executor.llm import LocalModel
from memex.runtime_wasm import Limits

MODEL = os.environ.get("MEMEX_TEST_LOCAL_MODEL", "qwen-1.5b")


def _skip_reason() -> str | None:
    return local_model_unavailable(MODEL)


pytestmark = [pytest.mark.local_llm, pytest.mark.slow]


@pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))
def test_the_demos_task_with_the_local_model(tmp_path: Path) -> None:
    ws = SUITES["big-outputs"].build(0, tmp_path / "ws")
    [task] = [t for t in ws.tasks if t.id == "refund_total"]
    path = tmp_path / "t.jsonl"
    with LocalModel(MODEL, fetch=False, startup_timeout=LOCAL_MODEL_START,
                    n_threads=LOCAL_MODEL_THREADS) as lm:
        # Bounded so a slow machine ends the rollout rather than the CI job: at most three
        # turns (a reply repeating an earlier one is asked again once), no model call started
        # after 10 minutes, each at most 10 minutes (an idle 2-core machine answers in 5-20 s).
        agent = MemexAgent(model=lm.client(max_reply_tokens=320, timeout=LOCAL_MODEL_CALL,
                                            max_retries=0),
                           tools=ws.tools, submit=task.answer,
                           sandbox=SandboxSpec(limits=Limits(timeout=60), preload=ws.preload),
                           budget=Budget(max_turns=3, max_seconds=LOCAL_MODEL_ROLLOUT),
                           aids=Aids(resample_tries=1),
                           hooks=Hooks(trajectory_path=str(path)))
        r = agent.run(task.question)
    t = r.trajectory
    assert r.end_reason in ("submitted", "max_turns", "max_seconds"), (r.end_reason, r.error)
    assert 1 <= len(t.steps) <= 3 and all(0 <= s.resampled <= 1 for s in t.steps)
    assert t.llm_calls == len(t.steps) + sum(s.resampled for s in t.steps)
    assert t.prompt_tokens > 300 and t.completion_tokens > 0  # real usage from the server
    ran = [s for s in t.steps if s.code]
    assert ran, "the model wrote no code block in any turn"
    assert all(s.observation for s in t.steps)
    # the tool's 5,000 rows stayed in the guest: no observation carries them
    assert all(len(s.observation) < 20_000 for s in t.steps)
    if r.submitted:  # a submitted answer passed the task's schema and can be graded
        assert r.answer == t.answer
        assert grade(t.answer, task.reference, task.grader,
                     tolerance=task.tolerance) in (True, False)
    [loaded] = load_trajectories(path)
    assert loaded == t
