"""`memex eval run` against the real local model (llama.cpp on 127.0.0.1) on one question
of the big-outputs suite (the agent's own local test runs another), code action space: the
rollout ran, was graded and written, and the report reads it back. Tolerant of wrong
answers: the model is small.

Skipped (with the reason) when llama-cpp-python or the model file is absent; `.ci/run`
provides both."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from lanes import LOCAL_MODEL_CALL, LOCAL_MODEL_ROLLOUT, LOCAL_MODEL_START, LOCAL_MODEL_THREADS

from memex.eval import SUITES, load_results, run_eval, summarise
from memex.executor import Aids, Budget
from memex.executor.internal import local_model_unavailable
from memex.executor.llm import LocalModel

MODEL = os.environ.get("MEMEX_TEST_LOCAL_MODEL", "qwen-1.5b")


def _skip_reason() -> str | None:
    return local_model_unavailable(MODEL)


pytestmark = [pytest.mark.local_llm, pytest.mark.slow]


@pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))
def test_a_question_with_the_local_model(tmp_path: Path) -> None:
    with LocalModel(MODEL, fetch=False, startup_timeout=LOCAL_MODEL_START,
                    n_threads=LOCAL_MODEL_THREADS) as lm:
        # bounded so a slow machine ends the rollouts rather than the CI job
        run = run_eval(SUITES["big-outputs"],
                       llm=lm.client(max_reply_tokens=320, timeout=LOCAL_MODEL_CALL,
                                     max_retries=0),
                       out=tmp_path, spaces=["code"], tasks=["status_count"],
                       budget=Budget(max_turns=3, max_seconds=LOCAL_MODEL_ROLLOUT),
                       aids=Aids(resample_tries=1), backend="pool")
    assert run.ran == 1 and [r.task for r in run.results] == ["status_count"]
    for r in run.results:
        assert r.end_reason in ("submitted", "max_turns", "max_seconds"), (r.end_reason, r.error)
        assert 1 <= r.turns <= 3 and r.prompt_tokens > 300 and r.completion_tokens > 0
        assert not r.correct or (r.end_reason == "submitted" and r.answer is not None)
    (row,) = summarise(load_results(tmp_path))
    assert row.rollouts == 1 and row.correct == sum(r.correct for r in run.results)
