"""smolagents' CodeAgent with its code run in MemEx: one argument, ``executor=``.

The agent's tool stays on the host and is called from the sandboxed code with typed values;
the code runs under hard caps with no network; ``final_answer`` ends the run as smolagents
expects. Run: ``python examples/frameworks/smolagents_executor.py [--local]`` (needs the
``smolagents`` extra).
"""

from __future__ import annotations

import contextlib

import _common
from _common import EXPECTED, QUESTION, endpoint, parser
from smolagents import CodeAgent, OpenAIServerModel, tool

from memex import Limits
from memex.executor.llm import ScriptedReply
from memex.integrations.smolagents import MemexExecutor


@tool
def sales(region: str) -> list:
    """The sales rows of a region: a list of dicts like {"region": "east", "amount": 120}.

    Args:
        region: east, west or north.
    """
    return _common.sales(region)


def code(text: str) -> ScriptedReply:
    return ScriptedReply(content=f"Thought: next step.\n<code>\n{text}\n</code>")


SCRIPT = [
    code("totals = {r: sum(row['amount'] for row in sales(r)) for r in ('east', 'west', "
         "'north')}\nprint(totals)"),
    code("best = max(totals, key=totals.get)\nfinal_answer(f'{best} {totals[best]}')"),
]


def main() -> None:
    args = parser(__doc__ or "").parse_args()
    with contextlib.ExitStack() as stack:
        base_url, model_id = endpoint(args, stack, SCRIPT)
        # llama.cpp's server takes message content as plain text only
        model = OpenAIServerModel(model_id=model_id, api_base=base_url, api_key="local",
                                  flatten_messages_as_text=True, temperature=0,
                                  max_tokens=args.max_reply_tokens)
        executor = stack.enter_context(MemexExecutor(limits=Limits(timeout=10,
                                                                   memory=512 << 20)))
        agent = CodeAgent(tools=[sales], model=model, executor=executor, max_steps=6)
        answer = agent.run(QUESTION)
        print(f"answer: {answer!r} (expected {EXPECTED!r})")
        for call in executor.tool_calls:
            print(f"  tool call from the sandbox: {call.tool}({call.arguments}) -> "
                  f"{call.outcome}")


if __name__ == "__main__":
    main()
