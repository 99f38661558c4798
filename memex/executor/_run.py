"""One rollout in progress: the conversation, the budget checks, the model calls (with the
repeat handling of :class:`~memex.executor.Aids`) and the trajectory. A turn itself is the
loop's (``loops.code_turn`` / ``loops.tools_turn``); :class:`Run` is the
:class:`~memex.executor.loops.TurnContext` it works in, kept off the agent so one agent can
run many rollouts at once.
"""

from __future__ import annotations

import ast
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from pydantic_core import to_jsonable_python

from ..errors import ConfigError, LLMError, MemexError
from ..host_tools import ToolCallRecord
from ._config import Aids, EndReason
from ._prompt import REMOVED, answer_fields, answer_is_object, render_schema
from ._session import AgentSession
from ._spec import AgentSpec
from ._trajectory import Step, ToolCallInfo, Trajectory, TrajectoryWriter
from .llm import Completion
from .loops._code import code_turn
from .loops._tools import tools_turn
from .spawn._spec import describe_input
from .spawn._tree import Node, SpawnTree

__all__ = ["Rollout", "Run"]

_NAME_ERROR = re.compile(r"NameError: name '(\w+)' is not defined")


@dataclass(frozen=True, kw_only=True)
class Rollout:
    """The outcome of one run. ``answer`` is the typed object the submit schema describes
    (None when nothing valid was submitted); ``end_reason`` says why it ended (an
    :class:`EndReason`: submitted, a budget of its own or of its agent tree, a failed model
    call or sandbox, a cancel)."""

    answer: Any
    submitted: bool
    end_reason: EndReason
    trajectory: Trajectory
    error: str | None = None

    @property
    def turns(self) -> int:
        return len(self.trajectory.steps)

    @property
    def total_tokens(self) -> int:
        return self.trajectory.total_tokens


class _LLMFailed(Exception):
    """The model call failed after the client's retries: the rollout ends with llm_error."""


