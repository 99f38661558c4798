"""The agent loop, LLM client, backends, trajectories and sub-agents."""

from ._agent import Aids, Budget, MemexAgent, Rollout
from ._observe import bound_text, render_observation
from ._parse import TextToolCall, extract_code, extract_tool_calls
from ._trajectory import (
    Step,
    ToolCallInfo,
    Trajectory,
    TrajectoryWriter,
    load_trajectories,
    save_trajectories,
)

__all__ = [
    "Aids",
    "Budget",
    "MemexAgent",
    "Rollout",
    "Step",
    "TextToolCall",
    "ToolCallInfo",
    "Trajectory",
    "TrajectoryWriter",
    "bound_text",
    "extract_code",
    "extract_tool_calls",
    "load_trajectories",
    "render_observation",
    "save_trajectories",
]
