"""Code mode for OpenAI Agents SDK agents: ``MemexCodeMode().agent(agent)`` is the same agent
with its function tools moved into a persistent MemEx sandbox behind one ``run_python`` tool.

The model writes Python; the agent's tools are typed functions inside the guest, each call
checked against the tool's schema and dispatched to the agent's real tool on the host (its own
invoker, context and failure semantics; errors raise in the guest). The sandbox is held in the
run context: one per run, or one per context object (``per="context"``) so that runs sharing a
context share the session. ``submit(answer)``, checked against the agent's output type, ends
the run with that answer. Tools that need approval or carry guardrails stay ordinary tool calls,
so approvals and guardrails keep applying to them.
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from agents import Agent, AgentHooks, FunctionTool, RunContextWrapper
from agents.agent import ToolsToFinalOutputResult
from agents.tool import CustomTool, FunctionToolResult, set_function_tool_failure_error_function
from agents.tool_context import ToolContext
from pydantic import TypeAdapter

from ...backends import Backend
from ...errors import ConfigError
from ...executor.internal import render_observation
from ...host_tools import EgressPolicy, Tool, ToolCallRecord, ToolHost, ToolSet
from ...runtime_wasm import AGENT_LIMITS, Limits, Mount, SandboxAPI, TurnStatus
from .._sandbox import (
    ACCEPTED,
    NO_OUTPUT,
    Guest,
    SandboxSettings,
    interrupt,
    output_adapter,
    submit_tool,
)

__all__ = ["MemexCodeMode"]

RUN_PYTHON = "run_python"
_CODE_SCHEMA = {"type": "object", "properties": {"code": {
    "type": "string", "description": "Python source; runs in the persistent session"}},
    "required": ["code"], "additionalProperties": False}
_INSTRUCTIONS = ("Act by writing Python for the {name} tool: its code runs in a persistent "
                 "session where the functions its description lists are already defined (call "
                 "them from code, keep results in variables, print only what you need).")
Selector = Literal["all"] | Sequence[str] | Callable[[FunctionTool], bool]


@dataclass(frozen=True, kw_only=True, eq=False)
class _Binding:
    """What one ``run_python`` tool puts in the guest: the agent's tools and its output type."""

    tools: dict[str, FunctionTool]
    adapter: TypeAdapter[Any] | None


@dataclass(kw_only=True, eq=False)
class _Session:
    guest: Guest
    bound: _Binding | None = None
    anchor: Any = None  # keeps a context that cannot be weakly referenced alive with its session
    ctx: ToolContext[Any] | None = None
    loop: asyncio.AbstractEventLoop | None = None
    answers: list[Any] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def closed(self) -> bool:
        return self.guest.closed

    def close(self) -> None:
        self.guest.close()


