"""The agent: ``MemexAgent`` runs rollouts (``_run``) whose turns are the loops' (``loops``:
the code action space and the tool-calling baseline), talking to a model (``llm``), with
sub-agents (``spawn``) under one tree budget, recorded as trajectories (``_trajectory``,
rendered by ``_render``). The prompt texts are in ``_prompt``; a rollout's sandbox side
(tools through the door, inputs, the host-validated ``submit``) is ``_session``, whose guest
half is ``guest/agent_prelude.py``."""

from ._agent import ActionSpace, MemexAgent
from ._config import Aids, Budget, Caps, EndReason
from ._render import render_step, render_trajectory
from ._run import Rollout
from ._spec import AgentSpec, Hooks, ModelSettings, SandboxSpec, ToolPolicy
from ._trajectory import Step, ToolCallInfo, Trajectory, load_trajectories, save_trajectories
from .spawn import TreeBudget

__all__ = [
    "ActionSpace",
    "AgentSpec",
    "Aids",
    "Budget",
    "Caps",
    "EndReason",
    "Hooks",
    "MemexAgent",
    "ModelSettings",
    "Rollout",
    "SandboxSpec",
    "Step",
    "ToolCallInfo",
    "ToolPolicy",
    "Trajectory",
    "TreeBudget",
    "load_trajectories",
    "render_step",
    "render_trajectory",
    "save_trajectories",
]
