# Runs inside the guest (exec'd into the module ``memex_agents`` on the first call of
# spawn_agent, spawn_agents, wait_all or as_completed). Imports nothing from the host packages.
"""Sub-agents from a code block.

``spawn_agent(task, ...)`` starts another agent at once and returns an ``AgentHandle``
(``spawn_agents(n, task, ...)`` a group of ``n`` on one task, all or none); the
sub-agent runs on the host in a sandbox of its own, in parallel with this one, and its typed
answer comes back here as an object (never through a model's context).

``h.result(timeout=None)`` waits for the answer and raises ``AgentFailed`` (``kind``: error |
timeout | trap | budget | cancelled, and a ``reason``) when there is none; ``h.done()``;
``h.cancel()``; ``h.trajectory()`` is the sub-agent's whole record (a typed Trajectory).
``wait_all(handles)`` returns every result in order (an ``AgentFailed`` in place of a failed
one); ``as_completed(handles)`` yields handles as they finish; handles are awaitable in the
guest's event loop (``await h``, ``asyncio.gather(*handles)``). A wait never outlives the
block: near the block's time limit it raises TimeoutError and the sub-agents keep running, to
be waited for in a later block. Values are copied by ``boot.py`` (the part every session
loads).
"""

import time as _time

import memex_guest.door as _door
import memex_guest.tools as _tools
from memex_agents import AgentFailed, SpawnError, _prep, _rebuild
from memex_guest._codec import Raw as _Raw
from memex_guest._codec import packb as _packb

__all__ = ["AgentFailed", "AgentHandle", "SpawnError", "as_completed", "spawn_agent",
           "spawn_agents", "wait_all"]

_BUILTINS = {int: "int", float: "float", str: "str", bool: "bool", bytes: "bytes",
             list: "list", dict: "dict", tuple: "tuple", set: "set", frozenset: "frozenset"}
_JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean",
               type(None): "null", list: "array", dict: "object"}


def _json_schema(tp):
    """A JSON Schema for a builtin type or a generic alias of builtins (``list[int]``,
    ``dict[str, float]``, ``int | None``...)."""
    if tp is None:
        return {"type": "null"}
    if tp in _JSON_TYPES:
        return {"type": _JSON_TYPES[tp]}
    origin = getattr(tp, "__origin__", None)
    args = getattr(tp, "__args__", ())
    if origin is None and type(tp).__name__ == "UnionType":
        return {"anyOf": [_json_schema(a) for a in tp.__args__]}
    if origin is list and len(args) == 1:
        return {"type": "array", "items": _json_schema(args[0])}
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": _json_schema(args[0])}
        return {"type": "array", "prefixItems": [_json_schema(a) for a in args],
                "minItems": len(args), "maxItems": len(args)}
    if origin is dict and len(args) == 2 and args[0] is str:
        return {"type": "object", "additionalProperties": _json_schema(args[1])}
    raise SpawnError("submit", "submit=%r: give a JSON Schema dict, a builtin type (int, str, "
                     "list, dict...), list[...]/dict[str, ...] of those, or a record class "
                     "the host knows" % (tp,))


def _submit_spec(submit):
    if isinstance(submit, dict):
        return {"schema": submit}
    if isinstance(submit, type):
        if issubclass(submit, _tools.Record):
            return {"record": submit.__type_name__}
        if submit in _BUILTINS:
            return {"builtin": _BUILTINS[submit]}
    return {"schema": _json_schema(submit)}


def _tool_names(tools):
    if isinstance(tools, str) or not hasattr(tools, "__iter__"):
        raise SpawnError("tools", "tools is a list of tool names (or tool functions)")
    import sys

    mod = sys.modules.get("tools")
    by_alias = {a: n for n, a in (getattr(mod, "ALIASES", None) or {}).items()}
    names = []
    for t in tools:
        if not isinstance(t, str):
            name = getattr(t, "__name__", None)
            if not callable(t) or not isinstance(name, str):
                raise SpawnError("tools", "tools lists names or tool functions, not %r" % (t,))
            t = name
        names.append(by_alias.get(t, t))
    return names


def _request(op, args, typed=False):
    try:
        return _door.request(op, args, {}, typed)
    except _door.DoorError as exc:
        if exc.kind == "unknown_op":
            raise RuntimeError("sub-agents are not enabled for this agent") from None
        raise


