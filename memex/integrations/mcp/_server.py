"""``memex mcp``: MemEx as an MCP server. Every MCP host gets a persistent, capped Python
sandbox (state kept across calls like a notebook) whose guest can call the operator's host
tools and bridged MCP servers' tools, and nothing else.

Tools, each with an input schema, an output schema (structured content) and annotations:
``run_python``, ``reset``, ``list_files``, ``read_file``, ``write_file``, ``checkpoint``,
``restore``. A guest fault (an exception, a limit that stopped the cell) is a result with
``isError`` and the reason; the server itself never falls over because of a guest. Blocking
sandbox work runs on worker threads; a call whose client goes away interrupts its cell.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import mimetypes
from importlib.metadata import version
from typing import Annotated, Any, Literal, TypeVar

import anyio
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INVALID_PARAMS,
    CallToolResult,
    ImageContent,
    TextContent,
    ToolAnnotations,
)
from pydantic import BaseModel, Field

from ...errors import GuestFileTooLarge, MemexError
from ...executor.internal import bound_text, render_observation
from ...host_tools import ToolSet
from ...runtime_wasm import TurnResult
from ._config import McpConfig
from ._progress import Progress, progress_token
from ._sessions import Session, SessionError, Sessions

__all__ = ["build_server"]

T = TypeVar("T")
MAX_READ_BYTES = 8 << 20
_IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")

SessionArg = Annotated[str | None, Field(
    description="the session to use (from an earlier result); omit it to use this "
                "connection's session, or to start one when the connection has none")]


# ---- what the tools return ----------------------------------------------------------------
class GuestError(BaseModel):
    type: str
    message: str
    traceback: str


class RunResult(BaseModel):
    """What one cell did."""

    session: str
    status: Literal["ok", "error", "exit", "killed"]
    stdout: str
    stderr: str
    value: str | None = Field(description="repr of the cell's final expression, if any")
    exception: GuestError | None
    limit: str | None = Field(description="the limit that stopped the cell: deadline, memory, "
                              "fuel, stack, cancelled...")
    rolled_back: bool = Field(description="the guest was put back to the end of the last "
                              "good cell")
    duration: float
    truncated: list[str]
    figures: int = Field(description="matplotlib figures returned as images")
    restored: dict[str, Any] | None = Field(
        default=None, description="the session was brought back from its last save (the "
        "server restarted): from_turn, lost_turns (begun after that save), files_kept")


class FileEntry(BaseModel):
    name: str
    path: str
    kind: Literal["file", "dir", "link"]
    size: int


class FileList(BaseModel):
    session: str
    path: str
    entries: list[FileEntry]


class FileContent(BaseModel):
    session: str
    path: str
    size: int
    encoding: Literal["utf-8", "base64"]
    content: str


class Written(BaseModel):
    session: str
    path: str
    size: int


class CheckpointInfo(BaseModel):
    session: str
    name: str
    turns: int
    size: int


class SessionInfo(BaseModel):
    session: str


# ---- helpers ------------------------------------------------------------------------------
def _key(ctx: Context) -> str | None:
    """The connection's default-session key: the stdio process, or a handshake-era HTTP
    client's Mcp-Session-Id; None for a stateless HTTP request."""
    headers = ctx.headers
    if headers is None:
        return "stdio"
    sid = headers.get("mcp-session-id")
    return f"http:{sid}" if sid else None


PRINCIPAL = "memex.principal"
"""The key of ``scope["state"]`` where BearerAuth leaves the name of the principal it
found: a request's key is hashed and looked up once, by BearerAuth, not again by each
layer after it."""


def principal_of(scope: Any) -> str:
    """The principal an HTTP request speaks for, as BearerAuth found it (without a token,
    ``--no-auth``: anonymous)."""
    state = scope.get("state") if isinstance(scope, dict) else None
    name = state.get(PRINCIPAL) if isinstance(state, dict) else None
    return name if isinstance(name, str) else "anonymous"


def _owner(ctx: Context) -> str:
    if ctx.headers is None:
        return "stdio"
    return principal_of(getattr(ctx.request_context.request, "scope", None))


def _error(message: str, structured: dict[str, Any] | None = None) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=message)],
                          structured_content=structured, is_error=True)


