"""``MemexCodeMode`` on real pydantic-ai agents, driven by pydantic-ai's own ``FunctionModel``:
the model sees ``run_python``; the agent's tools are typed functions in the guest; state
across calls; ``submit()`` ends the run with the output type; limits come back as
observations and the run goes on; the one-line switch from tool calling; selectors; sessions
per run and per conversation; another backend."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from memex import Limits
from memex.integrations.pydantic_ai import MemexCodeMode


class Answer(BaseModel):
    total: int
    label: str


class Item(BaseModel):
    name: str
    price: float


def scripted(*codes: str, seen: list[AgentInfo] | None = None
             ) -> Callable[[list[ModelMessage], AgentInfo], ModelResponse]:
    """A model that sends one run_python call per step, then text."""

    def fn(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if seen is not None:
            seen.append(info)
        n = sum(1 for m in messages if m.kind == "response")
        if n < len(codes):
            return ModelResponse(parts=[ToolCallPart(tool_name="run_python",
                                                     args={"code": codes[n]},
                                                     tool_call_id=f"call-{n}")])
        return ModelResponse(parts=[TextPart("no more steps")])

    return fn


def returns(result: Any) -> list[str]:
    return [str(p.content) for m in result.all_messages() for p in m.parts
            if isinstance(p, ToolReturnPart)]


def make_agent(fn: Any, mode: MemexCodeMode | None, output: Any = Answer) -> Agent[None, Any]:
    agent: Agent[None, Any] = Agent(FunctionModel(fn), output_type=output,
                                    capabilities=[mode] if mode is not None else [])

    @agent.tool_plain
    def catalog(category: str) -> list[Item]:
        """The items of a category."""
        return [Item(name=f"{category}-{i}", price=10.0 * i) for i in (1, 2, 3)]

    @agent.tool_plain
    def rate(currency: str) -> float:
        """An exchange rate."""
        return {"EUR": 1.0, "NOK": 11.5}[currency]

    return agent


@pytest.fixture
def mode() -> Iterator[MemexCodeMode]:
    m = MemexCodeMode(limits=Limits(timeout=2))
    yield m
    m.close()
    m.close()


def test_tools_are_typed_functions_state_persists_and_submit_ends_the_run(
        mode: MemexCodeMode) -> None:
    seen: list[AgentInfo] = []
    fn = scripted("items = catalog('book')\nprint(items[0].name, type(items[0].price).__name__)",
                  "total = int(sum(i.price for i in items) * rate('NOK'))\nprint(total)",
                  "submit({'total': total, 'label': 'books in NOK'})",
                  seen=seen)
    result = make_agent(fn, mode).run_sync("What do the books cost in NOK?")
    assert result.output == Answer(total=690, label="books in NOK")
    shown = returns(result)
    assert shown[0].startswith("book-1 float")  # a record from the agent's own tool, typed
    assert "690" in shown[1]
    names = [t.name for t in seen[0].function_tools]
    assert names == ["run_python"]  # the model sees code mode only
    description = seen[0].function_tools[0].description or ""
    assert "catalog(category: str)" in description and "submit(answer:" in description
    first = result.all_messages()[0]
    assert "run_python" in str(getattr(first, "instructions", ""))  # the capability's note
    assert [c.tool for c in mode.tool_calls] == ["catalog", "rate", "submit"]


@pytest.mark.slow
def test_limits_and_errors_are_observations_and_the_run_goes_on(mode: MemexCodeMode) -> None:
    fn = scripted("kept = 3", "while True:\n    kept += 1", "rate('XXX')",
                  "submit({'total': kept, 'label': 'x'})")
    result = make_agent(fn, mode).run_sync("go")
    assert result.output.total == 3  # the stopped loop was rolled back
    shown = returns(result)
    assert "time limit" in shown[1]
    assert "ToolExecutionError: 'XXX'" in shown[2]  # the tool's own failure, in the guest


def test_a_rejected_submit_can_be_fixed(mode: MemexCodeMode) -> None:
    fn = scripted("submit({'total': 'many'})", "submit({'total': 2, 'label': 'ok'})")
    result = make_agent(fn, mode).run_sync("go")
    assert result.output == Answer(total=2, label="ok")
    first = returns(result)[0]  # checked on the host against the output type's schema
    assert "'label' is a required property" in first and "'many' is not of type" in first


def test_one_line_switch_from_tool_calling(mode: MemexCodeMode) -> None:
    def tool_calls(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        n = sum(1 for m in messages if m.kind == "response")
        if n == 0:
            return ModelResponse(parts=[ToolCallPart(tool_name="rate",
                                                     args={"currency": "NOK"})])
        return ModelResponse(parts=[TextPart("11.5")])

    assert make_agent(tool_calls, None, output=str).run_sync("NOK?").output == "11.5"
    code = scripted("submit(str(rate('NOK')))")
    assert make_agent(code, mode, output=str).run_sync("NOK?").output == "11.5"


def test_a_selector_keeps_some_tools_native() -> None:
    seen: list[AgentInfo] = []
    with_selector = MemexCodeMode(tools=["catalog"])
    try:
        fn = scripted("submit({'total': len(catalog('pen')), 'label': 'n'})", seen=seen)
        result = make_agent(fn, with_selector).run_sync("go")
    finally:
        with_selector.close()
    assert result.output.total == 3
    assert sorted(t.name for t in seen[0].function_tools) == ["rate", "run_python"]


def test_sessions_per_run_and_per_conversation() -> None:
    per_run = MemexCodeMode()
    try:
        agent = make_agent(scripted("x = 1", "submit({'total': x, 'label': 'a'})"), per_run)
        assert agent.run_sync("one").output.total == 1
        agent2 = make_agent(scripted("submit({'total': x, 'label': 'b'})", "x = 5",
                                     "submit({'total': x, 'label': 'b'})"), per_run)
        result = agent2.run_sync("two")  # a new run: x is not defined any more
        assert "NameError" in returns(result)[0] and result.output.total == 5
    finally:
        per_run.close()
    per_conv = MemexCodeMode(per="conversation")
    try:
        make_agent(scripted("y = 7", "submit({'total': y, 'label': 'c'})"),
                   per_conv).run_sync("first", conversation_id="conv-1")
        again = make_agent(scripted("submit({'total': y * 6, 'label': 'c'})"),
                           per_conv).run_sync("second", conversation_id="conv-1")
        assert again.output.total == 42  # the same sandbox across the conversation's runs
    finally:
        per_conv.close()


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["subprocess", "pool"])
def test_on_another_backend(backend: str) -> None:
    on_pool = MemexCodeMode(backend=backend, limits=Limits(timeout=2))
    try:
        fn = scripted("items = catalog('cup')", "while True: pass",
                      "submit({'total': len(items), 'label': 'cups'})")
        result = make_agent(fn, on_pool).run_sync("go")
        assert result.output.total == 3 and "time limit" in returns(result)[1]
    finally:
        on_pool.close()
