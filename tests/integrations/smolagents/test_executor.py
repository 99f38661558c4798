"""smolagents' real agent loop (``CodeAgent``, ``ToolCallingAgent``) with its code run by
``MemexExecutor``, the model scripted (``ScriptedLLM``) behind smolagents' own
``OpenAIServerModel``: state across steps, typed tool values and variables, final_answer,
limits reported to the model with the session going on, managed agents, a tool holding a live
MCP connection, the tool-calling/code switch, and other backends."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from smolagents import CodeAgent, OpenAIServerModel, Tool, ToolCallingAgent, tool

from memex import EgressPolicy, Limits, ToolSet
from memex.executor.llm import ScriptedLLM, ScriptedReply, ScriptedToolCall
from memex.integrations.smolagents import MemexExecutor

MCP_SERVER = str(Path(__file__).parents[2] / "host_tools" / "mcp" / "mcp_test_server.py")


@tool
def sales(region: str) -> pd.DataFrame:
    """Sales rows of a region.

    Args:
        region: The region's name.
    """
    return pd.DataFrame({"region": [region] * 3, "amount": [10, 20, 30]})


def code(text: str) -> str:
    return f"Thought: next step.\n<code>\n{text}\n</code>"


def model(srv: ScriptedLLM) -> OpenAIServerModel:
    return OpenAIServerModel(model_id="scripted", api_base=srv.base_url, api_key="scripted")


@pytest.fixture
def executor() -> Iterator[MemexExecutor]:
    # pandas is preloaded (outside any deadline): only the loops are meant to meet the 3 s
    ex = MemexExecutor(limits=Limits(timeout=3, memory=256 << 20), preload=("pandas",))
    yield ex
    ex.cleanup()
    ex.cleanup()  # idempotent


def observations(agent: CodeAgent) -> list[str]:
    return [str(getattr(s, "observations", "") or getattr(s, "error", "") or "")
            for s in agent.memory.steps[1:]]


def test_state_typed_values_variables_and_final_answer(executor: MemexExecutor) -> None:
    script = [
        code("df = sales('north')\nprint(type(df).__name__, df.amount.dtype, "
             "type(targets).__name__)"),
        code("total = int(df.amount.sum()) + bonus\nprint(total)"),
        code("final_answer({'total': total, 'rows': len(targets)})\nprint('not reached')"),
    ]
    targets = pd.DataFrame({"region": ["north", "south"], "goal": [50, 70]})
    with ScriptedLLM(script) as srv:
        agent = CodeAgent(tools=[sales], model=model(srv), executor=executor, max_steps=5)
        answer = agent.run("Total north sales plus the bonus.",
                           additional_args={"bonus": 5, "targets": targets})
    obs = observations(agent)
    assert answer == {"total": 65, "rows": 2}, (answer, obs)  # the steps say why not
    assert "DataFrame int64 DataFrame" in obs[0]  # the tool's value and a variable, typed
    assert "65" in obs[1]
    assert "not reached" not in obs[2]  # final_answer ended the code there
    assert [c.tool for c in executor.tool_calls] == ["sales", "final_answer"]


@pytest.mark.slow
def test_limits_are_errors_for_the_model_and_the_session_goes_on(
        executor: MemexExecutor) -> None:
    script = [
        code("kept = 41"),
        code("while True:\n    kept += 1"),
        code("hog = bytearray(1 << 30)"),
        code("final_answer(kept + 1)"),
    ]
    with ScriptedLLM(script) as srv:
        agent = CodeAgent(tools=[], model=model(srv), executor=executor, max_steps=6)
        answer = agent.run("Keep going.")
    assert answer == 42  # the stopped loop was rolled back: kept is still 41
    obs = observations(agent)
    assert "stopped by its time limit (deadline)" in obs[1]
    assert "variables are as they were before this code" in obs[1]
    assert "MemoryError" in obs[2]
    # the error reached the model in the next request, as smolagents shows errors
    assert "time limit" in str(srv.requests[2].messages)


@pytest.mark.slow
def test_a_managed_agent_and_a_tool_with_a_live_mcp_connection(executor: MemexExecutor
                                                               ) -> None:
    class Weather(Tool):
        name = "weather"
        description = "Today's high in a city, from the weather service."
        inputs = {"city": {"type": "string", "description": "the city"}}  # noqa: RUF012
        output_type = "number"

        def __init__(self, tools: ToolSet) -> None:
            super().__init__()
            self.remote = tools["get-weather"]  # holds the MCP client session

        def forward(self, city: str) -> float:
            return float(self.remote.checker.returns(self.remote.handler(city=city)).high)

    with ToolSet.from_mcp(sys.executable, args=[MCP_SERVER]) as mcp_tools, \
            ScriptedLLM([code("final_answer(6 * 7)")]) as helper_srv, \
            ScriptedLLM([code("high = weather('Oslo')\nhelp_said = helper(task='compute')\n"
                              "print(high, help_said)"),
                         code("final_answer([high, help_said])")]) as srv:
        helper = CodeAgent(tools=[], model=model(helper_srv), name="helper",
                           description="Computes things.", max_steps=2)
        agent = CodeAgent(tools=[Weather(mcp_tools)], model=model(srv), executor=executor,
                          managed_agents=[helper], max_steps=4)
        answer = agent.run("Weather and a computation.")
    assert answer[0] == 21.0 and "42" in str(answer[1])


@pytest.mark.slow
def test_the_same_tool_in_tool_calling_and_in_code_mode() -> None:
    calls = [ScriptedReply(tool_calls=(ScriptedToolCall(name="sales",
                                                        arguments={"region": "east"}),)),
             ScriptedReply(tool_calls=(ScriptedToolCall(name="final_answer",
                                                        arguments={"answer": 60}),))]
    with ScriptedLLM(calls) as srv:
        tool_agent = ToolCallingAgent(tools=[sales], model=model(srv), max_steps=3)
        by_tools = tool_agent.run("East sales total?")
    script = [code("final_answer(int(sales('east').amount.sum()))")]
    with ScriptedLLM(script) as srv, MemexExecutor() as ex:
        code_agent = CodeAgent(tools=[sales], model=model(srv), executor=ex, max_steps=3)
        by_code = code_agent.run("East sales total?")
    assert by_tools == by_code == 60


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["subprocess", "pool"])
def test_same_semantics_on_other_backends(backend: str) -> None:
    script = [code("df = sales('west')\nn = len(df)"),
              code("while True: n += 1"),
              code("final_answer(n)")]
    # pandas is preloaded outside any deadline: only the loop is meant to meet the 2 s one
    # (under load, importing it for the first cell's DataFrame took longer than that)
    with ScriptedLLM(script) as srv, MemexExecutor(limits=Limits(timeout=2), preload=("pandas",),
                                                   backend=backend) as ex:
        agent = CodeAgent(tools=[sales], model=model(srv), executor=ex, max_steps=4)
        assert agent.run("Rows?") == 3
        assert "time limit" in observations(agent)[1]


def test_egress_policy_passes_through() -> None:
    script = [code("import urllib.request\ntry:\n    urllib.request.urlopen('http://127.0.0.1:9/')"
                   "\nexcept Exception as e:\n    final_answer(type(e).__name__)")]
    with ScriptedLLM(script) as srv, MemexExecutor(policy=EgressPolicy()) as ex:
        agent = CodeAgent(tools=[], model=model(srv), executor=ex, max_steps=2)
        assert agent.run("Fetch it.") == "EgressDenied"
    assert ex.egress is not None and ex.egress.records[0].decision == "deny"


@pytest.mark.slow
def test_final_answer_returns_an_image_and_errors_are_smolagents_own() -> None:
    """A PIL image given to final_answer arrives as a PIL image (as from smolagents' remote
    executors), inside containers too; one past the pixel bound is refused before its pixels
    are decoded; a failing step raises smolagents' InterpreterError and AgentError (its
    local and its remote executors' types), a deadline its ExecutionTimeoutError."""
    from PIL import Image
    from smolagents.default_tools import FinalAnswerTool
    from smolagents.local_python_executor import ExecutionTimeoutError, InterpreterError
    from smolagents.utils import AgentError

    from memex.errors import MemexError
    from memex.integrations.smolagents import _executor

    with MemexExecutor(limits=Limits(timeout=20, memory=512 << 20)) as ex:
        ex.send_tools({"final_answer": FinalAnswerTool()})
        out = ex("from PIL import Image\nimg = Image.new('RGB', (4, 3), (255, 0, 0))\n"
                 "final_answer(img)")
        assert out.is_final_answer and isinstance(out.output, Image.Image)
        assert out.output.size == (4, 3) and out.output.getpixel((1, 1)) == (255, 0, 0)
        out = ex("final_answer({'chart': img, 'n': 2})")
        assert isinstance(out.output["chart"], Image.Image) and out.output["n"] == 2
        with pytest.raises(InterpreterError, match="ZeroDivisionError"):
            ex("1 / 0")
        with pytest.raises(AgentError) as caught:  # what its remote executors raise, too
            ex("1 / 0")
        assert isinstance(caught.value, MemexError)
        with pytest.raises(InterpreterError, match="cannot be opened on the host"):
            big = _executor.MAX_IMAGE_PIXELS // 1000 + 1
            ex(f"final_answer(Image.new('1', (1000, {big})))")
        assert ex("2 + 2").output == 4  # the session goes on (its value an object)
    with MemexExecutor(limits=Limits(timeout=1)) as ex, \
            pytest.raises(ExecutionTimeoutError, match="time limit"):
        ex("while True: pass")