def _ok(text: str, model: BaseModel, extra: list[Any] | None = None) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text), *(extra or [])],
                          structured_content=model.model_dump(mode="json"))


def _run_result(s: Session, r: TurnResult, figures: int,
                restored: dict[str, Any] | None) -> RunResult:
    exc = r.exception
    return RunResult.model_validate({"restored": restored,
        "session": s.id, "status": r.status.value, "stdout": r.stdout, "stderr": r.stderr,
        "value": r.value, "limit": r.limit, "rolled_back": r.rolled_back,
        "duration": r.duration, "truncated": list(r.truncated), "figures": figures,
        "exception": None if exc is None else {"type": exc.type, "message": exc.message,
                                               "traceback": exc.traceback}})


def _instructions(cfg: McpConfig, tools: ToolSet | None) -> str:
    parts = [
        "A persistent Python sandbox (CPython 3.15 in WebAssembly, with numpy, pandas and "
        "matplotlib): variables, imports and files in /tmp stay between run_python calls, like "
        "a notebook. Print what you need to see; the value of a cell's last line is shown. "
        f"Each call may run {cfg.limits.limits().timeout:g} s at most. There is no network"
        + (" except what the operator's egress policy allows." if cfg.policy else "."),
        "Results carry a `session`. Over stdio, and for HTTP clients with a session, calls "
        "without one share the connection's session; otherwise pass the `session` of an "
        "earlier result to keep its state. Sessions end after "
        f"{cfg.sessions.idle_timeout:g} s without calls.",
    ]
    if cfg.packages:
        parts.append("A cell may declare pure-Python packages it needs in an inline script "
                     "block (PEP 723): lines `# /// script`, `# dependencies = [\"humanize\"]`, "
                     "`# ///` at its top. They are fetched for the session; one that has "
                     "already run cells then starts over (its variables are gone).")
    if tools is not None and len(tools):
        parts.append("Python functions already defined in the session (call them from "
                     "code):\n" + tools.catalogue())
    return "\n\n".join(parts)


# ---- the server ---------------------------------------------------------------------------
UNOFFERED = ("resources/list", "resources/read", "resources/templates/list", "prompts/list",
             "prompts/get")
"""Methods MCPServer serves that memex mcp has nothing behind (not advertised, not answered)."""


class _Server(MCPServer):
    """MCPServer answering a call to a tool it does not have as the spec says: a JSON-RPC
    error -32602 ``Unknown tool: NAME``, not a tool result."""

    async def call_tool(self, name: str, arguments: dict[str, Any],
                        context: Context[Any, Any] | None = None) -> Any:
        if self._tool_manager.get_tool(name) is None:
            raise MCPError(INVALID_PARAMS, f"Unknown tool: {name[:200]}")
        return await super().call_tool(name, arguments, context)


