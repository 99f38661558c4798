"""A block that uses a name before a later block of the same reply defines it.

Small models copy the worked example's last block (``submit({"count": count})``) to the top
of a reply and compute ``count`` in the block after it: run in order, the first block fails
with a NameError and the rest of the reply, the computation included, is never run. Read
from the trajectories of ``memex eval``: 12 of the 14 NameErrors of a big-outputs run were
this. ``Aids.defer_forward_use`` runs such a block again right after the block that defines
the name. Only a block of one statement is deferred, so running it again repeats nothing
that its first try did. The code is parsed on the host (``ast``), never run there.
"""

from __future__ import annotations

import ast
import re

__all__ = ["defined_by_later", "missing_name"]

_MISSING = re.compile(r"name '([A-Za-z_]\w*)' is not defined")


def missing_name(exc_type: str, message: str) -> str | None:
    """The name a guest ``NameError`` says is not defined, or None."""
    if exc_type != "NameError":
        return None
    m = _MISSING.search(message)
    return m.group(1) if m else None


def defined_by_later(blocks: list[str], i: int, name: str) -> int | None:
    """The index of the first block after ``blocks[i]`` that binds ``name`` at its top level
    (an assignment, a ``for`` or ``with`` target, a ``def``, ``class`` or ``import``), if
    ``blocks[i]`` is a single statement; else None."""
    if not _one_statement(blocks[i]):
        return None
    for j in range(i + 1, len(blocks)):
        if name in _bound(blocks[j]):
            return j
    return None


def _one_statement(code: str) -> bool:
    try:
        return len(ast.parse(code).body) == 1
    except (SyntaxError, ValueError):
        return False


def _bound(code: str) -> set[str]:
    """The names a block binds in the session's namespace: every name it stores to, at any
    depth, outside the bodies of the functions, classes, lambdas and comprehensions it
    defines (their own scopes), plus the names those definitions and its imports bind."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return set()
    out: set[str] = set()
    todo: list[ast.AST] = [tree]
    while todo:
        for node in ast.iter_child_nodes(todo.pop()):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                out.update((a.asname or a.name).partition(".")[0] for a in node.names)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                out.add(node.id)
            elif not isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp,
                                       ast.GeneratorExp)):
                todo.append(node)
    return out
