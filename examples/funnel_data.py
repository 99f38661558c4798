"""The funnel task's warehouse: a small SQLite database generated deterministically.

Tables:
  customers(customer_id INTEGER, segment TEXT, country TEXT, signup_date TEXT)
  events(customer_id INTEGER, event TEXT, ts TEXT)   -- event: signup | verified | activated

Every customer has a ``signup`` event; some go on to ``verified`` and then ``activated``.
Each segment has its own rates, so the conversions differ and one segment drops off most.
"""

from __future__ import annotations

import datetime as dt
import random
import sqlite3
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import BaseModel, Field

from memex.host_tools import tool

SEGMENTS = ("self_serve", "smb", "enterprise")
# (P(verified | signup), P(activated | verified)) per segment, for seed 0 .. the rates move a
# little per seed so each seed has its own exact answer.
BASE_RATES = {"self_serve": (0.62, 0.35), "smb": (0.78, 0.55), "enterprise": (0.9, 0.72)}

TASK = ("Our warehouse has tables customers(customer_id, segment, country, signup_date) and "
        "events(customer_id, event, ts) with events 'signup', 'verified', 'activated'. "
        "For each customer segment, compute the signup-to-activation conversion rate "
        "(customers with an 'activated' event / customers with a 'signup' event, as a fraction "
        "between 0 and 1). Then say which segment has the largest drop-off (the lowest "
        "conversion). Use the sql tool.")


class FunnelAnswer(BaseModel):
    """The typed answer of the funnel task."""

    conversion: dict[str, float] = Field(
        description="segment name -> signup-to-activation conversion, a fraction in [0, 1]")
    worst_segment: str = Field(description="the segment with the lowest conversion")


def build_warehouse(path: str | Path, *, seed: int = 0, customers: int = 1200) -> Path:
    """Write the warehouse for ``seed`` to ``path`` (replacing it) and return the path."""
    path = Path(path)
    path.unlink(missing_ok=True)
    rng = random.Random(seed)
    rates = {s: (min(0.97, v + rng.uniform(-0.05, 0.05)), min(0.95, a + rng.uniform(-0.08, 0.08)))
             for s, (v, a) in BASE_RATES.items()}
    con = sqlite3.connect(path)
    try:
        con.executescript(
            "CREATE TABLE customers (customer_id INTEGER PRIMARY KEY, segment TEXT NOT NULL,"
            " country TEXT NOT NULL, signup_date TEXT NOT NULL);"
            "CREATE TABLE events (customer_id INTEGER NOT NULL, event TEXT NOT NULL,"
            " ts TEXT NOT NULL);")
        start = dt.datetime(2026, 1, 1)
        weights = [0.5, 0.35, 0.15]
        for cid in range(1, customers + 1):
            seg = rng.choices(SEGMENTS, weights)[0]
            country = rng.choice(["US", "DE", "FR", "IN", "BR", "JP"])
            t = start + dt.timedelta(minutes=rng.randrange(0, 60 * 24 * 180))
            con.execute("INSERT INTO customers VALUES (?, ?, ?, ?)",
                        (cid, seg, country, t.date().isoformat()))
            con.execute("INSERT INTO events VALUES (?, 'signup', ?)", (cid, t.isoformat()))
            p_ver, p_act = rates[seg]
            if rng.random() < p_ver:
                t += dt.timedelta(hours=rng.uniform(0.1, 72))
                con.execute("INSERT INTO events VALUES (?, 'verified', ?)", (cid, t.isoformat()))
                if rng.random() < p_act:
                    t += dt.timedelta(hours=rng.uniform(1, 24 * 14))
                    con.execute("INSERT INTO events VALUES (?, 'activated', ?)",
                                (cid, t.isoformat()))
        con.commit()
    finally:
        con.close()
    return path


def sql_tool(db: str | Path) -> Any:
    """A read-only ``sql(query) -> DataFrame`` tool over the warehouse at ``db``."""
    uri = f"file:{Path(db).resolve()}?mode=ro"

    @tool
    def sql(query: str) -> pd.DataFrame:
        """Run a read-only SQL query (SQLite dialect) on the warehouse.

        Args:
            query: one SELECT statement.

        Returns:
            The result rows as a DataFrame.
        """
        con = sqlite3.connect(uri, uri=True)
        try:
            return pd.read_sql_query(query, con)
        finally:
            con.close()

    return sql


def reference_answer(db: str | Path) -> FunnelAnswer:
    """The exact answer, computed on the host."""
    con = sqlite3.connect(db)
    try:
        rows = con.execute(
            "SELECT c.segment, COUNT(DISTINCT s.customer_id), COUNT(DISTINCT a.customer_id) "
            "FROM customers c JOIN events s ON s.customer_id = c.customer_id "
            "AND s.event = 'signup' LEFT JOIN events a ON a.customer_id = c.customer_id "
            "AND a.event = 'activated' GROUP BY c.segment").fetchall()
    finally:
        con.close()
    conv = {seg: act / sig for seg, sig, act in rows}
    return FunnelAnswer(conversion=conv, worst_segment=min(conv, key=lambda s: conv[s]))


def score(answer: FunnelAnswer | None, ref: FunnelAnswer, *, tol: float = 0.01) -> bool:
    """Correct when the worst segment matches and every segment's rate is within ``tol``
    (rates given as percentages are accepted too)."""
    if answer is None or answer.worst_segment != ref.worst_segment:
        return False
    for seg, want in ref.conversion.items():
        got = answer.conversion.get(seg)
        if got is None:
            return False
        if got > 1.0:
            got /= 100.0
        if abs(got - want) > tol:
            return False
    return True
