"""``memex eval export``: rollouts as training data. One JSON line per rollout: the
messages the model saw and wrote (code blocks or tool calls, and the observations), the
grader's reward, and where it came from (suite, model, action space, variant, seed, task)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..executor import load_trajectories
from ._results import TRAJECTORIES, load_results

__all__ = ["EXPORT_FORMATS", "export_rollouts"]

EXPORT_FORMATS = ("chat-jsonl",)


def export_rollouts(out: str | Path, *, fmt: str = "chat-jsonl", suite: str | None = None,
                    model: str | None = None, space: str | None = None,
                    correct: bool | None = None) -> Iterator[dict[str, Any]]:
    """The run folder's rollouts that pass the filters, as chat records (not those whose
    model endpoint failed: they have no outcome to reward)."""
    if fmt not in EXPORT_FORMATS:
        raise ConfigError(f"export formats are {', '.join(EXPORT_FORMATS)}, got {fmt!r}")
    folder = Path(out)
    results = load_results(folder)
    trajectories = {t.id: t for t in load_trajectories(folder / TRAJECTORIES)}
    for r in results:
        if (r.endpoint_failed or (suite is not None and r.suite != suite)
                or (model is not None and r.model != model)
                or (space is not None and r.space != space)
                or (correct is not None and r.correct != correct)):
            continue
        t = trajectories.get(r.trajectory)
        if t is None:
            raise ConfigError(f"{folder / TRAJECTORIES} has no trajectory {r.trajectory}")
        yield {"messages": [dict(m) for m in t.messages], "reward": 1.0 if r.correct else 0.0,
               "suite": r.suite, "model": r.model, "space": r.space, "variant": r.variant,
               "seed": r.seed, "task": r.task, "answer": r.answer, "reference": r.reference,
               "end_reason": r.end_reason, "trajectory": r.trajectory}
