"""Code mode for any pydantic-ai ``Agent`` in one line:
``Agent(model, tools=[...], capabilities=[MemexCodeMode()])``.

The model sees one tool, ``run_python``, whose code runs in a persistent MemEx sandbox (one per
run, or one per conversation); the agent's own tools become typed Python functions inside the
guest, their calls checked against each tool's schema and dispatched to the agent's real tools
on the host (so the tools stay unchanged). ``submit(answer)`` in the guest, checked against
the agent's output type, ends the run with that answer. Tools a selector leaves out stay
ordinary tool calls.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from pydantic import ValidationError
from pydantic_ai import RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.result import FinalResult
from pydantic_ai.tools import ToolDefinition, matches_tool_selector
from pydantic_ai.toolsets import AbstractToolset, ToolsetTool, WrapperToolset
from pydantic_core import SchemaValidator, core_schema
from pydantic_graph import End

from ...backends import Backend
from ...executor.internal import render_observation
from ...host_tools import EgressPolicy, Tool, ToolCallRecord, ToolHost, ToolSet
from ...runtime_wasm import AGENT_LIMITS, Limits, Mount, TurnStatus
from .._sandbox import (
    ACCEPTED,
    NO_OUTPUT,
    Guest,
    SandboxSettings,
    output_adapter,
    submit_tool,
)

__all__ = ["MemexCodeMode", "MemexToolset"]

RUN_PYTHON = "run_python"
_CODE_SCHEMA = {"type": "object", "properties": {"code": {
    "type": "string", "description": "Python source; runs in the persistent session"}},
    "required": ["code"], "additionalProperties": False}
_ARGS = SchemaValidator(core_schema.typed_dict_schema(
    {"code": core_schema.typed_dict_field(core_schema.str_schema())}))


@dataclass(kw_only=True, eq=False)
class _Session:
    guest: Guest
    names: tuple[str, ...] = ()
    answer: list[Any] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def close(self) -> None:
        self.guest.close()


@dataclass
class MemexCodeMode(AbstractCapability[Any]):
    """The capability: ``tools`` selects the tools that move into the sandbox (``"all"``, a
    list of names, or a predicate); ``limits``/``mounts``/``preload`` as for
    ``memex.Sandbox``; ``policy`` the guest's egress policy; ``backend`` where sandboxes live;
    ``per="conversation"`` keeps one sandbox across the runs of a conversation (close the
    capability to end them); ``submit`` offers ``submit(answer)`` for the output type."""

    tools: Any = "all"
    limits: Limits | None = None
    mounts: Sequence[Mount] = ()
    preload: Sequence[str] = ()
    policy: EgressPolicy | str | None = None
    backend: str | Backend | None = None
    per: Literal["run", "conversation"] = "run"
    submit: bool = True
    _output: Any = field(default=str, init=False, repr=False)
    _sessions: dict[str, _Session] = field(default_factory=dict, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _settings: SandboxSettings | None = field(default=None, init=False, repr=False)
    _calls: deque[ToolCallRecord] = field(default_factory=lambda: deque(maxlen=1000),
                                          init=False, repr=False)

    @property
    def tool_calls(self) -> list[ToolCallRecord]:
        """Every call guest code made to the agent's tools (the last 1,000)."""
        with self._lock:
            return list(self._calls)

    def _record(self, rec: ToolCallRecord) -> None:
        with self._lock:  # (tool_calls copies it under the lock)
            self._calls.append(rec)  # a bounded deque: the oldest records drop out

    def for_agent(self, agent: object) -> MemexCodeMode:
        out = replace(self)
        out._output = getattr(agent, "output_type", str)
        out._sessions, out._lock = self._sessions, self._lock
        out._settings, out._calls = self._settings, self._calls
        return out

    def get_wrapper_toolset(self, toolset: AbstractToolset[Any]) -> AbstractToolset[Any]:
        return MemexToolset(toolset, mode=self)

    def get_instructions(self) -> str:
        return ("Act by writing Python for the run_python tool: its code runs in a persistent "
                "session where the functions its description lists are already defined "
                "(call them from code, keep results in variables, print only what you need)."
                + (" When you have the answer, call submit(answer) in code." if self.submit
                   else ""))

    async def after_node_run(self, ctx: RunContext[Any], *, node: object, result: object) -> Any:
        """A ``submit()`` that was accepted during this node ends the run with its answer."""
        s = self._sessions.get(self._key(ctx) or "")
        if s is not None and s.answer and not isinstance(result, End):
            return End(FinalResult(s.answer[-1], tool_name=RUN_PYTHON))
        return result

    async def after_run(self, ctx: RunContext[Any], *, result: object) -> Any:
        if self.per == "run":
            s = self._pop(self._key(ctx))
            if s is not None:
                await asyncio.to_thread(s.close)
        else:
            s = self._sessions.get(self._key(ctx) or "")
            if s is not None:
                s.answer.clear()
        return result

    async def on_run_error(self, ctx: RunContext[Any], *, error: BaseException) -> Any:
        if self.per == "run":
            s = self._pop(self._key(ctx))
            if s is not None:
                await asyncio.to_thread(s.close)
        raise error

    def close(self) -> None:
        """End every sandbox this capability holds (idempotent)."""
        with self._lock:
            sessions, self._sessions = list(self._sessions.values()), {}
            self._sessions.clear()
        for s in sessions:
            s.close()
        if self._settings is not None:
            self._settings.close()

    # ---- sessions ---------------------------------------------------------------------------
    def _key(self, ctx: RunContext[Any]) -> str | None:
        return ctx.conversation_id if self.per == "conversation" else ctx.run_id

    def _pop(self, key: str | None) -> _Session | None:
        with self._lock:
            return self._sessions.pop(key, None) if key is not None else None

    def session(self, ctx: RunContext[Any]) -> _Session:
        key = self._key(ctx) or "default"
        with self._lock:
            s = self._sessions.get(key)
            if s is None:
                s = self._sessions[key] = self._open()
            return s

    def _open(self) -> _Session:
        if self._settings is None:
            self._settings = SandboxSettings(
                limits=self.limits or AGENT_LIMITS, mounts=self.mounts,
                preload=self.preload, policy=self.policy, backend=self.backend,
                label="pydantic-ai")
        return _Session(guest=self._settings.open())


