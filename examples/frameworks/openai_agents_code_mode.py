"""An OpenAI Agents SDK agent switched from tool calling to code-as-action by one call,
``MemexCodeMode().agent(agent)``: its function tools move into a persistent sandbox behind one
``run_python`` tool (the tools themselves unchanged), and ``submit()`` ends the run.

Run: ``python examples/frameworks/openai_agents_code_mode.py [--local]`` (needs the
``openai-agents`` extra). It asks the same question both ways, through the SDK's Chat
Completions model (what a local model speaks).
"""

from __future__ import annotations

import contextlib
from typing import Any

from _common import BY_CODE, BY_TOOLS, EXPECTED, QUESTION, endpoint, parser, sales
from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

from memex import Limits
from memex.integrations.openai_agents import MemexCodeMode

sales_tool = function_tool(sales)


def make_agent(base_url: str, model: str) -> Agent[Any]:
    client = AsyncOpenAI(base_url=base_url, api_key="local")
    return Agent(name="analyst", instructions="Answer with the region and its total.",
                 model=OpenAIChatCompletionsModel(model=model, openai_client=client),
                 tools=[sales_tool])


def main() -> None:
    args = parser(__doc__ or "").parse_args()
    set_tracing_disabled(True)  # offline: no trace export
    with contextlib.ExitStack() as stack:
        base_url, model = endpoint(args, stack, BY_TOOLS)
        result = Runner.run_sync(make_agent(base_url, model), QUESTION)
        print(f"tool calling: {result.final_output!r} after {len(result.raw_responses)} "
              "model calls")
    with contextlib.ExitStack() as stack:
        base_url, model = endpoint(args, stack, BY_CODE)
        mode = stack.enter_context(MemexCodeMode(limits=Limits(timeout=10)))
        result = Runner.run_sync(mode.agent(make_agent(base_url, model)), QUESTION)
        print(f"code mode:    {result.final_output!r} after {len(result.raw_responses)} "
              f"model calls (expected {EXPECTED!r})")
        for rec in mode.tool_calls:
            print(f"  tool call from the sandbox: {rec.tool}({rec.arguments}) -> {rec.outcome}")


if __name__ == "__main__":
    main()
