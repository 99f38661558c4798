"""An agent whose sandbox has guest packages (SandboxSpec(packages=...)): its code imports
one, on the in-process and the subprocess backend (and not without them)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from package_index import build_wheel, package_index
from pydantic import BaseModel

from memex.backends import get_backend
from memex.executor import Budget, MemexAgent, ModelSettings, SandboxSpec
from memex.executor.llm import LLMClient, ScriptedLLM
from memex.runtime_wasm import Limits


class Answer(BaseModel):
    text: str


@pytest.fixture(scope="module", autouse=True)
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    w = tmp_path_factory.mktemp("wheels")
    build_wheel(w, "memexagent-shout", "1.0",
                {"memexagent_shout.py": "def shout(s):\n    return s.upper() + '!'\n"})
    with package_index(w) as idx, pytest.MonkeyPatch.context() as mp:
        mp.setenv("PIP_INDEX_URL", idx.url)
        yield


def py(code: str) -> str:
    return f"Running code.\n```python\n{code}\n```"


@pytest.mark.parametrize("backend", [None, "subprocess"])
def test_the_agents_code_imports_its_package(backend: Any) -> None:
    script = [py("from memexagent_shout import shout\nsubmit(text=shout('hi'))")]
    be = get_backend(backend) if backend else None
    try:
        with ScriptedLLM(script) as srv:
            llm = LLMClient("scripted", base_url=srv.base_url)
            agent = MemexAgent(model=ModelSettings(client=llm), submit=Answer,
                               sandbox=SandboxSpec(limits=Limits(timeout=20), backend=be,
                                                   packages=("memexagent-shout==1.0",)))
            r = agent.run("shout hi")
        assert r.submitted and r.answer == Answer(text="HI!"), r.trajectory.steps
    finally:
        if be is not None:
            be.close()
    with ScriptedLLM(script) as srv:  # the positive control: without the package
        llm = LLMClient("scripted", base_url=srv.base_url)
        r = MemexAgent(model=ModelSettings(client=llm), submit=Answer, budget=Budget(max_turns=1),
                       sandbox=SandboxSpec(limits=Limits(timeout=20))).run("shout hi")
    assert not r.submitted and "ModuleNotFoundError" in r.trajectory.steps[0].observation