class MemexCodeMode:
    """Code mode for agents of the OpenAI Agents SDK.

    ``tools`` selects the function tools that move into the sandbox (``"all"``, names, or a
    predicate); ``limits``/``mounts``/``preload`` as for ``memex.Sandbox``; ``timeout`` the
    deadline of one ``run_python`` call (default: the limits' timeout); ``policy`` the guest's
    egress policy; ``backend`` where sandboxes live; ``per="context"`` keeps one sandbox per
    context object passed to ``Runner.run`` (else one per run); ``kind="custom"`` makes
    ``run_python`` a raw-string custom tool (Responses models only; the SDK ends runs on
    function-tool results alone, so it has no ``submit``). ``close()`` ends every sandbox."""

    def __init__(self, *, tools: Selector = "all", limits: Limits | None = None,
                 mounts: Sequence[Mount] = (), preload: Sequence[str] = (),
                 timeout: float | None = None, policy: EgressPolicy | str | None = None,
                 backend: str | Backend | None = None, per: Literal["run", "context"] = "run",
                 kind: Literal["function", "custom"] = "function", submit: bool | None = None,
                 name: str = RUN_PYTHON, keep_calls: int = 1000) -> None:
        if per not in ("run", "context"):
            raise ConfigError(f"per must be 'run' or 'context', got {per!r}")
        if kind not in ("function", "custom"):
            raise ConfigError(f"kind must be 'function' or 'custom', got {kind!r}")
        if kind == "custom" and submit:
            raise ConfigError("submit needs kind='function': the Agents SDK ends a run on "
                              "function-tool results only")
        if timeout is not None and not 0 < timeout < float("inf"):
            raise ConfigError(f"timeout must be a finite number of seconds > 0, got {timeout!r}")
        self.selector, self.timeout = tools, timeout
        self.per, self.kind, self.name = per, kind, name
        self.submit = kind == "function" if submit is None else submit
        self._settings = SandboxSettings(limits=limits or AGENT_LIMITS, mounts=mounts,
                                         preload=preload, policy=policy, backend=backend,
                                         label="openai-agents")
        self._sessions: dict[int, _Session] = {}
        self._lock = threading.Lock()
        self._calls: deque[ToolCallRecord] = deque(maxlen=keep_calls)
        self._keep = keep_calls
        self._closed = False

    # ---- the one-configuration switch -----------------------------------------------------
    def agent(self, agent: Agent[Any]) -> Agent[Any]:
        """``agent`` in code mode: the selected function tools live in the sandbox behind
        ``run_python``; every other tool, handoff and setting is as it was."""
        inside, outside = self.split(agent.tools)
        code = self.tool(inside, output_type=agent.output_type)
        changes: dict[str, Any] = {
            "tools": [*outside, code],
            "instructions": _with_instructions(agent.instructions, self._instructions()),
            "hooks": _Hooks(agent.hooks, self) if self.per == "run" else agent.hooks,
        }
        if self.submit:
            changes["tool_use_behavior"] = _EndOnSubmit(agent.tool_use_behavior, self)
        return agent.clone(**changes)

    def split(self, tools: Sequence[Any]) -> tuple[list[FunctionTool], list[Any]]:
        """The tools that move into the sandbox, and the ones that stay native (everything not
        a function tool, and function tools that need approval or have guardrails)."""
        inside: list[FunctionTool] = []
        outside: list[Any] = []
        for t in tools:
            if isinstance(t, FunctionTool) and _plain(t) and self._selected(t):
                inside.append(t)
            else:
                outside.append(t)
        return inside, outside

    def tool(self, tools: Sequence[FunctionTool], *, output_type: object = None
             ) -> FunctionTool | CustomTool:
        """The ``run_python`` tool with ``tools`` bound in the guest (``submit`` checked
        against ``output_type`` when submit is on)."""
        adapter = output_adapter(output_type) if self.submit else None
        by_name = {t.name: _raising(t) for t in tools}
        if len(by_name) != len(tools):
            raise ConfigError("two tools share a name")
        binding = _Binding(tools=by_name, adapter=adapter)
        catalogue = ToolSet(self._stand_ins(list(by_name.values()), adapter)).catalogue()
        description = ("Run Python code in a persistent session (variables, imports and "
                       "functions stay defined between calls); returns what it prints, the "
                       "value of its last line, or the error. These functions are defined in "
                       "the session:\n" + (catalogue or "(none)"))

        async def run(ctx: ToolContext[Any], code: str) -> str:
            return await self._invoke(ctx, code, binding)

        async def run_json(ctx: ToolContext[Any], arguments: str) -> str:
            try:
                code = json.loads(arguments)["code"]
            except (ValueError, KeyError, TypeError):
                return 'error: the arguments must be a JSON object {"code": "..."}'
            if not isinstance(code, str):
                return "error: code must be a string"
            return await self._invoke(ctx, code, binding)

        if self.kind == "custom":
            return CustomTool(name=self.name, description=description, on_invoke_tool=run)
        made = FunctionTool(name=self.name, description=description,
                            params_json_schema=_CODE_SCHEMA, on_invoke_tool=run_json)
        # Model-facing outcomes come back as text; anything raised is the host's fault (a
        # dead worker, misuse) and fails the run instead of reaching the model as a string.
        return set_function_tool_failure_error_function(made, None)

    # ---- what the caller can read ---------------------------------------------------------
    @property
    def tool_calls(self) -> list[ToolCallRecord]:
        """Every call guest code made to the agent's tools (the last ``keep_calls``)."""
        with self._lock:
            return list(self._calls)

    def sandbox(self, ctx: RunContextWrapper[Any]) -> SandboxAPI[Any] | None:
        """The live sandbox of a run (its context wrapper) or context object, if any."""
        s = self._sessions.get(id(self._anchor(ctx)))
        return s.guest.sandbox if s is not None and not s.closed else None

    def close(self) -> None:
        """End every sandbox (idempotent); a backend made from a name is closed too."""
        with self._lock:
            sessions, self._sessions = list(self._sessions.values()), {}
            self._closed = True
        for s in sessions:
            s.close()
        self._settings.close()

    def __enter__(self) -> MemexCodeMode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- running code ----------------------------------------------------------------------
    async def _invoke(self, ctx: ToolContext[Any], code: str, binding: _Binding) -> str:
        anchor = self._anchor(ctx)
        loop = asyncio.get_running_loop()
        work = asyncio.ensure_future(asyncio.to_thread(self._run, anchor, binding, ctx, loop,
                                                       code))
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            s = self._sessions.get(id(anchor))
            if s is not None:
                interrupt(s.guest.sandbox)  # the run was cancelled: stop the cell, roll it back
            raise

    def _run(self, anchor: object, binding: _Binding, ctx: ToolContext[Any],
             loop: asyncio.AbstractEventLoop, code: str) -> str:
        """(worker thread) One cell, with this call's context serving the guest's calls."""
        s = self._session(anchor)
        with s.lock:
            if s.closed:
                raise ConfigError("this run's MemEx sandbox was closed")
            self._bind(s, binding)
            s.ctx, s.loop, before = ctx, loop, len(s.answers)
            try:
                r = s.guest.sandbox.run(code, timeout=self.timeout)
            finally:
                s.ctx = s.loop = None
        text = render_observation(r, limit=20_000)
        if r.status is TurnStatus.OK and len(s.answers) > before:
            return ACCEPTED if text == NO_OUTPUT else f"{text}\n{ACCEPTED}"
        del s.answers[before:]  # an answer from a cell that then failed does not stand
        return text

    def _bind(self, s: _Session, binding: _Binding) -> None:
        """Install ``binding``'s functions in the session's guest, unless they are there: a
        context's session can serve several agents (other tools, another output type)."""
        if s.bound is binding:
            return
        made = [self._bridged(t, s) for t in binding.tools.values()]
        if binding.adapter is not None:
            made.append(submit_tool(binding.adapter, s.answers.append))
        names = sorted(t.name for t in made)
        g = s.guest
        if g.host is not None and s.bound is not None and names == sorted(
                [*s.bound.tools, *(["submit"] if s.bound.adapter is not None else [])]):
            g.host.tools = ToolSet(made)  # the same functions: new handlers, no reinstall
        else:
            if g.host is not None:
                g.host.close()
            g.host = ToolHost(ToolSet(made), keep_calls=self._keep, on_call=self._record
                              ).attach(g.sandbox)
        s.bound = binding

    def _stand_ins(self, tools: list[FunctionTool], adapter: TypeAdapter[Any] | None
                   ) -> list[Tool]:
        out = [Tool.from_openai(_definition(t), lambda **_kw: None) for t in tools]
        if adapter is not None:
            out.append(submit_tool(adapter, None))
        return out

    def _bridged(self, t: FunctionTool, s: _Session) -> Tool:
        """A MemEx tool that calls the agent's tool on the agent's loop, in the calling
        run's context."""
        counter = iter(range(1 << 62))

        def handler(**arguments: Any) -> Any:
            ctx, loop = s.ctx, s.loop
            if ctx is None or loop is None:
                raise RuntimeError(f"{t.name} can only be called while run_python runs")
            args = json.dumps(arguments)
            sub = ToolContext.from_agent_context(
                ctx, tool_call_id=f"{ctx.tool_call_id}.memex{next(counter)}", tool_name=t.name,
                tool_arguments=args, agent=ctx.agent, run_config=ctx.run_config)
            fut = asyncio.run_coroutine_threadsafe(_call(t, sub, args), loop)
            return fut.result()

        return Tool.from_openai(_definition(t), handler)

    # ---- sessions ---------------------------------------------------------------------------
    def _anchor(self, ctx: RunContextWrapper[Any]) -> Any:
        """What a session belongs to: the run (its usage record, shared by every context
        wrapper of one run) or the caller's context object."""
        if self.per == "context":
            if ctx.context is None:
                raise ConfigError("per='context' needs a context: Runner.run(..., context=...)")
            return ctx.context
        return ctx.usage

    def _session(self, anchor: object) -> _Session:
        key = id(anchor)
        with self._lock:
            if self._closed:
                raise ConfigError("this MemexCodeMode is closed")
            s = self._sessions.get(key)
        if s is not None:
            return s
        fresh = self._open()  # outside the lock: other runs' sessions do not wait for it
        with self._lock:
            s = None if self._closed else self._sessions.setdefault(key, fresh)
        if s is not fresh:
            fresh.close()
            if s is None:
                raise ConfigError("this MemexCodeMode is closed")
            return s
        try:
            weakref.finalize(anchor, self._drop, key, s)
        except TypeError:
            s.anchor = anchor  # not weakly referable: kept (and the id reserved) until close()
        return s

    def _drop(self, key: int, s: _Session | None = None) -> None:
        with self._lock:
            current = self._sessions.get(key)
            if current is not None and (s is None or current is s):
                del self._sessions[key]
            else:
                current = None
        if current is not None:
            current.close()

    def end_run(self, ctx: RunContextWrapper[Any]) -> None:
        """Close the sandbox of the run ``ctx`` belongs to (done when the agent ends)."""
        self._drop(id(self._anchor(ctx)))

    def _open(self) -> _Session:
        return _Session(guest=self._settings.open())

    def _record(self, rec: ToolCallRecord) -> None:
        with self._lock:  # (tool_calls copies it under the lock)
            self._calls.append(rec)  # a bounded deque: the oldest records drop out

    def _selected(self, t: FunctionTool) -> bool:
        sel = self.selector
        if sel == "all":
            return True
        if callable(sel):
            return bool(sel(t))
        return t.name in sel

    def _instructions(self) -> str:
        text = _INSTRUCTIONS.format(name=self.name)
        if self.submit:
            text += " When you have the answer, call submit(answer) in code."
        return text

    def answer(self, ctx: RunContextWrapper[Any]) -> list[Any]:
        """The answers submitted (and accepted) in the session of ``ctx``."""
        s = self._sessions.get(id(self._anchor(ctx)))
        return s.answers if s is not None else []


