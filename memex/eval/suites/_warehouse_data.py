"""The warehouse suite's data: a DuckDB file of 31 tables over four business domains
(sales, marketing, finance, support), generated deterministically from a seed.

What makes it a retrieval test rather than a lookup: look-alike and legacy tables
(``orders_legacy``, ``customers_archive``, ``orders_staging``), figures published twice
(``revenue_monthly`` holds a preliminary and, for some months, a revised row), columns whose
names say less than they mean (``amount`` is gross, ``net_amount`` is after discount;
``value``; ``region`` codes vs names), and codes that need a lookup table to become names.
"""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd

__all__ = ["DESCRIPTIONS", "build_database"]

D0 = dt.date(2025, 1, 1)

# table -> (domain, description, {column: description}) -- what the schema tools show
DESCRIPTIONS: dict[str, tuple[str, str, dict[str, str]]] = {
    "customers": ("sales", "current customers", {
        "customer_id": "key", "name": "company name", "segment_code": "-> customer_segments",
        "region": "region code -> regions", "signup_date": "date of signup",
        "is_active": "false once the customer churned"}),
    "customers_archive": ("sales", "customers deleted before 2025 (not current)", {
        "customer_id": "key (not in customers)", "name": "company name",
        "segment_code": "-> customer_segments", "region": "region code",
        "deleted_at": "date of deletion"}),
    "customer_segments": ("sales", "segment codes and names", {
        "segment_code": "key", "segment_name": "display name"}),
    "regions": ("sales", "sales regions", {"code": "key", "name": "full name",
                                           "currency": "local currency"}),
    "product_categories": ("sales", "product categories", {
        "category_id": "key", "category": "name"}),
    "products": ("sales", "the product catalogue", {
        "product_id": "key", "name": "product name", "category_id": "-> product_categories",
        "list_price": "USD", "launched": "launch date"}),
    "orders": ("sales", "orders since 2025-01-01 (earlier ones: orders_legacy)", {
        "order_id": "key", "customer_id": "-> customers", "order_date": "date",
        "status": "completed | cancelled | refunded", "channel": "web | sales | partner",
        "amount": "gross amount in USD, before discounts"}),
    "orders_staging": ("sales", "today's orders being loaded (incomplete, duplicates orders)", {
        "order_id": "key", "customer_id": "-> customers", "order_date": "date",
        "amount": "gross amount in USD", "loaded": "false until the nightly load"}),
    "order_items": ("sales", "order lines", {
        "order_id": "-> orders", "product_id": "-> products", "quantity": "units",
        "unit_price": "USD", "discount": "fraction off", "net_amount":
        "quantity * unit_price * (1 - discount), USD"}),
    "orders_legacy": ("sales", "orders of the old system, 2022-2024 (not in orders)", {
        "legacy_id": "key", "cust_ref": "customer id", "order_dt": "date",
        "total": "gross amount in USD", "src": "source system"}),
    "returns": ("sales", "returned orders", {
        "return_id": "key", "order_id": "-> orders", "return_date": "date",
        "refund_amount": "USD", "reason": "free text"}),
    "sales_targets": ("sales", "quarterly targets per region", {
        "region": "region code", "quarter": "e.g. 2025-Q2", "target": "USD"}),
    "campaigns": ("marketing", "marketing campaigns", {
        "campaign_id": "key", "name": "campaign name", "channel": "email | search | social",
        "start_date": "date", "end_date": "date", "budget": "planned USD"}),
    "campaign_spend_daily": ("marketing", "actual spend per campaign per day", {
        "campaign_id": "-> campaigns", "day": "date", "spend": "USD"}),
    "leads": ("marketing", "leads from campaigns", {
        "lead_id": "key", "campaign_id": "-> campaigns", "created_at": "date",
        "source": "utm source code", "converted_customer_id": "-> customers, null if not"}),
    "lead_status_history": ("marketing", "status changes of leads", {
        "lead_id": "-> leads", "status": "new | qualified | won | lost", "changed_at": "date"}),
    "web_sessions": ("marketing", "website visits", {
        "session_id": "key", "customer_id": "-> customers, null when anonymous",
        "started_at": "timestamp", "pages": "pages viewed", "utm_source": "utm source code"}),
    "utm_sources": ("marketing", "utm source codes", {"code": "key", "description": "text"}),
    "email_sends": ("marketing", "email sends of campaigns", {
        "send_id": "key", "campaign_id": "-> campaigns", "sent_at": "date",
        "recipients": "count"}),
    "email_events": ("marketing", "email engagement per send", {
        "send_id": "-> email_sends", "event": "open | click | unsubscribe", "n": "count"}),
    "invoices": ("finance", "invoices of completed orders", {
        "invoice_id": "key", "order_id": "-> orders", "issued": "date", "due": "date",
        "amount": "USD"}),
    "payments": ("finance", "payments of invoices", {
        "payment_id": "key", "invoice_id": "-> invoices", "paid_at": "date",
        "amount": "USD"}),
    "revenue_monthly": ("finance", "published monthly revenue per region", {
        "month": "first day of the month", "region": "region code", "value": "USD",
        "status": "preliminary | revised (a revised row replaces the preliminary one)",
        "published_at": "date"}),
    "fx_rates": ("finance", "monthly exchange rates", {
        "month": "first day of the month", "currency": "code", "usd_per_unit": "rate"}),
    "cost_centers": ("finance", "cost centers", {"cost_center_id": "key", "name": "name",
                                                 "owner": "person"}),
    "expenses": ("finance", "expenses", {
        "expense_id": "key", "cost_center_id": "-> cost_centers", "month": "first day",
        "amount": "USD", "category": "travel | software | hardware | services"}),
    "budgets": ("finance", "yearly budgets per cost center", {
        "cost_center_id": "-> cost_centers", "year": "year", "amount": "USD"}),
    "tickets": ("support", "support tickets", {
        "ticket_id": "key", "customer_id": "-> customers", "opened_at": "timestamp",
        "closed_at": "timestamp, null while open", "priority": "low | normal | high | urgent",
        "category": "billing | bug | howto | outage", "agent_id": "-> support_agents"}),
    "ticket_comments": ("support", "comments on tickets", {
        "ticket_id": "-> tickets", "author": "agent | customer", "created_at": "timestamp"}),
    "support_agents": ("support", "support agents", {
        "agent_id": "key", "name": "name", "team": "team name"}),
    "sla_policies": ("support", "resolution targets", {
        "priority": "key", "hours": "hours to resolve"}),
    "csat_responses": ("support", "satisfaction survey answers", {
        "ticket_id": "-> tickets", "score": "1 (bad) .. 5 (good)"}),
}