def spawn_agent(task, inputs=None, submit=None, tools=None, model=None, limits=None,
                fork=False, instructions=None):
    """Start a sub-agent on ``task`` now and return its AgentHandle (it runs in parallel).

    inputs: {name: value} copied into its session as they are (DataFrames, arrays, records,
        functions, classes, objects). submit: the type of its answer (a JSON Schema dict, a
        builtin type or list[...]/dict[str, ...] of them, a record class such as this task's
        answer class); None accepts any value. tools: the names of the tools it may use
        (default: all of yours). model: another model at the same endpoint. limits: a dict
        tightening max_turns, max_tokens, max_seconds, max_cost, timeout (seconds per block)
        or memory (bytes). fork=True starts it from a copy of this session as it was when
        the previous block ended (what this block defined is not in it: pass it in inputs).
        instructions: extra text for its system prompt."""
    spec = _spec(task, inputs, submit, tools, model, limits, fork, instructions)
    return AgentHandle(_started(_request_spawn("agent.spawn", [spec]), "id"), task)


def spawn_agents(n, task, inputs=None, submit=None, tools=None, model=None, limits=None,
                 fork=False, instructions=None):
    """Start ``n`` sub-agents on the same ``task`` and inputs at once (a group sampled from
    one state: best-of-n, votes); a list of ``n`` AgentHandles. All or none: when the tree's
    budget has no room for all ``n``, none is started. With fork=True every one starts from
    the same copy of this session (its pages shared until each writes). The other
    arguments are spawn_agent's."""
    if type(n) is not int or n < 1:
        raise SpawnError("n", "spawn_agents(n, task, ...) needs n as an int >= 1, not %r"
                         % (n,))
    spec = _spec(task, inputs, submit, tools, model, limits, fork, instructions)
    ids = _started(_request_spawn("agent.spawn_many", [spec, n]), "ids")
    if type(ids) is not list or len(ids) != n:
        raise SpawnError("protocol", "malformed reply: %r" % (ids,))
    return [AgentHandle(i, task) for i in ids]


def _spec(task, inputs, submit, tools, model, limits, fork, instructions):
    """The request spawn_agent and spawn_agents send (checked here, and again on the host)."""
    if not isinstance(task, str) or not task.strip():
        raise SpawnError("task", "spawn_agent() needs the task as a non-empty str")
    spec = {"task": task, "fork": bool(fork)}
    if inputs is not None:
        if not isinstance(inputs, dict):
            raise SpawnError("inputs", "inputs is a dict of name -> value, not %s"
                             % type(inputs).__name__)
        encoded = {}
        for name, value in inputs.items():
            if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
                raise SpawnError("inputs", "input names are public identifiers, not %r"
                                 % (name,))
            where = "inputs[%r]" % name
            prepared = _prep(value, where)
            try:
                encoded[name] = _Raw(_packb(prepared, True))
            except (TypeError, ValueError, OverflowError) as exc:
                raise SpawnError("input", "%s cannot be copied to a sub-agent: %s"
                                 % (where, exc)) from None
        spec["inputs"] = encoded
    if submit is not None:
        spec["submit"] = _submit_spec(submit)
    if tools is not None:
        spec["tools"] = _tool_names(tools)
    if model is not None:
        if not isinstance(model, str) or not model:
            raise SpawnError("model", "model is a model name (str)")
        spec["model"] = model
    if limits is not None:
        if not isinstance(limits, dict):
            raise SpawnError("limits", "limits is a dict such as {'max_turns': 4}")
        spec["limits"] = dict(limits)
    if instructions is not None:
        if not isinstance(instructions, str):
            raise SpawnError("instructions", "instructions is a str")
        spec["instructions"] = instructions
    return spec


def _request_spawn(op, args):
    try:
        return _request(op, args, True)
    except _door.DoorError as exc:
        raise SpawnError(exc.kind, "the sub-agent could not be started: %s" % exc.message
                         ) from None


def _started(reply, key):
    """``reply[key]``, or the SpawnError the host's refusal says."""
    if type(reply) is not dict or key not in reply:
        err = reply if type(reply) is dict else {}
        raise SpawnError(str(err.get("error", "protocol")),
                         str(err.get("message", "malformed reply: %r" % (reply,))))
    return reply[key]


