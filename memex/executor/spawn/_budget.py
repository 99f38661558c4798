"""The budget of an agent tree, and what a sub-agent's ending means to its parent."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...errors import ConfigError

if TYPE_CHECKING:
    from .._run import Rollout

__all__ = ["FAILURE_KINDS", "TreeBudget", "failure"]

FAILURE_KINDS = ("error", "timeout", "trap", "budget", "cancelled")


@dataclass(frozen=True, kw_only=True)
class TreeBudget:
    """One budget for a root rollout and every sub-agent under it (None: no bound).

    ``max_depth`` is how deep sub-agents may nest (the root is depth 0; 0 disables spawning);
    ``max_live`` bounds sub-agents running at once and ``max_children`` those started in all;
    ``max_turns`` (model calls), ``max_tokens``, ``max_cost`` (USD) and ``max_seconds`` (wall
    time from the root's start) count the whole tree, root included. ``models`` lists the
    models a sub-agent may ask for (None: any model at the same endpoint)."""

    max_depth: int = 2
    max_live: int = 8
    max_children: int = 64
    max_turns: int | None = None
    max_tokens: int | None = None
    max_cost: float | None = None
    max_seconds: float | None = None
    models: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("max_depth", "max_live", "max_children"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"TreeBudget.{name} must be an int >= 0, got {v!r}")
        for name in ("max_turns", "max_tokens", "max_cost", "max_seconds"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)
                                  or not 0 < v < float("inf")):
                raise ConfigError(f"TreeBudget.{name} must be > 0 or None, got {v!r}")
        if self.models is not None and (isinstance(self.models, str) or not all(
                isinstance(m, str) for m in self.models)):
            raise ConfigError("TreeBudget.models is a tuple of model names or None")


def failure(rollout: Rollout | None, error: str | None) -> tuple[str, str]:
    """(kind, reason) of a child that ended without an answer."""
    if rollout is None:
        return "error", error or "the sub-agent could not start"
    end, t = rollout.end_reason, rollout.trajectory
    if end in ("max_turns", "max_tokens", "max_cost"):
        return "budget", (f"it ended without an answer: its {end} budget ran out after "
                          f"{len(t.steps)} turns, {t.total_tokens} tokens")
    if end == "max_seconds":
        return "timeout", f"it ended without an answer after {t.duration:.1f}s (max_seconds)"
    if end.startswith("tree_"):
        return "budget", f"the agent tree's {end[5:]} budget ran out"
    if end == "llm_error":
        return "error", f"its model call failed: {rollout.error}"
    if end == "sandbox_error":
        return "trap", f"its sandbox failed: {rollout.error}"
    if end == "cancelled":
        return "cancelled", "cancelled"
    detail = f": {rollout.error}" if rollout.error else ""
    return "error", f"it ended without an answer ({end}){detail}"
