"""What the framework examples share: one question, one tool, and the model that answers it.

By default the model is a scripted chat-completions server on 127.0.0.1 (``ScriptedLLM``:
offline, deterministic, replies written the way that framework expects). With ``--local`` the
examples talk to a real model instead: ``--base-url``/``OPENAI_BASE_URL`` if set, else the
local model served by llama.cpp (``examples/_llm_choice.py``; needs the ``local`` extra).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Any

from memex.executor.llm import ScriptedLLM, ScriptedReply, ScriptedToolCall

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _llm_choice  # examples/_llm_choice.py, beside this folder

SALES = {"east": [120, 80], "west": [200, 150, 60], "north": [90, 40, 30]}
QUESTION = ("Which region (east, west or north) has the highest total sales, and what is that "
            "total? Use the sales tool.")
EXPECTED = "west 410"


def sales(region: str) -> list[dict[str, Any]]:
    """The sales rows of a region (east, west or north): a list of dicts like
    {"region": "east", "amount": 120}."""
    return [{"region": region, "amount": a} for a in SALES[region]]


def call(name: str, **arguments: Any) -> ScriptedReply:
    """A scripted reply that calls one tool."""
    return ScriptedReply(tool_calls=(ScriptedToolCall(name=name, arguments=arguments),))


# What a model sends, as tool calls and as code through run_python (the code-mode adapters).
BY_TOOLS = [call("sales", region="east"), call("sales", region="west"),
            call("sales", region="north"), ScriptedReply(content="west 410")]
BY_CODE = [
    call("run_python", code="totals = {r: sum(row['amount'] for row in sales(r)) "
                            "for r in ('east', 'west', 'north')}\nprint(totals)"),
    call("run_python", code="best = max(totals, key=totals.get)\n"
                            "submit(f'{best} {totals[best]}')"),
]


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--local", action="store_true",
                   help="a real model (an endpoint, else the local one) instead of the script")
    _llm_choice.add_arguments(p)
    return p


def endpoint(args: argparse.Namespace, stack: contextlib.ExitStack,
             script: list[ScriptedReply]) -> tuple[str, str]:
    """``(base_url, model)`` of the model the example talks to."""
    if not args.local:
        srv = stack.enter_context(ScriptedLLM(script))
        return srv.base_url, srv.model
    client = _llm_choice.open_llm(args, stack)
    return client.base_url, client.model
