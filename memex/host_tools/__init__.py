"""Typed host tools over the msgpack door: tools defined from typed Python callables or OpenAI
function definitions, grouped in tool sets, shown to the guest as real Python functions (module
``tools``) and served through the door with validation, budgets, a gate and call records.
The wire format is docs/abi.md. ``Egress`` serves network requests of the guest under an
egress policy (docs/egress.md)."""

from ._egress_host import Egress, EgressRecord
from ._egress_policy import EgressDecision, EgressLimits, EgressPolicy, EgressRule, EgressSecret
from ._host import GateDecision, ToolBudget, ToolCallRecord, ToolHost, ToolRequest
from ._tool import Tool, ToolParam, tool
from ._toolset import ToolSet

__all__ = [
    "Egress",
    "EgressDecision",
    "EgressLimits",
    "EgressPolicy",
    "EgressRecord",
    "EgressRule",
    "EgressSecret",
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
