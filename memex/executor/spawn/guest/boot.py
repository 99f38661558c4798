# Runs inside the guest (exec'd by memex.executor's session into the module
# ``memex_agents``). Imports nothing from the host packages.
"""The part of the sub-agent API every session needs, kept small because every session
compiles it: the exceptions, the copying of values (inputs, a sub-agent's answer) and the
names bound in ``__main__``. ``spawn_agent``, ``spawn_agents``, ``wait_all`` and ``as_completed``
there load the rest (``api.py``, fetched through the door) the first time one is called.

Values are copied with their types: plain values, tuples, sets, datetimes, numpy arrays,
DataFrames and records travel through the typed codec; functions, classes and any other object
are pickled here (cloudpickle: by value for what this session defined) and rebuilt in the other
agent's sandbox. The host carries those bytes as an opaque ``GuestObject`` record and never
unpickles them.
"""

import memex_guest.door as _door
import memex_guest.tools as _tools
from memex_guest._codec import Raw as _Raw
from memex_guest._codec import ext_bytes as _ext_bytes
from memex_guest._codec import packb as _packb

_EXT_RECORD = 5
_OBJECT = "GuestObject"  # record type of a pickled value (the host never opens it)
_PLAIN = (str, int, float, bool, bytes, type(None))
_CODEC_MODULES = ("numpy", "pandas", "datetime", "decimal")  # the typed codec carries these
_MAX_DEPTH = 200
_config = {"depth": 0, "max_depth": 0, "pickled": ()}
_api = {}  # the loaded names of api.py


class AgentFailed(Exception):
    """A sub-agent that ended without an answer. ``kind`` is error | timeout | trap | budget |
    cancelled; ``reason`` says why; ``agent_id`` and ``task`` say which."""

    def __init__(self, kind, reason, agent_id=None, task=None):
        super().__init__(kind, reason)
        self.kind = kind
        self.reason = reason
        self.agent_id = agent_id
        self.task = task

    def __str__(self):
        who = "sub-agent %s" % self.agent_id if self.agent_id else "sub-agent"
        return "%s failed (%s): %s" % (who, self.kind, self.reason)

    def __reduce__(self):
        return AgentFailed, (self.kind, self.reason, self.agent_id, self.task)


class SpawnError(Exception):
    """spawn_agent() refused to start a sub-agent: a bad argument (``kind`` task, inputs,
    input, submit, tools, model, limits) or a budget of the agent tree (depth, max_live,
    max_children, budget, cancelled). Nothing was started."""

    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind
        self.message = message

    def __reduce__(self):
        return SpawnError, (self.kind, self.message)


# ---- values -------------------------------------------------------------------------------
def _what(v):
    """A short description of a value that travels pickled (shown to the sub-agent's model)."""
    t = type(v)
    code = getattr(v, "__code__", None)
    if code is not None and callable(v):
        names = list(code.co_varnames[:code.co_argcount + code.co_kwonlyargcount])
        if code.co_flags & 0x04:
            names.insert(code.co_argcount, "*" + code.co_varnames[len(names)])
        return "function %s(%s)" % (getattr(v, "__name__", "?"), ", ".join(names))
    if isinstance(v, type):
        return "class %s" % v.__name__
    if t.__name__ == "module":
        return "module %s" % v.__name__
    mod = t.__module__
    return "%s object" % (t.__name__ if mod in ("__main__", "builtins") else
                          "%s.%s" % (mod, t.__qualname__))


def _pickled(v, where):
    try:
        import cloudpickle

        dumps = cloudpickle.dumps
    except ImportError:  # a guest without cloudpickle: importable objects only
        import pickle

        dumps = pickle.dumps
    try:
        data = dumps(v)
    except Exception as exc:
        raise SpawnError("input", "%s (%s) cannot be copied to a sub-agent: %s: %s"
                         % (where, _what(v), type(exc).__name__, exc)) from None
    return _record(_OBJECT, {"what": _what(v), "data": data})


def _record(type_name, fields):
    return _Raw(_ext_bytes(_EXT_RECORD, _packb([type_name, fields], True)))