# ---- the agent's settings, composed ---------------------------------------------------------
class _Hooks(AgentHooks[Any]):
    """The agent's own hooks, plus: the run's sandbox closes when the agent ends."""

    def __init__(self, inner: Any, mode: MemexCodeMode) -> None:
        self.inner, self.mode = inner, mode

    async def on_start(self, context: Any, agent: Any) -> None:
        if self.inner is not None:
            await self.inner.on_start(context, agent)

    async def on_end(self, context: Any, agent: Any, output: Any) -> None:
        try:
            if self.inner is not None:
                await self.inner.on_end(context, agent, output)
        finally:
            await asyncio.to_thread(self.mode.end_run, context)

    async def on_handoff(self, context: Any, agent: Any, source: Any) -> None:
        if self.inner is not None:
            await self.inner.on_handoff(context, agent, source)

    async def on_tool_start(self, context: Any, agent: Any, tool: Any) -> None:
        if self.inner is not None:
            await self.inner.on_tool_start(context, agent, tool)

    async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: Any) -> None:
        if self.inner is not None:
            await self.inner.on_tool_end(context, agent, tool, result)

    async def on_llm_start(self, context: Any, agent: Any, system_prompt: Any,
                           input_items: Any) -> None:
        if self.inner is not None:
            await self.inner.on_llm_start(context, agent, system_prompt, input_items)

    async def on_llm_end(self, context: Any, agent: Any, response: Any) -> None:
        if self.inner is not None:
            await self.inner.on_llm_end(context, agent, response)


