"""Google-style docstrings split into the parts a tool needs: the summary line (catalogue), the
description, one description per parameter (guest docstrings, JSON Schema) and the Returns text.

Only the ``Args:`` and ``Returns:`` sections are taken apart; any other section (``Raises:``,
``Examples:``...) stays in the description, since a model reading the tool may need it.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field

__all__ = ["Docstring", "parse_docstring"]

_ARGS = {"args", "arguments", "parameters", "params", "keyword args", "keyword arguments"}
_RETURNS = {"returns", "return", "yields"}
_SECTION = re.compile(r"^([A-Za-z][A-Za-z ]*):\s*$")
_ENTRY = re.compile(r"^(\*{0,2}[A-Za-z_][A-Za-z0-9_]*)\s*(?:\(([^)]*)\))?\s*:\s?(.*)$")


@dataclass(frozen=True, kw_only=True)
class Docstring:
    """The parts of one docstring."""

    summary: str = ""
    description: str = ""
    params: dict[str, str] = field(default_factory=dict)
    returns: str = ""


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _entries(lines: list[str]) -> dict[str, str]:
    """``name (type): text`` entries with indented continuation lines."""
    out: dict[str, str] = {}
    base = min((_indent(x) for x in lines if x.strip()), default=0)
    current: str | None = None
    for line in lines:
        if not line.strip():
            continue
        m = _ENTRY.match(line.strip()) if _indent(line) == base else None
        if m:
            current = m.group(1).lstrip("*")
            out[current] = m.group(3).strip()
        elif current is not None:
            out[current] = (out[current] + " " + line.strip()).strip()
    return out


def _returns_text(lines: list[str]) -> str:
    text = " ".join(x.strip() for x in lines if x.strip())
    # "list[Item]: the items" -> keep only the prose; the type comes from the annotation.
    m = re.match(r"^[\w\[\], .|'\"]+:\s+(.*)$", text)
    return m.group(1) if m else text


def parse_docstring(doc: str | None) -> Docstring:
    """Split ``doc`` (raw ``__doc__``; indentation is cleaned here)."""
    if not doc or not doc.strip():
        return Docstring()
    lines = inspect.cleandoc(doc).splitlines()
    summary_lines: list[str] = []
    i = 0
    while i < len(lines) and lines[i].strip() and not _SECTION.match(lines[i]):
        summary_lines.append(lines[i].strip())
        i += 1
    summary = " ".join(summary_lines)
    rest: list[str] = []
    params: dict[str, str] = {}
    returns = ""
    while i < len(lines):
        m = _SECTION.match(lines[i])
        name = m.group(1).strip().lower() if m and _indent(lines[i]) == 0 else None
        if name in _ARGS or name in _RETURNS:
            j = i + 1
            while j < len(lines) and (not lines[j].strip() or _indent(lines[j]) > 0):
                j += 1
            body = lines[i + 1 : j]
            if name in _ARGS:
                params.update(_entries(body))
            else:
                returns = _returns_text(body)
            i = j
            continue
        rest.append(lines[i])
        i += 1
    description = "\n".join(rest).strip("\n")
    return Docstring(summary=summary, description=description, params=params, returns=returns)
