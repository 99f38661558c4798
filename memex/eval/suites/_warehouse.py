"""The ``warehouse`` suite: enterprise structured retrieval over a DuckDB warehouse of 32
tables (``_warehouse_data``), with generic schema-discovery tools and SQL returning
DataFrames. 42 questions from one-table lookups to multi-join funnels and cohorts; each
seed picks its own parameters (a segment, a month, a campaign...) and every reference
answer is recomputed from that seed's data with the question's reference SQL.
"""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd

from ...host_tools import Tool, tool
from .._suite import EvalTask, Workspace
from ._warehouse_data import (
    CATEGORIES,
    COST_CENTERS,
    DESCRIPTIONS,
    PRIORITIES,
    REGIONS,
    SEGMENTS,
    SOURCES,
    TEAMS,
    build_database,
)

__all__ = ["build", "warehouse_tools"]

MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]

INSTRUCTIONS = ("The warehouse is a DuckDB database: find the tables you need with the schema "
                "tools before you query.")


@dataclass(frozen=True, kw_only=True)
class _Q:
    """A question template: ``text`` and ``sql`` are formatted with the seed's parameters;
    ``shape`` says how the SQL result becomes the answer: ``scalar`` (first cell),
    ``dict`` (first column -> second), ``set`` (first column)."""

    id: str
    tags: tuple[str, ...]
    text: str
    sql: str
    field: str
    kind: str  # JSON Schema type of the field: integer | number | string | dict | list
    shape: str = "scalar"
    grader: str = "exact"
    tolerance: float = 1e-6


def _q(id: str, tag: str, text: str, sql: str, field: str, kind: str, **kw: Any) -> _Q:
    return _Q(id=id, tags=(tag,), text=text, sql=sql, field=field, kind=kind, **kw)


_NUM = {"grader": "numeric", "tolerance": 1e-4}
_FRAC = {"grader": "numeric", "tolerance": 1e-3}
_COMPLETED_2025 = "o.status = 'completed'"

