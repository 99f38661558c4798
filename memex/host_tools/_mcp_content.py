"""What an MCP tool result's non-text content becomes (``ToolSet.from_mcp``): plain records,
sent to the guest like any other record (``result.data``, ``result.mime_type``). Defined
apart from the client so that they need no MCP SDK to be used or unpickled."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["McpAudio", "McpImage", "McpResource", "McpResourceLink"]


@dataclass(frozen=True, kw_only=True)
class McpImage:
    """An image an MCP tool returned (``data`` decoded from base64)."""

    data: bytes
    mime_type: str


@dataclass(frozen=True, kw_only=True)
class McpAudio:
    """Audio an MCP tool returned (``data`` decoded from base64)."""

    data: bytes
    mime_type: str


@dataclass(frozen=True, kw_only=True)
class McpResource:
    """A resource embedded in an MCP tool result: ``text`` or ``data`` (binary)."""

    uri: str
    mime_type: str | None = None
    text: str | None = None
    data: bytes | None = None


@dataclass(frozen=True, kw_only=True)
class McpResourceLink:
    """A link to a resource the MCP server holds (not fetched)."""

    uri: str
    name: str
    description: str | None = None
    mime_type: str | None = None
