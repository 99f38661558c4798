"""The MemEx agent: the model writes Python, the sandbox runs it, only what is printed returns.

``MemexAgent(...).run(task, inputs=...)`` drives one rollout to a typed ``submit()`` or to a
budget. ``action_space="tools"`` runs the same loop as a classic tool-calling agent (the same
prompt core, tools as JSON function calls plus ``python_exec``, results serialized to text):
the baseline, one setting away.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from ..errors import ConfigError, MemexError
from ..host_tools import Tool, ToolBudget, ToolCallRecord, ToolSet
from ..runtime_wasm import Limits, Mount
from . import _prompt
from ._session import AgentSession
from ._trajectory import Step, ToolCallInfo, Trajectory, TrajectoryWriter

if TYPE_CHECKING:
    from ._spawn import _Node
    from ._spawn_budget import TreeBudget

__all__ = ["Aids", "Budget", "MemexAgent", "Rollout"]

ActionSpace = Literal["code", "tools"]


@dataclass(frozen=True, kw_only=True)
class Budget:
    """When a rollout stops without an answer (None: no bound). ``max_turns`` counts model
    calls."""

    max_turns: int = 12
    max_tokens: int | None = None
    max_seconds: float | None = None
    max_cost: float | None = None

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ConfigError("Budget.max_turns must be >= 1")
        for name in ("max_tokens", "max_seconds", "max_cost"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise ConfigError(f"Budget.{name} must be > 0 or None")


@dataclass(frozen=True, kw_only=True)
class Aids:
    """Help for small models, each switchable so its effect can be measured
    (bench/agent.py): a worked example in the prompt, a nudge after a reply with no code, a
    note when a reply repeats an earlier one verbatim, a preview of the variables a block
    created, a reminder to submit when few turns remain, stop sequences that cut a reply
    where the model starts writing the output it imagines its code will print, and
    re-asking (seeded, at ``repeat_temperature``) when a reply repeats an earlier failed one: at
    temperature 0 a small model copies its failing block turn after turn, and every copy
    left in the context makes the next one likelier, so a repeat is asked again before it
    runs and only a fresh reply (or the last try) enters the context."""

    example: bool = True
    nudge: bool = True
    repeat_note: bool = True
    preview_variables: bool = True
    submit_reminder: bool = True
    stop_sequences: bool = True  # end a reply where a model starts inventing the output
    resample_repeats: bool = True
    repeat_temperature: float = 0.8
    resample_tries: int = 2

    def __post_init__(self) -> None:
        if not 0.0 < self.repeat_temperature <= 2.0:
            raise ConfigError("Aids.repeat_temperature must be in (0, 2]")
        if not 0 <= self.resample_tries <= 10:
            raise ConfigError("Aids.resample_tries must be between 0 and 10")


@dataclass(frozen=True, kw_only=True)
class Rollout:
    """The outcome of one run. ``answer`` is the typed object the submit schema describes
    (None when nothing valid was submitted); ``end_reason`` is ``submitted``, ``max_turns``,
    ``max_tokens``, ``max_seconds``, ``max_cost``, ``llm_error`` or ``sandbox_error``."""

    answer: Any
    submitted: bool
    end_reason: str
    trajectory: Trajectory
    error: str | None = None

    @property
    def turns(self) -> int:
        return len(self.trajectory.steps)

    @property
    def total_tokens(self) -> int:
        return self.trajectory.total_tokens


NUDGE = ("Your reply had no ```python code block, so nothing ran. Reply with one ```python "
         "block; call submit(...) in it when you know the answer.")
TOOLS_NUDGE = ("Your reply had no function call, so nothing ran. Call one of the functions; "
               "call submit when you know the answer.")
STOP = ["```output", "\nOutput:", "\nUser:"]
REMOVED = "MemEx removed a turn here"
REPEAT = ("Note: this reply repeats an earlier reply word for word; its output is above. "
          "Do something different, or submit the answer if you have it.")


def _remaining(budget: Budget, turns: int) -> int:
    return budget.max_turns - turns


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
        temperature: float = 0.0, max_tokens: int = 1024, spawn: Any = None,
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
        self.limits = limits or Limits(timeout=60)
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
        self._backend: Any = None
        self._owns_backend = False
        if backend is not None:
            from ._backend import get_backend

            self._backend = get_backend(backend)
            self._owns_backend = isinstance(backend, str)
        from ._spawn_budget import TreeBudget

        if spawn is True:
            spawn = TreeBudget()
        if spawn not in (None, False) and not isinstance(spawn, TreeBudget):
            raise ConfigError("spawn takes a TreeBudget (or True for the default one)")
        self.spawn: TreeBudget | None = spawn or None
        from ._llm import LLMClient

        if isinstance(model, LLMClient):
            self.llm = model
        else:
            self.llm = LLMClient(model=model, base_url=base_url, api_key=api_key,
                                 temperature=temperature, max_tokens=max_tokens)

    # ---- public -----------------------------------------------------------------------------
    def run(self, task: str, *, inputs: Mapping[str, Any] | None = None) -> Rollout:
        """Run one rollout to a valid submit() or a budget. LLM and sandbox failures end the
        rollout with ``end_reason`` saying so; only host misuse raises."""
        return _Run(self, task, dict(inputs or {})).go()

    async def arun(self, task: str, *, inputs: Mapping[str, Any] | None = None) -> Rollout:
        """:meth:`run` on a worker thread, so many rollouts can share an event loop."""
        return await asyncio.to_thread(self.run, task, inputs=inputs)

    def close(self) -> None:
        """Close the backend this agent made from a name (idempotent)."""
        if self._owns_backend and self._backend is not None:
            self._backend.close()

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
            parts.append("Send each code block as a call of the `python` function (argument "
                         "`code`) instead of a fenced block.")
        if code and len(self.tools):
            parts.append("Tools (Python functions):\n" + self.tools.catalogue())
        schema = _prompt.render_schema(self.submit_schema)
        parts.append(f"submit(answer) takes: {schema}" if code
                     else f"The submit function's `answer` takes: {schema}")
        if inputs:
            where = "Variables already defined in the session" if code else "Data available"
            lines = [f"- {k}: {_describe(v)}" for k, v in inputs.items()]
            if not code:
                lines.append("(these are variables of the python_exec session)")
            parts.append(f"{where}:\n" + "\n".join(lines))
        if self.aids.example:
            parts.append(_prompt.CODE_EXAMPLE if code else _prompt.TOOLS_EXAMPLE)
        if not code:
            parts.append(_prompt.TEXT_CALL_HINT)
        if self.instructions:
            parts.append(self.instructions.strip())
        return "\n\n".join(parts)

    def tool_definitions(self) -> list[dict[str, Any]]:
        """The JSON function tools offered in the tool-calling action space."""
        from ._session import make_submit_tool

        defs = [t.to_openai() for t in self.tools]
        defs.append({"type": "function", "function": {
            "name": "python_exec",
            "description": "Run Python code in a persistent session; returns what it prints "
                           "and the value of its last line.",
            "parameters": {"type": "object", "properties": {"code": {"type": "string"}},
                           "required": ["code"]}}})
        defs.append(make_submit_tool(self.submit_schema, lambda _a: None).to_openai())
        return defs


PYTHON_TOOL = {"type": "function", "function": {
    "name": "python", "description": "Run a Python code block in the persistent session.",
    "parameters": {"type": "object", "properties": {"code": {"type": "string"}},
                   "required": ["code"]}}}


class _Run:
    """State of one rollout (kept off the agent so one agent can run many at once)."""

    def __init__(self, agent: MemexAgent, task: str, inputs: dict[str, Any],
                 node: _Node | None = None) -> None:
        if not isinstance(task, str) or not task.strip():
            raise ConfigError("the task must be a non-empty string")
        if node is None and agent.spawn is not None:
            from ._spawn import SpawnTree

            node = SpawnTree(agent.spawn).root
        self.node = node  # this rollout's place in a sub-agent tree, if spawning is on
        if node is not None:
            node.run = self
        self.a = agent
        self.task = task
        self.inputs = inputs
        self.t0 = time.monotonic()
        self.traj = Trajectory(
            id=uuid.uuid4().hex[:16], task=task, model=str(agent.llm.model),
            action_space=agent.action_space if agent.code_via == "text" or
            agent.action_space == "tools" else "code/tool_call",
            started=time.time(), inputs={k: _describe(v) for k, v in inputs.items()})
        self.steps: list[Step] = []
        self.messages: list[dict[str, Any]] = []
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cost: float | None = None
        self.pending_calls: list[ToolCallRecord] = []
        # what each reply ran -> (turn, how it ended), to catch and explain verbatim repeats
        # + the reply's message, until it is taken out of the context
        self.replies: dict[str, tuple[int, str, dict[str, Any] | None]] = {}
        # replies whose run failed in a way running them again would repeat (an exception,
        # not a time limit): only these are asked again; polling or retrying a timed-out
        # wait with the same code is legitimate
        self.failed: set[str] = set()
        self.writer = TrajectoryWriter(agent.trajectory_path) if agent.trajectory_path else None

    # ---- driving ----------------------------------------------------------------------------
    def go(self) -> Rollout:
        a = self.a
        session = None
        end, error = "max_turns", None
        try:
            if self.writer:
                self.writer.start(self.traj)
            session = self._open_session()
            system = a.system_prompt(self.inputs)
            if self.node is not None and self.node.prompt_section():
                system += "\n\n" + self.node.prompt_section()
            self.messages = [
                {"role": "system", "content": system},
                {"role": "user", "content": f"Task: {self.task}"},
            ]
            while True:
                stop = self._budget_reason()
                if stop:
                    end = stop
                    break
                step = self._turn(session)
                self._add(step)
                if session.submitted:
                    end = "submitted"
                    break
        except _LLMFailed as exc:
            end, error = "llm_error", str(exc)
        except MemexError as exc:
            if session is None and isinstance(exc, ConfigError):
                raise
            end, error = "sandbox_error", f"{type(exc).__name__}: {exc}"
        finally:
            answer = session.answer if session is not None and session.submitted else None
            submitted = session is not None and session.submitted
            if self.node is not None:  # sub-agents: stopped, joined, attached to their steps
                end = self.node.end_reason(end)
                self.node.finish(end, submitted, answer)
                self.steps = self.node.attach(self.steps)
            if session is not None:
                session.close()
            self.traj = replace(
                self.traj, steps=tuple(self.steps), messages=tuple(self.messages),
                answer=_jsonable_answer(answer) if submitted else None, submitted=submitted,
                end_reason=end, prompt_tokens=self.prompt_tokens,
                completion_tokens=self.completion_tokens, cost=self.cost,
                duration=time.monotonic() - self.t0,
                llm_calls=sum(1 + s.resampled for s in self.steps), error=error)
            if self.writer:
                self.writer.end(self.traj)
                self.writer.close()
        return Rollout(answer=answer, submitted=submitted, end_reason=end,
                       trajectory=self.traj, error=error)

    def _open_session(self) -> AgentSession:
        a = self.a
        opener = None
        if a._backend is not None:
            opener = a._backend.open
        door, prepared = None, False
        if self.node is not None:  # a sub-agent: a fork of its parent or of a template
            opener, door, prepared = self.node.session_options(opener)
        return AgentSession(
            tools=a.tools, submit_schema=a.submit_schema, limits=a.limits, mounts=a.mounts,
            preload=a.preload, inputs=self.inputs, tool_budget=a.tool_budget, gate=a.gate,
            install_tools=a.action_space == "code", open_sandbox=opener, door=door,
            spawn=self.node, prepared=prepared,
            on_call=self.pending_calls.append)

    def _budget_reason(self) -> str | None:
        b = self.a.budget
        if len(self.steps) >= b.max_turns:
            return "max_turns"
        if b.max_tokens is not None and self.prompt_tokens + self.completion_tokens \
                >= b.max_tokens:
            return "max_tokens"
        if b.max_seconds is not None and time.monotonic() - self.t0 >= b.max_seconds:
            return "max_seconds"
        if b.max_cost is not None and self.cost is not None and self.cost >= b.max_cost:
            return "max_cost"
        if self.node is not None:  # the tree's budget, and a cancel from the parent
            return self.node.stop_reason()
        return None

    def _add(self, step: Step) -> None:
        self.steps.append(step)
        if self.writer:
            self.writer.step(self.traj, step)
        if self.a.on_step is not None:
            self.a.on_step(step)

    def _complete(self, messages: list[dict[str, Any]] | None = None, **kwargs: Any) -> Any:
        from ..errors import LLMError

        c: Any = None
        messages = self.messages if messages is None else messages
        try:
            if self.a.on_text is None:
                c = self.a.llm.complete(messages, **kwargs)
            else:  # stream the text to the caller as it arrives
                for part in self.a.llm.stream(messages, **kwargs):
                    if isinstance(part, str):
                        self.a.on_text(part)
                    else:
                        c = part
                if c is None:
                    raise LLMError("the stream ended without a completion")
        except LLMError as exc:
            raise _LLMFailed(f"{type(exc).__name__}: {exc}") from exc
        self.prompt_tokens += c.usage.prompt_tokens
        self.completion_tokens += c.usage.completion_tokens
        if c.cost is not None:
            self.cost = (self.cost or 0.0) + c.cost
        if self.node is not None:
            self.node.charge(c)
        return c

    def _complete_fresh(self, key_of: Callable[[Any], str | None],
                        **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        """The model's reply, asked again while it repeats an earlier reply word for word (see
        :class:`Aids`): hotter and seeded, with a note on the last observation (for that
        request only) saying how the repeated code ended. In the code space the earlier turn
        is first removed from the context (its reply and observation; its results are still
        in the sandbox), leaving a one-line remark in the message before it, so there is
        nothing left to copy. Returns the completion kept and the usage of every call made
        for it (``resampled``: how many times it was asked again)."""
        aids = self.a.aids
        t0 = time.monotonic()
        c = self._complete(**kwargs)
        prompt, completion, cost = c.usage.prompt_tokens, c.usage.completion_tokens, c.cost
        tries = 0
        while aids.resample_repeats and tries < aids.resample_tries:
            key = key_of(c)
            if key is None or key not in self.failed or self._budget_reason():
                break
            tries += 1
            if self.a.on_text is not None:
                self.a.on_text("\n[this repeats an earlier reply word for word; asking again]\n")
            turn, outcome, msg = self.replies[key]
            code = self.a.action_space == "code"
            if code and msg is not None:
                self._remove_turn(msg, outcome)
                self.replies[key] = (turn, outcome, None)
            note = (f"[Your reply repeated {'code' if code else 'calls'} you already ran "
                    f"(turn {turn + 1}) word for word; {outcome}. Doing it again gives the "
                    "same result: reply with something different (fix the cause, look at the "
                    "data first, or submit the answer if you have it).]")
            last = dict(self.messages[-1])
            last["content"] = f"{last.get('content') or ''}\n\n{note}"
            c = self._complete([*self.messages[:-1], last], **kwargs,
                               temperature=aids.repeat_temperature,
                               seed=1000 * len(self.steps) + tries)
            prompt += c.usage.prompt_tokens
            completion += c.usage.completion_tokens
            if c.cost is not None:
                cost = (cost or 0.0) + c.cost
        usage = {"prompt_tokens": prompt, "completion_tokens": completion, "cost": cost,
                 "llm_seconds": time.monotonic() - t0, "resampled": tries}
        return c, usage

    def _remove_turn(self, msg: dict[str, Any], outcome: str) -> None:
        """Take a turn (its assistant message and the observation after it) out of the
        context; the message before it gets a one-line remark."""
        at = next((i for i, m in enumerate(self.messages) if m is msg), None)
        if at is None or at < 2:
            return
        end = next((j for j in range(at + 1, len(self.messages))
                    if self.messages[j].get("role") == "assistant"), len(self.messages))
        del self.messages[at:end]
        before = dict(self.messages[at - 1])
        before["content"] = (f"{before.get('content') or ''}\n\n[{REMOVED}: code that was then "
                             f"written again word for word; {outcome}.]")
        self.messages[at - 1] = before

    def _turn_timeout(self) -> float | None:
        b = self.a.budget
        left = None if b.max_seconds is None else b.max_seconds - (time.monotonic() - self.t0)
        tree_left = self.node.turn_seconds_left() if self.node is not None else None
        if tree_left is not None:
            left = tree_left if left is None else min(left, tree_left)
        if left is None:
            return None
        return max(0.05, min(self.a.limits.timeout, left))

    def _reminder(self) -> str:
        left = _remaining(self.a.budget, len(self.steps) + 1)
        if self.a.aids.submit_reminder and 0 < left <= 2:
            return (f"\n[{left} turn{'s' if left > 1 else ''} left: submit your best answer "
                    "now if you have one.]")
        return ""

    def _turn(self, session: AgentSession) -> Step:
        if self.a.action_space == "tools":
            from ._tools_loop import tools_turn

            return tools_turn(self, session)
        from ._code_loop import code_turn

        return code_turn(self, session)

    def take_calls(self, kind: str = "code") -> tuple[ToolCallInfo, ...]:
        out = tuple(replace(_info(r), kind=kind) for r in self.pending_calls)
        self.pending_calls.clear()
        return out


class _LLMFailed(Exception):
    pass


def _info(r: ToolCallRecord) -> ToolCallInfo:
    result = getattr(r, "result", "") or (r.message or "")
    return ToolCallInfo(name=r.tool, arguments=r.arguments, outcome=r.outcome,
                        result=result if r.outcome == "ok" else (r.message or r.outcome),
                        duration=r.duration)


def _describe(v: Any) -> str:
    from ._spawn_spec import describe_input

    return describe_input(v)


def _jsonable_answer(answer: Any) -> Any:
    try:
        from pydantic_core import to_jsonable_python

        return to_jsonable_python(answer, serialize_unknown=True)
    except Exception:
        return repr(answer)

