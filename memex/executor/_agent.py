"""The MemEx agent: the model writes Python, the sandbox runs it, only what is printed returns.

``MemexAgent(...).run(task, inputs=...)`` drives one rollout (``_run.Run``) to a typed
``submit()`` or to a budget. ``action_space="tools"`` runs the same loop as a classic
tool-calling agent (the same prompt core, tools as JSON function calls plus ``python_exec``,
results serialized to text): the baseline, one setting away.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping

from ..backends import get_backend
from ..errors import ConfigError
from ..host_tools import Tool, ToolSet
from ._config import Aids, Budget
from ._run import Rollout, Run
from ._spec import (
    ActionSpace,
    AgentSpec,
    Hooks,
    ModelSettings,
    SandboxSpec,
    SubmitSchema,
    ToolPolicy,
)
from .llm import LLMClient
from .spawn import TreeBudget

__all__ = ["ActionSpace", "MemexAgent"]


class MemexAgent:
    """An agent whose action is a Python block run in a persistent sandbox.

    ``model`` is a model name, an ``LLMClient`` or :class:`ModelSettings` (endpoint,
    temperature, ``max_reply_tokens``, ``code_via``); ``tools`` are tools (``@tool``
    functions, Tool objects, a ToolSet); ``submit`` is the answer schema (pydantic model,
    dataclass, TypedDict, any type, a JSON Schema dict, or None for any value). ``sandbox``
    (:class:`SandboxSpec`) says where and how the code runs (limits, mounts, preload, the
    backend); ``budget`` and ``aids`` bound and help the rollout; ``tool_policy`` bounds and
    gates tool calls; ``hooks`` watch it. ``spawn`` (a
    :class:`~memex.executor.TreeBudget`, or True) lets the agent's code start sub-agents with
    ``spawn_agent()``, every rollout of the tree under that one budget (docs/spawn.md).
    ``action_space="tools"`` runs the same loop as a tool-calling agent: the baseline.
    """

    def __init__(
        self, *, model: str | LLMClient | ModelSettings | None = None,
        tools: ToolSet | Iterable[Tool | Callable[..., object]] = (),
        submit: SubmitSchema = None, instructions: str = "",
        action_space: ActionSpace = "code", sandbox: SandboxSpec | None = None,
        budget: Budget | None = None, aids: Aids | None = None,
        tool_policy: ToolPolicy | None = None, hooks: Hooks | None = None,
        spawn: TreeBudget | bool | None = None,
    ) -> None:
        if action_space not in ("code", "tools"):
            raise ConfigError(f"action_space is 'code' or 'tools', got {action_space!r}")
        toolset = tools if isinstance(tools, ToolSet) else ToolSet(tools)
        if "submit" in toolset or "python_exec" in toolset:
            raise ConfigError("'submit' and 'python_exec' are reserved tool names")
        settings = (model if isinstance(model, ModelSettings)
                    else ModelSettings(client=model) if isinstance(model, LLMClient)
                    else ModelSettings(model=model))
        box = sandbox or SandboxSpec()
        if spawn is True:
            spawn = TreeBudget()
        if spawn not in (None, False) and not isinstance(spawn, TreeBudget):
            raise ConfigError("spawn takes a TreeBudget (or True for the default one)")
        # A backend named here is made once and owned by the agent (close() ends it); a
        # Backend instance stays the caller's.
        self._owns_backend = isinstance(box.backend, str)
        self.spec = AgentSpec(
            llm=settings.llm(), tools=toolset, submit_schema=submit, instructions=instructions,
            action_space=action_space, model=settings, sandbox=box,
            backend=None if box.backend is None else get_backend(box.backend),
            budget=budget or Budget(), aids=aids or Aids(),
            tool_policy=tool_policy or ToolPolicy(), hooks=hooks or Hooks(),
            spawn=spawn if isinstance(spawn, TreeBudget) else None)

    @property
    def llm(self) -> LLMClient:
        return self.spec.llm

    # ---- public -----------------------------------------------------------------------------
    def run(self, task: str, *, inputs: Mapping[str, object] | None = None) -> Rollout:
        """Run one rollout to a valid submit() or a budget. LLM and sandbox failures end the
        rollout with ``end_reason`` saying so; only host misuse raises."""
        return Run(self.spec, task, dict(inputs or {})).go()

    async def arun(self, task: str, *, inputs: Mapping[str, object] | None = None
                   ) -> Rollout:
        """:meth:`run` on a worker thread, so many rollouts can share an event loop."""
        return await asyncio.to_thread(self.run, task, inputs=inputs)

    def system_prompt(self, inputs: Mapping[str, object]) -> str:
        """The system prompt a rollout with these inputs starts from."""
        return self.spec.system_prompt(inputs)

    def close(self) -> None:
        """Close the backend this agent made from a name (idempotent)."""
        if self._owns_backend and self.spec.backend is not None:
            self.spec.backend.close()

    def __enter__(self) -> MemexAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
