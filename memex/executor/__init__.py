"""The agent loop, LLM client, backends, trajectories and sub-agents."""

from ._agent import Aids, Budget, MemexAgent, Rollout
from ._llm import Completion, LLMClient, Price, ToolCall, Usage
from ._local_model import LocalModel, ModelSpec, fetch_model
from ._observe import bound_text, render_observation
from ._parse import TextToolCall, extract_code, extract_tool_calls
from ._scripted import (
    RecordedRequest,
    ScriptedError,
    ScriptedLLM,
    ScriptedReply,
    ScriptedToolCall,
)
from ._spawn_budget import FAILURE_KINDS, TreeBudget
from ._spawn_spec import GuestObject
from ._trajectory import (
    Step,
    ToolCallInfo,
    Trajectory,
    TrajectoryWriter,
    load_trajectories,
    save_trajectories,
)

__all__ = [
    "FAILURE_KINDS",
    "Aids",
    "Budget",
    "Completion",
    "GuestObject",
    "LLMClient",
    "LocalModel",
    "MemexAgent",
    "ModelSpec",
    "Price",
    "RecordedRequest",
    "Rollout",
    "ScriptedError",
    "ScriptedLLM",
    "ScriptedReply",
    "ScriptedToolCall",
    "Step",
    "TextToolCall",
    "ToolCall",
    "ToolCallInfo",
    "Trajectory",
    "TrajectoryWriter",
    "TreeBudget",
    "Usage",
    "bound_text",
    "extract_code",
    "extract_tool_calls",
    "fetch_model",
    "load_trajectories",
    "render_observation",
    "save_trajectories",
]
