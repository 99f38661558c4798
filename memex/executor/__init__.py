"""The agent loop, LLM client, backends, trajectories and sub-agents."""

from ._agent import Aids, Budget, MemexAgent, Rollout
from ._backend import Backend, get_backend
from ._backend_inprocess import InProcessBackend
from ._backend_pool import PoolBackend, PoolStats, TenantQuota
from ._backend_ray import RayBackend, RayCheckpoint, RaySandbox
from ._backend_subprocess import ProcessCheckpoint, ProcessSandbox, SubprocessBackend
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
    "Backend",
    "Budget",
    "Completion",
    "GuestObject",
    "InProcessBackend",
    "LLMClient",
    "LocalModel",
    "MemexAgent",
    "ModelSpec",
    "PoolBackend",
    "PoolStats",
    "Price",
    "ProcessCheckpoint",
    "ProcessSandbox",
    "RayBackend",
    "RayCheckpoint",
    "RaySandbox",
    "RecordedRequest",
    "Rollout",
    "ScriptedError",
    "ScriptedLLM",
    "ScriptedReply",
    "ScriptedToolCall",
    "Step",
    "SubprocessBackend",
    "TenantQuota",
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
    "get_backend",
    "load_trajectories",
    "render_observation",
    "save_trajectories",
]
