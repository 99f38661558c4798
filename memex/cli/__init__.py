"""The ``memex`` command line (``memex prepare | run | repl | agent | trajectory | model |
policy | mcp | serve | kernel | selftest``); no layer imports it."""

from ._main import build_parser, main, run

__all__ = ["build_parser", "main", "run"]