QUESTIONS: tuple[_Q, ...] = (
    # ---- lookups: one table or one join to a lookup table
    _q("active_in_segment", "lookup",
       "How many active customers are in the {segment_name} segment?",
       "SELECT count(*) FROM customers c JOIN customer_segments s USING (segment_code) "
       "WHERE s.segment_name = '{segment_name}' AND c.is_active", "count", "integer"),
    _q("products_in_category", "lookup",
       "How many products are in the {category} category?",
       "SELECT count(*) FROM products p JOIN product_categories c USING (category_id) "
       "WHERE c.category = '{category}'", "count", "integer"),
    _q("region_name", "lookup", "What is the full name of the region with code {region}?",
       "SELECT name FROM regions WHERE code = '{region}'", "name", "string"),
    _q("campaign_budget", "lookup", "What is the planned budget in USD of the campaign "
       "'{campaign}'?", "SELECT budget FROM campaigns WHERE name = '{campaign}'", "budget",
       "number", **_NUM),
    _q("sla_hours", "lookup", "How many hours does the SLA allow to resolve a {priority} "
       "priority ticket?", "SELECT hours FROM sla_policies WHERE priority = '{priority}'",
       "hours", "integer"),
    _q("orders_in_month", "lookup", "How many orders (any status) were placed in {month_name} "
       "2025?", "SELECT count(*) FROM orders WHERE month(order_date) = {month}", "count",
       "integer"),
    _q("cancelled_orders", "lookup", "How many orders were cancelled?",
       "SELECT count(*) FROM orders WHERE status = 'cancelled'", "count", "integer"),
    _q("priciest_product", "lookup", "Which product has the highest list price? Give its "
       "name.", "SELECT name FROM products ORDER BY list_price DESC LIMIT 1", "product",
       "string"),
    _q("agents_in_team", "lookup", "How many support agents are in the {team} team?",
       "SELECT count(*) FROM support_agents WHERE team = '{team}'", "count", "integer"),
    _q("leads_from_source", "lookup", "How many leads came from {source_name}?",
       "SELECT count(*) FROM leads l JOIN utm_sources u ON u.code = l.source "
       "WHERE u.description = '{source_name}'", "count", "integer"),
    _q("biggest_budget_2025", "lookup", "Which cost center has the largest budget for 2025? "
       "Give its name.", "SELECT c.name FROM budgets b JOIN cost_centers c USING "
       "(cost_center_id) WHERE b.year = 2025 ORDER BY b.amount DESC LIMIT 1", "name",
       "string"),
    _q("tickets_of_priority", "lookup", "How many support tickets have {priority} priority?",
       "SELECT count(*) FROM tickets WHERE priority = '{priority}'", "count", "integer"),
    # ---- aggregates over one or two tables
    _q("completed_amount", "aggregate", "What is the total gross amount in USD of completed "
       "orders?", "SELECT sum(amount) FROM orders WHERE status = 'completed'", "total",
       "number", **_NUM),
    _q("avg_order_channel", "aggregate", "What is the average gross amount of a completed order "
       "in the {channel} channel?", "SELECT avg(amount) FROM orders WHERE status = "
       "'completed' AND channel = '{channel}'", "average", "number", **_NUM),
    _q("refunds_total", "aggregate", "What is the total refund amount of all returns?",
       "SELECT sum(refund_amount) FROM returns", "total", "number", **_NUM),
    _q("orders_per_channel", "aggregate", "How many orders (any status) came through each "
       "channel?", "SELECT channel, count(*) FROM orders GROUP BY 1", "counts", "dict",
       shape="dict"),
    _q("campaign_spend", "aggregate", "How much was actually spent on the campaign "
       "'{campaign}' (USD)?", "SELECT sum(d.spend) FROM campaign_spend_daily d JOIN "
       "campaigns c USING (campaign_id) WHERE c.name = '{campaign}'", "spend", "number", **_NUM),
    _q("csat_average", "aggregate", "What is the average satisfaction (CSAT) score?",
       "SELECT avg(score) FROM csat_responses", "average", "number", **_FRAC),
    _q("cost_center_expenses", "aggregate", "What were the total expenses of the {cost_center} "
       "cost center?", "SELECT sum(e.amount) FROM expenses e JOIN cost_centers c USING "
       "(cost_center_id) WHERE c.name = '{cost_center}'", "total", "number", **_NUM),
    _q("busiest_agent", "aggregate", "Which support agent handled the most tickets? Give the "
       "agent's name.", "SELECT a.name FROM tickets t JOIN support_agents a USING (agent_id) "
       "GROUP BY a.agent_id, a.name ORDER BY count(*) DESC, a.agent_id LIMIT 1", "name",
       "string"),
    _q("units_in_category", "aggregate", "How many units of {category} products were sold in "
       "completed orders?", "SELECT sum(i.quantity) FROM order_items i JOIN orders o USING "
       "(order_id) JOIN products p USING (product_id) JOIN product_categories c USING "
       "(category_id) WHERE o.status = 'completed' AND c.category = '{category}'", "units",
       "integer"),
    _q("anonymous_sessions", "aggregate", "How many web sessions were anonymous (no known "
       "customer)?", "SELECT count(*) FROM web_sessions WHERE customer_id IS NULL", "count",
       "integer"),
    _q("campaign_clicks", "aggregate", "How many email clicks did the campaign '{campaign}' "
       "get?", "SELECT coalesce(sum(e.n), 0) FROM email_events e JOIN email_sends s USING "
       "(send_id) JOIN campaigns c USING (campaign_id) WHERE c.name = '{campaign}' AND "
       "e.event = 'click'", "clicks", "integer"),
    _q("payments_in_month", "aggregate", "What was the total amount of payments received in "
       "{month_name} 2025?", "SELECT coalesce(sum(amount), 0) FROM payments WHERE "
       "year(paid_at) = 2025 AND month(paid_at) = {month}", "total", "number", **_NUM),
    # ---- grounding: the look-alike table, the revised figure, the right column
    _q("revenue_final", "grounding", "What was the revenue of region {region} in {month_name} "
       "2025? Use the final figure (the revised one where a revision was published).",
       "SELECT value FROM revenue_monthly WHERE region = '{region}' AND month(month) = "
       "{month} ORDER BY status = 'revised' DESC LIMIT 1", "revenue", "number", **_NUM),
    _q("revenue_revision", "grounding", "Across all regions and months, how many monthly "
       "revenue figures were revised after their preliminary publication?",
       "SELECT count(*) FROM revenue_monthly WHERE status = 'revised'", "count", "integer"),
    _q("legacy_orders_2023", "grounding", "How many orders were placed in 2023?",
       "SELECT count(*) FROM orders_legacy WHERE year(order_dt) = 2023", "count", "integer"),
    _q("current_in_region", "grounding", "How many current customers (archived ones excluded) "
       "are in the region {region_name}?", "SELECT count(*) FROM customers c JOIN regions r "
       "ON r.code = c.region WHERE r.name = '{region_name}'", "count", "integer"),
    _q("net_completed_month", "grounding", "What was the net amount (after discounts) of "
       "completed orders placed in {month_name} 2025?", "SELECT sum(i.net_amount) FROM "
       "order_items i JOIN orders o USING (order_id) WHERE o.status = 'completed' AND "
       "month(o.order_date) = {month}", "net", "number", **_NUM),
    _q("distinct_buyers", "grounding", "How many distinct customers placed at least one "
       "completed order?", "SELECT count(DISTINCT customer_id) FROM orders WHERE status = "
       "'completed'", "count", "integer"),
    _q("lead_conversion", "grounding", "What fraction of the leads of campaign '{campaign}' "
       "became customers? Answer as a fraction between 0 and 1.",
       "SELECT avg(CASE WHEN converted_customer_id IS NULL THEN 0 ELSE 1 END) FROM leads l "
       "JOIN campaigns c USING (campaign_id) WHERE c.name = '{campaign}'", "fraction",
       "number", **_FRAC),
    _q("late_payments", "grounding", "How many invoices were paid after their due date?",
       "SELECT count(*) FROM invoices i JOIN payments p USING (invoice_id) WHERE "
       "p.paid_at > i.due", "count", "integer"),
    # ---- multi-join funnels and cohorts
    _q("buyers_per_segment", "funnel", "For each customer segment (by segment name), how many "
       "customers placed at least one completed order?", "SELECT s.segment_name, "
       "count(DISTINCT o.customer_id) FROM orders o JOIN customers c USING (customer_id) JOIN "
       "customer_segments s USING (segment_code) WHERE o.status = 'completed' GROUP BY 1",
       "buyers", "dict", shape="dict"),
    _q("top_region_sales", "funnel", "Which region (full name) has the highest total gross "
       "amount of completed orders?", "SELECT r.name FROM orders o JOIN customers c USING "
       "(customer_id) JOIN regions r ON r.code = c.region WHERE o.status = 'completed' "
       "GROUP BY r.name ORDER BY sum(o.amount) DESC LIMIT 1", "region", "string"),
    _q("repeat_buyers", "funnel", "Of the customers with at least one completed order, what "
       "fraction have two or more? Answer as a fraction between 0 and 1.",
       "SELECT avg(CASE WHEN n >= 2 THEN 1 ELSE 0 END) FROM (SELECT customer_id, count(*) n "
       "FROM orders WHERE status = 'completed' GROUP BY 1)", "fraction", "number", **_FRAC),
    _q("q1_cohort_30d", "cohort", "Of the customers who signed up in the first quarter of "
       "2025, how many placed a completed order within 30 days after signing up?",
       "SELECT count(DISTINCT c.customer_id) FROM customers c JOIN orders o USING "
       "(customer_id) WHERE c.signup_date BETWEEN DATE '2025-01-01' AND DATE '2025-03-31' AND "
       "o.status = 'completed' AND o.order_date BETWEEN c.signup_date AND c.signup_date + "
       "INTERVAL 30 DAY", "count", "integer"),
    _q("resolution_hours", "cohort", "What is the average resolution time in hours of closed "
       "{priority} priority tickets?", "SELECT avg(epoch(closed_at - opened_at)) / 3600 FROM "
       "tickets WHERE priority = '{priority}' AND closed_at IS NOT NULL", "hours", "number",
       **_FRAC),
    _q("sla_breaches", "cohort", "How many closed tickets took longer to resolve than the SLA "
       "of their priority allows?", "SELECT count(*) FROM tickets t JOIN sla_policies s USING "
       "(priority) WHERE t.closed_at IS NOT NULL AND epoch(t.closed_at - t.opened_at) > "
       "s.hours * 3600", "count", "integer"),
    _q("segments_above_avg", "funnel", "Which customer segments (by name) have an average "
       "completed-order gross amount above the average over all completed orders?",
       "SELECT s.segment_name FROM orders o JOIN customers c USING (customer_id) JOIN "
       "customer_segments s USING (segment_code) WHERE o.status = 'completed' GROUP BY 1 "
       "HAVING avg(o.amount) > (SELECT avg(amount) FROM orders WHERE status = 'completed')",
       "segments", "list", shape="set", grader="set"),
    _q("best_campaign_per_dollar", "funnel", "Which campaign won the most converted leads per "
       "dollar actually spent? Give its name.", "SELECT c.name FROM campaigns c JOIN (SELECT "
       "campaign_id, count(converted_customer_id) won FROM leads GROUP BY 1) l USING "
       "(campaign_id) JOIN (SELECT campaign_id, sum(spend) spent FROM campaign_spend_daily "
       "GROUP BY 1) d USING (campaign_id) ORDER BY won / spent DESC LIMIT 1", "campaign",
       "string"),
    _q("target_attainment", "funnel", "What fraction of its 2025-Q2 sales target did region "
       "{region} reach with the gross amount of completed orders placed in that quarter "
       "(by the customer's region)? Answer as a fraction (1.0 = target met).",
       "SELECT (SELECT sum(o.amount) FROM orders o JOIN customers c USING (customer_id) WHERE "
       "c.region = '{region}' AND o.status = 'completed' AND quarter(o.order_date) = 2) / "
       "(SELECT target FROM sales_targets WHERE region = '{region}' AND quarter = '2025-Q2')",
       "fraction", "number", **_FRAC),
    _q("top3_products_net", "funnel", "Which 3 products have the highest total net amount in "
       "completed orders? Give their names.", "SELECT p.name FROM order_items i JOIN orders o "
       "USING (order_id) JOIN products p USING (product_id) WHERE o.status = 'completed' "
       "GROUP BY p.product_id, p.name ORDER BY sum(i.net_amount) DESC LIMIT 3", "products",
       "list", shape="set", grader="set"),
)


