"""A fastmcp server in code mode whose ``execute`` blocks run in MemEx:
``CodeMode(sandbox_provider=MemexSandboxProvider(...))``. The blocks get CPython with pandas,
hard caps and no network; each ``await call_tool(...)`` is an ordinary call to the server's
tools on the host.

Run ``python examples/frameworks/fastmcp_code_mode.py`` to see an MCP client (fastmcp's own,
in memory) discover the tools and execute a block as a model would write it, or add
``--serve`` to serve it over stdio to an MCP host (needs the ``fastmcp`` extra).
"""

from __future__ import annotations

import argparse
import asyncio

from _common import EXPECTED, QUESTION, sales
from fastmcp import Client, FastMCP
from fastmcp.experimental.transforms.code_mode import CodeMode

from memex import Limits
from memex.integrations.fastmcp import MemexSandboxProvider

BLOCK = """\
import asyncio
import pandas as pd
regions = ("east", "west", "north")
replies = await asyncio.gather(*(call_tool("sales", {"region": r}) for r in regions))
df = pd.DataFrame([row for reply in replies for row in reply["result"]])
totals = df.groupby("region").amount.sum()
return f"{totals.idxmax()} {int(totals.max())}"
"""


def build(provider: MemexSandboxProvider) -> FastMCP:
    mcp = FastMCP("sales")

    mcp.tool(sales)

    mcp.add_transform(CodeMode(sandbox_provider=provider, wall_clock_timeout_secs=30))
    return mcp


async def demo(mcp: FastMCP) -> None:
    async with Client(mcp) as client:
        tools = await client.list_tools()
        print("the host sees:", [t.name for t in tools])
        found = await client.call_tool("search", {"query": "sales of a region"})
        print("search:", found.content[0].text.splitlines()[0])  # type: ignore[union-attr]
        print(f"question: {QUESTION}")
        result = await client.call_tool("execute", {"code": BLOCK})
        print(f"execute: {result.content[0].text!r} (expected {EXPECTED!r})")  # type: ignore


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--serve", action="store_true", help="serve over stdio instead")
    args = p.parse_args()
    with MemexSandboxProvider(limits=Limits(timeout=20, memory=512 << 20)) as provider:
        mcp = build(provider)
        if args.serve:
            mcp.run("stdio")
        else:
            asyncio.run(demo(mcp))
            print(f"calls from the sandbox: {len(provider.tool_calls)}, "
                  f"batched: {sum(c.batch for c in provider.tool_calls)}")


if __name__ == "__main__":
    main()
