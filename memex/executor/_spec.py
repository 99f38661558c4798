"""The records a :class:`~memex.MemexAgent` is configured by, each one concern: how the model
is reached (:class:`ModelSettings`), where and how its code runs (:class:`SandboxSpec`), what
its tools may do (:class:`ToolPolicy`), who watches the rollout (:class:`Hooks`); with
``Budget`` and ``Aids`` they make the :class:`AgentSpec` that every rollout receives (a
sub-agent's is a copy with its own tools, answer schema, budget and limits)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from ..backends import Backend
from ..errors import ConfigError
from ..host_tools import Gate, Tool, ToolBudget, ToolSet
from ..runtime_wasm import AGENT_LIMITS, Limits, Mount
from . import _prompt
from ._config import Aids, Budget
from ._session import make_submit_tool
from ._trajectory import Step
from .llm import LLMClient
from .spawn import TreeBudget
from .spawn._spec import describe_input

__all__ = ["ActionSpace", "AgentSpec", "CodeVia", "Hooks", "ModelSettings", "SandboxSpec",
           "StepHook", "SubmitSchema", "TextHook", "ToolPolicy"]

ActionSpace = Literal["code", "tools"]
CodeVia = Literal["text", "tool_call"]
# What ``submit(answer)`` takes: a type (pydantic model, dataclass, TypedDict, list[int]...),
# a JSON Schema mapping, or None (any value). Any, because a type form is not a value type.
SubmitSchema = Any


class StepHook(Protocol):
    """Called with each step of a rollout as it ends."""

    def __call__(self, step: Step, /) -> None: ...


class TextHook(Protocol):
    """Called with each piece of the model's text as it streams in."""

    def __call__(self, delta: str, /) -> None: ...


@dataclass(frozen=True, kw_only=True)
class ModelSettings:
    """How the model is reached and how it replies: ``model`` (or ``$MEMEX_MODEL``) at an
    OpenAI-compatible ``base_url`` (or ``$OPENAI_BASE_URL``), at most ``max_reply_tokens``
    per reply; ``code_via="tool_call"`` asks for code as a native ``python`` function call
    instead of fenced blocks. ``client`` (an :class:`LLMClient`) replaces the first five."""

    model: str | None = None
    base_url: str | None = None
    api_key: str | None = None
    temperature: float = 0.0
    max_reply_tokens: int = 1024
    code_via: CodeVia = "text"
    client: LLMClient | None = None

    def __post_init__(self) -> None:
        if self.code_via not in ("text", "tool_call"):
            raise ConfigError(f"code_via is 'text' or 'tool_call', got {self.code_via!r}")

    def llm(self) -> LLMClient:
        if self.client is not None:
            return self.client
        return LLMClient(model=self.model, base_url=self.base_url, api_key=self.api_key,
                         temperature=self.temperature, max_reply_tokens=self.max_reply_tokens)


@dataclass(frozen=True, kw_only=True)
class SandboxSpec:
    """Where and how the agent's code runs: ``limits`` per block (default
    :data:`~memex.runtime_wasm.AGENT_LIMITS`), granted ``mounts``, modules to ``preload``,
    pure-Python ``packages`` for the guest (``Sandbox(packages=...)``), the ``backend`` (a
    name such as ``"pool"``, a Backend, or None: in-process) and how many characters of a
    block's output go back to the model (``observation_chars``)."""

    limits: Limits = AGENT_LIMITS
    mounts: tuple[Mount, ...] = ()
    preload: tuple[str, ...] = ()
    packages: tuple[str, ...] = ()
    backend: str | Backend | None = None
    observation_chars: int = 4000

    def __post_init__(self) -> None:
        object.__setattr__(self, "mounts", tuple(self.mounts))
        object.__setattr__(self, "preload", tuple(self.preload))
        if isinstance(self.packages, str):
            raise ConfigError("packages takes a list of requirements, not one string")
        object.__setattr__(self, "packages", tuple(self.packages))
        if isinstance(self.observation_chars, bool) or not isinstance(
                self.observation_chars, int) or self.observation_chars < 1:
            raise ConfigError(f"observation_chars must be an int >= 1, got "
                              f"{self.observation_chars!r}")


@dataclass(frozen=True, kw_only=True)
class ToolPolicy:
    """What the agent's tool calls may do: a per-sandbox :class:`~memex.ToolBudget` and a
    ``gate`` that sees each call first (allow, deny, or ask)."""

    budget: ToolBudget | None = None
    gate: Gate | None = None


@dataclass(frozen=True, kw_only=True)
class Hooks:
    """Who watches a rollout: ``on_step`` after each turn, ``on_text`` as the model's text
    streams in, and ``trajectory_path``, a JSONL file each rollout is appended to."""

    on_step: StepHook | None = None
    on_text: TextHook | None = None
    trajectory_path: str | os.PathLike[str] | None = None


@dataclass(frozen=True, kw_only=True)
class AgentSpec:
    """Everything one rollout needs, frozen: what :class:`~memex.MemexAgent` hands each run.
    ``backend`` is the Backend the sandbox spec named, made once."""

    llm: LLMClient
    tools: ToolSet
    submit_schema: SubmitSchema = None
    instructions: str = ""
    action_space: ActionSpace = "code"
    model: ModelSettings = field(default_factory=ModelSettings)
    sandbox: SandboxSpec = field(default_factory=SandboxSpec)
    backend: Backend | None = None
    budget: Budget = field(default_factory=Budget)
    aids: Aids = field(default_factory=Aids)
    tool_policy: ToolPolicy = field(default_factory=ToolPolicy)
    hooks: Hooks = field(default_factory=Hooks)
    spawn: TreeBudget | None = None

    # ---- the prompt -------------------------------------------------------------------------
    def system_prompt(self, inputs: Mapping[str, object]) -> str:
        parts = [_prompt.CORE]
        code = self.action_space == "code"
        parts.append(_prompt.CODE_RULES if code else _prompt.TOOLS_RULES)
        if code and self.model.code_via == "tool_call":
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
        """The worked example: built from these tools and answer schema (the fixed
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