@dataclass
class MemexToolset(WrapperToolset[Any]):
    """The agent's toolset as the model sees it in code mode: ``run_python`` plus the tools
    that stay native; the sandboxed ones live in the guest."""

    mode: MemexCodeMode = field(kw_only=True)

    async def _split(self, ctx: RunContext[Any]
                     ) -> tuple[dict[str, ToolsetTool[Any]], dict[str, ToolsetTool[Any]]]:
        inner = await self.wrapped.get_tools(ctx)
        inside: dict[str, ToolsetTool[Any]] = {}
        outside: dict[str, ToolsetTool[Any]] = {}
        for name, t in inner.items():
            eligible = t.tool_def.kind == "function"
            if eligible and await matches_tool_selector(self.mode.tools, ctx, t.tool_def):
                inside[name] = t
            else:
                outside[name] = t
        return inside, outside

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        inside, outside = await self._split(ctx)
        catalogue = ToolSet(_stand_ins(inside, self.mode)).catalogue() if inside else "(none)"
        description = ("Run Python code in a persistent session (variables, imports and "
                       "functions stay defined between calls); returns what it prints, the "
                       "value of its last line, or the error. These functions are defined in "
                       "the session:\n" + catalogue)
        run = ToolsetTool(toolset=self, tool_def=ToolDefinition(
            name=RUN_PYTHON, description=description, parameters_json_schema=_CODE_SCHEMA),
            max_retries=3, args_validator=_ARGS)
        return {**outside, RUN_PYTHON: run}

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any],
                        tool: ToolsetTool[Any]) -> Any:
        if name != RUN_PYTHON:
            return await self.wrapped.call_tool(name, tool_args, ctx, tool)
        inside, _ = await self._split(ctx)
        s = self.mode.session(ctx)
        loop = asyncio.get_running_loop()
        tools = [_bridged(self.wrapped, t, ctx, loop) for t in inside.values()]
        if self.mode.submit:
            tools.append(submit_tool(output_adapter(self.mode._output), s.answer.append))
        code = str(tool_args.get("code", ""))
        return await asyncio.to_thread(_run, s, tools, code, self.mode._record)


def _stand_ins(inside: dict[str, ToolsetTool[Any]], mode: MemexCodeMode) -> list[Tool]:
    """The sandboxed tools as MemEx tools (for the catalogue in run_python's description)."""
    out = [Tool.from_openai(_definition(t.tool_def), lambda **_kw: None)
           for t in inside.values()]
    if mode.submit:
        out.append(submit_tool(output_adapter(mode._output), None))
    return out


def _definition(td: ToolDefinition) -> dict[str, Any]:
    return {"name": td.name, "description": td.description or "",
            "parameters": td.parameters_json_schema or {"type": "object", "properties": {}}}


def _bridged(toolset: AbstractToolset[Any], t: ToolsetTool[Any], ctx: RunContext[Any],
             loop: asyncio.AbstractEventLoop) -> Tool:
    """A MemEx tool whose handler runs the agent's own tool on the agent's event loop."""

    def handler(**arguments: Any) -> Any:
        try:
            args = t.args_validator.validate_python(arguments)
        except ValidationError as exc:
            raise ValueError(str(exc)) from None
        fut = asyncio.run_coroutine_threadsafe(
            toolset.call_tool(t.tool_def.name, args, replace(ctx, tool_name=t.tool_def.name),
                              t), loop)
        return fut.result()

    return Tool.from_openai(_definition(t.tool_def), handler)


def _run(s: _Session, tools: list[Tool], code: str,
         on_call: Callable[[ToolCallRecord], None]) -> str:
    """(worker thread) Bind this step's tools and run the code."""
    with s.lock:
        names = tuple(t.name for t in tools)
        g = s.guest
        if g.host is None or names != s.names:
            if g.host is not None:
                g.host.close()
            g.host = ToolHost(ToolSet(tools), on_call=on_call).attach(g.sandbox)
            s.names = names
        else:
            g.host.tools = ToolSet(tools)  # the same names: the step's handlers, no reinstall
        r = g.sandbox.run(code)
    text = render_observation(r, limit=20_000)
    if r.status is TurnStatus.OK and s.answer:
        return ACCEPTED if text == NO_OUTPUT else f"{text}\n{ACCEPTED}"
    return text