class _EndOnSubmit:
    """``tool_use_behavior``: an accepted ``submit()`` ends the run with its answer; other
    results follow the agent's own behaviour."""

    def __init__(self, inner: object, mode: MemexCodeMode) -> None:
        self.inner, self.mode = inner, mode

    async def __call__(self, ctx: RunContextWrapper[Any], results: list[FunctionToolResult]
                       ) -> ToolsToFinalOutputResult:
        answers = self.mode.answer(ctx)
        for r in results:
            if r.tool.name == self.mode.name and isinstance(r.output, str) \
                    and r.output.endswith(ACCEPTED) and answers:
                return ToolsToFinalOutputResult(is_final_output=True, final_output=answers[-1])
        return await _behaviour(self.inner, ctx, results)


async def _behaviour(inner: Any, ctx: RunContextWrapper[Any],
                     results: list[FunctionToolResult]) -> ToolsToFinalOutputResult:
    """The SDK's documented ``tool_use_behavior`` semantics, for the agent's own setting."""
    if not results or inner == "run_llm_again":
        return ToolsToFinalOutputResult(is_final_output=False)
    if inner == "stop_on_first_tool":
        return ToolsToFinalOutputResult(is_final_output=True, final_output=results[0].output)
    if isinstance(inner, dict):
        names = inner.get("stop_at_tool_names", [])
        for r in results:
            if r.tool.name in names:
                return ToolsToFinalOutputResult(is_final_output=True, final_output=r.output)
        return ToolsToFinalOutputResult(is_final_output=False)
    out = inner(ctx, results)
    return await out if asyncio.iscoroutine(out) else out  # type: ignore[no-any-return]


