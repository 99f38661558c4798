"""The two action spaces as turns of one loop: ``code_turn`` (the model's code blocks run in
the rollout's sandbox, what they print comes back) and ``tools_turn`` (the tool-calling
baseline: JSON function calls, results serialized to text). Both speak only to the small
protocols in ``_context`` (:class:`TurnContext`, :class:`TurnSession`); replies are parsed by
``_parse`` (fenced code, tool calls written as text) and observations bounded by
``_observe``; ``_order`` finds the later block that defines a name a block used too early."""

from ._code import code_turn
from ._context import TurnContext, TurnSession
from ._observe import NO_OUTPUT, bound_text, render_observation, trim_traceback
from ._order import defined_by_later, missing_name
from ._parse import TextToolCall, cut_after_code, extract_code, extract_tool_calls
from ._tools import tools_turn

__all__ = [
    "NO_OUTPUT",
    "TextToolCall",
    "TurnContext",
    "TurnSession",
    "bound_text",
    "code_turn",
    "cut_after_code",
    "defined_by_later",
    "extract_code",
    "extract_tool_calls",
    "missing_name",
    "render_observation",
    "tools_turn",
    "trim_traceback",
]
