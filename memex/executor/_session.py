"""One rollout's sandbox: tools served through the door, typed inputs placed in globals, the
``submit`` tool validated on the host against the rollout's schema."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import msgpack

from ..errors import ConfigError, MemexError
from ..host_tools import (
    EncodeError,
    Tool,
    ToolBudget,
    ToolCallRecord,
    ToolHost,
    ToolSet,
    decode,
    encode,
)
from ..runtime_wasm import Door, Limits, Mount, Sandbox, TurnResult, TurnStatus
from ._trajectory import Step, ToolCallInfo, Trajectory

__all__ = ["AgentSession", "HostCall", "make_submit_tool", "prelude_cells"]

SUBMIT_DOC = "Submit the final answer; it is checked against the task's answer schema."


class _SubmitBox:
    """The first accepted answer of a rollout (later submits in the same rollout are kept
    as the answer only if none was accepted yet)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.accepted = False
        self.answer: Any = None
        self.attempts = 0

    def accept(self, answer: object) -> None:
        with self.lock:
            self.attempts += 1
            if not self.accepted:
                self.accepted, self.answer = True, answer


def make_submit_tool(schema: object, on_accept: Callable[[Any], None]) -> Tool:
    """The ``submit(answer)`` tool: ``schema`` is a type (pydantic model, dataclass,
    TypedDict, ``list[int]``...), a JSON Schema mapping, or None (any value)."""
    if isinstance(schema, Mapping):
        definition = {"name": "submit", "description": SUBMIT_DOC,
                      "parameters": {"type": "object", "properties": {"answer": dict(schema)},
                                     "required": ["answer"], "additionalProperties": False}}

        def handler_js(answer: object) -> None:
            on_accept(answer)

        return Tool.from_openai(definition, handler_js, inline=True)

    def submit(answer: object) -> None:
        on_accept(answer)

    submit.__annotations__ = {"answer": Any if schema is None else schema, "return": None}
    submit.__doc__ = f"{SUBMIT_DOC}\n\nArgs:\n    answer: the final answer."
    return Tool.from_function(submit, name="submit", inline=True)


@dataclass(frozen=True, kw_only=True)
class HostCall:
    """A tool call made by the host on the model's behalf (tool-calling action space)."""

    ok: bool
    value: Any  # the decoded value, or the error map
    record: ToolCallRecord | None