def _with_instructions(inner: Any, extra: str) -> Any:
    if inner is None:
        return extra
    if isinstance(inner, str):
        return f"{inner}\n\n{extra}"

    async def instructions(ctx: RunContextWrapper[Any], agent: Agent[Any]) -> str:
        text = inner(ctx, agent)
        if asyncio.iscoroutine(text):
            text = await text
        return f"{text}\n\n{extra}"

    return instructions


# ---- tools -------------------------------------------------------------------------------
def _plain(t: FunctionTool) -> bool:
    """A tool whose calls need no approval and no guardrail: safe to call from code."""
    return (t.needs_approval is False and not t.tool_input_guardrails
            and not t.tool_output_guardrails)


def _raising(t: FunctionTool) -> FunctionTool:
    """A copy of ``t`` whose failures raise (in the guest) instead of becoming a message."""
    return set_function_tool_failure_error_function(copy.copy(t), None)


async def _call(t: FunctionTool, ctx: ToolContext[Any], args: str) -> Any:
    if callable(t.is_enabled):
        enabled = t.is_enabled(ctx, ctx.agent)  # type: ignore[arg-type]
        if asyncio.iscoroutine(enabled):
            enabled = await enabled
        if not enabled:
            raise RuntimeError(f"the tool {t.name} is disabled for this run")
    elif not t.is_enabled:
        raise RuntimeError(f"the tool {t.name} is disabled")
    return await t.on_invoke_tool(ctx, args)


def _definition(t: FunctionTool) -> dict[str, Any]:
    return {"name": t.name, "description": t.description or "",
            "parameters": t.params_json_schema or {"type": "object", "properties": {}}}