def build_server(config: McpConfig, sessions: Sessions) -> MCPServer:
    """The MCP server over ``sessions`` (the caller owns and closes them)."""
    tools = sessions.tools
    mcp = _Server(config.name, instructions=_instructions(config, tools), log_level="WARNING",
                  version=version("memex"))
    # Only the capabilities it has: MCPServer answers resources and prompts (empty lists)
    # and so advertises them; the SDK offers no switch, so their handlers go (a client then
    # gets the spec's -32601, and tests/integrations/mcp pins the advertised set).
    handlers = mcp._lowlevel_server._request_handlers
    for method in UNOFFERED:
        handlers.pop(method, None)
    network = config.policy is not None

    async def session_of(ctx: Context, handle: str | None) -> Session:
        """The session of a call: from the table on the event loop when it is there, else
        made (or brought back, or room made for it: a save, a guest closed) on a thread,
        within the principal's share of them."""
        key, owner = _key(ctx), _owner(ctx)
        found = sessions.existing(handle, key=key, owner=owner)
        if found is not None:
            return found
        return await sessions.shares.run(
            owner, functools.partial(sessions.resolve, handle, key=key, owner=owner))

    def note(ctx: Context, s: Session) -> str:
        return "" if _key(ctx) is not None else \
            f"\n[session {s.id}: pass it as `session` to keep this state]"

    @mcp.tool(annotations=ToolAnnotations(title="Run Python", read_only_hint=False,
                                          destructive_hint=True, idempotent_hint=False,
                                          open_world_hint=network))
    async def run_python(
        code: Annotated[str, Field(description="Python source; runs in the session's "
                                   "persistent namespace")],
        ctx: Context,
        timeout: Annotated[float | None, Field(gt=0, description="seconds for this call "
                                               "(at most the server's limit)")] = None,
        session: SessionArg = None,
    ) -> Annotated[CallToolResult, RunResult]:
        """Run Python code in the persistent sandbox and return what it printed, the value
        of its last line and any error. Open matplotlib figures come back as images."""
        progress = Progress(ctx) if progress_token(ctx) is not None else None
        try:
            s = await session_of(ctx, session)
            run = functools.partial(sessions.run, s, code, timeout,
                                    progress.heard if progress is not None else None)
            if progress is None:
                r, figures = await sessions.call(s, run, turn=True,
                                                 on_cancel=lambda: sessions.interrupt(s))
            else:  # the cell's output as it is printed, while it runs
                async with anyio.create_task_group() as tg:
                    tg.start_soon(progress.pump)
                    r, figures = await sessions.call(s, run, turn=True,
                                                     on_cancel=lambda: sessions.interrupt(s))
                    tg.cancel_scope.cancel()
        except (SessionError, MemexError) as exc:
            return _error(str(exc))
        text = render_observation(r, limit=config.sessions.max_output_chars) or "(no output)"
        images = [ImageContent(type="image", data=base64.b64encode(png).decode(),
                               mime_type="image/png") for png in figures]
        if s.started_over is not None:  # new packages: said once, on this answer
            text = f"[{s.started_over}]\n" + text
            s.started_over = None
        restored, s.notice = s.notice, None  # said once, on the first answer after
        if restored is not None:
            text = (f"[this session was brought back from its save at call "
                    f"{restored.get('from_turn')} ({restored.get('reason')}); "
                    f"{restored.get('lost_turns')} later calls were lost]\n" + text)
        result = _run_result(s, r, len(figures), restored)
        out = _ok(text + note(ctx, s), result, images)
        out.is_error = not r.ok
        return out

    @mcp.tool(annotations=ToolAnnotations(title="Reset the session", read_only_hint=False,
                                          destructive_hint=True, idempotent_hint=True,
                                          open_world_hint=False))
    async def reset(ctx: Context, session: SessionArg = None
                    ) -> Annotated[CallToolResult, SessionInfo]:
        """Start the session over with a fresh interpreter and an empty /tmp (its named
        checkpoints can still be restored)."""
        try:
            s = await session_of(ctx, session)
            await sessions.call(s, lambda: sessions.reset(s),
                                on_cancel=lambda: sessions.interrupt(s))
        except (SessionError, MemexError) as exc:
            return _error(str(exc))
        return _ok(f"session {s.id} reset", SessionInfo(session=s.id))

    @mcp.tool(annotations=ToolAnnotations(title="List files", read_only_hint=True,
                                          idempotent_hint=True, open_world_hint=False))
    async def list_files(
        ctx: Context,
        path: Annotated[str, Field(description="a folder under /tmp or a mount")] = "/tmp",
        session: SessionArg = None,
    ) -> Annotated[CallToolResult, FileList]:
        """The files and folders in a folder of the sandbox (its /tmp and granted mounts)."""
        try:
            s = await session_of(ctx, session)
            files = await sessions.call(s, lambda: sessions.files(s, path))
        except (SessionError, MemexError) as exc:
            return _error(str(exc))
        entries = [FileEntry.model_validate(dataclasses.asdict(f)) for f in files]
        text = "\n".join(f"{e.kind:4} {e.size:>10} {e.path}" for e in entries) or "(empty)"
        return _ok(text, FileList(session=s.id, path=path, entries=entries))

    @mcp.tool(annotations=ToolAnnotations(title="Read a file", read_only_hint=True,
                                          idempotent_hint=True, open_world_hint=False))
    async def read_file(
        path: Annotated[str, Field(description="a file under /tmp or a mount")],
        ctx: Context,
        session: SessionArg = None,
    ) -> Annotated[CallToolResult, FileContent]:
        """A file of the sandbox: text as UTF-8, anything else as base64; images also come
        back as image content."""
        try:
            s = await session_of(ctx, session)
            data = await sessions.call(s, lambda: sessions.use(
                s, lambda sb: sb.read_file(path, max_bytes=MAX_READ_BYTES), changes=False))
        except GuestFileTooLarge:
            return _error(f"{path} is over the {MAX_READ_BYTES}-byte limit of read_file")
        except (SessionError, MemexError) as exc:
            return _error(str(exc))
        mime = mimetypes.guess_type(path)[0] or ""
        try:
            text, encoding = data.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            text, encoding = base64.b64encode(data).decode(), "base64"
        extra = [ImageContent(type="image", data=base64.b64encode(data).decode(), mime_type=mime)
                 ] if mime in _IMAGE_TYPES else []
        shown = bound_text(text, config.sessions.max_output_chars) if encoding == "utf-8" \
            else f"({len(data)} bytes of {mime or 'binary data'}, base64 in the structured result)"
        content = FileContent.model_validate({"session": s.id, "path": path, "size": len(data),
                                              "encoding": encoding, "content": text})
        return _ok(shown, content, extra)

    @mcp.tool(annotations=ToolAnnotations(title="Write a file", read_only_hint=False,
                                          destructive_hint=True, idempotent_hint=True,
                                          open_world_hint=False))
    async def write_file(
        path: Annotated[str, Field(description="a file under /tmp or a writable mount")],
        content: Annotated[str, Field(description="the file's content")],
        ctx: Context,
        encoding: Annotated[Literal["utf-8", "base64"], Field(
            description="how `content` is written: text, or base64 for binary data")] = "utf-8",
        session: SessionArg = None,
    ) -> Annotated[CallToolResult, Written]:
        """Write (or replace) a file the sandbox's code can then read."""
        try:
            data = base64.b64decode(content, validate=True) if encoding == "base64" \
                else content.encode("utf-8")
        except ValueError as exc:
            return _error(f"content is not valid base64: {exc}")
        try:
            s = await session_of(ctx, session)
            await sessions.call(s, lambda: sessions.use(s, lambda sb: sb.write_file(path, data)))
        except (SessionError, MemexError) as exc:
            return _error(str(exc))
        return _ok(f"wrote {len(data)} bytes to {path}",
                   Written(session=s.id, path=path, size=len(data)))

    @mcp.tool(annotations=ToolAnnotations(title="Checkpoint the session", read_only_hint=False,
                                          destructive_hint=False, idempotent_hint=False,
                                          open_world_hint=False))
    async def checkpoint(
        name: Annotated[str, Field(min_length=1, max_length=64,
                                   description="a name to restore it by")],
        ctx: Context,
        replace: Annotated[bool, Field(description="replace a checkpoint of the same "
                                       "name")] = False,
        session: SessionArg = None,
    ) -> Annotated[CallToolResult, CheckpointInfo]:
        """Save the session's interpreter state under a name (cheap: copy-on-write)."""
        try:
            s = await session_of(ctx, session)
            if sessions.has_checkpoint(s, name) and not replace:
                return _error(f"a checkpoint named {name!r} exists; pass replace=true to "
                              "replace it")
            cp = await sessions.call(s, lambda: sessions.checkpoint(s, name))
        except (SessionError, MemexError) as exc:
            return _error(str(exc))
        info = CheckpointInfo(session=s.id, name=name, turns=cp.turns, size=cp.size)
        return _ok(f"checkpoint {name!r} saved", info)

    @mcp.tool(annotations=ToolAnnotations(title="Restore a checkpoint", read_only_hint=False,
                                          destructive_hint=True, idempotent_hint=True,
                                          open_world_hint=False))
    async def restore(
        name: Annotated[str, Field(description="a checkpoint of this session")],
        ctx: Context,
        session: SessionArg = None,
    ) -> Annotated[CallToolResult, CheckpointInfo]:
        """Put the session's interpreter back to a named checkpoint (files in /tmp are not
        rolled back)."""
        try:
            s = await session_of(ctx, session)
            cp = await sessions.call(s, lambda: sessions.restore(s, name))
        except (SessionError, MemexError) as exc:
            return _error(str(exc))
        info = CheckpointInfo(session=s.id, name=name, turns=cp.turns, size=cp.size)
        return _ok(f"restored {name!r}", info)

    return mcp
