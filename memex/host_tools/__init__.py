"""Typed host tools over the msgpack door: tools defined from typed Python callables or OpenAI
function definitions, grouped in tool sets, shown to the guest as real Python functions (module
``tools``) and served through the door with validation, budgets, a gate and call records.
The wire format is docs/abi.md (``encode``/``decode`` are its host side). ``egress`` serves the
guest's network requests under an egress policy (docs/egress.md); ``ToolSet.from_mcp`` makes an
MCP server's tools typed guest functions (docs/mcp.md; the ``mcp`` extra).

This layer imports ``memex.runtime_wasm`` (the door) and nothing of ``memex.backends`` or
``memex.executor``: a ``ToolHost`` attaches to any ``SandboxAPI``.
"""

from ._codec import DecodeError, EncodeError, RecordFields, decode, encode
from ._host import Gate, GateDecision, ToolBudget, ToolCallRecord, ToolHost, ToolRequest
from ._mcp_content import McpAudio, McpImage, McpResource, McpResourceLink
from ._params import ArgumentsInvalid, ReturnInvalid, ToolParam
from ._tool import Tool, tool
from ._toolset import ToolSet
from .egress._host import Egress, EgressRecord
from .egress._policy import EgressPolicy
from .egress._rules import EgressDecision, EgressLimits, EgressRule, EgressSecret

__all__ = [
    "ArgumentsInvalid",
    "DecodeError",
    "Egress",
    "EgressDecision",
    "EgressLimits",
    "EgressPolicy",
    "EgressRecord",
    "EgressRule",
    "EgressSecret",
    "EncodeError",
    "Gate",
    "GateDecision",
    "McpAudio",
    "McpImage",
    "McpResource",
    "McpResourceLink",
    "RecordFields",
    "ReturnInvalid",
    "Tool",
    "ToolBudget",
    "ToolCallRecord",
    "ToolHost",
    "ToolParam",
    "ToolRequest",
    "ToolSet",
    "decode",
    "encode",
    "tool",
]
