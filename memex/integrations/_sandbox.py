"""What the framework adapters share (smolagents, pydantic-ai, the OpenAI Agents SDK, fastmcp):
one set of sandbox settings that opens sandboxes in-process or on a backend with the egress
policy attached; a guest whose tool host, egress and sandbox close together; the text a cell
that raised, exited or was stopped reads as; ``submit()`` checked against an output type.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter, ValidationError

from ..backends import Backend, get_backend
from ..executor.internal import NO_OUTPUT, trim_traceback
from ..host_tools import Egress, EgressPolicy, Tool, ToolHost
from ..runtime_wasm import Door, Limits, Mount, Sandbox, SandboxAPI, TurnResult, TurnStatus

__all__ = ["ACCEPTED", "LIMIT_WORDS", "NO_OUTPUT", "Guest", "SandboxSettings", "error_text",
           "interrupt", "output_adapter", "submit_tool"]

ACCEPTED = "[answer accepted]"  # what run_python's text ends with after an accepted submit()

LIMIT_WORDS = {"deadline": "its time limit", "fuel": "its instruction budget",
               "memory": "the memory limit", "stack": "the stack limit",
               "cancelled": "a cancellation", "lifetime": "the session's lifetime"}


@dataclass(kw_only=True, eq=False)
class Guest:
    """A sandbox with what is attached to it; ``close()`` ends them all (idempotent)."""

    sandbox: SandboxAPI[Any]
    door: Door
    egress: Egress | None = None
    host: ToolHost | None = None
    closed: bool = False

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.host is not None:
            self.host.close()
        if self.egress is not None:
            self.egress.detach()
        self.sandbox.close()


class SandboxSettings:
    """``limits``/``mounts``/``preload`` as for ``memex.Sandbox``, ``policy`` (an
    ``EgressPolicy`` or a policy file), ``backend`` (a name, made on first use and closed with
    these settings, or a ``Backend`` the caller owns; None: in-process)."""

    def __init__(self, *, limits: Limits, mounts: Sequence[Mount] = (),
                 preload: Sequence[str] = (), policy: EgressPolicy | str | None = None,
                 backend: str | Backend | None = None, label: str = "") -> None:
        self.limits, self.mounts, self.preload, self.label = limits, mounts, preload, label
        self.policy = (policy if policy is None or isinstance(policy, EgressPolicy)
                       else EgressPolicy.load(policy))
        self._spec = backend
        self._backend: Backend | None = backend if isinstance(backend, Backend) else None

    def open(self, door: Door | None = None, *, rollback: bool = True) -> Guest:
        """A new sandbox (``rollback`` applies in-process; backends keep their own)."""
        door = door or Door()
        if self._backend is None and isinstance(self._spec, str):
            self._backend = get_backend(self._spec)
        sb: SandboxAPI[Any] = (
            self._backend.open(limits=self.limits, mounts=self.mounts, preload=self.preload,
                               door=door)
            if self._backend is not None else
            Sandbox(limits=self.limits, mounts=self.mounts, preload=self.preload, door=door,
                    rollback=rollback))
        try:
            egress = (Egress(self.policy, label=self.label).attach(sb)
                      if self.policy is not None else None)
        except BaseException:
            sb.close()
            raise
        return Guest(sandbox=sb, door=door, egress=egress)

    def close(self) -> None:
        """Close a backend these settings made from a name (idempotent)."""
        if isinstance(self._spec, str) and self._backend is not None:
            self._backend.close()
            self._backend = None


def error_text(r: TurnResult) -> str:
    """A cell that did not end well, for a model: the trimmed traceback, the exit, or the
    limit that stopped it (and that its changes were undone)."""
    exc = r.exception
    if exc is not None:
        tb = trim_traceback(exc.traceback) if exc.traceback else ""
        return tb.strip() or f"{exc.type}: {exc.message}"
    if r.status is TurnStatus.EXIT:
        return f"the code called exit({r.exit_code})"
    if r.status is TurnStatus.OK:
        return "the code ended without a value"
    what = LIMIT_WORDS.get(r.limit or "", r.limit or "a limit")
    undone = "; variables are as they were before this code" if r.rolled_back else ""
    return f"the code was stopped by {what} ({r.limit}){undone}"


def interrupt(sb: SandboxAPI[Any]) -> None:
    """Stop a running cell where the sandbox can be interrupted (an in-process one)."""
    if isinstance(sb, Sandbox):
        sb.interrupt()


def output_adapter(output: Any) -> TypeAdapter[Any]:
    """A validator of an agent's output type (anything, when it is a spec pydantic cannot
    validate directly, such as a framework's output marker)."""
    try:
        return TypeAdapter(str if output is None else output)
    except Exception:
        return TypeAdapter(Any)


def submit_tool(adapter: TypeAdapter[Any], accept: Callable[[Any], None] | None) -> Tool:
    """``submit(answer)``: checked against ``adapter`` on the host, then handed to ``accept``
    (None: a stand-in for the catalogue)."""

    def submit(answer: object) -> None:
        if accept is None:
            return
        try:
            value = adapter.validate_python(answer)
        except ValidationError as exc:
            raise ValueError(f"the answer does not fit the output type: {exc}") from None
        accept(value)

    return Tool.from_openai({"name": "submit", "description": "Submit the final answer; it "
                             "ends the run once it fits the output type.",
                             "parameters": {"type": "object", "properties": {
                                 "answer": adapter.json_schema()}, "required": ["answer"]}},
                            submit)
