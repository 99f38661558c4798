"""What MemEx's network front ends share (``memex serve``, ``memex mcp``): the one
authentication (``KeyRing`` of ``Principal``s: keys kept hashed, compared in constant
time, ``hash_key``, ``bearer_key``); the connection
edge that bounds what a client can hold of a server before any application code runs
(``ConnectionGuard``, ``EdgeLimits``, and ``EdgeTable``, its keys in a config file), and
the session core: one table of sessions and held
checkpoints per owner with its bounds (``SessionTable``, ``Bounds``, ``CoreSession``), the
fair shares that admit each operation in the event loop (``Shares``), and the keeper that
saves sessions to SQLite, evicts idle ones and brings them back after a restart
(``Keeper``, ``DurableSession``); a tenant's operator tools and egress policy (loaded by
``load_tools``, described by ``describe_tools``); and the one style of their config files
(``FileModel``, ``LimitsTable`` and the other models of Limits' fields that
``limits_model`` makes, ``Size``, ``Seconds``, ``config_error``). Imports no web
framework: each front end brings its own extra. A cluster's control actor (``Control``:
directory, ledger, placement and recovery across Ray nodes) and the door kits that carry a
tenant's tools across nodes are ``internal``."""

from ._auth import KeyRing, Principal, bearer_key, check_key_hashes, hash_key, key_matches
from ._durable import DurableSession, Keeper, session_fields
from ._edge import ConnectionGuard, EdgeLimits, EdgeTable
from ._packages import PackageGate, allowed_packages
from ._policy import PrincipalTable, unenforced
from ._settings import (
    FileModel,
    LimitsModel,
    LimitsTable,
    Seconds,
    SecondsOrZero,
    Size,
    config_error,
    limits_model,
    read_toml,
)
from ._shares import Shares, default_running_turns
from ._table import ID_PATTERN, Bounds, QuotaExceeded, SessionTable
from ._tools import describe_tools, load_tools

__all__ = [
    "ID_PATTERN",
    "Bounds",
    "ConnectionGuard",
    "DurableSession",
    "EdgeLimits",
    "EdgeTable",
    "FileModel",
    "Keeper",
    "KeyRing",
    "LimitsModel",
    "LimitsTable",
    "PackageGate",
    "Principal",
    "PrincipalTable",
    "QuotaExceeded",
    "Seconds",
    "SecondsOrZero",
    "SessionTable",
    "Shares",
    "Size",
    "allowed_packages",
    "bearer_key",
    "check_key_hashes",
    "config_error",
    "default_running_turns",
    "describe_tools",
    "hash_key",
    "key_matches",
    "limits_model",
    "load_tools",
    "read_toml",
    "session_fields",
    "unenforced",
]
