"""Sub-agents: ``spawn_agent()`` in a guest starts a full MemEx rollout on the host, in parallel.

A root rollout of an agent built with ``spawn=TreeBudget(...)`` owns a :class:`SpawnTree`: one
budget (depth, live and total sub-agents, turns, tokens, cost, wall time) for every rollout in
the tree, each of which is a :class:`Node`. A node serves its guest's door ops:

* ``agent.spawn(spec)`` (inline, returns at once; ``agent.spawn_many(spec, n)`` for a group,
  all or none): checks the request, starts the child on its
  own thread with its own sandbox and door (a fork of the tree's template for its kind, see
  ``_template``, or with ``fork=True`` a ``fork_in_turn`` of the parent's sandbox), and
  answers its id;
* ``agent.poll(ids)`` / ``agent.cancel(id)`` (inline);
* ``agent.wait(ids, timeout, mode)`` and ``agent.trajectory(id)`` (blocking on a pool thread):
  they return before the calling block's deadline, so a wait never kills the block.

Every rollout of the tree checks the tree's budget before each model call (and a cancel flag);
a budget that runs out cancels every running sub-agent at once (each handle says why). A
cancelled child's sandbox is closed from a helper thread, which interrupts a running block in
~10 ms; a model request already in flight is let finish and its reply discarded. When any
rollout ends, its running children are cancelled and every child thread is joined, so no
sandbox or thread outlives the root. Children's final trajectories are attached to the step
of the parent that spawned them.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from importlib import resources
from typing import TYPE_CHECKING, Any

from ...errors import MemexError
from ...host_tools import EncodeError, encode
from ...runtime_wasm import Door, DoorContext, Sandbox
from .._config import EndReason
from .._session import AgentSession, prelude_cells
from .._spec import Hooks
from .._trajectory import Step, Trajectory
from ..llm import Completion, LLMClient
from ._budget import TreeBudget, failure
from ._spec import ChildSpec, SpawnRefused, holds_objects, parse_spec
from ._template import Templates

if TYPE_CHECKING:
    from .._run import Rollout, Run
    from .._spec import AgentSpec

# How the tree starts a sub-agent's rollout: (agent, task, inputs, node) -> its Rollout. The
# executor's run gives it to the tree, so the tree never imports the agent.
StartRollout = Callable[["AgentSpec", str, dict[str, Any], "Node"], "Rollout"]

__all__ = ["Node", "SpawnTree", "StartRollout"]

WAIT_MARGIN = 0.5  # a wait returns this long before its block's deadline
TREE_GRACE = 2 * WAIT_MARGIN  # a block may run this long past the tree's max_seconds
_UNSET: Any = object()

PROMPT = """\
Sub-agents: spawn_agent(task, inputs={{...}}, submit=None, tools=None, limits=None, \
fork=False) starts another agent on a sub-task and returns a handle at once; it works in \
parallel with you, in a session of its own. inputs are copied into its session as they are \
(DataFrames, arrays, functions, objects); submit is the type of its answer (a JSON Schema \
dict, int/str/list/dict, or a record class such as your answer's); tools names the tools it \
may use (default: all of yours). h.result() waits for its answer as an object (raises \
AgentFailed with .kind and .reason if it has none); h.done(), h.cancel(), h.trajectory() (its \
full record). wait_all(handles) returns all answers in order (an AgentFailed in place of a \
failed one); as_completed(handles) yields handles as they finish; handles can be awaited. \
fork=True starts it from a copy of your variables as they were when your previous block \
ended. spawn_agents(n, task, ...) starts n on the same task at once (all or none; a list of \
handles). At most {max_live} sub-agents run at once ({left} more may be started in all); they \
can nest {levels} more level(s)."""


class SpawnTree:
    """The shared state of one root rollout and its sub-agents (thread-safe)."""

    def __init__(self, budget: TreeBudget, *, start: StartRollout) -> None:
        self.budget = budget
        self.start = start
        self.cond = threading.Condition()
        self.t0 = time.monotonic()
        self.turns = 0
        self.tokens = 0
        self.cost = 0.0
        self.spawned = 0
        self.live = 0
        self.exhausted: EndReason | None = None
        self.nodes: list[Node] = []
        self.templates = Templates()
        self._llms: dict[tuple[int, str], LLMClient] = {}
        self._timer: threading.Timer | None = None
        self._closed = False
        self.root = Node(self, None, node_id="", depth=0, task="")
        if budget.max_seconds is not None:
            self._timer = threading.Timer(budget.max_seconds, self.trip,
                                          (EndReason.MAX_SECONDS,))
            self._timer.name = "memex-agent-tree-timer"
            self._timer.daemon = True
            self._timer.start()

    # ---- budget -------------------------------------------------------------------------
    def _over(self, turns: int | None = None) -> EndReason | None:
        return self.budget.over(turns=turns, tokens=self.tokens, cost=self.cost,
                                seconds=time.monotonic() - self.t0)

    def reserve_turn(self) -> EndReason | None:
        """Count one model call against the tree; the reason it may not happen, if any."""
        with self.cond:
            what = self.exhausted or self._over(self.turns)
            if what is None:
                self.turns += 1
                return None
        self.trip(what)
        return what.of_tree()

    def charge(self, tokens: int, cost: float | None) -> None:
        with self.cond:
            self.tokens += tokens
            self.cost += cost or 0.0
            what = self._over()
        if what is not None:
            self.trip(what)

    def usage(self) -> str:
        b = self.budget
        parts = [f"{self.turns}{'/' + str(b.max_turns) if b.max_turns else ''} turns",
                 f"{self.tokens}{'/' + str(b.max_tokens) if b.max_tokens else ''} tokens"]
        if b.max_cost is not None:
            parts.append(f"${self.cost:.4f}/${b.max_cost:g}")
        if b.max_seconds is not None:
            parts.append(f"{time.monotonic() - self.t0:.1f}/{b.max_seconds:g}s")
        return ", ".join(parts)

    def trip(self, what: EndReason) -> None:
        """The tree's ``what`` budget ran out: every running sub-agent is cancelled."""
        with self.cond:
            if self.exhausted is None:
                self.exhausted = what
            victims = [n for n in self.nodes if n.status == "running"]
        reason = f"the agent tree's {what.cap} budget ran out ({self.usage()})"
        for n in victims:
            n.stop("budget", reason, what.of_tree())

    def seconds_left(self) -> float | None:
        b = self.budget
        return None if b.max_seconds is None else b.max_seconds - (time.monotonic() - self.t0)

    def llm_for(self, llm: LLMClient, model: str) -> LLMClient:
        """A client for ``model`` at ``llm``'s endpoint, shared within the tree."""
        key = (id(llm), model)
        with self.cond:
            if key not in self._llms:
                self._llms[key] = llm.with_model(model)
            return self._llms[key]

    def close(self) -> None:
        """Stop the wall-time timer and release the clients made for other models."""
        if self._closed:
            return
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer.join()
        self.templates.close()
        for llm in self._llms.values():
            llm.close()


class Node:
    """One rollout of a tree: the root (``parent is None``) or a sub-agent."""

    def __init__(self, tree: SpawnTree, parent: Node | None, *, node_id: str, depth: int,
                 task: str, agent: AgentSpec | None = None,
                 inputs: dict[str, Any] | None = None, pickled: tuple[str, ...] = (),
                 step_index: int = 0) -> None:
        self.tree = tree
        self.parent = parent
        self.id = node_id
        self.depth = depth
        self.task = task
        self.agent = agent
        self.inputs = inputs or {}
        self.pickled = pickled
        self.step_index = step_index
        self.children: list[Node] = []
        self.by_id: dict[str, Node] = {}
        self.run: Run | None = None
        self.session: AgentSession | None = None
        self.thread: threading.Thread | None = None
        self.fork_sandbox: Sandbox | None = None
        self.status = "running"  # running | done | failed | cancelled
        self.kind: str | None = None
        self.reason = ""
        self.stopped: tuple[str, str, EndReason] | None = None  # kind, reason, end
        self.answer: Any = None
        self.answer_enc: Any = _UNSET
        self.trajectory: Trajectory | None = None
        self.finished = False
        self._closer: threading.Thread | None = None

    # ---- hooks for the rollout (Run) ---------------------------------------------------
    def stop_reason(self) -> EndReason | None:
        """Why this rollout may not make another model call (checked before each one)."""
        if self.stopped is not None:
            return self.stopped[2]
        return self.tree.reserve_turn()

    def charge(self, c: Completion) -> None:
        self.tree.charge(c.usage.prompt_tokens + c.usage.completion_tokens, c.cost)

    def turn_seconds_left(self) -> float | None:
        """The bound the tree's wall time puts on a block starting now. A little grace past
        the tree's end lets a block waiting for sub-agents see them cancelled (and why)
        instead of being cut off at the same moment."""
        left = self.tree.seconds_left()
        return None if left is None else max(0.0, left) + TREE_GRACE

    def end_reason(self, end: EndReason) -> EndReason:
        if end is not EndReason.SUBMITTED and self.stopped is not None:
            return self.stopped[2]
        return end

    def session_options(self, opener: Callable[..., Any] | None
                        ) -> tuple[Callable[..., Any] | None, Door | None, bool]:
        """(opener, door, prepared) for the rollout's session: the fork of its parent made at
        spawn time, else a fork of the tree's template for its kind (in-process sandboxes
        only: ``opener`` is the backend's, or None)."""
        sb = self.fork_sandbox
        if sb is not None:
            def take(**_kw: Any) -> Sandbox:
                self.fork_sandbox = None  # the session owns it now
                return sb

            return take, sb.door, False
        if self.parent is None or opener is not None or self.agent is None:
            return opener, None, False
        define, _ = prelude_cells([], self)
        return self.tree.templates.opener(self.agent, define), None, True

    def bind(self, session: AgentSession) -> None:
        """Serve the sub-agent door ops of ``session``'s guest (called by the session)."""
        with self.tree.cond:
            self.session = session
        door = session.door
        door.register("agent.spawn", self._op_spawn, inline=True)
        door.register("agent.spawn_many", self._op_spawn_many, inline=True)
        door.register("agent.poll", self._op_poll, inline=True)
        door.register("agent.cancel", self._op_cancel, inline=True)
        door.register("agent.wait", self._op_wait, context=True)
        door.register("agent.trajectory", self._op_trajectory, context=True)
        door.register("agent.api", self._op_api, inline=True)

    def guest_define(self) -> str:
        """A cell defining the guest module ``memex_agents`` (the small part of the API every
        session needs; the rest loads on first use, see ``_op_api``). The same for every
        session, so a template sandbox runs it once for all the children it is forked for."""
        return ("def __memex_spawn_define__(src):\n"
                "    import sys, types\n"
                "    m = types.ModuleType('memex_agents')\n"
                "    m.__file__ = '<memex-agents>'\n"
                "    sys.modules['memex_agents'] = m\n"
                "    exec(compile(src, '<memex-agents>', 'exec'), m.__dict__)\n"
                f"__memex_spawn_define__({_guest_source('boot.py')!r})\n"
                "del __memex_spawn_define__\n")

    def guest_hooks(self) -> str:
        """An expression that binds the API in ``__main__`` for this node and gives the
        prelude its hooks."""
        config = {"depth": self.depth, "max_depth": self.tree.budget.max_depth,
                  "pickled": list(self.pickled)}
        return f"__import__('sys').modules['memex_agents']._setup({config!r})"

    def prompt_section(self) -> str:
        b = self.tree.budget
        if self.depth >= b.max_depth:
            return ""
        left = max(0, b.max_children - self.tree.spawned)
        return PROMPT.format(max_live=b.max_live, left=left, levels=b.max_depth - self.depth)

    def finish(self, end: str, submitted: bool, answer: object) -> None:
        """The rollout ended: cancel its running children and join every child thread. A
        sub-agent's answer is given to its parent now, before its sandbox closes."""
        with self.tree.cond:
            children = list(self.children)
        for c in children:
            c.stop("cancelled", f"its parent agent ended ({end})", EndReason.CANCELLED)
        for c in children:
            if c.thread is not None:
                c.thread.join()
        if self.parent is None:
            self.tree.close()
        elif submitted:
            with self.tree.cond:
                if self.status == "running":
                    self.status, self.answer = "done", answer
                    self.tree.live -= 1
                    self.tree.cond.notify_all()

    def attach(self, steps: list[Step]) -> list[Step]:
        """``steps`` with each child's trajectory attached to the step that spawned it."""
        if not steps:
            return steps
        by_step: dict[int, list[Trajectory]] = {}
        for c in self.children:
            if c.trajectory is not None:
                by_step.setdefault(min(c.step_index, len(steps) - 1), []).append(c.trajectory)
        return [replace(s, children=s.children + tuple(by_step[i])) if i in by_step else s
                for i, s in enumerate(steps)]

    # ---- lifecycle of a child ----------------------------------------------------------
    def stop(self, kind: str, reason: str, end_reason: EndReason) -> bool:
        """Decide this child's outcome as a failure now and interrupt its work; False if it
        had already ended."""
        tree = self.tree
        with tree.cond:
            if self.status != "running":
                return False
            self.stopped = (kind, reason, end_reason)
            self.status = "cancelled" if kind == "cancelled" else "failed"
            self.kind, self.reason = kind, reason
            tree.live -= 1
            if self.session is not None and self._closer is None:
                # started under the lock, so the child's thread never sees it unstarted
                self._closer = threading.Thread(
                    target=_close_quietly, args=(self.session,), daemon=True,
                    name=f"memex-agent-{self.id}-stop")
                self._closer.start()
            tree.cond.notify_all()
        return True

    def _main(self) -> None:
        """The child's thread: one full rollout, then its outcome for the parent."""
        rollout: Rollout | None = None
        error: str | None = None
        try:
            assert self.agent is not None
            rollout = self.tree.start(self.agent, self.task, self.inputs, self)
        except BaseException as exc:  # a child's failure is data for its parent
            error = f"{type(exc).__name__}: {exc}"
        finally:
            self.inputs = {}
            if self.fork_sandbox is not None:  # never handed to a session
                self.fork_sandbox.close()
                self.fork_sandbox = None
            with self.tree.cond:
                closer = self._closer
            if closer is not None:
                closer.join()
            self._finished(rollout, error)

    def _finished(self, rollout: Rollout | None, error: str | None) -> None:
        tree = self.tree
        traj = rollout.trajectory if rollout is not None else self._failed_trajectory(error)
        with tree.cond:
            self.trajectory = traj
            self.session = None
            if self.status == "running":
                if rollout is not None and rollout.submitted:
                    self.status, self.answer = "done", rollout.answer
                else:
                    self.kind, self.reason = failure(rollout, error)
                    self.status = "cancelled" if self.kind == "cancelled" else "failed"
                tree.live -= 1
            self.finished = True
            tree.cond.notify_all()

    def _failed_trajectory(self, error: str | None) -> Trajectory:
        a = self.agent
        return Trajectory(id=uuid.uuid4().hex[:16], task=self.task,
                          model=str(a.llm.model) if a is not None else "",
                          action_space=a.action_space if a is not None else "",
                          started=time.time(), end_reason=EndReason.ERROR, error=error)

    # ---- door ops (this node is the parent) --------------------------------------------
    def _op_spawn(self, spec: object) -> dict[str, Any]:
        try:
            return {"id": self._spawn(spec, 1)[0].id}
        except SpawnRefused as exc:
            return {"error": exc.kind, "message": exc.message}

    def _op_spawn_many(self, spec: object, n: object) -> dict[str, Any]:
        try:
            if type(n) is not int or n < 1:
                raise SpawnRefused("n", f"spawn_agents needs n as an int >= 1, not {n!r}")
            return {"ids": [node.id for node in self._spawn(spec, n)]}
        except SpawnRefused as exc:
            return {"error": exc.kind, "message": exc.message}

    def _spawn(self, raw: object, n: int) -> list[Node]:
        """``n`` children on one request, all or none: the budget is checked for all of
        them at once, and with ``fork`` every child maps the same image of this session."""
        tree, b, run, session = self.tree, self.tree.budget, self.run, self.session
        if run is None or session is None:
            raise SpawnRefused("protocol", "this agent is not running")
        if self.stopped is not None:
            raise SpawnRefused("cancelled", "this agent is being stopped")
        if self.depth >= b.max_depth:
            raise SpawnRefused("depth", f"sub-agents may nest {b.max_depth} level(s) deep and "
                               f"this agent is at depth {self.depth}: do this work here")
        records = {name: cls for cls, name in session.toolset.record_names.items()}
        spec = parse_spec(raw, tools=run.spec.tools, records=records, budget=run.spec.budget,
                          limits=run.spec.sandbox.limits, allowed_models=b.models)
        sandbox = session.sandbox
        if spec.fork and not isinstance(sandbox, Sandbox):
            raise SpawnRefused("fork", "fork=True needs an in-process sandbox")
        agent = self._child_agent(spec)
        what = "sub-agent" if n == 1 else f"{n} sub-agents"
        with tree.cond:
            if tree.exhausted is not None:
                raise SpawnRefused("budget", f"the agent tree's {tree.exhausted} budget ran "
                                   f"out ({tree.usage()})")
            if tree.live + n > b.max_live:
                then = "wait for one first" if n == 1 else "start fewer, or wait for some"
                raise SpawnRefused("max_live", f"{tree.live} sub-agents are running in this "
                                   f"agent tree (max_live={b.max_live}), no room for {what}: "
                                   f"{then}")
            if tree.spawned + n > b.max_children:
                raise SpawnRefused("max_children", f"this agent tree has started "
                                   f"{tree.spawned} of its {b.max_children} sub-agents "
                                   f"(max_children), no room for {what}")
            nodes = []
            for _ in range(n):
                k = len(self.children) + 1
                node = Node(tree, self, node_id=f"{self.id}.{k}" if self.id else str(k),
                            depth=self.depth + 1, task=spec.task, agent=agent,
                            inputs=spec.inputs, pickled=spec.pickled,
                            step_index=len(run.steps))
                self.children.append(node)
                self.by_id[node.id] = node
                tree.nodes.append(node)
                nodes.append(node)
            tree.spawned += n
            tree.live += n
        started = 0
        try:
            if spec.fork:
                assert isinstance(sandbox, Sandbox)
                for node in nodes:  # one image of this session, mapped by each
                    node.fork_sandbox = sandbox.fork_in_turn(door=Door(), limits=spec.limits)
            for node in nodes:
                node.thread = threading.Thread(target=node._main, daemon=True,
                                               name=f"memex-agent-{node.id}")
                node.thread.start()
                started += 1
        except (MemexError, RuntimeError) as exc:
            for node in nodes[started:]:
                node.thread = None
                if node.fork_sandbox is not None:
                    node.fork_sandbox.close()
                    node.fork_sandbox = None
            with tree.cond:
                tree.spawned -= n - started
                tree.live -= n - started
                for node in nodes[started:]:
                    self.children.remove(node)
                    del self.by_id[node.id]
                    tree.nodes.remove(node)
            for node in nodes[:started]:  # started before a thread could not be: stopped
                node.stop("cancelled", "the rest of its group could not be started",
                          EndReason.CANCELLED)
            raise SpawnRefused("fork" if spec.fork else "start",
                               f"the {what} could not be started: {exc}") from None
        return nodes

    def _child_agent(self, spec: ChildSpec) -> AgentSpec:
        """The parent's spec with the child's tools, answer schema, instructions, budget,
        limits and model; nobody watches a child's rollout but its parent."""
        assert self.run is not None
        parent = self.run.spec
        llm = parent.llm
        if spec.model is not None and spec.model != parent.llm.model:
            llm = self.tree.llm_for(parent.llm, spec.model)
        return replace(parent, llm=llm, tools=spec.tools, submit_schema=spec.submit,
                       instructions=spec.instructions, budget=spec.budget,
                       sandbox=replace(parent.sandbox, limits=spec.limits), hooks=Hooks())

    def _lookup(self, ids: object) -> list[tuple[str, Node | None]]:
        if not isinstance(ids, list):
            ids = [ids]
        return [(str(i), self.by_id.get(i) if isinstance(i, str) else None) for i in ids]

    def _op_api(self) -> str:
        return _guest_source("api.py")

    def _op_poll(self, ids: object) -> dict[str, str]:
        with self.tree.cond:
            return {i: n.status if n is not None else "unknown" for i, n in self._lookup(ids)}

    def _op_cancel(self, agent_id: object) -> bool:
        node = self.by_id.get(agent_id) if isinstance(agent_id, str) else None
        return node is not None and node.stop("cancelled", "cancelled by its parent agent",
                                              EndReason.CANCELLED)

    def _op_wait(self, ctx: DoorContext, ids: object, timeout: object = None, mode: object = "all"
                 ) -> dict[str, Any]:
        nodes = self._lookup(ids)
        now = time.monotonic()
        deadline = ctx.deadline - WAIT_MARGIN
        until, why = min((deadline, "deadline"), (now + ctx.door.call_timeout - 1.0, "slice"))
        if isinstance(timeout, int | float) and not isinstance(timeout, bool) \
                and now + max(0.0, timeout) < until:
            until, why = now + max(0.0, timeout), "timeout"
        known = [n for _, n in nodes if n is not None]
        with self.tree.cond:
            while True:
                ended = sum(1 for n in known if n.status != "running")
                if ended == len(known) or (mode == "any" and ended) or \
                        self.stopped is not None:
                    break
                left = until - time.monotonic()
                if left <= 0:
                    break
                self.tree.cond.wait(left)
            settled = [(i, n) for i, n in nodes if n is None or n.status != "running"]
        pending = [i for i, n in nodes if n is not None and n.status == "running"]
        results = {i: self._result(i, n) for i, n in settled}
        return {"results": results, "pending": pending,
                "deadline": bool(pending) and why == "deadline"
                and time.monotonic() >= until}

    def _result(self, agent_id: str, node: Node | None) -> dict[str, Any]:
        if node is None:
            return {"status": "failed", "kind": "error",
                    "reason": f"no sub-agent {agent_id!r} here (a handle works only in the "
                              "agent that spawned it)"}
        if node.status != "done":
            return {"status": node.status, "kind": node.kind, "reason": node.reason}
        if node.answer_enc is _UNSET:
            assert self.session is not None
            try:
                node.answer_enc = (encode(node.answer, names=self.session.toolset.record_names),
                                   holds_objects(node.answer))
            except (EncodeError, ValueError, OverflowError) as exc:
                return {"status": "failed", "kind": "error",
                        "reason": f"its answer cannot be sent back: {exc}"}
        answer, pickled = node.answer_enc
        return {"status": "done", "answer": answer, "pickled": pickled}

    def _op_trajectory(self, ctx: DoorContext, agent_id: object) -> dict[str, Any]:
        node = self.by_id.get(agent_id) if isinstance(agent_id, str) else None
        if node is None:
            return {"error": f"no sub-agent {agent_id!r} here (a handle works only in the "
                             "agent that spawned it)"}
        until = min(ctx.deadline - WAIT_MARGIN, time.monotonic() + ctx.door.call_timeout - 1)
        with self.tree.cond:
            while not node.finished:
                left = until - time.monotonic()
                if left <= 0:
                    return {"pending": f"sub-agent {agent_id} is still running or stopping; "
                                       "its trajectory is not final yet: ask again later"}
                self.tree.cond.wait(left)
            traj = node.trajectory
        return {"trajectory": encode(traj)}


_SOURCES: dict[str, str] = {}


def _guest_source(name: str) -> str:
    if name not in _SOURCES:
        guest = resources.files("memex.executor.spawn").joinpath("guest")
        _SOURCES[name] = guest.joinpath(name).read_text()
    return _SOURCES[name]


def _close_quietly(session: AgentSession) -> None:
    with contextlib.suppress(Exception):
        session.sandbox.close()
