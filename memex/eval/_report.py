"""``memex eval report``: one row per suite x model x action space (x aid variant) with
accuracy and its 95% interval, tokens, calls, wall time, cost and tokens per correct answer,
as a table (Markdown, JSON or CSV), and a cost-vs-accuracy Pareto plot."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ._results import RolloutResult, latest

__all__ = ["FORMATS", "Summary", "TaskCell", "by_task", "format_by_task", "format_summaries",
           "pareto_plot", "summarise", "wilson"]

FORMATS = ("md", "json", "csv")


@dataclass(frozen=True, kw_only=True)
class Summary:
    """One group of rollouts. Means are per rollout; ``cost`` is the total in USD (None
    when no rollout had a price); ``tokens_per_correct`` None when none was correct."""

    suite: str
    model: str
    space: str
    variant: str
    rollouts: int
    correct: int
    accuracy: float
    ci_low: float
    ci_high: float
    prompt_tokens: float
    completion_tokens: float
    llm_calls: float
    tool_calls: float
    seconds: float
    cost: float | None
    tokens_per_correct: float | None
    submitted: int
    endpoint_errors: int = 0  # rollouts left out because the model endpoint failed


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval of ``k`` successes in ``n`` (95% by default): sensible at
    0 and n, unlike the normal approximation."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (0.0 if k == 0 else max(0.0, c - h)), (1.0 if k == n else min(1.0, c + h))


def summarise(results: Iterable[RolloutResult],
              prices: Mapping[str, tuple[float, float]] | None = None) -> list[Summary]:
    """Group results by suite, model, action space and variant. ``prices`` (model -> USD
    per 1M input and output tokens) overrides the cost recorded with the rollouts. A
    rollout whose model endpoint failed counts only in ``endpoint_errors``: it says nothing
    about the model."""
    groups: dict[tuple[str, str, str, str], list[RolloutResult]] = {}
    failed: dict[tuple[str, str, str, str], int] = {}
    for r in latest(results):
        key = (r.suite, r.model, r.space, r.variant)
        if r.endpoint_failed:
            failed[key] = failed.get(key, 0) + 1
            groups.setdefault(key, [])
        else:
            groups.setdefault(key, []).append(r)
    out = []
    for (suite, model, space, variant), rs in sorted(groups.items()):
        errors = failed.get((suite, model, space, variant), 0)
        if not rs:
            out.append(Summary(
                suite=suite, model=model, space=space, variant=variant, rollouts=0,
                correct=0, accuracy=0.0, ci_low=0.0, ci_high=1.0, prompt_tokens=0.0,
                completion_tokens=0.0, llm_calls=0.0, tool_calls=0.0, seconds=0.0, cost=None,
                tokens_per_correct=None, submitted=0, endpoint_errors=errors))
            continue
        n = len(rs)
        k = sum(r.correct for r in rs)
        lo, hi = wilson(k, n)
        costs = [_cost(r, prices) for r in rs]
        known = [c for c in costs if c is not None]
        tokens = sum(r.tokens for r in rs)
        out.append(Summary(
            suite=suite, model=model, space=space, variant=variant, rollouts=n, correct=k,
            accuracy=k / n, ci_low=lo, ci_high=hi,
            prompt_tokens=_mean(r.prompt_tokens for r in rs),
            completion_tokens=_mean(r.completion_tokens for r in rs),
            llm_calls=_mean(r.llm_calls for r in rs), tool_calls=_mean(r.tool_calls for r in rs),
            seconds=_mean(r.seconds for r in rs), cost=sum(known) if known else None,
            tokens_per_correct=tokens / k if k else None,
            submitted=sum(r.end_reason == "submitted" for r in rs), endpoint_errors=errors))
    return out


def _mean(xs: Iterable[float]) -> float:
    v = list(xs)
    return sum(v) / len(v) if v else 0.0


def _cost(r: RolloutResult, prices: Mapping[str, tuple[float, float]] | None) -> float | None:
    if prices and r.model in prices:
        pin, pout = prices[r.model]
        return (r.prompt_tokens * pin + r.completion_tokens * pout) / 1e6
    return r.cost


_COLUMNS = ("suite", "model", "space", "variant", "rollouts", "correct", "accuracy", "ci_low",
            "ci_high", "prompt_tokens", "completion_tokens", "llm_calls", "tool_calls",
            "seconds", "cost", "tokens_per_correct", "submitted", "endpoint_errors")


def _machine(records: Sequence[Any], columns: Sequence[str], fmt: str) -> str | None:
    """``records`` as JSON or CSV (``columns`` in order); None for Markdown, which each
    table writes its own way. An unknown format is refused."""
    if fmt not in FORMATS:
        raise ConfigError(f"report formats are {', '.join(FORMATS)}, got {fmt!r}")
    if fmt == "json":
        return json.dumps([asdict(r) for r in records], indent=2)
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(columns)
        for r in records:
            w.writerow([getattr(r, c) for c in columns])
        return buf.getvalue()
    return None


def format_summaries(rows: list[Summary], fmt: str = "md") -> str:
    """The table as Markdown (for people), JSON or CSV (for tools)."""
    machine = _machine(rows, _COLUMNS, fmt)
    if machine is not None:
        return machine
    head = ("| suite | model | space | variant | correct | accuracy (95% CI) | prompt tok | "
            "completion tok | LLM calls | tool calls | wall s | cost $ | tokens/correct |")
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for r in rows:
        cost = "-" if r.cost is None else f"{r.cost:.4f}"
        tpc = "-" if r.tokens_per_correct is None else f"{r.tokens_per_correct:,.0f}"
        lines.append(
            f"| {r.suite} | {r.model} | {r.space} | {r.variant} | {r.correct}/{r.rollouts} | "
            f"{r.accuracy:.0%} ({r.ci_low:.0%}-{r.ci_high:.0%}) | {r.prompt_tokens:,.0f} | "
            f"{r.completion_tokens:,.0f} | {r.llm_calls:.1f} | {r.tool_calls:.1f} | "
            f"{r.seconds:.1f} | {cost} | {tpc} |")
    errors = sum(r.endpoint_errors for r in rows)
    if errors:
        lines.append(f"\n{errors} rollout{'s' if errors != 1 else ''} not counted: the model "
                     "endpoint failed (run the same `memex eval run` again to run "
                     f"{'them' if errors != 1 else 'it'})")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, kw_only=True)
class TaskCell:
    """How one task went in one suite x model x action space x variant: ``correct`` of
    ``rollouts`` (its seeds; a rollout whose endpoint failed is not counted)."""

    suite: str
    model: str
    space: str
    variant: str
    task: str
    correct: int
    rollouts: int


def by_task(results: Iterable[RolloutResult]) -> list[TaskCell]:
    """Each task's tally per suite, model, action space and variant, in the order tasks
    first appear: where two spaces or two variants differ, task by task."""
    cells: dict[tuple[str, str, str, str, str], list[int]] = {}
    for r in latest(results):
        if r.endpoint_failed:
            continue
        tally = cells.setdefault((r.suite, r.model, r.space, r.variant, r.task), [0, 0])
        tally[0] += r.correct
        tally[1] += 1
    return [TaskCell(suite=k[0], model=k[1], space=k[2], variant=k[3], task=k[4],
                     correct=c, rollouts=n) for k, (c, n) in cells.items()]


def format_by_task(cells: list[TaskCell], fmt: str = "md") -> str:
    """Markdown: one table per suite (and model), a row per task and a column per action
    space x variant, each cell ``correct/rollouts``; JSON or CSV: one record per cell."""
    machine = _machine(cells, ("suite", "model", "space", "variant", "task", "correct",
                               "rollouts"), fmt)
    if machine is not None:
        return machine
    out: list[str] = []
    for suite, model in dict.fromkeys((c.suite, c.model) for c in cells):
        mine = [c for c in cells if (c.suite, c.model) == (suite, model)]
        cols = sorted({(c.space, c.variant) for c in mine},
                      key=lambda sv: (sv[0], sv[1] != "default", sv[1]))
        tasks = list(dict.fromkeys(c.task for c in mine))
        at = {(c.task, c.space, c.variant): f"{c.correct}/{c.rollouts}" for c in mine}
        head = "| task | " + " | ".join(f"{s} {v}" for s, v in cols) + " |"
        out += [f"{suite} · {model}", "", head, "|" + "---|" * (len(cols) + 1)]
        out += ["| " + t + " | " + " | ".join(at.get((t, s, v), "-") for s, v in cols) + " |"
                for t in tasks]
        out.append("")
    return "\n".join(out)


def _x(r: Summary, priced: bool) -> float:
    return (r.cost or 0.0) / r.rollouts if priced else r.prompt_tokens + r.completion_tokens


def _frontier(points: list[tuple[float, float]]) -> list[int]:
    """Indexes of the points no other point beats on both cost (lower) and accuracy
    (higher), by increasing cost."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    best = -1.0
    keep = []
    for i in order:
        if points[i][1] > best:
            keep.append(i)
            best = points[i][1]
    return keep


