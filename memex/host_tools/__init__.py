"""Typed host tools over the msgpack door: tools defined from typed Python callables or OpenAI
function definitions, grouped in tool sets, shown to the guest as real Python functions (module
``tools``) and served through the door with validation, budgets, a gate and call records.
The wire format is docs/abi.md."""

from ._host import GateDecision, ToolBudget, ToolCallRecord, ToolHost, ToolRequest
from ._tool import Tool, ToolParam, tool
from ._toolset import ToolSet

__all__ = [
    "GateDecision",
    "Tool",
    "ToolBudget",
    "ToolCallRecord",
    "ToolHost",
    "ToolParam",
    "ToolRequest",
    "ToolSet",
    "tool",
]