class AgentSession:
    """The sandbox side of one rollout. ``open_sandbox`` lets a backend provide the sandbox
    (any object with Sandbox's ``run``/``door``/``close``); by default it is in-process.
    ``door`` is the door that sandbox was (or will be) opened with (default: a new one);
    ``spawn`` (a sub-agent tree node) serves the sub-agent API to this session's guest;
    ``prepared`` says the opened sandbox already holds this tool set's stubs and the prelude's
    definitions (a fork of a template, see :func:`prelude_cells`)."""

    def __init__(
        self, *, tools: ToolSet, submit_schema: Any, limits: Limits | None = None,
        mounts: Iterable[Mount] = (), preload: Iterable[str] = (),
        packages: Sequence[str] = (), inputs: Mapping[str, Any] | None = None,
        tool_budget: ToolBudget | None = None,
        gate: Any = None, install_tools: bool = True,
        open_sandbox: Callable[..., Any] | None = None,
        on_call: Callable[[ToolCallRecord], None] | None = None,
        door: Door | None = None, spawn: Any = None, prepared: bool = False,
        explain_errors: bool = True, wide_tables: bool = True,
    ) -> None:
        self.inputs = dict(inputs or {})
        for name in self.inputs:
            if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
                raise ConfigError(f"input names must be public identifiers, got {name!r}")
            if name in tools or name in ("submit", "tools"):
                raise ConfigError(f"input {name!r} would hide a tool of the same name")
        self.box = _SubmitBox()
        submit = make_submit_tool(submit_schema, self.box.accept)
        self.toolset = ToolSet([*tools, submit])
        self.door = door if door is not None else Door()
        self.spawn = spawn
        self.prepared = prepared
        self.explain = explain_errors
        self.wide = wide_tables
        self._encoded: dict[str, Any] = {}
        for name, value in self.inputs.items():
            try:
                self._encoded[name] = encode(value, names=self.toolset.record_names)
            except (EncodeError, ValueError, OverflowError) as exc:
                raise ConfigError(f"input {name!r} cannot be sent to the guest: {exc}") from exc
        self._vars: list[tuple[str, str]] = []
        self.door.register("agent.input", self._op_input, inline=True)
        self.door.register("agent.vars", self._op_vars, inline=True)
        self.door.register("agent.kept", self._op_kept, inline=True)
        self._kept: list[tuple[str, str]] = []
        self.host = ToolHost(self.toolset, budget=tool_budget, gate=gate, on_call=on_call)
        if spawn is not None:
            spawn.bind(self)
        opener: Callable[..., Any] = open_sandbox or Sandbox
        self.sandbox: Any = None
        try:
            more: dict[str, Any] = {"packages": list(packages)} if packages else {}
            self.sandbox = opener(limits=limits, mounts=tuple(mounts), preload=tuple(preload),
                                  door=self.door, **more)
            self.host.attach(self.sandbox, install=install_tools and not prepared)
            self._prelude()
        except BaseException:
            self.close()
            raise

    def _op_input(self, name: object) -> Any:
        if name not in self._encoded:
            raise KeyError(f"no input named {name!r}")
        return self._encoded[name]

    def _prelude(self) -> None:
        define, call = prelude_cells(list(self.inputs), self.spawn, explain=self.explain,
                                     wide=self.wide)
        cell = call if self.prepared else define + call
        r = self.sandbox.run(cell, filename="<memex-agent-prelude>")
        if r.status is not TurnStatus.OK:
            what = (f"{r.exception.type}: {r.exception.message}" if r.exception
                    else f"{r.status.value} ({r.limit})")
            raise MemexError(f"setting up the agent's guest scope failed: {what}")
        self._encoded.clear()  # the guest holds them now; free the host copies

    # ---- turns ----------------------------------------------------------------------------
    def run(self, code: str, *, timeout: float | None = None) -> TurnResult:
        result: TurnResult = self.sandbox.run(code, timeout=timeout)
        return result

    def after_turn(self, *, keep_tools: bool, variables: bool
                   ) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        """What the guest reports after a turn, in one guest call (one round trip a turn):

        - kept tools: each tool (or ``submit``, or ``tools``) the last blocks rebound or
          deleted is put back under its name, as (the tool's name, the name the value assigned
          to it now has, or "" when it was deleted); see ``Aids.keep_tool_names``;
        - new variables: the names the last blocks bound or rebound (a moved value's new name
          among them), with a short description each.

        Each report is taken as the guest sends it (checked by ``_str_pairs``); one whose
        reporter the model's code broke is empty and the other still comes."""
        self._kept, self._vars = [], []
        cell = (_REPORT_KEPT if keep_tools else "") + (_REPORT_VARIABLES if variables else "")
        if cell:
            self.sandbox.run(cell, filename="<memex-agent-after-turn>")
        return self._kept, self._vars

    def _op_vars(self, items: object) -> None:
        self._vars = _str_pairs(items, 100, 200)

    def _op_kept(self, items: object) -> None:
        self._kept = _str_pairs(items, 100, 120)

    @property
    def submitted(self) -> bool:
        return self.box.accepted

    @property
    def answer(self) -> Any:
        return self.box.answer

    # ---- host-side tool calls (the tool-calling action space) ----------------------------
    def call_tool(self, name: str, arguments: Mapping[str, Any]) -> HostCall:
        """Run a tool through the same door pipeline a guest uses (validation, budgets,
        gate, records), from the host."""
        before = len(self.host.calls)
        frame = msgpack.packb({"v": 1, "id": 1, "op": "tools.call",
                               "args": [name, dict(arguments)], "kwargs": {}},
                              use_bin_type=True)
        reply = msgpack.unpackb(self.door.dispatch(frame), raw=False, strict_map_key=False,
                                ext_hook=msgpack.ExtType)
        record = self.host.calls[-1] if len(self.host.calls) > before else None
        if not reply.get("ok"):
            return HostCall(ok=False, value=reply.get("error"), record=record)
        return HostCall(ok=True, value=decode(reply.get("value")), record=record)

    def close(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
        self.host.close()


# Each report stops only itself if it fails (the model's code may have replaced its function).
_REPORT_KEPT = "try:\n    __memex_keep_tools__()\nexcept Exception:\n    pass\n"
_REPORT_VARIABLES = "try:\n    __memex_new_variables__()\nexcept Exception:\n    pass\n"


def _str_pairs(items: object, first: int, second: int) -> list[tuple[str, str]]:
    """Up to 50 pairs of strings from what the guest sent (a list of 2-lists), each string cut
    to its bound; anything else in it is skipped."""
    if not isinstance(items, list):
        return []
    pairs = (x for x in items if isinstance(x, list) and len(x) == 2)
    return [(a[:first], b[:second]) for a, b in pairs
            if isinstance(a, str) and isinstance(b, str)][:50]


def prelude_cells(input_names: list[str], spawn: Any = None, *, explain: bool = True,
                  wide: bool = True) -> tuple[str, str]:
    """The guest prelude as (definitions, call): the definitions are the same for every
    session (so a template sandbox can run them once and be forked); the call binds this
    session's inputs, submit() and, with ``spawn``, the sub-agent API. ``explain``: a
    rejected submit says what it was sent (Aids.explain_errors); ``wide``: pandas prints wide
    frames whole (Aids.wide_tables)."""
    src = resources.files("memex.executor").joinpath("guest/agent_prelude.py").read_text()
    records = {c.__name__: [f.name for f in dataclasses.fields(c)]
               for c in (Trajectory, Step, ToolCallInfo)}
    define = (spawn.guest_define() if spawn is not None else "") + src + "\n"
    hooks = spawn.guest_hooks() if spawn is not None else "None"
    call = (f"__memex_agent_prelude__({input_names!r}, {SUBMIT_DOC!r}, {records!r}, {hooks}, "
            f"{explain!r}, {wide!r})\n"
            "del __memex_agent_prelude__\n")
    return define, call
