"""Trajectories: typed records of every step of a rollout, saved as JSONL events.

A file holds events (``start``, ``step``, ``end``) of one or more rollouts, written as they
happen so a crashed run still leaves a readable prefix. Sub-agent rollouts end after the step
that spawned them was written, so the ``end`` event carries them (``children``: step index ->
trajectories) and loading puts them back on their steps. A :class:`Trajectory` is a plain frozen
record, so it can be handed to another rollout's ``inputs`` and arrives in the guest as a typed
record (steps, code, observations, tool calls), not as flattened text.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from ..errors import ConfigError
from ._config import EndReason

__all__ = ["Step", "ToolCallInfo", "Trajectory", "TrajectoryWriter", "load_trajectories",
           "save_trajectories"]

FORMAT = 1


@dataclass(frozen=True, kw_only=True)
class ToolCallInfo:
    """One tool call: made by code in a block (``kind="code"``), or by the model as a native
    function call (``"native"``) or as a call written in text (``"text"``)."""

    name: str
    arguments: str  # bounded summary
    outcome: str  # "ok" or an error kind
    result: str  # bounded summary of the value, or the error message
    duration: float
    kind: str = "code"


@dataclass(frozen=True, kw_only=True)
class Step:
    """One turn: the model's reply and what was done with it. Tokens and ``llm_seconds``
    include the calls re-asked because a reply repeated an earlier one (``resampled``)."""

    index: int
    reply: str  # the model's text (a native call's code is in `code`)
    action: str  # "code" | "native_code" | "tool_calls" | "none"
    code: tuple[str, ...] = ()
    observation: str = ""  # exactly what went back to the model
    status: str = "ok"  # ok | error | killed | no_action | repeated | submitted | rejected
    tool_calls: tuple[ToolCallInfo, ...] = ()
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float | None = None
    llm_seconds: float = 0.0
    exec_seconds: float = 0.0
    error: str | None = None  # the guest exception type, limit, or loop error
    new_variables: tuple[str, ...] = ()
    children: tuple[Trajectory, ...] = ()  # sub-agent rollouts started in this step
    resampled: int = 0  # extra model calls made because the reply repeated an earlier one


@dataclass(frozen=True, kw_only=True)
class Trajectory:
    """A whole rollout. ``answer`` is the submitted answer as JSON data (``None`` when the
    rollout ended without one); ``end_reason`` says why it ended."""

    id: str
    task: str
    model: str
    action_space: str
    started: float  # unix time
    inputs: Mapping[str, str] = field(default_factory=dict)  # name -> one-line description
    steps: tuple[Step, ...] = ()
    messages: tuple[Mapping[str, Any], ...] = ()
    answer: Any = None
    submitted: bool = False
    end_reason: EndReason = EndReason.RUNNING
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float | None = None
    duration: float = 0.0
    llm_calls: int = 0
    error: str | None = None

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def tool_calls(self) -> tuple[ToolCallInfo, ...]:
        return tuple(c for s in self.steps for c in s.tool_calls)

    # ---- JSON ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return _jsonable(asdict(self))  # type: ignore[no-any-return]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Trajectory:
        try:
            d = dict(data)
            d["inputs"] = dict(d.get("inputs") or {})
            d["steps"] = tuple(_step(s) for s in d.get("steps") or ())
            d["messages"] = tuple(d.get("messages") or ())
            d["end_reason"] = EndReason(d.get("end_reason", EndReason.RUNNING))
            return cls(**d)
        except (TypeError, KeyError, AttributeError, ValueError) as exc:
            raise ConfigError(f"not a MemEx trajectory record: {exc}") from exc

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write this trajectory as a JSONL file of its own (start, steps, end)."""
        with TrajectoryWriter(path, append=False) as w:
            w.write(self)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Trajectory:
        """The single trajectory in ``path`` (see :func:`load_trajectories` for several)."""
        found = load_trajectories(path)
        if len(found) != 1:
            raise ConfigError(f"{path} holds {len(found)} trajectories, not one")
        return found[0]