class Run:
    """State of one rollout. ``node`` is its place in a sub-agent tree (None: spawning off,
    or a root whose tree this run makes)."""

    def __init__(self, spec: AgentSpec, task: str, inputs: dict[str, Any],
                 node: Node | None = None) -> None:
        if not isinstance(task, str) or not task.strip():
            raise ConfigError("the task must be a non-empty string")
        if node is None and spec.spawn is not None:
            node = SpawnTree(spec.spawn, start=_start_child).root
        self.node = node
        if node is not None:
            node.run = self
        self.spec = spec
        self.task = task
        self.inputs = inputs
        self.t0 = time.monotonic()
        self.traj = Trajectory(
            id=uuid.uuid4().hex[:16], task=task, model=str(spec.llm.model),
            action_space=spec.action_space if spec.model.code_via == "text" or
            spec.action_space == "tools" else "code/tool_call",
            started=time.time(), inputs={k: describe_input(v) for k, v in inputs.items()})
        self.steps: list[Step] = []
        self.messages: list[dict[str, Any]] = []
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cost: float | None = None
        self.pending_calls: list[ToolCallRecord] = []
        # what each reply ran -> (turn, how it ended, the reply's message until it is taken
        # out of the context), to catch and explain verbatim repeats
        self.replies: dict[str, tuple[int, str, dict[str, Any] | None]] = {}
        # replies whose run failed in a way running them again would repeat (an exception,
        # not a time limit): only these are asked again; polling or retrying a timed-out
        # wait with the same code is legitimate
        self.failed: set[str] = set()
        path = spec.hooks.trajectory_path
        self.writer = TrajectoryWriter(path) if path else None
        self.variables: dict[str, str] = {}
        # one more turn was given for a submit rejected on the last one (Aids.grace_turn)
        self.graced = False

    # ---- the TurnContext of the loops ------------------------------------------------------
    @property
    def aids(self) -> Aids:
        return self.spec.aids

    @property
    def observation_chars(self) -> int:
        return self.spec.sandbox.observation_chars

    @property
    def native_code(self) -> bool:
        return self.spec.model.code_via == "tool_call"

    @property
    def turn(self) -> int:
        return len(self.steps)

    def tool_definitions(self) -> list[dict[str, Any]]:
        return self.spec.tool_definitions()

    def seen(self, key: str) -> bool:
        return key in self.replies

    def remember(self, key: str, outcome: str, message: dict[str, Any] | None, *,
                 failed: bool) -> None:
        """Record how this turn's reply (by its repeat key) ended; ``failed``: running the
        same reply again would end the same way (it is then asked again, see Aids): a code
        block that raised, or tool calls however they ended."""
        if key not in self.replies:
            self.replies[key] = (self.turn, outcome, message)
            if failed:
                self.failed.add(key)

    def take_calls(self, kind: str = "code") -> tuple[ToolCallInfo, ...]:
        out = tuple(replace(_info(r), kind=kind) for r in self.pending_calls)
        self.pending_calls.clear()
        return out

    def drop_calls(self) -> None:
        self.pending_calls.clear()

    def turn_timeout(self) -> float | None:
        b = self.spec.budget
        left = None if b.max_seconds is None else b.max_seconds - (time.monotonic() - self.t0)
        tree_left = self.node.turn_seconds_left() if self.node is not None else None
        if tree_left is not None:
            left = tree_left if left is None else min(left, tree_left)
        if left is None:
            return None
        return max(0.05, min(self.spec.sandbox.limits.timeout, left))

    def _turn_limit(self) -> int:
        return self.spec.budget.max_turns + (1 if self.graced else 0)

    def _grace_due(self, rejected: bool, turns_done: int) -> bool:
        """A submit rejected on the last turn gets one more turn (once): the model has just
        learnt what was wrong with its answer and is likeliest to fix it now."""
        return (rejected and self.spec.aids.grace_turn and not self.graced
                and turns_done == self._turn_limit())

    def reminder(self, *, rejected: bool = False) -> str:
        left = self._turn_limit() - (len(self.steps) + 1)
        if self._grace_due(rejected, len(self.steps) + 1):
            return ("\n[Your answer was rejected on the last turn: you get one more turn. Fix "
                    "the answer and submit it.]")
        if self.spec.aids.submit_reminder and 0 < left <= 2:
            return (f"\n[{left} turn{'s' if left > 1 else ''} left: submit your best answer "
                    "now if you have one.]")
        return ""

    def explain(self, status: str, error: str | None, text: str) -> str:
        a = self.spec
        if not a.aids.explain_errors:
            return ""
        if status == "rejected":
            return f"[submit(answer) takes: {render_schema(a.submit_schema)}]"
        if error == "KeyError":
            frames = [f"{n}: {d}" for n, d in self.variables.items() if d.startswith("DataFrame")]
            return (f"[a key that does not exist. Your DataFrames: {'; '.join(frames[-5:])}]"
                    if frames else "")
        aliases = a.tools.aliases
        if error in ("TypeError", "AttributeError") and "'function' object" in text:
            name = _tool_as_data(text, [aliases.get(n, n) for n in a.tools.names])
            return (f"[{name} is a tool, not its result: call it, keep what it returns "
                    f"(result = {name}(...)) and use that]") if name else ""
        m = _NAME_ERROR.search(text) if error == "NameError" else None
        if m is None:
            return ""
        tools = ", ".join(f"{aliases.get(n, n)}()" for n in a.tools.names)
        names = [n for n in self.variables if n != m.group(1)]
        have = f"; your variables: {', '.join(names[-20:])}" if names else ""
        return (f"[{m.group(1)!r} is not defined in this session. What is: the tools "
                f"{tools + ', ' if tools else ''}submit(){have}.]")

    def submit_hint(self, blocks: list[str]) -> str:
        # the last plain value (the guest's preview says "int = 3", "float = 0.5",
        # "str len 4") that the blocks assign at top level: what a stuck model computed
        plain = [n for n in _assigned(blocks) if self.variables.get(n, "").startswith(
            ("int = ", "float = ", "bool = ", "str len "))]
        if not plain:
            return ""
        fields = answer_fields(self.spec.submit_schema)
        if len(fields) > 1 or (not fields and answer_is_object(self.spec.submit_schema)):
            return ""
        name = plain[-1]
        value = f'{{"{fields[0][0]}": {name}}}' if fields else name
        return (f"[If {name} answers the task, submit it instead of running this again: "
                f"submit({value})]")

    def complete(self, key_of: Callable[[Completion], str | None], **kwargs: Any
                 ) -> tuple[Completion, dict[str, Any]]:
        """The model's reply, asked again while it repeats an earlier failed reply word for
        word (see :class:`Aids`): hotter and seeded, with a note on the last observation (for
        that request only) saying how the repeated code ended. In the code space the earlier
        turn is first removed from the context (its reply and observation; its results are
        still in the sandbox), leaving a one-line remark in the message before it, so there
        is nothing left to copy. Returns the completion kept and the usage of every call made
        for it (``resampled``: how many times it was asked again)."""
        aids = self.spec.aids
        t0 = time.monotonic()
        c = self._complete(**kwargs)
        prompt, completion, cost = c.usage.prompt_tokens, c.usage.completion_tokens, c.cost
        tries = 0
        while aids.resample_repeats and tries < aids.resample_tries:
            key = key_of(c)
            if key is None or key not in self.failed or self._budget_reason():
                break
            tries += 1
            c = self._ask_again(key, tries, **kwargs)
            prompt += c.usage.prompt_tokens
            completion += c.usage.completion_tokens
            if c.cost is not None:
                cost = (cost or 0.0) + c.cost
        usage = {"prompt_tokens": prompt, "completion_tokens": completion, "cost": cost,
                 "llm_seconds": time.monotonic() - t0, "resampled": tries}
        return c, usage

    # ---- driving ---------------------------------------------------------------------------
    def go(self) -> Rollout:
        session = None
        end, error = EndReason.MAX_TURNS, None
        try:
            if self.writer:
                self.writer.start(self.traj)
            session = self._open_session()
            system = self.spec.system_prompt(self.inputs)
            if self.node is not None and self.node.prompt_section():
                system += "\n\n" + self.node.prompt_section()
            self.messages = [
                {"role": "system", "content": system},
                {"role": "user", "content": f"Task: {self.task}"},
            ]
            turn = tools_turn if self.spec.action_space == "tools" else code_turn
            while True:
                stop = self._budget_reason()
                if stop:
                    end = stop
                    break
                step = turn(self, session)
                self._add(step)
                if self._grace_due(step.status == "rejected", len(self.steps)):
                    self.graced = True
                if session.submitted:
                    end = EndReason.SUBMITTED
                    break
        except _LLMFailed as exc:
            end, error = EndReason.LLM_ERROR, str(exc)
        except MemexError as exc:
            if session is None and isinstance(exc, ConfigError):
                raise
            end, error = EndReason.SANDBOX_ERROR, f"{type(exc).__name__}: {exc}"
        finally:
            rollout = self._finish(session, end, error)
        return rollout

    def _finish(self, session: AgentSession | None, end: EndReason, error: str | None
                ) -> Rollout:
        submitted = session is not None and session.submitted
        answer = session.answer if session is not None and submitted else None
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
        a = self.spec
        opener = a.backend.open if a.backend is not None else None
        door, prepared = None, False
        if self.node is not None:  # a sub-agent: a fork of its parent or of a template
            opener, door, prepared = self.node.session_options(opener)
        return AgentSession(
            tools=a.tools, submit_schema=a.submit_schema, limits=a.sandbox.limits,
            mounts=a.sandbox.mounts, preload=a.sandbox.preload,
            packages=a.sandbox.packages, inputs=self.inputs,
            tool_budget=a.tool_policy.budget, gate=a.tool_policy.gate,
            install_tools=a.action_space == "code", open_sandbox=opener, door=door,
            spawn=self.node, prepared=prepared, on_call=self.pending_calls.append,
            explain_errors=a.aids.explain_errors, wide_tables=a.aids.wide_tables)

    def _budget_reason(self) -> EndReason | None:
        if len(self.steps) >= self._turn_limit():  # its own turns, a grace turn included
            return EndReason.MAX_TURNS
        end = self.spec.budget.over(tokens=self.prompt_tokens + self.completion_tokens,
                                     seconds=time.monotonic() - self.t0, cost=self.cost)
        if end is None and self.node is not None:  # the tree's, and a cancel from the parent
            end = self.node.stop_reason()
        return end

    def _add(self, step: Step) -> None:
        self.steps.append(step)
        if self.writer:
            self.writer.step(self.traj, step)
        if self.spec.hooks.on_step is not None:
            self.spec.hooks.on_step(step)

    # ---- model calls -----------------------------------------------------------------------
    def _complete(self, messages: list[dict[str, Any]] | None = None, **kwargs: Any
                  ) -> Completion:
        a = self.spec
        c: Completion | None = None
        messages = self.messages if messages is None else messages
        try:
            if a.hooks.on_text is None:
                c = a.llm.complete(messages, **kwargs)
            else:  # stream the text to the caller as it arrives
                for part in a.llm.stream(messages, **kwargs):
                    if isinstance(part, str):
                        a.hooks.on_text(part)
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

    def _ask_again(self, key: str, tries: int, **kwargs: Any) -> Completion:
        """Ask again for a reply that repeated the failed reply ``key``: see :meth:`complete`."""
        a = self.spec
        if a.hooks.on_text is not None:
            a.hooks.on_text("\n[this repeats an earlier reply word for word; asking again]\n")
        turn, outcome, msg = self.replies[key]
        code = a.action_space == "code"
        if code and msg is not None:
            self._remove_turn(msg, outcome)
            self.replies[key] = (turn, outcome, None)
        note = (f"[Your reply repeated {'code' if code else 'calls'} you already ran "
                f"(turn {turn + 1}) word for word; {outcome}. Doing it again gives the "
                "same result: reply with something different (fix the cause, look at the "
                "data first, or submit the answer if you have it).]")
        last = dict(self.messages[-1])
        last["content"] = f"{last.get('content') or ''}\n\n{note}"
        return self._complete([*self.messages[:-1], last], **kwargs,
                              temperature=a.aids.repeat_temperature,
                              seed=1000 * len(self.steps) + tries)

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


