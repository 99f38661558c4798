"""The MemEx agent: the model writes Python, the sandbox runs it, only what is printed returns.

``MemexAgent(...).run(task, inputs=...)`` drives one rollout (``_run.Run``) to a typed
``submit()`` or to a budget. ``action_space="tools"`` runs the same loop as a classic
tool-calling agent (the same prompt core, tools as JSON function calls plus ``python_exec``,
results serialized to text): the baseline, one setting away.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

from ..backends import Backend, get_backend
from ..errors import ConfigError
from ..host_tools import Tool, ToolBudget, ToolSet
from ..runtime_wasm import AGENT_LIMITS, Limits, Mount
from . import _prompt
from ._config import Aids, Budget
from ._run import Rollout, Run
from ._session import make_submit_tool
from ._trajectory import Step
from .llm import LLMClient
from .spawn import TreeBudget
from .spawn._spec import describe_input

__all__ = ["ActionSpace", "MemexAgent"]

ActionSpace = Literal["code", "tools"]


class MemexAgent:
    """An agent whose action is a Python block run in a persistent sandbox.

    ``model`` is a model name or an ``LLMClient``; ``tools`` are tools (``@tool`` functions,
    Tool objects, a ToolSet); ``submit`` is the answer schema (pydantic model, dataclass,
    TypedDict, any type, a JSON Schema dict, or None for any value). ``backend`` chooses where
    sandboxes live (a name or a Backend; default in-process). ``code_via="tool_call"`` asks
    for code as a native ``python`` function call instead of fenced blocks. ``spawn`` (a
    :class:`~memex.executor.TreeBudget`, or True) lets the agent's code start sub-agents with
    ``spawn_agent()``, every rollout of the tree under that one budget (docs/spawn.md).
    """

    def __init__(
        self, *, model: Any = None, tools: ToolSet | Iterable[Tool | Callable[..., Any]] = (),
        submit: Any = None, instructions: str = "", action_space: ActionSpace = "code",
        code_via: Literal["text", "tool_call"] = "text", limits: Limits | None = None,
        budget: Budget | None = None, aids: Aids | None = None, mounts: Iterable[Mount] = (),
        preload: Iterable[str] = (), tool_budget: ToolBudget | None = None, gate: Any = None,
        backend: Any = None, observation_chars: int = 4000,
        trajectory_path: str | None = None, on_step: Callable[[Step], None] | None = None,
        on_text: Callable[[str], None] | None = None, base_url: str | None = None,
        api_key: str | None = None,
        temperature: float = 0.0, max_reply_tokens: int = 1024, spawn: Any = None,
    ) -> None:
        if action_space not in ("code", "tools"):
            raise ConfigError(f"action_space is 'code' or 'tools', got {action_space!r}")
        if code_via not in ("text", "tool_call"):
            raise ConfigError(f"code_via is 'text' or 'tool_call', got {code_via!r}")
        self.tools = tools if isinstance(tools, ToolSet) else ToolSet(tools)
        if "submit" in self.tools or "python_exec" in self.tools:
            raise ConfigError("'submit' and 'python_exec' are reserved tool names")
        self.submit_schema = submit
        self.instructions = instructions
        self.action_space: ActionSpace = action_space
        self.code_via = code_via
        self.limits = limits or AGENT_LIMITS
        self.budget = budget or Budget()
        self.aids = aids or Aids()
        self.mounts = tuple(mounts)
        self.preload = tuple(preload)
        self.tool_budget = tool_budget
        self.gate = gate
        self.observation_chars = observation_chars
        self.trajectory_path = trajectory_path
        self.on_step = on_step
        self.on_text = on_text
        # A backend named here is made once and owned by the agent (close() ends it); a
        # Backend instance stays the caller's.
        self.backend: Backend | None = None if backend is None else get_backend(backend)
        self._owns_backend = isinstance(backend, str)
        if spawn is True:
            spawn = TreeBudget()
        if spawn not in (None, False) and not isinstance(spawn, TreeBudget):
            raise ConfigError("spawn takes a TreeBudget (or True for the default one)")
        self.spawn: TreeBudget | None = spawn or None
        if isinstance(model, LLMClient):
            self.llm = model
        else:
            self.llm = LLMClient(model=model, base_url=base_url, api_key=api_key,
                                 temperature=temperature, max_reply_tokens=max_reply_tokens)

    # ---- public -----------------------------------------------------------------------------
    def run(self, task: str, *, inputs: Mapping[str, Any] | None = None) -> Rollout:
        """Run one rollout to a valid submit() or a budget. LLM and sandbox failures end the
        rollout with ``end_reason`` saying so; only host misuse raises."""
        return Run(self, task, dict(inputs or {})).go()

    async def arun(self, task: str, *, inputs: Mapping[str, Any] | None = None) -> Rollout:
        """:meth:`run` on a worker thread, so many rollouts can share an event loop."""
        return await asyncio.to_thread(self.run, task, inputs=inputs)

    def close(self) -> None:
        """Close the backend this agent made from a name (idempotent)."""
        if self._owns_backend and self.backend is not None:
            self.backend.close()

    def __enter__(self) -> MemexAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- prompt -----------------------------------------------------------------------------
    def system_prompt(self, inputs: Mapping[str, Any]) -> str:
        parts = [_prompt.CORE]
        code = self.action_space == "code"
        parts.append(_prompt.CODE_RULES if code else _prompt.TOOLS_RULES)
        if code and self.code_via == "tool_call":
            parts.append(_prompt.PYTHON_TOOL_RULE)
        if code and len(self.tools):
            parts.append("Tools (Python functions):\n" + self.tools.catalogue())
        schema = _prompt.render_schema(self.submit_schema)
        parts.append(f"submit(answer) takes: {schema}" if code
                     else f"The submit function's `answer` takes: {schema}")
        if inputs:
            where = "Variables already defined in the session" if code else "Data available"
            lines = [f"- {k}: {describe_input(v)}" for k, v in inputs.items()]
            if not code:
                lines.append("(these are variables of the python_exec session)")
            parts.append(f"{where}:\n" + "\n".join(lines))
        if self.aids.example:
            parts.append(self._example(code))
        if not code:
            parts.append(_prompt.TEXT_CALL_HINT)
        if self.instructions:
            parts.append(self.instructions.strip())
        return "\n\n".join(parts)

    def _example(self, code: bool) -> str:
        """The worked example: built from this agent's tools and answer schema (the fixed
        ``orders()`` one with ``Aids.example_from_tools=False``, for comparison)."""
        if not self.aids.example_from_tools:
            return _prompt.CODE_EXAMPLE if code else _prompt.TOOLS_EXAMPLE
        # A tool that needs no arguments (a listing, a schema) is the natural first call.
        tools = sorted(self.tools, key=lambda t: any(p.required for p in t.params))
        call = _example_call(tools[0], self.tools.aliases, code) if tools else None
        return (_prompt.code_example if code else _prompt.tools_example)(call,
                                                                         self.submit_schema)

    def tool_definitions(self) -> list[dict[str, Any]]:
        """The JSON function tools offered in the tool-calling action space."""
        defs = [t.to_openai() for t in self.tools]
        defs.append({"type": "function", "function": {
            "name": "python_exec",
            "description": "Run Python code in a persistent session; returns what it prints "
                           "and the value of its last line.",
            "parameters": {"type": "object", "properties": {"code": {"type": "string"}},
                           "required": ["code"]}}})
        defs.append(make_submit_tool(self.submit_schema, lambda _a: None).to_openai())
        return defs


def _example_call(tool: Tool, aliases: Mapping[str, str], code: bool) -> str:
    """``tool`` called with made-up values for its required parameters: ``name(a="...")``
    in code, ``name`` with a JSON object for function calling."""
    required = [p for p in tool.params if p.required]
    if code:
        inner = ", ".join(f"{p.py_name}=" + ('"..."' if p.annotation is str
                                             else _prompt.placeholder(p.annotation))
                          for p in required)
        return f"{aliases.get(tool.name, tool.name)}({inner})"
    args = {p.name: "..." if p.annotation is str
            else json.loads(_prompt.placeholder(p.annotation, style="json")) for p in required}
    return f"`{tool.name}` with {json.dumps(args)}"
