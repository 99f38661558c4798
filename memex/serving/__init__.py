"""What MemEx's network front ends share (``memex serve``, ``memex mcp``): the connection
edge that bounds what a client can hold of a server before any application code runs
(``ConnectionGuard``, ``EdgeLimits``), and the session core: one table of sessions and held
checkpoints per owner with its bounds (``SessionTable``, ``Bounds``, ``CoreSession``), the
fair shares that admit each operation in the event loop (``Shares``), and the keeper that
saves sessions to SQLite, evicts idle ones and brings them back after a restart
(``Keeper``, ``DurableSession``). Imports no web
framework: each front end brings its own extra."""

from ._durable import DurableSession, Keeper, session_fields
from ._edge import ConnectionGuard, EdgeLimits
from ._shares import DEFAULT_MAX_RUNNING, Shares
from ._table import Bounds, CoreSession, QuotaExceeded, SessionTable

__all__ = ["DEFAULT_MAX_RUNNING", "Bounds", "ConnectionGuard", "CoreSession", "DurableSession",
           "EdgeLimits", "Keeper", "QuotaExceeded", "SessionTable", "Shares", "session_fields"]
