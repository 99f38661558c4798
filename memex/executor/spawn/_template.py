"""Template sandboxes: what makes a sub-agent's sandbox cheap to start.

Opening a session compiles the tool stubs and the prelude in the guest (~0.2 s of CPU), the
same work for every sub-agent with the same tools, answer schema and limits. A tree keeps one
template sandbox per such combination that has done that work once (and never runs a
rollout); each sub-agent's sandbox is a fork of it (copy-on-write, a few ms) with a door of its
own, and only the per-session part of the prelude runs in it. Templates close with the tree.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ...errors import MemexError
from ...host_tools import ToolSet
from ...runtime_wasm import Door, Sandbox, TurnStatus
from .._session import make_submit_tool

if TYPE_CHECKING:
    from .._spec import AgentSpec

__all__ = ["Templates"]


class _Entry:
    __slots__ = ("keep", "lock", "sandbox")

    def __init__(self, keep: object) -> None:
        self.lock = threading.Lock()
        self.sandbox: Sandbox | None = None
        self.keep = keep  # the schema object, so its id stays this entry's


def _schema_key(schema: object) -> tuple[str, Any]:
    if isinstance(schema, Mapping):
        return "json", json.dumps(schema, sort_keys=True, default=repr)
    return "obj", id(schema)


class Templates:
    """The template sandboxes of one agent tree (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[tuple[Any, ...], _Entry] = {}
        self._closed = False

    def opener(self, agent: AgentSpec, define: str) -> Callable[..., Sandbox]:
        """A session opener for ``agent``'s sub-agent: a fork of the matching template
        (built on first use; ``define`` is the prelude's definitions cell)."""
        key = (tuple(t.name for t in agent.tools), _schema_key(agent.submit_schema),
               agent.sandbox.limits, agent.sandbox.mounts, agent.sandbox.preload,
               agent.sandbox.packages, agent.action_space)
        with self._lock:
            if self._closed:
                raise MemexError("the agent tree has ended")
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = _Entry(agent.submit_schema)

        def open_fork(*, door: Door | None = None, **_kw: Any) -> Sandbox:
            with entry.lock:
                if entry.sandbox is None or entry.sandbox.closed:
                    entry.sandbox = _build(agent, define)
                return entry.sandbox.fork(door=door)

        return open_fork

    def close(self) -> None:
        with self._lock:
            self._closed = True
            entries = list(self._entries.values())
            self._entries.clear()
        for e in entries:
            with e.lock:
                if e.sandbox is not None:
                    e.sandbox.close()
                    e.sandbox = None


def _build(agent: AgentSpec, define: str) -> Sandbox:
    box = agent.sandbox
    sb = Sandbox(limits=box.limits, mounts=box.mounts, preload=box.preload,
                 packages=list(box.packages) or None)
    try:
        cells = [define]
        if agent.action_space == "code":
            tools = ToolSet([*agent.tools, make_submit_tool(agent.submit_schema,
                                                            lambda _a: None)])
            cells.insert(0, tools.install_source())
        for cell in cells:
            r = sb.run(cell, filename="<memex-agent-template>")
            if r.status is not TurnStatus.OK:
                what = (f"{r.exception.type}: {r.exception.message}" if r.exception
                        else f"{r.status.value} ({r.limit})")
                raise MemexError(f"preparing a sub-agent sandbox failed: {what}")
    except BaseException:
        sb.close()
        raise
    return sb
