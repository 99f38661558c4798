"""The ``big-outputs`` suite: tools that return thousands of records, the case where one
call floods a tool-calling agent's context (its result arrives as text, cut to the
observation bound) while a code agent keeps the result in a variable and prints one number.

Three tools over one seed's data: ``transactions()`` (a DataFrame of 5,000 card
transactions), ``web_log()`` (8,000 access-log lines as strings) and ``inventory()``
(3,000 stock records as dicts). Eight questions, parameters and answers per seed.
"""

from __future__ import annotations

import datetime as dt
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd

from ...host_tools import Tool, tool
from .._suite import EvalTask, Workspace

__all__ = ["build", "make_data"]

MERCHANTS = ["Northwind", "Contoso", "Fabrikam", "Tailspin", "Litware", "Adatum", "Proseware",
             "Woodgrove", "Lucerne", "Margie"]
COUNTRIES = ["US", "DE", "FR", "JP", "BR", "IN", "GB", "CA"]
PATHS = ["/", "/login", "/search", "/cart", "/checkout", "/api/items", "/api/orders",
         "/account", "/help", "/static/app.js"]
CATEGORIES = ["tools", "garden", "kitchen", "toys", "office", "outdoor"]


def make_data(seed: int) -> dict[str, Any]:
    """The seed's three data sets: a transactions DataFrame, log lines, inventory dicts."""
    rng = random.Random(f"big-outputs-{seed}")
    m_w = [rng.uniform(0.3, 2.0) for _ in MERCHANTS]
    rows = []
    t0 = dt.datetime(2025, 1, 1)
    for i in range(1, 5001):
        kind = rng.choices(["purchase", "refund", "fee"], [0.86, 0.1, 0.04])[0]
        amount = round(rng.lognormvariate(3.5, 1.0), 2) if kind != "fee" else 2.5
        rows.append((f"T{seed:02d}{i:05d}", (t0 + dt.timedelta(minutes=rng.randrange(525600)))
                     .isoformat(timespec="minutes"), kind, amount,
                     rng.choices(MERCHANTS, m_w)[0], rng.choice(COUNTRIES)))
    transactions = pd.DataFrame(rows, columns=["id", "time", "type", "amount", "merchant",
                                               "country"])
    slow = {p: rng.uniform(20, 400) for p in PATHS}
    lines = []
    for _ in range(8000):
        p = rng.choice(PATHS)
        status = rng.choices([200, 301, 404, 500], [0.85, 0.05, 0.07, 0.03])[0]
        ms = max(1, int(rng.gauss(slow[p], slow[p] / 4)))
        ts = (t0 + dt.timedelta(seconds=rng.randrange(86400 * 30))).isoformat()
        lines.append(f"{ts} GET {p} {status} {ms}ms")
    inventory = [{"sku": f"SKU-{seed:02d}-{i:04d}", "category": rng.choice(CATEGORIES),
                  "stock": rng.randint(0, 400), "reorder_level": rng.randint(10, 120),
                  "unit_cost": round(rng.uniform(0.5, 90), 2)} for i in range(3000)]
    return {"transactions": transactions, "log": lines, "inventory": inventory}


def _tools(data: dict[str, Any]) -> list[Tool]:
    @tool
    def transactions() -> pd.DataFrame:
        """All card transactions of the period.

        Returns:
            One row per transaction: id, time, type (purchase | refund | fee), amount (USD),
            merchant, country.
        """
        return data["transactions"].copy()

    @tool
    def web_log() -> list[str]:
        """The web server's access log for the month.

        Returns:
            One line per request: "<time> <method> <path> <status> <milliseconds>ms".
        """
        return list(data["log"])

    @tool
    def inventory() -> list[dict[str, Any]]:
        """The warehouse inventory.

        Returns:
            One dict per SKU: sku, category, stock, reorder_level, unit_cost (USD).
        """
        return [dict(r) for r in data["inventory"]]

    return [transactions, web_log, inventory]


def _schema(field: str, kind: str) -> dict[str, Any]:
    return {"type": "object", "properties": {field: {"type": kind}}, "required": [field],
            "additionalProperties": False}


def _tasks(seed: int, data: dict[str, Any]) -> tuple[EvalTask, ...]:
    rng = random.Random(f"big-outputs-params-{seed}")
    tx: pd.DataFrame = data["transactions"]
    country = rng.choice(COUNTRIES)
    merchant = rng.choice(MERCHANTS)
    purchases = tx[tx["type"] == "purchase"]
    parsed = [ln.split() for ln in data["log"]]
    per_path: dict[str, list[int]] = {}
    for _ts, _m, path, _s, ms in parsed:
        per_path.setdefault(path, []).append(int(ms[:-2]))
    status = rng.choice(["404", "500"])
    inv = data["inventory"]
    cat = rng.choice(CATEGORIES)

    def task(id: str, q: str, field: str, kind: str, ref: object, **kw: Any) -> EvalTask:
        return EvalTask(id=id, question=q, answer=_schema(field, kind), reference={field: ref},
                        tags=("big-outputs",), **kw)

    return (
        task("refund_total", "What is the total amount in USD of all refund transactions?",
             "total", "number", round(float(tx[tx["type"] == "refund"]["amount"].sum()), 2),
             grader="numeric", tolerance=1e-4),
        task("country_count", f"How many transactions (of any type) were made in {country}?",
             "count", "integer", int((tx["country"] == country).sum())),
        task("top_merchant", "Which merchant has the most purchase transactions?", "merchant",
             "string", Counter(purchases["merchant"]).most_common(1)[0][0]),
        task("merchant_purchases", f"What is the total purchase amount in USD at {merchant}?",
             "total", "number", round(float(purchases[purchases["merchant"] == merchant]
                                            ["amount"].sum()), 2),
             grader="numeric", tolerance=1e-4),
        task("status_count", f"How many requests in the web log got status {status}?", "count",
             "integer", sum(1 for p in parsed if p[3] == status)),
        task("slowest_path", "Which path has the highest average response time in the web "
             "log?", "path", "string",
             max(per_path, key=lambda p: sum(per_path[p]) / len(per_path[p]))),
        task("below_reorder", "How many SKUs have a stock below their reorder level?", "count",
             "integer", sum(1 for r in inv if r["stock"] < r["reorder_level"])),
        task("category_value", f"What is the total stock value (stock x unit_cost, USD) of the "
             f"{cat} category?", "value", "number",
             round(sum(r["stock"] * r["unit_cost"] for r in inv if r["category"] == cat), 2),
             grader="numeric", tolerance=1e-4),
    )


def build(seed: int, workdir: Path) -> Workspace:
    """Seed ``seed``'s data (held in memory; ``workdir`` is not needed), tools and tasks."""
    data = make_data(seed)
    return Workspace(tasks=_tasks(seed, data), tools=tuple(_tools(data)), preload=("pandas",))
