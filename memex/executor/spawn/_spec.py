"""What a guest asks for when it spawns a sub-agent, checked and turned into host objects.

Everything here runs inside the parent's ``agent.spawn`` door call, so a bad request is refused
at once with a clear message (:class:`SpawnRefused`) and nothing is started. Inputs arrive in
the typed encoding and are decoded here (the sub-agent's prompt describes them); values the
guest pickled stay opaque :class:`GuestObject` bytes: the host runs another Python than the
guests and never unpickles, unmarshals or evaluates what a guest sends.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...errors import ConfigError, MemexError
from ...host_tools import DecodeError, RecordFields, ToolSet, decode
from ...runtime_wasm import Limits
from .. import _prompt
from .._config import Budget
from .._session import make_submit_tool
from .._trajectory import Trajectory

__all__ = ["ChildSpec", "GuestObject", "SpawnRefused", "describe_input", "from_guest",
           "holds_objects", "parse_spec"]

MAX_TASK_CHARS = 100_000
_BUILTINS: dict[str, Any] = {"int": int, "float": float, "str": str, "bool": bool,
                             "bytes": bytes, "list": list, "dict": dict, "tuple": tuple,
                             "set": set, "frozenset": frozenset}
_BUDGET_KEYS = ("max_turns", "max_tokens", "max_seconds", "max_cost")
_LIMIT_KEYS = ("timeout", "memory")
_INT_KEYS = ("max_turns", "max_tokens", "memory")
_PLAIN = frozenset([str, int, float, bool, bytes, type(None)])


@dataclass(frozen=True, kw_only=True)
class GuestObject:
    """A value a guest pickled to hand to a sub-agent (a function, a class, any object the
    typed codec cannot carry). The host carries ``data`` between guests and never opens it."""

    what: str  # e.g. "function score(a, b)", "class Point", "KMeans object"
    data: bytes

    def __repr__(self) -> str:
        return f"<GuestObject {self.what} ({len(self.data)} bytes)>"


class SpawnRefused(Exception):
    """A spawn request refused before anything started; the guest raises ``SpawnError``
    with ``kind`` and the message."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


@dataclass(frozen=True, kw_only=True)
class ChildSpec:
    """A checked spawn request."""

    task: str
    inputs: dict[str, Any]
    pickled: tuple[str, ...]  # the inputs holding GuestObjects (rebuilt in the child's guest)
    tools: ToolSet
    submit: Any
    model: str | None
    budget: Budget
    limits: Limits
    fork: bool
    instructions: str


def parse_spec(spec: object, *, tools: ToolSet, records: Mapping[str, type],
               budget: Budget, limits: Limits, allowed_models: tuple[str, ...] | None
               ) -> ChildSpec:
    """Check a guest's spawn request against the parent's tools, record classes (guest name
    -> host class), budget and limits."""
    if not isinstance(spec, dict):
        raise SpawnRefused("protocol", "a spawn request is a map")
    unknown = set(spec) - {"task", "inputs", "submit", "tools", "model", "limits", "fork",
                           "instructions"}
    if unknown:
        raise SpawnRefused("protocol", f"unknown spawn fields {sorted(map(str, unknown))}")
    task = spec.get("task")
    if not isinstance(task, str) or not task.strip():
        raise SpawnRefused("task", "the task must be a non-empty str")
    if len(task) > MAX_TASK_CHARS:
        raise SpawnRefused("task", f"the task has {len(task)} characters (at most "
                           f"{MAX_TASK_CHARS}); pass large material in inputs")
    child_tools = _tools(spec.get("tools"), tools)
    inputs, pickled = _inputs(spec.get("inputs"), child_tools)
    submit = _submit(spec.get("submit"), records)
    model = spec.get("model")
    if model is not None:
        if not isinstance(model, str) or not model:
            raise SpawnRefused("model", "model is a model name")
        if allowed_models is not None and model not in allowed_models:
            raise SpawnRefused("model", f"model {model!r} is not allowed here; allowed: "
                               f"{', '.join(allowed_models) or 'none'}")
    b, lim = _limits(spec.get("limits"), budget, limits)
    instructions = spec.get("instructions") or ""
    if not isinstance(instructions, str):
        raise SpawnRefused("instructions", "instructions is a str")
    return ChildSpec(task=task, inputs=inputs, pickled=pickled, tools=child_tools,
                     submit=submit, model=model,
                     budget=b, limits=lim, fork=bool(spec.get("fork")),
                     instructions=instructions)


def _tools(raw: object, tools: ToolSet) -> ToolSet:
    if raw is None:
        return tools
    if not isinstance(raw, list | tuple) or not all(isinstance(n, str) for n in raw):
        raise SpawnRefused("tools", "tools is a list of tool names")
    unknown = [n for n in raw if n not in tools]
    if unknown:
        have = ", ".join(tools.names) or "none"
        raise SpawnRefused("tools", f"no tool named {', '.join(map(repr, unknown))} "
                           f"(this agent's tools: {have})")
    return tools.filter(list(raw))


