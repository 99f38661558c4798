"""MemEx inside the stacks people already use: each subpackage adapts one upstream package,
installed as an optional extra (``mcp``: MemEx as an MCP server for MCP hosts). They sit above
every other layer and below the CLI."""

__all__: list[str] = []
