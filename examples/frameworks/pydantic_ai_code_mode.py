"""A pydantic-ai agent switched from tool calling to code-as-action by one argument,
``capabilities=[MemexCodeMode()]``: the same tools, now typed functions in a persistent
sandbox behind one ``run_python`` tool, with ``submit()`` for the output type.

Run: ``python examples/frameworks/pydantic_ai_code_mode.py [--local]`` (needs the
``pydantic-ai`` extra). It asks the same question both ways.
"""

from __future__ import annotations

import contextlib
from typing import Any

from _common import BY_CODE, BY_TOOLS, EXPECTED, QUESTION, endpoint, parser, sales
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from memex import Limits
from memex.integrations.pydantic_ai import MemexCodeMode


def make_agent(base_url: str, model: str, capabilities: list[Any]) -> Agent[None, str]:
    llm = OpenAIChatModel(model, provider=OpenAIProvider(base_url=base_url, api_key="local"))
    agent: Agent[None, str] = Agent(llm, output_type=str, capabilities=capabilities,
                                    instructions="Answer with the region and its total.")

    agent.tool_plain(sales)

    return agent


def main() -> None:
    args = parser(__doc__ or "").parse_args()
    with contextlib.ExitStack() as stack:
        base_url, model = endpoint(args, stack, BY_TOOLS)
        result = make_agent(base_url, model, []).run_sync(QUESTION)
        print(f"tool calling: {result.output!r} in {len(result.all_messages())} messages")
    with contextlib.ExitStack() as stack:
        base_url, model = endpoint(args, stack, BY_CODE)
        mode = stack.enter_context(contextlib.closing(MemexCodeMode(limits=Limits(timeout=10))))
        result = make_agent(base_url, model, [mode]).run_sync(QUESTION)
        print(f"code mode:    {result.output!r} in {len(result.all_messages())} messages "
              f"(expected {EXPECTED!r})")


if __name__ == "__main__":
    main()