def _tool_as_data(text: str, tools: list[str]) -> str | None:
    """The tool a traceback's source lines use as if it were its result (``orders[...]``,
    ``orders.head()``, ``for o in orders``): a name not followed by a call."""
    for line in text.splitlines():
        if not line.startswith("    ") or line.lstrip().startswith(("File ", "~", "^")):
            continue
        for name in tools:
            if re.search(rf"\b{re.escape(name)}\b(?!\s*\()", line):
                return name
    return None


def _assigned(blocks: list[str]) -> list[str]:
    """Names the blocks bind at top level with ``=``, in order."""
    out: list[str] = []
    for code in blocks:
        try:
            tree = ast.parse(code)
        except SyntaxError:
            continue
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else (
                [node.target] if isinstance(node, ast.AnnAssign | ast.AugAssign) else [])
            out += [t.id for t in targets if isinstance(t, ast.Name)]
    return out


def _start_child(spec: AgentSpec, task: str, inputs: dict[str, Any], node: Node
                 ) -> Rollout:
    """How a spawn tree starts a sub-agent's rollout (given to the tree, so that the tree
    never imports the run)."""
    return Run(spec, task, inputs, node=node).go()


def _info(r: ToolCallRecord) -> ToolCallInfo:
    result = getattr(r, "result", "") or (r.message or "")
    return ToolCallInfo(name=r.tool, arguments=r.arguments, outcome=r.outcome,
                        result=result if r.outcome == "ok" else (r.message or r.outcome),
                        duration=r.duration)


def _jsonable_answer(answer: object) -> Any:
    try:
        return to_jsonable_python(answer, serialize_unknown=True)
    except Exception:
        return repr(answer)