def _params(seed: int, con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    """This seed's choices for the templates' blanks."""
    rng = random.Random(f"warehouse-params-{seed}")
    month = rng.randint(1, 12)
    camps = [r[0] for r in con.execute("SELECT name FROM campaigns ORDER BY campaign_id")
             .fetchall()]
    region = rng.choice(REGIONS)
    return {
        "segment_name": rng.choice(SEGMENTS)[1], "category": rng.choice(CATEGORIES),
        "region": region[0], "region_name": rng.choice(REGIONS)[1], "month": month,
        "month_name": MONTHS[month - 1], "campaign": rng.choice(camps),
        "priority": rng.choice(PRIORITIES)[0], "team": rng.choice(TEAMS),
        "source_name": rng.choice(SOURCES)[1], "channel": rng.choice(["web", "sales", "partner"]),
        "cost_center": rng.choice(COST_CENTERS),
    }


_JSON = {"integer": {"type": "integer"}, "number": {"type": "number"},
         "string": {"type": "string"},
         "dict": {"type": "object", "additionalProperties": {"type": "integer"}},
         "list": {"type": "array", "items": {"type": "string"}}}


def _plain(v: object) -> Any:
    if isinstance(v, dt.date | dt.datetime):
        return v.isoformat()
    if hasattr(v, "item"):  # numpy scalars
        return v.item()
    return v


def _reference(con: duckdb.DuckDBPyConnection, q: _Q, params: dict[str, Any]) -> Any:
    rows = con.execute(q.sql.format(**params)).fetchall()
    if q.shape == "dict":
        return {str(k): _plain(v) for k, v in rows}
    if q.shape == "set":
        return sorted(str(r[0]) for r in rows)
    value = _plain(rows[0][0]) if rows else None
    if q.kind == "number" and value is not None:
        value = float(value)
    if q.kind == "integer" and value is not None:
        value = int(value)
    return value


def warehouse_tools(db: Path) -> list[Tool]:
    """Read-only tools over the DuckDB file ``db``: list_tables, describe_table,
    search_columns and sql."""
    def connect() -> duckdb.DuckDBPyConnection:
        return duckdb.connect(str(db), read_only=True)

    counts: dict[str, int] = {}
    with connect() as con:
        for name in DESCRIPTIONS:
            row = con.execute(f'SELECT count(*) FROM "{name}"').fetchone()
            counts[name] = int(row[0]) if row else 0

    @tool
    def list_tables() -> pd.DataFrame:
        """List the warehouse's tables.

        Returns:
            One row per table: table, domain, rows, description.
        """
        return pd.DataFrame([(n, d, counts[n], text) for n, (d, text, _c) in
                             DESCRIPTIONS.items()],
                            columns=["table", "domain", "rows", "description"])

    @tool
    def describe_table(table: str) -> pd.DataFrame:
        """Describe one table's columns.

        Args:
            table: a table name from list_tables().

        Returns:
            One row per column: column, type, description.
        """
        if table not in DESCRIPTIONS:
            raise ValueError(f"no table {table!r}; list_tables() lists them")
        with connect() as con:
            types = dict(con.execute(f'DESCRIBE "{table}"').fetchall()[i][:2]
                         for i in range(len(DESCRIPTIONS[table][2])))
        return pd.DataFrame([(c, types.get(c, "?"), d) for c, d in
                             DESCRIPTIONS[table][2].items()],
                            columns=["column", "type", "description"])

    @tool
    def search_columns(text: str) -> pd.DataFrame:
        """Find columns whose name or description contains a text (case-insensitive).

        Args:
            text: what to look for, e.g. "revenue".

        Returns:
            One row per match: table, column, description.
        """
        t = text.casefold()
        return pd.DataFrame([(n, c, d) for n, (_dom, _txt, cols) in DESCRIPTIONS.items()
                             for c, d in cols.items() if t in c.casefold() or t in d.casefold()],
                            columns=["table", "column", "description"])

    @tool
    def sql(query: str) -> pd.DataFrame:
        """Run one read-only SQL query (DuckDB dialect) on the warehouse.

        Args:
            query: a SELECT statement.

        Returns:
            The result rows as a DataFrame.
        """
        with connect() as con:
            try:
                return con.execute(query).df()
            except duckdb.Error as exc:
                raise ValueError(f"{type(exc).__name__}: {exc}") from None

    return [list_tables, describe_table, search_columns, sql]


def build(seed: int, workdir: Path) -> Workspace:
    """Seed ``seed``'s warehouse in ``workdir``, its tools and its 42 tasks."""
    db = build_database(workdir / "warehouse.duckdb", seed)
    with duckdb.connect(str(db), read_only=True) as con:
        params = _params(seed, con)
        tasks = tuple(
            EvalTask(id=q.id, question=q.text.format(**params),
                     answer={"type": "object", "properties": {q.field: _JSON[q.kind]},
                             "required": [q.field], "additionalProperties": False},
                     reference={q.field: _reference(con, q, params)}, grader=q.grader,
                     tolerance=q.tolerance, tags=q.tags)
            for q in QUESTIONS)
    return Workspace(tasks=tasks, tools=tuple(warehouse_tools(db)), preload=("pandas",),
                     instructions=INSTRUCTIONS)


