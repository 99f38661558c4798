"""smolagents' own executor tests against MemexExecutor (issue 48): its local executor's
TestLocalPythonExecutor (outputs compared as objects) and its remote executors'
CommonDockerExecutorIntegration (errors expected as AgentError), vendored unchanged in
smol_upstream_executor_tests.py (v1.26.0, each class's text checked by hash), with the
baseline of what MemEx does differently on purpose: each such test is xfail(strict) with
its reason, so a change either way is seen."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("smolagents")

import smol_upstream_executor_tests as upstream

from memex.integrations.smolagents import MemexExecutor

VENDORED = Path(upstream.__file__)
HASHES = {"class TestLocalPythonExecutor:":
          "39563b5c31caa0fd928047b1528eafc58b060cc2002241594e41018450511719",
          "class CommonDockerExecutorIntegration:":
          "c126d181465bec13895b41a2cc34d0ede398be815b0f2ecab69a3e5986d44587"}

# deliberate differences: test id -> why MemEx answers otherwise
DIFFERENT = {
    "test_additional_authorized_imports_are_installed[additional_authorized_imports5-True]":
        "no import allow-list: the sandbox is the boundary, so a name it does not have is "
        "not refused when the executor is made",
    "test_additional_authorized_imports_are_installed[additional_authorized_imports6-True]":
        "as above",
    "test_additional_authorized_imports_are_installed[additional_authorized_imports7-True]":
        "as above",
    "test_state_name":
        "executor.state is the host's (smolagents reads _print_outputs there); the guest's "
        "globals, where __name__ is '__main__', are not mirrored on the host",
    "test_evaluate_assign_error":
        "the error is CPython's own ('too many values to unpack'), not the wording of "
        "smolagents' AST interpreter",
    "test_function_def_recovers_source_code":
        "a function the code defined stays in the sandbox: final_answer cannot hand the host "
        "a guest function (its source is not carried)",
}


def test_the_vendored_classes_are_upstream_s_unchanged() -> None:
    text = VENDORED.read_text()
    body = text[text.index("# ---- vendored below, unchanged"):].split("\n", 1)[1]
    starts = sorted((body.index(head), head) for head in HASHES)
    for n, (at, head) in enumerate(starts):
        end = starts[n + 1][0] if n + 1 < len(starts) else len(body)
        assert hashlib.sha256(body[at:end].encode()).hexdigest() == HASHES[head], head


@pytest.fixture(autouse=True)
def _baseline_and_cleanup(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each deliberately different test xfail(strict) with its reason; the executors the
    upstream tests made, closed after each."""
    name = request.node.name
    why = DIFFERENT.get(name) or DIFFERENT.get(name.split("[")[0])
    if why is not None and request.node.cls is not None:
        request.applymarker(pytest.mark.xfail(strict=True, reason=why))
    yield
    while upstream.MADE:
        upstream.MADE.pop().cleanup()


class TestLocalPythonExecutor(upstream.TestLocalPythonExecutor):  # type: ignore[misc]
    pass


class TestRemoteExecutorIntegration(upstream.CommonDockerExecutorIntegration):  # type: ignore[misc]
    @pytest.fixture
    def custom_executor(self) -> Iterator[MemexExecutor]:
        with MemexExecutor() as executor:
            yield executor