SEGMENTS = [("ENT", "Enterprise"), ("MM", "Mid-Market"), ("SMB", "Small Business"),
            ("SS", "Self-Serve")]
REGIONS = [("NA", "North America", "USD"), ("EMEA", "Europe, Middle East and Africa", "EUR"),
           ("APAC", "Asia Pacific", "JPY"), ("LATAM", "Latin America", "BRL"),
           ("ANZ", "Australia and New Zealand", "AUD")]
CATEGORIES = ["Analytics", "Storage", "Security", "Networking", "Support Plans", "Training"]
CHANNELS = ["web", "sales", "partner"]
SOURCES = [("ggl", "Google search"), ("lnk", "LinkedIn"), ("nws", "Newsletter"),
           ("ref", "Referral"), ("evt", "Events")]
TEAMS = ["Tier 1", "Tier 2", "Billing"]
PRIORITIES = [("low", 120), ("normal", 72), ("high", 24), ("urgent", 8)]
COST_CENTERS = ["Engineering", "Sales", "Marketing", "Support", "Finance", "People",
                "Facilities", "Legal"]
_WORDS = ["Acme", "Globex", "Initech", "Umbrella", "Stark", "Wayne", "Tyrell", "Cyberdyne",
          "Hooli", "Vandelay", "Soylent", "Wonka", "Aperture", "Massive", "Oscorp", "Nakatomi"]


def _day(rng: random.Random, start: dt.date, days: int) -> dt.date:
    return start + dt.timedelta(days=rng.randrange(days))


