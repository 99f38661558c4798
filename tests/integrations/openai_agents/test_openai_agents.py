"""``MemexCodeMode`` on real OpenAI Agents SDK agents, driven by the SDK's own ``ScriptedModel``
(and by ``ScriptedLLM`` behind the SDK's Chat Completions model over the real OpenAI client):
the model sees ``run_python``; the agent's function tools are typed functions in the guest;
state across calls; ``submit()`` ends the run with the output type; limits and tool failures
come back as observations and the run goes on; the one-configuration switch; tools that need
approval stay native; sessions per run and per context; the raw-string custom tool; other
backends; the egress policy; cancellation."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    RunContextWrapper,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from agents.exceptions import UserError
from agents.items import ToolCallOutputItem
from agents.testing import ScriptedModel, assistant_message, function_call
from openai import AsyncOpenAI
from openai.types.responses import ResponseCustomToolCall
from pydantic import BaseModel

from memex import ConfigError, EgressPolicy, Mount
from memex.executor.llm import ScriptedLLM, ScriptedReply, ScriptedToolCall
from memex.integrations.openai_agents import MemexCodeMode

set_tracing_disabled(True)


class Answer(BaseModel):
    total: int
    label: str


class Item(BaseModel):
    name: str
    price: float


@function_tool
def catalog(category: str) -> list[Item]:
    """The items of a category."""
    return [Item(name=f"{category}-{i}", price=10.0 * i) for i in (1, 2, 3)]


@function_tool
def rate(currency: str) -> float:
    """An exchange rate."""
    return {"EUR": 1.0, "NOK": 11.5}[currency]


@function_tool
def sales(region: str) -> pd.DataFrame:
    """Sales rows of a region."""
    return pd.DataFrame({"region": [region] * 3, "amount": [10, 20, 30]})


@function_tool(needs_approval=True)
def refund(order: str) -> str:
    """Refund an order (a person approves each refund)."""
    return f"refunded {order}"


def code_calls(*codes: str, then: str | None = None) -> ScriptedModel:
    steps: list[Any] = [[function_call("run_python", {"code": c}, call_id=f"c{i}")]
                        for i, c in enumerate(codes)]
    if then is not None:
        steps.append([assistant_message(then)])
    return ScriptedModel(steps)


def outputs(result: Any) -> list[str]:
    return [str(i.output) for i in result.new_items if isinstance(i, ToolCallOutputItem)]


@pytest.fixture
def mode() -> Iterator[MemexCodeMode]:
    m = MemexCodeMode(timeout=2)
    yield m
    m.close()
    m.close()  # idempotent


@pytest.mark.slow
def test_typed_tools_state_and_submit_end_the_run() -> None:
    with MemexCodeMode(timeout=60) as mode:  # no cell here is meant to hit a deadline
        typed_tools_state_and_submit(mode)


def typed_tools_state_and_submit(mode: MemexCodeMode) -> None:
    model = code_calls("items = catalog('book')\nprint(items[0]['name'], "
                       "type(items[0]['price']).__name__)",
                       "total = int(sum(i['price'] for i in items) * rate('NOK'))\nprint(total)",
                       "df = sales('east')\nprint(type(df).__name__, int(df.amount.sum()))",
                       "submit({'total': total, 'label': 'books in NOK'})")
    agent = Agent(name="shop", instructions="Answer briefly.", model=model,
                  tools=[catalog, rate, sales], output_type=Answer)
    code_agent = mode.agent(agent)
    result = Runner.run_sync(code_agent, "What do the books cost in NOK?")
    assert result.final_output == Answer(total=690, label="books in NOK")
    shown = outputs(result)
    assert shown[0] == "book-1 float"  # the agent's own tool, its value typed in the guest
    assert shown[1] == "690"
    assert shown[2] == "DataFrame 60"  # a DataFrame stays a DataFrame
    call = model.first_call
    assert call is not None and [t.name for t in call.tools] == ["run_python"]
    description = call.tools[0].description  # type: ignore[union-attr]
    assert "catalog(category: str)" in description and "submit(answer:" in description
    assert call.system_instructions is not None
    assert call.system_instructions.startswith("Answer briefly.")
    assert "run_python" in call.system_instructions
    assert [r.tool for r in mode.tool_calls] == ["catalog", "rate", "sales", "submit"]
    assert mode.sandbox(result.context_wrapper) is None  # the run's sandbox ended with it
    assert agent.tools == [catalog, rate, sales]  # the original agent is unchanged


@pytest.mark.slow
def test_limits_and_tool_failures_are_observations_and_the_run_goes_on(
        mode: MemexCodeMode) -> None:
    model = code_calls("kept = 3", "while True:\n    kept += 1", "rate('XXX')",
                       "submit({'total': kept, 'label': 'x'})")
    agent = Agent(name="a", model=model, tools=[rate], output_type=Answer)
    result = Runner.run_sync(mode.agent(agent), "go")
    assert result.final_output.total == 3  # the stopped loop was rolled back
    shown = outputs(result)
    assert "time limit" in shown[1] and "as they were" in shown[1]
    assert "ToolExecutionError" in shown[2] and "XXX" in shown[2]  # raised in the guest


def test_a_rejected_submit_can_be_fixed_and_bad_arguments_are_answered(
        mode: MemexCodeMode) -> None:
    model = ScriptedModel([
        [function_call("run_python", "not json", call_id="c0")],
        [function_call("run_python", {"code": "submit({'total': 'many'})"}, call_id="c1")],
        [function_call("run_python", {"code": "submit({'total': 2, 'label': 'ok'})"},
                       call_id="c2")],
    ])
    agent = Agent(name="a", model=model, tools=[], output_type=Answer)
    result = Runner.run_sync(mode.agent(agent), "go")
    assert result.final_output == Answer(total=2, label="ok")
    shown = outputs(result)
    assert "JSON object" in shown[0]
    assert "does not fit" in shown[1] or "required property" in shown[1]


def test_the_one_configuration_switch(mode: MemexCodeMode) -> None:
    by_tools = ScriptedModel([[function_call("rate", {"currency": "NOK"}, call_id="t0")],
                              [assistant_message("11.5")]])
    agent = Agent(name="fx", model=by_tools, tools=[rate])
    assert Runner.run_sync(agent, "NOK?").final_output == "11.5"
    by_code = code_calls("submit(str(rate('NOK')))")
    switched = mode.agent(agent.clone(model=by_code))
    assert Runner.run_sync(switched, "NOK?").final_output == "11.5"


def test_approval_tools_stay_native_and_a_selector_keeps_others(mode: MemexCodeMode) -> None:
    inside, outside = mode.split([catalog, rate, refund])
    assert [t.name for t in inside] == ["catalog", "rate"]
    assert [t.name for t in outside] == ["refund"]  # its approvals keep applying
    picky = MemexCodeMode(tools=["catalog"])
    try:
        model = code_calls("submit({'total': len(catalog('pen')), 'label': 'n'})")
        agent = picky.agent(Agent(name="a", model=model, tools=[catalog, rate, refund],
                                  output_type=Answer))
        assert sorted(t.name for t in agent.tools) == ["rate", "refund", "run_python"]
        assert Runner.run_sync(agent, "go").final_output.total == 3
    finally:
        picky.close()


def test_sessions_per_run_and_per_context() -> None:
    with MemexCodeMode() as per_run:
        first = Agent(name="a", model=code_calls("x = 1", "submit({'total': x, 'label': 'a'})"),
                      output_type=Answer)
        assert Runner.run_sync(per_run.agent(first), "one").final_output.total == 1
        second = Agent(name="a", model=code_calls("print(x)", then="done"))
        result = Runner.run_sync(per_run.agent(second), "two")
        assert "NameError" in outputs(result)[0]  # a new run, a new sandbox

    class Deps:
        user = "ada"

    deps = Deps()
    with MemexCodeMode(per="context") as per_context:
        one = Agent(name="a", model=code_calls("y = 7", then="kept"))
        Runner.run_sync(per_context.agent(one), "first", context=deps)
        two = Agent(name="a", model=code_calls("submit({'total': y * 6, 'label': 'c'})"),
                    output_type=Answer)
        again = Runner.run_sync(per_context.agent(two), "second", context=deps)
        assert again.final_output.total == 42  # the context's sandbox, across runs
        wrapper: RunContextWrapper[Any] = RunContextWrapper(context=deps)
        assert per_context.sandbox(wrapper) is not None
        lone = Agent(name="a", model=code_calls("1"))
        with pytest.raises(UserError, match="needs a context") as info:
            Runner.run_sync(per_context.agent(lone), "no context")
        assert isinstance(info.value.__cause__, ConfigError)  # host misuse fails the run
    assert per_context.sandbox(wrapper) is None  # closed with the mode


def test_the_raw_string_custom_tool() -> None:
    raw = "items = catalog('mug')\nprint(len(items), \"quotes\" + '\\n' not in 'x')"
    model = ScriptedModel([
        [ResponseCustomToolCall(type="custom_tool_call", call_id="k0", name="run_python",
                                input=raw, id="k0")],
        [assistant_message("3 mugs")],
    ])
    with MemexCodeMode(kind="custom") as custom:
        agent = custom.agent(Agent(name="a", model=model, tools=[catalog]))
        assert type(agent.tools[0]).__name__ == "CustomTool"
        result = Runner.run_sync(agent, "How many mugs?")
        assert result.final_output == "3 mugs"
        assert outputs(result) == ["3 True"]  # the code arrived as written, no JSON escaping
    with pytest.raises(ConfigError, match="submit needs kind='function'"):
        MemexCodeMode(kind="custom", submit=True)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["subprocess", "pool"])
def test_same_semantics_on_other_backends(backend: str) -> None:
    # pandas is preloaded (outside any deadline) so only the loop meets the 2 s deadline
    with MemexCodeMode(backend=backend, timeout=2, preload=("pandas",)) as on_backend:
        model = code_calls("df = sales('west')\nn = len(df)", "while True: n += 1",
                           "submit({'total': n, 'label': 'rows'})")
        agent = on_backend.agent(Agent(name="a", model=model, tools=[sales],
                                       output_type=Answer))
        result = Runner.run_sync(agent, "Rows?")
        assert result.final_output.total == 3 and "time limit" in outputs(result)[1]


def test_egress_policy_passes_through() -> None:
    probe = ("import urllib.request\ntry:\n    urllib.request.urlopen('http://127.0.0.1:9/')\n"
             "except Exception as e:\n    submit(type(e).__name__)")
    with MemexCodeMode(policy=EgressPolicy()) as guarded:
        agent = guarded.agent(Agent(name="a", model=code_calls(probe)))
        assert Runner.run_sync(agent, "Fetch it.").final_output == "EgressDenied"


@pytest.mark.slow
def test_mounts_pass_through_read_only(tmp_path: Path) -> None:
    (tmp_path / "prices.csv").write_text("item,price\npen,1.5\ncup,4\n")
    probe = ("import pandas as pd\ndf = pd.read_csv('/data/prices.csv')\n"
             "try:\n    open('/data/new.txt', 'w')\n    wrote = 'yes'\n"
             "except OSError:\n    wrote = 'refused'\n"
             "submit(f'{df.price.sum()} {wrote}')")
    with MemexCodeMode(mounts=[Mount(host_path=tmp_path, guest_path="/data")]) as mounted:
        agent = mounted.agent(Agent(name="a", model=code_calls(probe)))
        assert Runner.run_sync(agent, "Sum the prices.").final_output == "5.5 refused"
    assert not (tmp_path / "new.txt").exists()


def test_a_cancelled_run_stops_its_cell() -> None:
    started = asyncio.Event()

    async def main(mode: MemexCodeMode) -> str:
        agent = mode.agent(Agent(name="a", model=code_calls("while True: pass")))
        task = asyncio.create_task(Runner.run(agent, "spin"))
        while not mode._sessions:  # the run's sandbox exists once run_python has started
            await asyncio.sleep(0.05)
        started.set()
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        s = next(iter(mode._sessions.values()))
        # the cell ended long before its 600 s deadline: the lock is free again
        assert await asyncio.to_thread(s.lock.acquire, True, 20)
        s.lock.release()
        r = await asyncio.to_thread(s.guest.sandbox.run, "1 + 1")
        return str(r.value)

    # The run's sandbox closes when the run's context is collected (weakref.finalize on it);
    # the cancelled run's context lives in a reference cycle, so a garbage collection at the
    # wrong moment (seen once under CI load) would close it before the check below. Hold
    # collections off while the run is checked.
    gc.disable()
    try:
        with MemexCodeMode(timeout=600) as mode:
            assert asyncio.run(main(mode)) == "2" and started.is_set()
    finally:
        gc.enable()


def test_chat_completions_over_the_real_openai_client() -> None:
    """The path a local model takes: the SDK's Chat Completions model, a real HTTP server."""
    replies = [ScriptedReply(tool_calls=(ScriptedToolCall(
                   name="run_python", arguments={"code": "r = rate('NOK')\nprint(r * 2)"}),)),
               ScriptedReply(tool_calls=(ScriptedToolCall(
                   name="run_python", arguments={"code": "submit(str(r))"}),))]
    with ScriptedLLM(replies) as srv, MemexCodeMode() as mode:
        client = AsyncOpenAI(base_url=srv.base_url, api_key="scripted")
        model = OpenAIChatCompletionsModel(model="scripted", openai_client=client)
        agent = mode.agent(Agent(name="fx", model=model, tools=[rate]))
        result = Runner.run_sync(agent, "NOK?")
        assert result.final_output == "11.5"
        assert outputs(result)[0] == "23.0"
        tools = srv.requests[0].tools or []
        assert [t["function"]["name"] for t in tools] == ["run_python"]
        assert "rate(currency: str)" in tools[0]["function"]["description"]


def test_closed_mode_refuses_new_runs() -> None:
    mode = MemexCodeMode()
    mode.close()
    agent = mode.agent(Agent(name="a", model=code_calls("1")))
    with pytest.raises(UserError, match="closed") as info:
        Runner.run_sync(agent, "go")
    assert isinstance(info.value.__cause__, ConfigError)
    with pytest.raises(ConfigError, match="per must be"):
        MemexCodeMode(per="thread")  # type: ignore[arg-type]
