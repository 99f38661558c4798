"""smolagents' executor seam: ``CodeAgent(executor=MemexExecutor(...))`` runs the code a
smolagents agent writes in a MemEx sandbox (hard caps, persistent state, no network unless a
policy allows it) instead of the default local interpreter.

The agent's tools (and managed agents) stay on the host and are called from guest code through
MemEx's typed tools, so tools holding live clients (an MCP connection, a database handle, a
managed agent) work, and their values arrive typed. ``final_answer(x)`` ends the code at once
and hands smolagents ``x`` as the host object it became (a PIL image as a PIL image, as
smolagents' remote executors hand it, its size checked before its pixels are decoded). A
step's last value comes back as an object too, as smolagents' local executor returns it (a
value the door cannot carry, an instance of a class the code defined, comes back as its
repr, as the remote executors return every value). A failing step raises an error that is
smolagents' ``AgentError`` (what its remote executors raise) and its ``InterpreterError``
(what its local one raises; ``ExecutionTimeoutError`` too for the deadline), and a
``MemexError``: the text the agent loop shows the model, with the state rolled back after a
limit; the next step runs in the same live session.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from smolagents.local_python_executor import (
    CodeOutput,
    ExecutionTimeoutError,
    InterpreterError,
    PythonExecutor,
)
from smolagents.monitoring import AgentLogger, LogLevel
from smolagents.tools import Tool as SmolTool
from smolagents.utils import AgentError

from ...backends import Backend
from ...errors import MemexError
from ...host_tools import (
    DecodeError,
    Egress,
    EgressPolicy,
    EncodeError,
    Tool,
    ToolBudget,
    ToolCallRecord,
    ToolHost,
    ToolSet,
    decode,
    encode,
)
from ...runtime_wasm import AGENT_LIMITS, Door, Limits, Mount, SandboxAPI, TurnResult, TurnStatus
from .._sandbox import SandboxSettings, error_text

__all__ = ["MemexExecutor"]

log = logging.getLogger(__name__)

_SIGNAL = "MemexFinalAnswer"
_IMAGE = "__memex_image__"
MAX_IMAGE_PIXELS = 40_000_000
"""Pixels of a final-answer image the host opens (the guest made it: its PNG header is
checked before its pixels are decoded; smolagents' remote executors take it as PIL too)."""
# Wraps the final_answer stub: the host records the answer, then the code stops here (a
# BaseException, so that `except Exception` in the agent's code cannot swallow it).
_FINAL_WRAPPER = f'''
class {_SIGNAL}(BaseException):
    """final_answer() was called: the step ends here."""
def __memex_wrap_final__():
    import sys
    import tools as _tools
    stub = getattr(_tools, "final_answer", None)
    if stub is None:
        return
    def pack(value, depth=0):
        # a PIL image crosses as PNG bytes (the host opens it again); containers, 8 deep
        image = sys.modules.get("PIL.Image")
        if image is not None and isinstance(value, image.Image):
            import io
            buf = io.BytesIO()
            value.save(buf, format="PNG")
            return {{"{_IMAGE}": buf.getvalue()}}
        if depth < 8:
            if isinstance(value, list):
                return [pack(v, depth + 1) for v in value]
            if isinstance(value, tuple):
                return tuple(pack(v, depth + 1) for v in value)
            if isinstance(value, dict):
                return {{k: pack(v, depth + 1) for k, v in value.items()}}
        return value
    def final_answer(*args, **kwargs):
        stub(*[pack(a) for a in args], **{{k: pack(v) for k, v in kwargs.items()}})
        raise {_SIGNAL}()
    final_answer.__doc__ = stub.__doc__
    final_answer.__signature__ = __import__("inspect").signature(stub)
    globals()["final_answer"] = final_answer
__memex_wrap_final__()
del __memex_wrap_final__
'''

# After a step whose last line had a value: that value, typed, to the host (what the door
# cannot carry stays the repr the result already holds).
_OUTPUT_CALL = (
    "import builtins as _b, memex_guest.door as _d\n"
    "try:\n"
    "    _d.request('smolagents.output', [getattr(_b, '_', None)], {}, True)\n"
    "except Exception:\n"
    "    pass\n"
    "del _b, _d\n")


class StepError(MemexError, AgentError, InterpreterError):
    """A step that failed in the sandbox: smolagents' ``AgentError`` (as its remote executors
    raise) and ``InterpreterError`` (as its local executor raises), and a MemexError."""

    def __init__(self, message: str, logger: AgentLogger) -> None:
        AgentError.__init__(self, message, logger)


class StepTimeout(StepError, ExecutionTimeoutError):
    """A step stopped by its deadline (smolagents' ``ExecutionTimeoutError`` too)."""


_TYPES = {"string": "string", "integer": "integer", "number": "number", "boolean": "boolean",
          "array": "array", "object": "object", "null": "null"}

def _schema(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A smolagents input spec as JSON Schema ("any", "image", "audio": anything)."""
    out: dict[str, Any] = {}
    kind = spec.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    types = [_TYPES[k] for k in kinds if k in _TYPES]
    if types and len(types) == len(kinds):
        if spec.get("nullable") and "null" not in types:
            types.append("null")
        out["type"] = types[0] if len(types) == 1 else types
    for key in ("description", "enum", "items", "properties"):
        if key in spec:
            out[key] = spec[key]
    return out


def tool_from_smolagents(tool: Any, handler: Any = None) -> Tool:
    """A MemEx tool calling a smolagents tool (or managed agent) on the host."""
    inputs: Mapping[str, Any] = getattr(tool, "inputs", {}) or {}
    required = [n for n, spec in inputs.items() if not spec.get("nullable")]
    definition = {"name": tool.name, "description": getattr(tool, "description", "") or "",
                  "parameters": {"type": "object", "required": required,
                                 "properties": {n: _schema(s) for n, s in inputs.items()}}}
    return Tool.from_openai(definition, handler or (lambda **kw: tool(**kw)))


class MemexExecutor(PythonExecutor):
    """Runs smolagents' code actions in a MemEx sandbox.

    ``limits``, ``mounts``, ``preload`` as for ``memex.Sandbox``; ``policy`` an egress policy
    (an ``EgressPolicy`` or a file) for the guest's HTTP; ``backend`` where the sandbox lives
    (a name or a ``Backend``: in-process by default); ``tool_budget`` and ``gate`` govern the
    agent's tool calls as for ``ToolHost``. ``cleanup()`` (smolagents calls it) closes it all.
    """

    def __init__(self, *, limits: Limits | None = None, mounts: Sequence[Mount] = (),
                 preload: Iterable[str] = (), policy: EgressPolicy | str | None = None,
                 backend: str | Backend | None = None, tool_budget: ToolBudget | None = None,
                 gate: Any = None, max_print_outputs_length: int = 50_000,
                 logger: AgentLogger | None = None) -> None:
        self.state: dict[str, Any] = {}  # smolagents reads "_print_outputs" after an error
        self.max_print_outputs_length = max_print_outputs_length
        # where a failed step's error is logged, as a remote executor's (AgentError logs it)
        self.logger = logger if logger is not None else AgentLogger(level=LogLevel.OFF)
        self._tool_budget, self._gate = tool_budget, gate
        self._door = Door()
        self._door.register("smolagents.variables", self._variables, inline=True)
        self._door.register("smolagents.output", self._on_output, inline=True)
        self._output: list[Any] = []
        self._pending: dict[str, Any] = {}
        self._final: list[Any] = []
        self._lock = threading.Lock()
        self._settings = SandboxSettings(limits=limits or AGENT_LIMITS, mounts=mounts,
                                         preload=tuple(preload), policy=policy,
                                         backend=backend, label="smolagents")
        self._guest = self._settings.open(self._door)

    @property
    def sandbox(self) -> SandboxAPI[Any]:
        return self._guest.sandbox

    @property
    def egress(self) -> Egress | None:
        return self._guest.egress

    @property
    def host(self) -> ToolHost | None:
        return self._guest.host

    # ---- the seam ---------------------------------------------------------------------------
    def send_tools(self, tools: dict[str, Any]) -> None:
        """Bind the agent's tools (and managed agents) in the guest as typed functions."""
        made: list[Tool] = []
        for name, tool in tools.items():
            if name == "final_answer":
                made.append(tool_from_smolagents(tool, self._final_answer(tool)))
            else:
                made.append(tool_from_smolagents(tool))
        if self._guest.host is not None:
            self._guest.host.close()
        self._guest.host = ToolHost(ToolSet(made), budget=self._tool_budget, gate=self._gate
                                    ).attach(self.sandbox)
        r = self.sandbox.run(_FINAL_WRAPPER, filename="<memex-smolagents-final>")
        if r.status is not TurnStatus.OK:
            raise RuntimeError(f"binding final_answer in the sandbox failed: {r.exception}")

    def send_variables(self, variables: dict[str, Any]) -> None:
        """Put the agent's variables in the guest's globals, typed (DataFrames stay
        DataFrames). A value that cannot cross (an open file, a model object) is skipped with
        a warning naming it."""
        names = self.host.tools.record_names if self.host is not None else None
        encoded: dict[str, Any] = {}
        for key, value in variables.items():
            if not (isinstance(key, str) and key.isidentifier()):
                continue
            try:
                encoded[key] = encode(value, names=names)
            except (EncodeError, ValueError, OverflowError) as exc:
                log.warning("variable %r is not sent to the MemEx sandbox: %s", key, exc)
        if not encoded:
            return
        with self._lock:
            self._pending = encoded
        r = self.sandbox.run("import memex_guest.door as _d\nglobals().update(_d.request("
                             "'smolagents.variables', [], {}, True))\ndel _d\n",
                             filename="<memex-smolagents-variables>")
        if r.status is not TurnStatus.OK:
            raise RuntimeError(f"sending variables to the sandbox failed: {r.exception}")

    def __call__(self, code_action: str) -> CodeOutput:
        self._final.clear()
        r = self.sandbox.run(code_action)
        logs = self._logs(r)
        self.state["_print_outputs"] = logs
        if self._final and r.exception is not None and r.exception.type.endswith(_SIGNAL):
            return CodeOutput(output=self._final[-1], logs=logs, is_final_answer=True)
        if r.ok:
            return CodeOutput(output=self._value(r), logs=logs, is_final_answer=False)
        # smolagents' own types, as its executors raise them (its loop shows the text)
        if r.limit == "deadline":
            raise StepTimeout(error_text(r), self.logger)
        raise StepError(error_text(r), self.logger)

    def _value(self, r: TurnResult) -> Any:
        """The step's last value as an object (its repr when the door cannot carry it)."""
        if r.value is None:
            return None
        self._output.clear()
        got = self.sandbox.run(_OUTPUT_CALL, filename="<memex-smolagents-output>")
        if got.ok and self._output:
            return _unpack(self._output[-1])
        return r.value

    def _on_output(self, value: Any) -> None:
        # the guest's encoding, decoded within the door's bounds (as a tool call's); what
        # cannot be decoded leaves the repr standing
        with contextlib.suppress(DecodeError, ValueError, TypeError):
            self._output.append(decode(value))

    def cleanup(self) -> None:
        """Close the tools' host, the sandbox and a backend made from a name (idempotent)."""
        self._guest.close()
        self._settings.close()

    def __enter__(self) -> MemexExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    # ---- what the caller can read ---------------------------------------------------------
    @property
    def tool_calls(self) -> list[ToolCallRecord]:
        """A record of every tool call the agent's code made (arguments, outcome, time)."""
        return list(self.host.calls) if self.host is not None else []

    # ---- helpers ----------------------------------------------------------------------------
    def _final_answer(self, tool: SmolTool) -> Any:
        def handler(**kwargs: Any) -> Any:
            kwargs = {k: _unpack(v) for k, v in kwargs.items()}
            value = tool(**kwargs)  # the agent's own final_answer tool (it may check or change)
            self._final.append(value)
            return None

        return handler

    def _variables(self) -> dict[str, Any]:
        with self._lock:
            pending, self._pending = self._pending, {}
        return pending

    def _logs(self, r: TurnResult) -> str:
        text = r.stdout + (r.stderr if r.stderr else "")
        limit = self.max_print_outputs_length
        return text if len(text) <= limit else text[:limit] + "\n[... output truncated]"


def _unpack(value: Any, depth: int = 0) -> Any:
    """The final answer as host objects: each image the guest packed opened as a PIL image
    (its size checked first). Depth-bounded as the guest's packing is (8), over a value the
    door already bounded in cost."""
    if isinstance(value, dict):
        if set(value) == {_IMAGE} and isinstance(value[_IMAGE], bytes):
            return _image(value[_IMAGE])
        if depth < 8:
            return {k: _unpack(v, depth + 1) for k, v in value.items()}
    if depth < 8 and isinstance(value, list | tuple):
        return type(value)(_unpack(v, depth + 1) for v in value)
    return value


def _image(png: bytes) -> Any:
    import io

    import PIL.Image

    try:
        img = PIL.Image.open(io.BytesIO(png), formats=["PNG"])  # reads the header only
        width, height = img.size
        if width * height > MAX_IMAGE_PIXELS:
            raise ValueError(f"{width}x{height} pixels, more than {MAX_IMAGE_PIXELS}")
        img.load()
    except (OSError, ValueError, PIL.Image.DecompressionBombError) as exc:
        raise ValueError(f"final_answer's image cannot be opened on the host: {exc}") from None
    return img
