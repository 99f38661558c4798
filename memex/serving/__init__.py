"""What MemEx's network front ends share (``memex serve``, ``memex mcp --http``): the
connection edge that bounds what a client can hold of a server before any application code
runs (``ConnectionGuard``, ``EdgeLimits``). Imports no web framework: each front end brings
its own extra."""

from ._edge import ConnectionGuard, EdgeLimits

__all__ = ["ConnectionGuard", "EdgeLimits"]