def pareto_plot(rows: list[Summary], path: str | Path, *, width: int = 800,
                height: int = 500) -> Path:
    """A cost-vs-accuracy scatter, one point per model x action space (x variant) per
    suite, the Pareto frontier drawn through the points no other beats. The cost axis is
    USD per rollout when every point has a price, else tokens per rollout (a local model's
    cost). Needs matplotlib (``pip install memex[eval]``)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ConfigError("the Pareto plot needs matplotlib: pip install 'memex[eval]'") from exc
    rows = [r for r in rows if r.rollouts]  # a group whose every endpoint call failed
    if not rows:
        raise ConfigError("no results to plot")
    priced = all(r.cost is not None for r in rows) and any(r.cost for r in rows)
    fig, ax = plt.subplots(figsize=(width / 100, height / 100), dpi=100)
    try:
        suites = sorted({r.suite for r in rows})
        xmax = max((_x(r, priced) for r in rows), default=1.0) or 1.0
        placed = -1
        for suite in suites:
            group = [r for r in rows if r.suite == suite]
            pts = [(_x(r, priced), r.accuracy) for r in group]
            for r, (x, y) in zip(group, pts, strict=True):
                ax.errorbar([x], [y], yerr=[[y - r.ci_low], [r.ci_high - y]], capsize=3,
                            fmt="o" if r.space == "code" else "s", ms=7, alpha=0.85)
                label = f"{r.model} · {r.space}" + ("" if r.variant == "default"
                                                    else f" · {r.variant}")
                if len(suites) > 1:
                    label += f" ({suite})"
                right = x > 0.6 * xmax  # labels stay inside the axes
                placed += 1  # and points on one level get their labels on three heights
                ax.annotate(label, (x, y), textcoords="offset points",
                            xytext=(-8 if right else 8, 6 + 11 * (placed % 3)),
                            ha="right" if right else "left", fontsize=8)
            front = _frontier(pts)
            if len(front) > 1:
                ax.plot([pts[i][0] for i in front], [pts[i][1] for i in front], "--", lw=1,
                        color="gray", label=f"Pareto frontier ({suite})")
        ax.set_xlabel("cost per rollout (USD)" if priced else "tokens per rollout")
        ax.set_ylabel("accuracy (95% interval)")
        ax.set_xlim(0, xmax * 1.12)
        ax.set_ylim(-0.05, 1.05)
        ax.set_title("Cost vs accuracy: code actions (o) vs tool calling (s)")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[1]:
            ax.legend(fontsize=8, loc="upper right")
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=100)
    finally:
        plt.close(fig)
    return out
