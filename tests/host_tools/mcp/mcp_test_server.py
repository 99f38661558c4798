"""An MCP server written for the tests (run as a real process, stdio or HTTP on 127.0.0.1):
tools returning a pydantic model, an int, a list, an image, an error, a slow call, one named
``get-weather``, and more than one page of tools when started with ``--many``."""

from __future__ import annotations

import argparse
import base64
import os
import time
from pathlib import Path
from typing import Any

from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.types import Image
from mcp_types import ListToolsResult, ToolAnnotations
from pydantic import BaseModel, Field

# A 1x1 transparent PNG.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==")


class Weather(BaseModel):
    """The weather in a city."""

    city: str
    high: float = Field(description="highest temperature, Celsius")
    conditions: list[str] = []


class PagedServer(MCPServer):
    """Lists its tools 10 to a page (the SDK's server sends them all at once)."""

    async def _handle_list_tools(self, ctx: Any, params: Any) -> ListToolsResult:
        tools = await self.list_tools()
        start = int(params.cursor) if params is not None and params.cursor else 0
        nxt = str(start + 10) if start + 10 < len(tools) else None
        return ListToolsResult(tools=tools[start:start + 10], next_cursor=nxt)


def build(many: bool) -> MCPServer:
    mcp = PagedServer("memex-test-server", instructions="tools for MemEx's bridge tests")

    @mcp.tool(name="get-weather", annotations=ToolAnnotations(read_only_hint=True))
    def get_weather(city: str, days: int = 1) -> Weather:
        """Weather for a city.

        Args:
            city: The city's name.
            days: How many days ahead.
        """
        # JSON Schema's "integer" admits 1e10 (an integral number): keep the list small.
        return Weather(city=city, high=20.0 + days, conditions=["sunny"] * max(0, min(days, 7)))

    @mcp.tool(annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True))
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @mcp.tool()
    def primes(n: int) -> list[int]:
        """The first n primes."""
        out: list[int] = []
        k = 2
        while len(out) < n:
            if all(k % p for p in out):
                out.append(k)
            k += 1
        return out

    @mcp.tool(structured_output=False)
    def image() -> Image:
        """A tiny PNG."""
        return Image(data=PNG, format="png")

    @mcp.tool(structured_output=False)
    def stats(values: list[float]) -> str:
        """Mean of values, as JSON text."""
        return f'{{"mean": {sum(values) / len(values)}, "n": {len(values)}}}'

    @mcp.tool(annotations=ToolAnnotations(destructive_hint=True))
    def fail(message: str) -> str:
        """Always fails, with the message given."""
        raise ToolError(message)

    @mcp.tool()
    def slow(seconds: float) -> str:
        """Sleeps (first touching $MCP_TEST_STARTED, when set: a test waits on it rather
        than guessing when the call began)."""
        if os.environ.get("MCP_TEST_STARTED"):
            Path(os.environ["MCP_TEST_STARTED"]).touch()
        time.sleep(seconds)
        return "done"

    @mcp.tool(annotations=ToolAnnotations(read_only_hint=True))
    def pid() -> int:
        """This server's process id."""
        return os.getpid()

    @mcp.tool(annotations=ToolAnnotations(destructive_hint=True))
    def record(note: str) -> int:
        """Not safe to repeat: appends a note, returns how many."""
        NOTES.append(note)
        return len(NOTES)

    if many:
        for i in range(60):
            mcp.add_tool(_constant(i), name=f"extra_{i:02d}", description=f"extra tool {i}")
    return mcp


def _constant(i: int) -> Any:
    def extra() -> int:
        return i

    return extra


NOTES: list[str] = []

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--http", type=int, default=None, help="serve streamable HTTP on this port")
    ap.add_argument("--many", action="store_true")
    a = ap.parse_args()
    server = build(a.many)
    if a.http is None:
        server.run()
    else:
        server.run("streamable-http", host="127.0.0.1", port=a.http)
