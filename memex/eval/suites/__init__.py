"""The bundled suites, each generated per seed: ``warehouse`` (structured retrieval over a
DuckDB warehouse; needs ``memex[eval]``), ``bulletins`` (reading over a corpus larger than
any context) and ``big-outputs`` (tools returning thousands of records). A suite's module
is imported when a workspace is built, so listing the suites needs none of their
dependencies."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import MappingProxyType

from ...errors import ConfigError
from .._suite import Suite, Workspace

__all__ = ["SUITES"]


def _deferred(module: str, extra: str) -> object:
    def build(seed: int, workdir: Path) -> Workspace:
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:
            raise ConfigError(f"this suite needs {exc.name}: pip install 'memex[{extra}]'"
                              ) from exc
        ws: Workspace = mod.build(seed, workdir)
        return ws

    return build


SUITES = MappingProxyType({
    "warehouse": Suite(
        name="warehouse", build=_deferred("memex.eval.suites._warehouse", "eval"),  # type: ignore[arg-type]
        description="42 questions over a 32-table DuckDB warehouse in four business "
                    "domains: lookups, aggregates, grounding traps (legacy and look-alike "
                    "tables, preliminary vs revised figures), funnels and cohorts"),
    "bulletins": Suite(
        name="bulletins", build=_deferred("memex.eval.suites._bulletins", "eval"),  # type: ignore[arg-type]
        description="36 questions over 150 generated monthly statistical bulletins "
                    "(merged-header and nested tables, footnotes, later issues revising figures): "
                    "search, read and arithmetic over several documents"),
    "big-outputs": Suite(
        name="big-outputs", build=_deferred("memex.eval.suites._big_outputs", "examples"),  # type: ignore[arg-type]
        description="8 questions whose tools return thousands of records (5,000 "
                    "transactions, 8,000 log lines, 3,000 stock records): one call floods a "
                    "tool-calling agent's context"),
})
