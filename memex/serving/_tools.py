"""Operator tools: host functions a tenant's guests may call that run in the server, not in
the client (a company search, a database the client must not reach). ``serve.toml`` names
them per tenant (``tools = ["acme_tools.py:TOOLS", "mypkg.tools:search"]``); each entry is
a Python file (relative to the config) or an importable module, and an attribute of it: a
:class:`~memex.host_tools.ToolSet`, a :class:`~memex.host_tools.Tool`, a typed function, or
a list of those.

On a session's door the server (in a cluster, the slab holding it: ``_doorkit``) answers
calls to these names itself and forwards every other tool call to the client
(``backends.internal.ClientDoor``), so a client can neither answer in the operator's place nor see
the operator's handlers. ``GET /v1/tools`` describes them (OpenAI
function definitions), which is how a client offers them to its model."""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import ConfigError, MemexError
from ..host_tools import Tool, ToolSet

__all__ = ["TOOL_SPEC", "describe_tools", "load_tools"]

TOOL_SPEC = re.compile(r"(?P<where>[^:]+):(?P<attr>[A-Za-z_][A-Za-z0-9_.]*)")


def _module(where: str, target: str, base: Path, tenant: str) -> Any:
    if target.endswith(".py"):
        path = (base / target).resolve()
        name = f"memex_operator_tools.{tenant}.{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None or not path.is_file():
            raise ConfigError(f"{where}: no Python file {str(path)!r}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses and pydantic look their module up here
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(name, None)
            raise ConfigError(f"{where}: running {str(path)!r} failed: "
                              f"{type(exc).__name__}: {exc}") from exc
        return module
    try:
        return importlib.import_module(target)
    except Exception as exc:
        raise ConfigError(f"{where}: cannot import {target!r}: {type(exc).__name__}: "
                          f"{exc}") from exc


def _tools_of(where: str, value: object) -> Iterable[Tool | Any]:
    if isinstance(value, ToolSet):
        return list(value)
    if isinstance(value, Tool) or callable(value):
        return [value]
    if isinstance(value, list | tuple):
        return list(value)
    raise ConfigError(f"{where}: is a {type(value).__name__}, not a ToolSet, a Tool, a "
                      "function or a list of them")


def load_tools(where: str, specs: list[str], base: Path, tenant: str) -> ToolSet | None:
    """The tenant's tools from ``module:attribute`` entries (None for no entry)."""
    if not specs:
        return None
    tools: list[Any] = []
    for spec in specs:
        found = TOOL_SPEC.fullmatch(spec) if isinstance(spec, str) else None
        if found is None:
            raise ConfigError(f"{where}: {spec!r} is not 'file.py:NAME' or 'module:NAME'")
        value = _module(f"{where} {spec!r}", found["where"], base, tenant)
        for part in found["attr"].split("."):
            if not hasattr(value, part):
                raise ConfigError(f"{where} {spec!r}: no attribute {part!r}")
            value = getattr(value, part)
        tools += _tools_of(f"{where} {spec!r}", value)
    try:
        toolset = ToolSet(tools)
        toolset.install_source(pin=True)  # every tool renders as a guest stub
    except MemexError as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    return toolset


def describe_tools(tools: ToolSet | None) -> list[dict[str, Any]]:
    """The ``GET /v1/tools`` entries: each tool's OpenAI function definition and what its
    value is (the one-line catalogue entry the guest's ``help(tools)`` shows)."""
    if tools is None:
        return []
    lines = dict(zip(tools.names, tools.catalogue().splitlines(), strict=False))
    return [{"definition": t.to_openai(), "returns": t.returns_doc,
             "catalogue": lines.get(t.name, "")} for t in tools]