class AgentHandle:
    """A running (or finished) sub-agent. Awaitable in the guest's event loop."""

    __slots__ = ("__weakref__", "_outcome", "_status", "id", "task")

    def __init__(self, agent_id, task):
        self.id = agent_id
        self.task = task
        self._outcome = None  # (True, value) | (False, AgentFailed)
        self._status = "running"

    def _settle(self, res):
        if self._outcome is not None or type(res) is not dict:
            return
        status = res.get("status")
        if status == "done":
            try:
                value = res.get("answer")
                if res.get("pickled"):
                    value = _rebuild(value)
            except Exception as exc:
                self._status = "failed"
                self._outcome = (False, AgentFailed(
                    "error", "its answer could not be rebuilt here: %s: %s"
                    % (type(exc).__name__, exc), self.id, self.task))
                return
            self._status = "done"
            self._outcome = (True, value)
            return
        self._status = status if status in ("failed", "cancelled") else "failed"
        self._outcome = (False, AgentFailed(str(res.get("kind") or "error"),
                                            str(res.get("reason") or ""), self.id, self.task))

    @property
    def status(self):
        """running | done | failed | cancelled (as of the last time the host was asked)."""
        if self._outcome is None:
            self.done()
        return self._status

    def done(self):
        """True once the sub-agent has an answer or a failure (does not wait)."""
        if self._outcome is None:
            r = _request("agent.poll", [[self.id]])
            if type(r) is dict and r.get(self.id) != "running":
                _wait([self], 0.0, "all", quiet=True)
        return self._outcome is not None

    def result(self, timeout=None):
        """The sub-agent's answer (waits); raises AgentFailed if it ended without one, and
        TimeoutError (it keeps running) if ``timeout`` seconds pass first."""
        _wait([self], timeout, "all")
        ok, value = self._outcome
        if ok:
            return value
        raise value

    def exception(self, timeout=None):
        """The AgentFailed of a failed sub-agent, None for one that answered (waits)."""
        _wait([self], timeout, "all")
        return None if self._outcome[0] else self._outcome[1]

    def cancel(self):
        """Stop the sub-agent; True if it was still running."""
        if self._outcome is not None:
            return False
        stopped = bool(_request("agent.cancel", [self.id]))
        _wait([self], 0.0, "all", quiet=True)
        return stopped

    def trajectory(self, timeout=None):
        """The sub-agent's whole trajectory (a typed Trajectory record: steps with code,
        observations, tool calls; answer; end_reason). Waits for it to end."""
        _wait([self], timeout, "all")
        r = _request("agent.trajectory", [self.id])
        if type(r) is dict and "trajectory" in r:
            return r["trajectory"]
        if type(r) is dict and "pending" in r:
            raise TimeoutError(r["pending"])
        raise ValueError(r.get("error") if type(r) is dict else "malformed reply %r" % (r,))

    async def _await(self):
        import asyncio

        delay = 0.002
        while not self.done():
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 0.05)
        return self.result()

    def __await__(self):
        return self._await().__await__()

    def __repr__(self):
        task = self.task if len(self.task) <= 60 else self.task[:57] + "..."
        return "<AgentHandle %s %s: %r>" % (self.id, self._status, task)


def _check_handles(handles, fn):
    handles = list(handles)
    for h in handles:
        if not isinstance(h, AgentHandle):
            raise TypeError("%s() takes AgentHandles from spawn_agent(), not %s"
                            % (fn, type(h).__name__))
    return handles


def _wait(handles, timeout, mode, quiet=False):
    """Block until every handle (``all``) or one more (``any``) has an outcome. Raises
    TimeoutError after ``timeout`` seconds or near the block's time limit (not if quiet)."""
    end = None if timeout is None else _time.monotonic() + max(0.0, timeout)
    before = sum(1 for h in handles if h._outcome is not None)
    while True:
        pending = [h for h in handles if h._outcome is None]
        if not pending or (mode == "any" and len(handles) - len(pending) > before):
            return
        left = None if end is None else max(0.0, end - _time.monotonic())
        ids = list(dict.fromkeys(h.id for h in pending))
        r = _request("agent.wait", [ids, left, mode])
        results = r.get("results") if type(r) is dict else None
        for h in pending:
            if type(results) is dict and h.id in results:
                h._settle(results[h.id])
        pending = [h for h in handles if h._outcome is None]
        if not pending or (mode == "any" and len(handles) - len(pending) > before):
            return
        if quiet:
            return
        names = ", ".join(h.id for h in pending)
        if type(r) is dict and r.get("deadline"):
            raise TimeoutError("this block is near its time limit and sub-agent(s) %s are "
                               "still running; they keep running: wait for them in a later "
                               "block" % names)
        if end is not None and _time.monotonic() >= end:
            raise TimeoutError("sub-agent(s) %s did not finish within %gs; they keep running"
                               % (names, timeout))


def wait_all(handles, timeout=None):
    """Wait for every handle; returns their results in order, with an AgentFailed (not
    raised) in place of each sub-agent that failed."""
    handles = _check_handles(handles, "wait_all")
    _wait(handles, timeout, "all")
    return [h._outcome[1] for h in handles]


def as_completed(handles, timeout=None):
    """Yield the handles as their sub-agents finish (``h.result()`` is then immediate)."""
    waiting = _check_handles(handles, "as_completed")
    end = None if timeout is None else _time.monotonic() + max(0.0, timeout)
    while waiting:
        ready = [h for h in waiting if h._outcome is not None]
        if not ready:
            left = None if end is None else max(0.0, end - _time.monotonic())
            _wait(waiting, left, "any")
            ready = [h for h in waiting if h._outcome is not None]
        for h in ready:
            waiting.remove(h)
            yield h