def _prep(v, where, depth=0):
    """``v`` ready for the typed codec: records keep their type names (the codec would send
    their fields as a dict), and what the codec cannot carry is pickled."""
    t = type(v)
    if t in _PLAIN:
        return v
    if depth > _MAX_DEPTH:
        raise SpawnError("input", "%s is nested more than %d levels deep" % (where, _MAX_DEPTH))
    d = depth + 1
    if t is list or t is tuple:
        if all(type(x) in _PLAIN for x in v):
            return v
        items = [_prep(x, "%s[%d]" % (where, i), d) for i, x in enumerate(v)]
        return items if t is list else tuple(items)
    if t is dict:
        return {k: _prep(x, "%s[%r]" % (where, k), d) for k, x in v.items()}
    if t.__name__ == "AgentHandle" and t.__module__ == "memex_agents":
        raise SpawnError("input", "%s is an AgentHandle, which means nothing to another agent: "
                         "pass its result() or trajectory() instead" % where)
    if isinstance(v, _tools.Record):
        fields = {k: _prep(x, "%s.%s" % (where, k), d) for k, x in v.__dict__.items()
                  if x is not _tools.MISSING}
        return _record(v.__record_type__, fields)
    if t in (set, frozenset) or t.__module__.partition(".")[0] in _CODEC_MODULES:
        return v
    return _pickled(v, where)


def _unpickle(rec):
    import pickle

    data = rec.__dict__.get("data")
    if type(data) is not bytes:
        raise TypeError("a GuestObject record without its bytes")
    return pickle.loads(data)


def _rebuild(v, depth=0):
    """``v`` with every GuestObject record (in lists, dicts, tuples and records) unpickled."""
    t = type(v)
    if t in _PLAIN or depth > _MAX_DEPTH:
        return v
    d = depth + 1
    if t is list:
        for i, x in enumerate(v):
            y = _rebuild(x, d)
            if y is not x:
                v[i] = y
        return v
    if t is dict:
        for k, x in list(v.items()):
            y = _rebuild(x, d)
            if y is not x:
                v[k] = y
        return v
    if t is tuple:
        items = [_rebuild(x, d) for x in v]
        return v if all(a is b for a, b in zip(items, v, strict=True)) else tuple(items)
    if isinstance(v, _tools.Record):
        if v.__record_type__ == _OBJECT:
            return _unpickle(v)
        for k, x in list(v.__dict__.items()):
            y = _rebuild(x, d)
            if y is not x:
                v.__dict__[k] = y
    return v


def _prep_answer(answer):
    """A sub-agent's answer made ready for ``submit``: functions and objects pickled, so the
    parent gets them back as objects."""
    return _prep(answer, "the answer")


# ---- the names in __main__ (the rest of the API loads on first use) ------------------------
def _load():
    if not _api:
        import sys

        src = _door.request("agent.api", [], {}, False)
        exec(compile(src, "<memex-agents>", "exec"), sys.modules["memex_agents"].__dict__)
        g = sys.modules["memex_agents"].__dict__
        _api.update(spawn_agent=g["spawn_agent"], spawn_agents=g["spawn_agents"],
                    wait_all=g["wait_all"], as_completed=g["as_completed"])
    return _api


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
        instructions: extra text for its system prompt.

    ``h.result(timeout=None)`` waits for its answer (raises AgentFailed with ``kind`` error |
    timeout | trap | budget | cancelled and a ``reason``); ``h.done()``; ``h.cancel()``;
    ``h.trajectory()`` (its whole typed record); ``await h``."""
    return _load()["spawn_agent"](task, inputs, submit, tools, model, limits, fork,
                                  instructions)


def spawn_agents(n, task, inputs=None, submit=None, tools=None, model=None, limits=None,
                 fork=False, instructions=None):
    """Start ``n`` sub-agents on the same ``task`` and inputs at once (a group sampled from
    one state: best-of-n, votes); a list of ``n`` AgentHandles. All or none: when the tree's
    budget has no room for all ``n``, none is started. With fork=True every one starts from
    the same copy of this session. The other arguments are spawn_agent's."""
    return _load()["spawn_agents"](n, task, inputs, submit, tools, model, limits, fork,
                                   instructions)


def wait_all(handles, timeout=None):
    """Wait for every handle; returns their results in order, with an AgentFailed (not
    raised) in place of each sub-agent that failed."""
    return _load()["wait_all"](handles, timeout)


def as_completed(handles, timeout=None):
    """Yield the handles as their sub-agents finish (``h.result()`` is then immediate)."""
    return _load()["as_completed"](handles, timeout)


_PUBLIC = {"AgentFailed": AgentFailed, "SpawnError": SpawnError, "spawn_agent": spawn_agent,
           "spawn_agents": spawn_agents, "wait_all": wait_all, "as_completed": as_completed}


def _setup(config):
    """Bind the API in ``__main__``; returns the hooks the agent prelude uses."""
    import __main__

    _config.update(config)
    for name, value in _PUBLIC.items():
        setattr(__main__, name, value)
    return {"rebuild": _rebuild_input, "prepare": _prep_answer if config.get("depth") else None}


def _rebuild_input(name, value):
    """An input with its pickled values rebuilt (the host says which inputs hold any)."""
    return _rebuild(value) if name in _config["pickled"] else value
