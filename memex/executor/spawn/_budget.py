"""The budget of an agent tree, and what a sub-agent's ending means to its parent."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...errors import ConfigError
from .._config import Caps, EndReason

if TYPE_CHECKING:
    from .._run import Rollout

__all__ = ["FAILURE_KINDS", "TreeBudget", "failure"]

FAILURE_KINDS = ("error", "timeout", "trap", "budget", "cancelled")


@dataclass(frozen=True, kw_only=True)
class TreeBudget(Caps):
    """One budget for a root rollout and every sub-agent under it (None: no bound).

    ``max_depth`` is how deep sub-agents may nest (the root is depth 0; 0 disables spawning);
    ``max_live`` bounds sub-agents running at once and ``max_children`` those started in all;
    the :class:`Caps` (``max_turns`` model calls, ``max_tokens``, ``max_cost`` USD and
    ``max_seconds`` wall time from the root's start) count the whole tree, root included.
    ``models`` lists the models a sub-agent may ask for (None: any model at the same
    endpoint)."""

    max_depth: int = 2
    max_live: int = 8
    max_children: int = 64
    models: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("max_depth", "max_live", "max_children"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"TreeBudget.{name} must be an int >= 0, got {v!r}")
        if self.models is not None and (isinstance(self.models, str) or not all(
                isinstance(m, str) for m in self.models)):
            raise ConfigError("TreeBudget.models is a tuple of model names or None")


def failure(rollout: Rollout | None, error: str | None) -> tuple[str, str]:
    """(kind, reason) of a child that ended without an answer."""
    if rollout is None:
        return "error", error or "the sub-agent could not start"
    end, t = EndReason(rollout.end_reason), rollout.trajectory
    if end.tree:
        return "budget", f"the agent tree's {end.cap} budget ran out"
    if end is EndReason.MAX_SECONDS:
        return "timeout", f"it ended without an answer after {t.duration:.1f}s (max_seconds)"
    if end.cap is not None:
        return "budget", (f"it ended without an answer: its {end} budget ran out after "
                          f"{len(t.steps)} turns, {t.total_tokens} tokens")
    if end is EndReason.LLM_ERROR:
        return "error", f"its model call failed: {rollout.error}"
    if end is EndReason.SANDBOX_ERROR:
        return "trap", f"its sandbox failed: {rollout.error}"
    if end is EndReason.CANCELLED:
        return "cancelled", "cancelled"
    detail = f": {rollout.error}" if rollout.error else ""
    return "error", f"it ended without an answer ({end}){detail}"