def _step(s: Mapping[str, Any]) -> Step:
    d = dict(s)
    d["code"] = tuple(d.get("code") or ())
    d["tool_calls"] = tuple(ToolCallInfo(**c) for c in d.get("tool_calls") or ())
    d["new_variables"] = tuple(d.get("new_variables") or ())
    d["children"] = tuple(Trajectory.from_dict(c) for c in d.get("children") or ())
    return Step(**d)


def _jsonable(v: object) -> Any:
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    if v is None or isinstance(v, str | int | float | bool):
        return v
    return repr(v)


_HEAD = ("id", "task", "model", "action_space", "started", "inputs")


class TrajectoryWriter:
    """Appends trajectory events to a JSONL file as a rollout goes, one line per event,
    flushed each time. Thread-safe: several rollouts may share one file."""

    def __init__(self, path: str | os.PathLike[str], *, append: bool = True) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f: IO[str] | None = open(self.path, "a" if append else "w",  # noqa: SIM115
                                        encoding="utf-8")
        self._lock = threading.Lock()

    def _emit(self, event: dict[str, Any]) -> None:
        line = json.dumps(_jsonable(event), ensure_ascii=False)
        with self._lock:
            if self._f is None:
                raise ConfigError(f"trajectory writer for {self.path} is closed")
            self._f.write(line + "\n")
            self._f.flush()

    def start(self, t: Trajectory) -> None:
        self._emit({"event": "start", "format": FORMAT,
                    **{k: getattr(t, k) for k in _HEAD}})

    def step(self, t: Trajectory, step: Step) -> None:
        self._emit({"event": "step", "id": t.id, "step": asdict(step)})

    def end(self, t: Trajectory) -> None:
        d = t.to_dict()
        for k in (*_HEAD, "steps"):
            if k != "id":
                d.pop(k, None)
        children = {str(i): [c.to_dict() for c in s.children]
                    for i, s in enumerate(t.steps) if s.children}
        if children:
            d["children"] = children
        self._emit({"event": "end", **d})

    def write(self, t: Trajectory) -> None:
        """All events of a finished trajectory."""
        self.start(t)
        for s in t.steps:
            self.step(t, replace(s, children=()) if s.children else s)
        self.end(t)

    def close(self) -> None:
        with self._lock:
            if self._f is not None:
                self._f.close()
                self._f = None

    def __enter__(self) -> TrajectoryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load_trajectories(path: str | os.PathLike[str]) -> list[Trajectory]:
    """Every trajectory in a JSONL file, in order of their start events. A rollout whose end
    event is missing (the run died) loads with ``end_reason="incomplete"``."""
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read trajectory file {p}: {exc}") from exc
    order: list[str] = []
    heads: dict[str, dict[str, Any]] = {}
    steps: dict[str, list[Step]] = {}
    ends: dict[str, dict[str, Any]] = {}
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            ev = json.loads(line)
            kind = ev.pop("event")
            if kind == "start":
                ev.pop("format", None)
                tid = ev["id"]
                order.append(tid)
                heads[tid] = ev
                steps[tid] = []
            elif kind == "step":
                steps[ev["id"]].append(_step(ev["step"]))
            elif kind == "end":
                ends[ev["id"]] = ev
            else:
                raise ValueError(f"unknown event {kind!r}")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ConfigError(f"{p}:{n}: not a trajectory event ({exc})") from exc
    out = []
    for tid in order:
        end = dict(ends.get(tid, {"end_reason": "incomplete"}))
        children = end.pop("children", None) or {}
        t = Trajectory.from_dict({**heads[tid], **end})
        try:
            kids = {int(i): tuple(Trajectory.from_dict(c) for c in cs)
                    for i, cs in children.items()}
        except (ValueError, TypeError, AttributeError) as exc:
            raise ConfigError(f"{p}: the children of trajectory {tid} are malformed "
                              f"({exc})") from exc
        found = [replace(s, children=s.children + kids[i]) if i in kids else s
                 for i, s in enumerate(steps[tid])]
        out.append(replace(t, steps=tuple(found)))
    return out


def save_trajectories(trajectories: Iterable[Trajectory], path: str | os.PathLike[str]) -> None:
    with TrajectoryWriter(path, append=False) as w:
        for t in trajectories:
            w.write(t)