def _inputs(raw: object, tools: ToolSet) -> tuple[dict[str, Any], tuple[str, ...]]:
    if raw is None:
        return {}, ()
    if not isinstance(raw, dict):
        raise SpawnRefused("inputs", "inputs is a map of name -> value")
    out: dict[str, Any] = {}
    pickled: list[str] = []
    for name, enc in raw.items():
        if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
            raise SpawnRefused("inputs", f"input names are public identifiers, not {name!r}")
        if name in tools or name in ("submit", "tools"):
            raise SpawnRefused("inputs", f"input {name!r} would hide the tool of that name")
        found: list[bool] = []
        try:
            out[name] = from_guest(decode(enc, max_depth=256), found)
        except DecodeError as exc:
            where = "".join(f"[{p!r}]" for p in exc.path)
            raise SpawnRefused("input", f"inputs[{name!r}]{where} is malformed: "
                               f"{exc.message}") from None
        if found:
            pickled.append(name)
    return out, tuple(pickled)


def from_guest(v: object, found: list[bool], depth: int = 0) -> Any:
    """A decoded guest value with pickled values as :class:`GuestObject` and trajectory
    records as :class:`~memex.executor.Trajectory` (other records stay ``RecordFields``);
    ``found`` gets an entry for each GuestObject."""
    if depth > 256 or v is None or isinstance(v, str | int | float | bytes):
        return v
    if isinstance(v, RecordFields):
        if v.type_name == "GuestObject":
            what, data = v.get("what"), v.get("data")
            if not isinstance(what, str) or not isinstance(data, bytes) or len(v) != 2:
                raise DecodeError("a GuestObject record is {what: str, data: bytes}")
            found.append(True)
            return GuestObject(what=what[:200], data=data)
        fields = {k: from_guest(x, found, depth + 1) for k, x in v.items()}
        if v.type_name == "Trajectory":
            try:
                return Trajectory.from_dict(fields)
            except ConfigError:
                pass
        return RecordFields(v.type_name, fields)
    if isinstance(v, list | tuple):
        if all(type(x) in _PLAIN for x in v):
            return v
        items = [from_guest(x, found, depth + 1) for x in v]
        return items if isinstance(v, list) else tuple(items)
    if isinstance(v, dict):
        return {k: from_guest(x, found, depth + 1) for k, x in v.items()}
    return v


def holds_objects(v: object, depth: int = 0) -> bool:
    """Whether a value (a sub-agent's answer) holds a value a guest pickled."""
    if depth > 256 or type(v) in _PLAIN:
        return False
    if isinstance(v, GuestObject) or (isinstance(v, RecordFields)
                                      and v.type_name == "GuestObject"):
        return True
    if isinstance(v, list | tuple):
        return any(holds_objects(x, depth + 1) for x in v if type(x) not in _PLAIN)
    if isinstance(v, dict):
        return any(holds_objects(x, depth + 1) for x in v.values())
    return False


def _submit(raw: object, records: Mapping[str, type]) -> Any:
    if raw is None:
        return None
    if not isinstance(raw, dict) or len(raw) != 1:
        raise SpawnRefused("submit", "malformed submit spec")
    (kind, value), = raw.items()
    schema: Any
    if kind == "builtin" and value in _BUILTINS:
        schema = _BUILTINS[value]
    elif kind == "record" and isinstance(value, str):
        if value not in records:
            known = ", ".join(sorted(records)) or "none"
            raise SpawnRefused("submit", f"submit={value}: the host knows no record class of "
                               f"that name (known: {known}); pass a JSON Schema dict instead")
        schema = records[value]
    elif kind == "schema" and isinstance(value, dict):
        schema = value
    else:
        raise SpawnRefused("submit", f"malformed submit spec {raw!r:.200}")
    try:
        make_submit_tool(schema, lambda _a: None)
    except MemexError as exc:
        raise SpawnRefused("submit", f"the submit schema cannot be used: {exc}") from None
    return schema


def _limits(raw: object, budget: Budget, limits: Limits) -> tuple[Budget, Limits]:
    if raw is None:
        return budget, limits
    if not isinstance(raw, dict):
        raise SpawnRefused("limits", "limits is a map such as {'max_turns': 4}")
    b: dict[str, Any] = {}
    lim: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in _BUDGET_KEYS + _LIMIT_KEYS:
            raise SpawnRefused("limits", f"unknown limit {key!r}; use "
                               f"{', '.join(_BUDGET_KEYS + _LIMIT_KEYS)}")
        number = int | float if key not in _INT_KEYS else int
        if isinstance(value, bool) or not isinstance(value, number) or not (
                value > 0 and math.isfinite(value)):
            raise SpawnRefused("limits", f"limits[{key!r}] must be a positive "
                               f"{'int' if number is int else 'number'}, got {value!r}")
        if key in _LIMIT_KEYS:
            lim[key] = value
            continue
        own = getattr(budget, key)
        if own is not None and value > own:
            raise SpawnRefused("limits", f"limits[{key!r}]={value} is above this agent's own "
                               f"{own}: a sub-agent's limits can only be tighter")
        b[key] = value
    try:  # the sandbox's limits: the one reader, this agent's own as base and ceiling
        return dataclasses.replace(budget, **b), Limits.from_mapping(
            lim, base=limits, ceiling=limits, where="the sub-agent's limits")
    except ConfigError as exc:
        raise SpawnRefused("limits", str(exc)) from None


def describe_input(v: object) -> str:
    """One line about an input for the prompt (``_prompt.describe_value`` plus the values
    that arrive from a guest)."""
    if isinstance(v, GuestObject):
        return v.what
    if isinstance(v, RecordFields):
        names = ", ".join(list(v)[:12])
        return f"{v.type_name} record with fields: {names}"
    return _prompt.describe_value(v)
