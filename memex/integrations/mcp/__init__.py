"""MemEx as an MCP server (``memex mcp``): every MCP host gets a persistent, capped Python
sandbox per session, whose guest can call the operator's host tools and bridged MCP servers
(docs/mcp.md). ``_config`` is what it serves (TOML and flags), ``_sessions`` the sandbox
behind each session, ``_server`` the MCP tools, ``_serve`` stdio and streamable HTTP (bearer
token). The other direction, an MCP server's tools inside a guest, is
``memex.host_tools.ToolSet.from_mcp``. Needs the ``mcp`` extra."""

from ._config import (
    BridgeConfig,
    HttpConfig,
    LimitsConfig,
    McpConfig,
    MountConfig,
    SessionsConfig,
    load_config,
)
from ._serve import BearerAuth, load_tools, serve
from ._server import build_server
from ._sessions import Session, SessionError, Sessions

__all__ = [
    "BearerAuth",
    "BridgeConfig",
    "HttpConfig",
    "LimitsConfig",
    "McpConfig",
    "MountConfig",
    "Session",
    "SessionError",
    "Sessions",
    "SessionsConfig",
    "build_server",
    "load_config",
    "load_tools",
    "serve",
]
