"""fastmcp's code-mode seam: ``CodeMode(sandbox_provider=MemexSandboxProvider(...))`` runs the
code a model sends to the ``execute`` tool in a MemEx sandbox (CPython with numpy and pandas,
hard caps, no network unless a policy allows it) instead of fastmcp's default interpreter.

The code keeps CodeMode's contract: a block of async Python with ``await call_tool(name,
params)`` in scope and ``return`` for its result. The external functions run on the host, on
the server's own event loop, so each nested call is an ordinary fastmcp tool call (auth,
middleware, validation). ``state="call"`` (the default) gives every ``execute`` a fresh sandbox,
so clients never see each other's data; ``state="shared"`` keeps one sandbox whose top-level
names persist between calls, for single-client servers (a stdio server serves one client).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from fastmcp.exceptions import ToolError

from ...backends import Backend
from ...errors import ConfigError
from ...host_tools import (
    EgressPolicy,
    EncodeError,
    Tool,
    ToolCallRecord,
    ToolHost,
    ToolSet,
    encode,
)
from ...runtime_wasm import SANDBOX_LIMITS, Limits, Mount, SandboxAPI, TurnResult, TurnStatus
from .._sandbox import Guest, SandboxSettings, error_text, interrupt

__all__ = ["MemexSandboxProvider"]

_RESULT, _INPUTS = "memex_result", "fastmcp.inputs"
# Installed once per sandbox: runs a block as the body of an async function whose top-level
# names are the session's globals (so "shared" state persists), with line numbers as sent.
_HELPER = f'''
def __memex_fastmcp__(src, names):
    import ast, asyncio, tools as _tools
    import memex_guest.door as _door
    g = globals()
    for name in names:  # inside the event loop a stub's call is awaitable (memex_guest.aio)
        g[name] = getattr(_tools, name)
    g.update(_door.request("{_INPUTS}", [], {{}}, True))
    tree = ast.parse(src, "<cell-execute>")
    assigned = set()
    def visit(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                assigned.add(child.name)
                continue
            if isinstance(child, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp,
                                  ast.GeneratorExp)):
                continue
            if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store):
                assigned.add(child.id)
            elif isinstance(child, ast.alias):
                assigned.add((child.asname or child.name).split(".")[0])
            elif isinstance(child, ast.ExceptHandler) and child.name:
                assigned.add(child.name)
            visit(child)
    visit(tree)
    body = ([ast.Global(names=sorted(assigned))] if assigned else []) + (tree.body or
                                                                         [ast.Pass()])
    fn = ast.AsyncFunctionDef(name="__memex_block__", args=ast.arguments(
        posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[]), body=body,
        decorator_list=[], returns=None, type_params=[])
    module = ast.fix_missing_locations(ast.Module(body=[fn], type_ignores=[]))
    exec(compile(module, "<cell-execute>", "exec"), g)
    try:
        value = asyncio.run(g["__memex_block__"]())
    finally:
        g.pop("__memex_block__", None)
    _tools.{_RESULT}(value)
'''


@dataclass(kw_only=True, eq=False)
class _Session:
    guest: Guest
    names: tuple[str, ...] = ()
    ready: bool = False
    inputs: dict[str, Any] = field(default_factory=dict)
    results: list[Any] = field(default_factory=list)
    functions: dict[str, Callable[..., Any]] = field(default_factory=dict)
    loop: asyncio.AbstractEventLoop | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def sandbox(self) -> SandboxAPI[Any]:
        return self.guest.sandbox

    def close(self) -> None:
        self.guest.close()


class MemexSandboxProvider:
    """A fastmcp ``SandboxProvider`` backed by MemEx.

    ``limits``/``mounts``/``preload`` as for ``memex.Sandbox``; ``timeout`` the deadline of one
    ``execute`` (default: the limits' timeout); ``policy`` the guest's egress policy;
    ``backend`` where sandboxes live; ``state`` as in the module docstring. ``close()`` ends
    the shared sandbox and a backend made from a name."""

    def __init__(self, *, limits: Limits | None = None, mounts: Sequence[Mount] = (),
                 preload: Sequence[str] = (), timeout: float | None = None,
                 policy: EgressPolicy | str | None = None, backend: str | Backend | None = None,
                 state: Literal["call", "shared"] = "call", keep_calls: int = 1000) -> None:
        if state not in ("call", "shared"):
            raise ConfigError(f"state must be 'call' or 'shared', got {state!r}")
        if timeout is not None and not 0 < timeout < float("inf"):
            raise ConfigError(f"timeout must be a finite number of seconds > 0, got {timeout!r}")
        self.timeout, self.state = timeout, state
        # What every block needs is imported in the sandbox's starting image, so that a fresh
        # sandbox per call maps it instead of importing asyncio each time.
        self._settings = SandboxSettings(
            limits=limits or SANDBOX_LIMITS, mounts=mounts,
            preload=tuple(dict.fromkeys(("ast", "asyncio", *preload))), policy=policy,
            backend=backend, label="fastmcp")
        self._shared: _Session | None = None
        self._lock = threading.Lock()
        self._calls: deque[ToolCallRecord] = deque(maxlen=keep_calls)
        self._keep = keep_calls
        self._closed = False

    # ---- the seam ---------------------------------------------------------------------------
    async def run(self, code: str, *, inputs: dict[str, Any] | None = None,
                  external_functions: dict[str, Callable[..., Any]] | None = None) -> Any:
        """Run ``code`` (CodeMode's async block) and return what it returns. A failure in the
        code, a limit or a bad value is a ``ToolError`` whose text the model reads."""
        if not isinstance(code, str):
            raise ToolError("code must be a string")
        functions = dict(external_functions or {})
        for name in functions:
            if not name.isidentifier() or name.startswith("_") or name == _RESULT:
                raise ToolError(f"cannot bind an external function named {name!r}")
        loop = asyncio.get_running_loop()
        holder: list[_Session] = []
        work = asyncio.ensure_future(asyncio.to_thread(
            self._execute, code, dict(inputs or {}), functions, loop, holder))
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            if holder:
                interrupt(holder[0].sandbox)  # fastmcp gave up (wall clock, client gone)
            raise

    # ---- what the caller can read ---------------------------------------------------------
    @property
    def tool_calls(self) -> list[ToolCallRecord]:
        """Every call guest code made to an external function (the last ``keep_calls``)."""
        with self._lock:
            return list(self._calls)

    def close(self) -> None:
        """End the shared sandbox (idempotent); a backend made from a name is closed too."""
        with self._lock:
            shared, self._shared, self._closed = self._shared, None, True
        if shared is not None:
            with shared.lock:
                shared.close()
        self._settings.close()

    def __enter__(self) -> MemexSandboxProvider:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- running ----------------------------------------------------------------------------
    def _execute(self, code: str, inputs: dict[str, Any], functions: dict[str, Callable[..., Any]],
                 loop: asyncio.AbstractEventLoop, holder: list[_Session]) -> Any:
        """(worker thread) One ``execute``: bind, run, hand back the value or raise."""
        s = self._session()
        holder.append(s)
        try:
            with s.lock:
                if s.guest.closed:
                    raise ToolError("the sandbox was closed")
                try:
                    s.inputs = {k: encode(v) for k, v in inputs.items() if k.isidentifier()}
                except (EncodeError, ValueError, OverflowError) as exc:
                    raise ToolError(f"an input cannot enter the sandbox: {exc}") from None
                self._bind(s, functions, loop)
                s.results.clear()
                names = sorted(functions)
                r = s.sandbox.run(f"__memex_fastmcp__({code!r}, {names!r})",
                                  timeout=self.timeout, filename="<memex-fastmcp>")
                s.loop = None
                if r.status is TurnStatus.OK and s.results:
                    return s.results[-1]
                raise ToolError(_block_error(r))
        finally:
            if self.state == "call":
                s.close()

    def _bind(self, s: _Session, functions: Mapping[str, Callable[..., Any]],
              loop: asyncio.AbstractEventLoop) -> None:
        s.functions, s.loop = dict(functions), loop
        names = tuple(sorted(functions))
        g = s.guest
        if g.host is None or names != s.names:
            if g.host is not None:
                g.host.close()
            tools = [_bridged(name, fn, s) for name, fn in sorted(functions.items())]
            tools.append(_result_tool(s))
            g.host = ToolHost(ToolSet(tools), keep_calls=self._keep, on_call=self._record
                              ).attach(g.sandbox)
            s.names = names
        if not s.ready:
            r = s.sandbox.run(_HELPER, filename="<memex-fastmcp-helper>")
            if r.status is not TurnStatus.OK:
                raise ToolError(f"setting up the sandbox failed: {error_text(r)}")
            s.ready = True

    def _session(self) -> _Session:
        with self._lock:
            if self._closed:
                raise ToolError("this MemexSandboxProvider is closed")
            if self.state == "shared" and self._shared is not None:
                return self._shared
        fresh = self._open()
        if self.state == "call":
            return fresh
        with self._lock:
            s = None if self._closed else (self._shared or fresh)
            if s is fresh:
                self._shared = fresh
        if s is not fresh:
            fresh.close()
            if s is None:
                raise ToolError("this MemexSandboxProvider is closed")
        return s

    def _open(self) -> _Session:
        # a one-call sandbox has no next cell to roll back to: no per-cell copy
        s = _Session(guest=self._settings.open(rollback=self.state == "shared"))
        s.guest.door.register(_INPUTS, lambda: _take_inputs(s), inline=True)
        return s

    def _record(self, rec: ToolCallRecord) -> None:
        if rec.tool == _RESULT:
            return
        with self._lock:  # (tool_calls copies it under the lock)
            self._calls.append(rec)  # a bounded deque: the oldest records drop out


def _take_inputs(s: _Session) -> dict[str, Any]:
    pending, s.inputs = s.inputs, {}
    return pending


def _bridged(name: str, fn: Callable[..., Any], s: _Session) -> Tool:
    """A MemEx tool calling the external function ``name`` of the current ``execute`` on the
    server's loop (each run binds its own functions; the tool looks them up at call time)."""
    params: dict[str, Any] = {}
    required: list[str] = []
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        sig = None
    if sig is not None:
        for p in sig.parameters.values():
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
                params[p.name] = {}
                if p.default is p.empty:
                    required.append(p.name)

    def handler(**arguments: Any) -> Any:
        current, loop = s.functions.get(name), s.loop
        if current is None or loop is None:
            raise RuntimeError(f"{name} can only be called while execute runs")
        result = current(**arguments)
        if inspect.isawaitable(result):
            return asyncio.run_coroutine_threadsafe(_awaited(result), loop).result()
        return result

    description = (inspect.getdoc(fn) or f"{name}, provided by the server").split("\n")[0]
    return Tool.from_openai({"name": name, "description": description, "parameters": {
        "type": "object", "properties": params, "required": required}}, handler)


async def _awaited(value: Any) -> Any:
    return await value


def _result_tool(s: _Session) -> Tool:
    def handler(value: object) -> None:
        s.results.append(value)

    return Tool.from_openai({"name": _RESULT, "description": "(internal) the block's value",
                             "parameters": {"type": "object", "properties": {"value": {}},
                                            "required": ["value"]}}, handler)


def _block_error(r: TurnResult) -> str:
    """The block's failure without the frames that ran it (this module's and asyncio's)."""
    lines = error_text(r).split("\n")
    if len(lines) > 1 and lines[0].startswith("Traceback") and lines[1].startswith("  [... "):
        del lines[1]
    return "\n".join(lines)
