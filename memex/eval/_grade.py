"""Graders: does a submitted answer match the reference? Pure functions of two JSON-like
values, so a suite's grading is reproducible from its results file alone.

* ``exact``: equal after normalisation (strings case-folded with whitespace collapsed and
  surrounding punctuation dropped; numbers equal, ``3`` and ``3.0`` alike; lists in order;
  dicts by normalised keys).
* ``numeric``: as ``exact``, but numbers match within ``tolerance`` (relative to the
  reference, or absolute below 1).
* ``set``: as ``numeric``, but lists are compared as sets (order and repeats ignored).
* ``dict``: as ``numeric`` for a reference that is a mapping (a figure per key); a missing
  or extra key fails the answer, as it does under every grader.
* ``judge``: an LLM decides (``_judge``; off unless ``run_eval(judge=...)`` names a model).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, Literal

from ..errors import ConfigError

__all__ = ["GRADERS", "GraderKind", "grade", "normalise_text"]

GraderKind = Literal["exact", "numeric", "set", "dict", "judge"]
GRADERS: tuple[str, ...] = ("exact", "numeric", "set", "dict", "judge")

_SPACE = re.compile(r"\s+")
_EDGE = ".,;:!?\"'`()[]{} "


def normalise_text(s: str) -> str:
    """Case-folded, whitespace collapsed, surrounding punctuation and quotes dropped."""
    return _SPACE.sub(" ", s.casefold()).strip(_EDGE)


def grade(got: object, want: object, kind: str = "exact", *, tolerance: float = 1e-6) -> bool:
    """Whether ``got`` matches the reference ``want`` under grader ``kind``."""
    if kind not in GRADERS:
        raise ConfigError(f"unknown grader {kind!r}: one of {', '.join(GRADERS)}")
    if kind == "judge":
        raise ConfigError("the judge grader asks a model: give run_eval(judge=LLMClient(...))")
    if not tolerance >= 0:
        raise ConfigError("a grader's tolerance must be >= 0")
    if kind == "dict" and not isinstance(want, Mapping):
        raise ConfigError("the dict grader needs a reference that is a mapping")
    tol = 1e-9 if kind == "exact" else tolerance
    return _match(got, want, kind, tol, 0)


def _number(v: object) -> float | None:
    if isinstance(v, bool):
        return None
    # "1,234" or "12.5%" stay text: the answer schema says what is a number
    return float(v) if isinstance(v, int | float) else None


def _match(got: object, want: object, kind: str, tol: float, depth: int) -> bool:
    if depth > 32:
        return False
    w = _number(want)
    if w is not None:
        g = _number(got)
        if g is None or math.isnan(g) or math.isnan(w):
            return False
        scale = max(1.0, abs(w))
        return abs(g - w) <= tol * scale
    if isinstance(want, bool) or want is None:
        return got is want or (got == want and type(got) is type(want))
    if isinstance(want, str):
        return isinstance(got, str) and normalise_text(got) == normalise_text(want)
    if isinstance(want, Mapping):
        if not isinstance(got, Mapping):
            return False
        g_items = {normalise_text(str(k)): v for k, v in got.items()}
        w_items = {normalise_text(str(k)): v for k, v in want.items()}
        if set(g_items) != set(w_items):
            return False
        return all(_match(g_items[k], v, kind, tol, depth + 1) for k, v in w_items.items())
    if isinstance(want, list | tuple):
        if not isinstance(got, list | tuple):
            return False
        if kind == "set":
            return _same_set(list(got), list(want), kind, tol, depth)
        return len(got) == len(want) and all(
            _match(g, v, kind, tol, depth + 1) for g, v in zip(got, want, strict=True))
    return bool(got == want)


def _same_set(got: list[Any], want: list[Any], kind: str, tol: float, depth: int) -> bool:
    """Every distinct wanted item is matched by some got item and vice versa."""
    return (all(any(_match(g, w, kind, tol, depth + 1) for g in got) for w in want)
            and all(any(_match(g, w, kind, tol, depth + 1) for w in want) for g in got))