def _tables(seed: int) -> dict[str, pd.DataFrame]:
    """Every table of seed ``seed`` as a DataFrame."""
    rng = random.Random(seed)
    t: dict[str, Any] = {}
    t["customer_segments"] = pd.DataFrame(SEGMENTS, columns=["segment_code", "segment_name"])
    t["regions"] = pd.DataFrame(REGIONS, columns=["code", "name", "currency"])
    seg_w = [rng.uniform(0.5, 1.5) * w for w in (0.15, 0.25, 0.35, 0.25)]
    reg_w = [rng.uniform(0.5, 1.5) * w for w in (0.35, 0.3, 0.15, 0.1, 0.1)]
    cust = []
    for cid in range(1, 1501):
        seg = rng.choices(SEGMENTS, seg_w)[0][0]
        cust.append((cid, f"{rng.choice(_WORDS)} {rng.choice(_WORDS)} {cid}", seg,
                     rng.choices(REGIONS, reg_w)[0][0], _day(rng, dt.date(2024, 1, 1), 540),
                     rng.random() > 0.12))
    t["customers"] = pd.DataFrame(cust, columns=["customer_id", "name", "segment_code",
                                                 "region", "signup_date", "is_active"])
    t["customers_archive"] = pd.DataFrame(
        [(100000 + i, f"{rng.choice(_WORDS)} Old {i}", rng.choice(SEGMENTS)[0],
          rng.choice(REGIONS)[0], _day(rng, dt.date(2023, 1, 1), 700)) for i in range(300)],
        columns=["customer_id", "name", "segment_code", "region", "deleted_at"])
    t["product_categories"] = pd.DataFrame(list(enumerate(CATEGORIES, 1)),
                                           columns=["category_id", "category"])
    prods = [(pid, f"{rng.choice(CATEGORIES).split()[0]} {rng.choice(_WORDS)} {pid}",
              rng.randint(1, len(CATEGORIES)), round(rng.uniform(20, 2000), 2),
              _day(rng, dt.date(2020, 1, 1), 1800)) for pid in range(1, 41)]
    t["products"] = pd.DataFrame(prods, columns=["product_id", "name", "category_id",
                                                 "list_price", "launched"])
    seg_of = {c[0]: c[2] for c in cust}
    spend_mult = {"ENT": 3.0, "MM": 1.8, "SMB": 1.0, "SS": 0.6}
    orders, items = [], []
    for oid in range(1, 6001):
        cid = rng.randint(1, 1500)
        status = rng.choices(["completed", "cancelled", "refunded"], [0.85, 0.1, 0.05])[0]
        gross = 0.0
        for _ in range(rng.randint(1, 4)):
            p = rng.choice(prods)
            q = rng.randint(1, 5)
            disc = rng.choice([0.0, 0.0, 0.05, 0.1, 0.2])
            price = round(p[3] * spend_mult[seg_of[cid]] ** 0.3, 2)
            gross += q * price
            items.append((oid, p[0], q, price, disc, round(q * price * (1 - disc), 2)))
        orders.append((oid, cid, _day(rng, D0, 365), status, rng.choices(CHANNELS, [5, 3, 2])[0],
                       round(gross, 2)))
    t["orders"] = pd.DataFrame(orders, columns=["order_id", "customer_id", "order_date",
                                                "status", "channel", "amount"])
    t["order_items"] = pd.DataFrame(items, columns=["order_id", "product_id", "quantity",
                                                    "unit_price", "discount", "net_amount"])
    t["orders_staging"] = pd.DataFrame(
        [(o[0], o[1], o[2], o[5], False) for o in rng.sample(orders, 200)],
        columns=["order_id", "customer_id", "order_date", "amount", "loaded"])
    t["orders_legacy"] = pd.DataFrame(
        [(f"L{i:05d}", rng.randint(1, 1500), _day(rng, dt.date(2022, 1, 1), 1095),
          round(rng.uniform(50, 5000), 2), rng.choice(["erp1", "erp2"])) for i in range(2000)],
        columns=["legacy_id", "cust_ref", "order_dt", "total", "src"])
    done = [o for o in orders if o[3] == "completed"]
    rets = [(i + 1, o[0], o[2] + dt.timedelta(days=rng.randint(1, 40)),
             round(o[5] * rng.uniform(0.2, 1.0), 2), rng.choice(["damaged", "not needed",
                                                                  "wrong item", "late"]))
            for i, o in enumerate(rng.sample(done, 320))]
    t["returns"] = pd.DataFrame(rets, columns=["return_id", "order_id", "return_date",
                                               "refund_amount", "reason"])
    region_of = {c[0]: c[3] for c in cust}
    actual: dict[tuple[str, int], float] = {}
    for o in done:
        k = (region_of[o[1]], (o[2].month - 1) // 3 + 1)
        actual[k] = actual.get(k, 0.0) + o[5]
    t["sales_targets"] = pd.DataFrame(  # targets near what was sold: some met, some missed
        [(r[0], f"2025-Q{q}", round(actual.get((r[0], q), 1e5) * rng.uniform(0.8, 1.25), -3))
         for r in REGIONS for q in range(1, 5)], columns=["region", "quarter", "target"])
    _marketing(rng, t)
    _finance(rng, t, orders)
    _support(rng, t)
    return t


def _marketing(rng: random.Random, t: dict[str, Any]) -> None:
    camps = []
    for cid in range(1, 21):
        start = _day(rng, D0, 300)
        camps.append((cid, f"{rng.choice(['Spring', 'Summer', 'Autumn', 'Winter', 'Launch', 'Q4'])}"
                      f" {rng.choice(['Push', 'Promo', 'Blitz', 'Drive', 'Wave'])} {cid}",
                      rng.choice(["email", "search", "social"]), start,
                      start + dt.timedelta(days=rng.randint(14, 60)),
                      round(rng.uniform(5e3, 8e4), -2)))
    t["campaigns"] = pd.DataFrame(camps, columns=["campaign_id", "name", "channel",
                                                  "start_date", "end_date", "budget"])
    spend = [(c[0], c[3] + dt.timedelta(days=d), round(c[5] / (c[4] - c[3]).days
                                                        * rng.uniform(0.6, 1.4), 2))
             for c in camps for d in range((c[4] - c[3]).days)]
    t["campaign_spend_daily"] = pd.DataFrame(spend, columns=["campaign_id", "day", "spend"])
    t["utm_sources"] = pd.DataFrame(SOURCES, columns=["code", "description"])
    leads, hist = [], []
    for lid in range(1, 3001):
        c = rng.choice(camps)
        conv = rng.randint(1, 1500) if rng.random() < rng.uniform(0.05, 0.3) else None
        created = c[3] + dt.timedelta(days=rng.randrange((c[4] - c[3]).days))
        leads.append((lid, c[0], created, rng.choice(SOURCES)[0], conv))
        hist.append((lid, "new", created))
        if rng.random() < 0.5 or conv:
            hist.append((lid, "qualified", created + dt.timedelta(days=rng.randint(1, 9))))
            hist.append((lid, "won" if conv else "lost",
                         created + dt.timedelta(days=rng.randint(10, 30))))
    t["leads"] = pd.DataFrame(leads, columns=["lead_id", "campaign_id", "created_at", "source",
                                              "converted_customer_id"])
    t["leads"]["converted_customer_id"] = t["leads"]["converted_customer_id"].astype("Int64")
    t["lead_status_history"] = pd.DataFrame(hist, columns=["lead_id", "status", "changed_at"])
    sess = [(i, rng.randint(1, 1500) if rng.random() < 0.6 else None,
             dt.datetime(2025, 1, 1) + dt.timedelta(minutes=rng.randrange(525600)),
             rng.randint(1, 30), rng.choice(SOURCES)[0]) for i in range(1, 8001)]
    t["web_sessions"] = pd.DataFrame(sess, columns=["session_id", "customer_id", "started_at",
                                                    "pages", "utm_source"])
    t["web_sessions"]["customer_id"] = t["web_sessions"]["customer_id"].astype("Int64")
    sends, events = [], []
    sid = 0
    for c in camps:
        for _ in range(rng.randint(1, 4) if c[2] == "email" else rng.randint(0, 1)):
            sid += 1
            n = rng.randint(500, 20000)
            sends.append((sid, c[0], c[3] + dt.timedelta(days=rng.randint(0, 10)), n))
            opens = int(n * rng.uniform(0.1, 0.4))
            events += [(sid, "open", opens), (sid, "click", int(opens * rng.uniform(0.05, 0.3))),
                       (sid, "unsubscribe", int(n * rng.uniform(0.001, 0.01)))]
    t["email_sends"] = pd.DataFrame(sends, columns=["send_id", "campaign_id", "sent_at",
                                                    "recipients"])
    t["email_events"] = pd.DataFrame(events, columns=["send_id", "event", "n"])


def _finance(rng: random.Random, t: dict[str, Any], orders: list[tuple[Any, ...]]) -> None:
    inv: list[tuple[Any, ...]] = []
    pay: list[tuple[Any, ...]] = []
    for o in orders:
        if o[3] != "completed":
            continue
        iid = len(inv) + 1
        due = o[2] + dt.timedelta(days=30)
        inv.append((iid, o[0], o[2], due, o[5]))
        if rng.random() < 0.93:
            pay.append((len(pay) + 1, iid, o[2] + dt.timedelta(days=rng.randint(1, 50)), o[5]))
    t["invoices"] = pd.DataFrame(inv, columns=["invoice_id", "order_id", "issued", "due",
                                               "amount"])
    t["payments"] = pd.DataFrame(pay, columns=["payment_id", "invoice_id", "paid_at",
                                               "amount"])
    rev = []
    for m in range(1, 13):
        month = dt.date(2025, m, 1)
        for r in REGIONS:
            v = round(rng.uniform(1e5, 9e5), 2)
            rev.append((month, r[0], v, "preliminary", month + dt.timedelta(days=35)))
            if rng.random() < 0.4:
                rev.append((month, r[0], round(v * rng.uniform(0.9, 1.1), 2), "revised",
                            month + dt.timedelta(days=65)))
    t["revenue_monthly"] = pd.DataFrame(rev, columns=["month", "region", "value", "status",
                                                      "published_at"])
    base = {"USD": 1.0, "EUR": 1.08, "JPY": 0.0067, "BRL": 0.19, "AUD": 0.66}
    t["fx_rates"] = pd.DataFrame(
        [(dt.date(2025, m, 1), c, round(v * rng.uniform(0.95, 1.05), 5))
         for m in range(1, 13) for c, v in base.items()],
        columns=["month", "currency", "usd_per_unit"])
    t["cost_centers"] = pd.DataFrame(
        [(i, n, f"{rng.choice(_WORDS)} lead") for i, n in enumerate(COST_CENTERS, 1)],
        columns=["cost_center_id", "name", "owner"])
    t["expenses"] = pd.DataFrame(
        [(i, rng.randint(1, len(COST_CENTERS)), dt.date(2025, rng.randint(1, 12), 1),
          round(rng.uniform(100, 25000), 2),
          rng.choice(["travel", "software", "hardware", "services"])) for i in range(1, 1501)],
        columns=["expense_id", "cost_center_id", "month", "amount", "category"])
    t["budgets"] = pd.DataFrame(
        [(i, y, round(rng.uniform(2e5, 2e6), -3)) for i in range(1, len(COST_CENTERS) + 1)
         for y in (2024, 2025)], columns=["cost_center_id", "year", "amount"])


def _support(rng: random.Random, t: dict[str, Any]) -> None:
    agents = [(i, f"{rng.choice(['Ana', 'Ben', 'Chen', 'Dara', 'Eli', 'Fay', 'Gus', 'Hana'])}"
               f" {rng.choice(_WORDS)}", rng.choice(TEAMS)) for i in range(1, 19)]
    t["support_agents"] = pd.DataFrame(agents, columns=["agent_id", "name", "team"])
    t["sla_policies"] = pd.DataFrame(PRIORITIES, columns=["priority", "hours"])
    load = [rng.uniform(0.3, 2.0) for _ in agents]
    tickets, comments, csat = [], [], []
    for tid in range(1, 2501):
        opened = dt.datetime(2025, 1, 1) + dt.timedelta(minutes=rng.randrange(525600))
        pr = rng.choices(PRIORITIES, [4, 6, 2, 1])[0]
        closed = (opened + dt.timedelta(hours=rng.uniform(0.5, 2.5) * pr[1])
                  if rng.random() < 0.9 else None)
        tickets.append((tid, rng.randint(1, 1500), opened, closed, pr[0],
                        rng.choice(["billing", "bug", "howto", "outage"]),
                        rng.choices(agents, load)[0][0]))
        for k in range(rng.randint(1, 5)):
            comments.append((tid, "agent" if k % 2 else "customer",
                             opened + dt.timedelta(hours=k * rng.uniform(0.5, 10))))
        if closed is not None and rng.random() < 0.4:
            csat.append((tid, rng.choices([1, 2, 3, 4, 5], [1, 1, 2, 4, 4])[0]))
    t["tickets"] = pd.DataFrame(tickets, columns=["ticket_id", "customer_id", "opened_at",
                                                  "closed_at", "priority", "category",
                                                  "agent_id"])
    t["ticket_comments"] = pd.DataFrame(comments, columns=["ticket_id", "author", "created_at"])
    t["csat_responses"] = pd.DataFrame(csat, columns=["ticket_id", "score"])


def build_database(path: Path, seed: int) -> Path:
    """Write seed ``seed``'s warehouse to the DuckDB file ``path`` (replacing it)."""
    path.unlink(missing_ok=True)
    con = duckdb.connect(str(path))
    try:
        for name, df in _tables(seed).items():
            con.register("df_view", df)
            con.execute(f'CREATE TABLE "{name}" AS SELECT * FROM df_view')
            con.unregister("df_view")
    finally:
        con.close()
    return path
