"""The ``bulletins`` suite: grounded reading over a corpus larger than any context.

150 generated monthly statistical bulletins (January 2013 to June 2025), each a text with a
two-line (merged) header table of regional labour figures, a sector table, a nested table
(services employment by branch: rows within rows, each level indented under its total),
footnotes, and a section revising figures published in earlier issues. Tools:
``search(query)`` (the best matching bulletins, a snippet each) and ``read(bulletin_id)``
(one bulletin's full text).
36 questions per seed from seven templates, each needing one to twelve bulletins and often
arithmetic: the figure as last revised (a later issue must be found), the first published
one, a change between two months, a quarter's mean, the month of a year's peak, a count,
and a branch's employment read from the nested table.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...host_tools import Tool, tool
from .._suite import EvalTask, Workspace

__all__ = ["build", "make_corpus"]

REGIONS = ["North", "South", "East", "West", "Central"]
SECTORS = ["Manufacturing", "Construction", "Retail", "Services"]
# The nested table's branches of Services: (name, parent, depth); shares drift per month.
BRANCHES = [("Public services", None, 1), ("Health", "Public services", 2),
            ("Education", "Public services", 2), ("Private services", None, 1),
            ("Finance", "Private services", 2), ("Hospitality", "Private services", 2),
            ("Transport", "Private services", 2)]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]
N = 150


@dataclass(frozen=True, kw_only=True)
class _Month:
    year: int
    month: int  # 1..12

    @property
    def name(self) -> str:
        return f"{MONTHS[self.month - 1]} {self.year}"

    @property
    def id(self) -> str:
        return f"MSB-{self.year}-{self.month:02d}"


def _months() -> list[_Month]:
    return [_Month(year=2013 + i // 12, month=i % 12 + 1) for i in range(N)]


def make_corpus(seed: int) -> tuple[dict[str, str], dict[str, Any]]:
    """(bulletin id -> text, the figures behind them: first published and final values)."""
    rng = random.Random(f"bulletins-{seed}")
    months = _months()
    first: dict[tuple[int, str], float] = {}  # (month index, region) -> unemployment rate
    emp: dict[tuple[int, str], float] = {}  # (month index, sector) -> thousands employed
    cpi: dict[int, float] = {}
    rate = {r: rng.uniform(3.5, 9.0) for r in REGIONS}
    level = {s: rng.uniform(300, 2500) for s in SECTORS}
    for i in range(N):
        for r in REGIONS:
            rate[r] = min(14.0, max(2.0, rate[r] + rng.gauss(0, 0.25)))
            first[(i, r)] = round(rate[r], 1)
        for s in SECTORS:
            level[s] = max(50.0, level[s] * (1 + rng.gauss(0.001, 0.01)))
            emp[(i, s)] = round(level[s], 1)
        cpi[i] = round(rng.gauss(2.2, 1.1), 1)
    final = dict(first)
    revisions: dict[int, list[tuple[int, str, float, float]]] = {}  # issue -> revisions
    for i in range(N - 2):
        for r in REGIONS:
            if rng.random() < 0.12:
                at = i + rng.choice([1, 2])
                new = round(final[(i, r)] + rng.choice([-0.3, -0.2, -0.1, 0.1, 0.2, 0.3]), 1)
                revisions.setdefault(at, []).append((i, r, final[(i, r)], new))
                final[(i, r)] = new
    branch = _branches(seed, emp)
    texts = {m.id: _text(i, m, months, first, emp, cpi, revisions.get(i, []), rng,
                         branch)
             for i, m in enumerate(months)}
    return texts, {"first": first, "final": final, "emp": emp, "cpi": cpi, "months": months,
                   "branch": branch}


def _branches(seed: int, emp: dict[tuple[int, str], float]) -> dict[tuple[int, str], float]:
    """(month index, branch) -> thousands employed: Services split in two, each half split
    again, by shares drifting month to month (a random stream of its own, so the rest of the
    corpus does not depend on this table)."""
    rng = random.Random(f"bulletins-branches-{seed}")
    top = rng.uniform(0.3, 0.45)
    inner = {p: [rng.uniform(0.5, 1.5) for n, q, _ in BRANCHES if q == p]
             for p in ("Public services", "Private services")}
    out: dict[tuple[int, str], float] = {}
    for i in range(N):
        top = min(0.6, max(0.2, top + rng.gauss(0, 0.005)))
        total = emp[(i, "Services")]
        parts = {"Public services": total * top, "Private services": total * (1 - top)}
        for p, weights in inner.items():
            for k in range(len(weights)):
                weights[k] = max(0.1, weights[k] * (1 + rng.gauss(0, 0.02)))
            kids = [n for n, q, _ in BRANCHES if q == p]
            for n, w in zip(kids, weights, strict=True):
                out[(i, n)] = round(parts[p] * w / sum(weights), 1)
            out[(i, p)] = round(parts[p], 1)
    return out


def _text(i: int, m: _Month, months: list[_Month], rates: dict[tuple[int, str], float],
          emp: dict[tuple[int, str], float], cpi: dict[int, float],
          revisions: list[tuple[int, str, float, float]], rng: random.Random,
          branch: dict[tuple[int, str], float]) -> str:
    pub = months[i + 1].name if i + 1 < N else f"{MONTHS[(m.month) % 12]} {m.year + 1}"
    up = sum(rates[(i, r)] < rates.get((i - 1, r), 99) for r in REGIONS)
    lines = [
        "MONTHLY STATISTICAL BULLETIN",
        f"Issue {i + 1} — {m.name} (published in {pub})",
        f"Bulletin id: {m.id}",
        "",
        "Summary",
        f"Unemployment fell in {up} of {len(REGIONS)} regions. Consumer prices rose "
        f"{cpi[i]:.1f}% on a year earlier{' [a]' if i % 7 == 0 else ''}.",
        "",
        "Table 1. Labour market by region",
        "                 | Unemployment | Change on   ",
        "Region           | rate (%)     | month (pp)  ",
        "-----------------+--------------+-------------",
    ]
    for r in REGIONS:
        prev = rates.get((i - 1, r))
        change = "n/a" if prev is None else f"{rates[(i, r)] - prev:+.1f}"
        lines.append(f"{r:<17}| {rates[(i, r)]:>12.1f} | {change:>11}")
    lines += ["", "Table 2. Employment by sector (thousands) [b]",
              "Sector           | Employed     ", "-----------------+--------------"]
    lines += [f"{s:<17}| {emp[(i, s)]:>12,.1f}" for s in SECTORS]
    lines += ["", "Table 3. Services employment by branch (thousands) [b]",
              "Branch                        | Employed     ",
              "------------------------------+--------------",
              f"{'Services (all branches)':<30}| {emp[(i, 'Services')]:>12,.1f}"]
    lines += [f"{'  ' * depth + ('of which: ' if depth > 1 else '') + name:<30}| "
              f"{branch[(i, name)]:>12,.1f}" for name, _, depth in BRANCHES]
    lines += ["", "Footnotes", "[a] Consumer price figure provisional.",
              "[b] Seasonally adjusted; figures may not sum due to rounding.", ""]
    lines.append("Revisions to earlier issues")
    if revisions:
        for j, r, old, new in revisions:
            lines.append(f"- {months[j].name}: {r} unemployment rate revised from {old:.1f}% "
                         f"to {new:.1f}%.")
    else:
        lines.append("- None this month.")
    lines += ["", rng.choice(["Next issue: see the release calendar.",
                              "Contact: statistics office, labour division.",
                              "Methodology notes are published separately."])]
    return "\n".join(lines) + "\n"


def _tools(texts: dict[str, str]) -> list[Tool]:
    words = {k: set(re.findall(r"[a-z0-9]+", v.lower())) for k, v in texts.items()}

    @tool
    def search(query: str) -> list[dict[str, str]]:
        """Search the bulletins by words (e.g. "March 2020", "revised North").

        Args:
            query: words to look for.

        Returns:
            Up to 10 best matches, each {"id", "title", "snippet"}.
        """
        q = re.findall(r"[a-z0-9]+", query.lower())
        if not q:
            raise ValueError("the query has no words")
        scored = sorted(((sum(w in words[k] for w in q), k) for k in texts), key=lambda x:
                        (-x[0], x[1]))
        out = []
        for score, k in scored[:10]:
            if score == 0:
                break
            lines = texts[k].splitlines()
            out.append({"id": k, "title": lines[1], "snippet": lines[5][:120]})
        return out

    @tool
    def read(bulletin_id: str) -> str:
        """The full text of one bulletin.

        Args:
            bulletin_id: an id from search(), e.g. "MSB-2020-03".

        Returns:
            The bulletin's text: summary, tables, footnotes, revisions to earlier issues.
        """
        if bulletin_id not in texts:
            raise ValueError(f"no bulletin {bulletin_id!r}; ids look like MSB-2020-03")
        return texts[bulletin_id]

    return [search, read]


def _schema(field: str, kind: str) -> dict[str, Any]:
    return {"type": "object", "properties": {field: {"type": kind}}, "required": [field],
            "additionalProperties": False}


def _tasks(seed: int, facts: dict[str, Any]) -> tuple[EvalTask, ...]:
    rng = random.Random(f"bulletins-params-{seed}")
    months: list[_Month] = facts["months"]
    first, final, emp, cpi = facts["first"], facts["final"], facts["emp"], facts["cpi"]
    revised = sorted({(i, r) for (i, r) in final if final[(i, r)] != first[(i, r)]})
    out: list[EvalTask] = []

    def add(kind: str, q: str, field: str, typ: str, ref: object, **kw: Any) -> None:
        out.append(EvalTask(id=f"{kind}_{len(out) + 1}", question=q, answer=_schema(field, typ),
                            reference={field: ref}, tags=(kind,), **kw))

    for i, r in rng.sample(revised, 6):
        add("final", f"What was the unemployment rate in the {r} region in {months[i].name}, "
            "as last revised? Give the percentage.", "rate", "number", final[(i, r)],
            grader="numeric", tolerance=1e-6)
    for i, r in rng.sample(revised, 5):
        add("first", f"What unemployment rate for the {r} region in {months[i].name} was "
            "first published (before any revision)? Give the percentage.", "rate", "number",
            first[(i, r)], grader="numeric", tolerance=1e-6)
    for _ in range(6):
        a, b = sorted(rng.sample(range(N), 2))
        s = rng.choice(SECTORS)
        add("change", f"By how many thousand did {s} employment change from "
            f"{months[a].name} to {months[b].name}? (later minus earlier, one decimal)",
            "change", "number", round(emp[(b, s)] - emp[(a, s)], 1), grader="numeric",
            tolerance=1e-3)
    for _ in range(5):
        y = rng.randint(2013, 2024)
        qn = rng.randint(1, 4)
        idx = [(y - 2013) * 12 + (qn - 1) * 3 + k for k in range(3)]
        add("quarter", f"What was the mean consumer price inflation (the yearly rise in "
            f"consumer prices) over the three months of Q{qn} {y}, to two decimals?", "mean",
            "number", round(sum(cpi[i] for i in idx) / 3, 2), grader="numeric", tolerance=1e-3)
    for _ in range(5):
        y = rng.randint(2013, 2024)
        r = rng.choice(REGIONS)
        idx = [(y - 2013) * 12 + k for k in range(12)]
        peak = max(idx, key=lambda i: (final[(i, r)], -i))
        add("peak", f"In which month of {y} was the {r} region's unemployment rate highest "
            "(as last revised; the first such month if tied)? Give the month's name.",
            "month", "string", MONTHS[months[peak].month - 1])
    for _ in range(5):
        i = rng.randrange(1, N)
        add("count", f"In how many regions did unemployment fall in {months[i].name}, "
            "according to that month's bulletin?", "regions", "integer",
            sum(first[(i, r)] < first[(i - 1, r)] for r in REGIONS))
    branch = facts["branch"]
    for _ in range(4):  # after the others: the earlier templates' tasks keep their ids
        i = rng.randrange(N)
        name, parent, _ = rng.choice([b for b in BRANCHES if b[2] == 2])
        add("branch", f"How many thousand people were employed in {name} ({str(parent).lower()}) "
            f"in {months[i].name}, according to that month's bulletin? One decimal.",
            "employed", "number", branch[(i, name)], grader="numeric", tolerance=1e-6)
    return tuple(out)


def build(seed: int, workdir: Path) -> Workspace:
    """Seed ``seed``'s 150 bulletins (in memory; ``workdir`` is not needed), tools, tasks."""
    texts, facts = make_corpus(seed)
    return Workspace(tasks=_tasks(seed, facts), tools=tuple(_tools(texts)), preload=(),
                     instructions="Bulletin ids look like MSB-2020-03 (March 2020). A later "
                                  "issue may revise a figure an earlier one published.")
