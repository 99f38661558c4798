"""The bundled suites: generated deterministically per seed and differently across seeds,
the sizes the suite promises, tools that work on the generated data (and refuse misuse),
and a scripted rollout through the real tools graded correct."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from memex.eval import SUITES, grade, run_eval
from memex.executor.llm import LLMClient, ScriptedLLM

pytest.importorskip("duckdb")


def _build(name: str, seed: int, root: Path) -> Any:
    folder = root / f"{name}-{seed}-{len(list(root.iterdir()))}"  # a folder per build
    folder.mkdir()
    return SUITES[name].build(seed, folder)


def _tool(ws: Any, name: str) -> Any:
    return next(t for t in ws.tools if t.name == name)


@pytest.mark.slow
def test_warehouse_is_deterministic_per_seed_and_differs_across_seeds(tmp_path: Path) -> None:
    a, b, c = (_build("warehouse", s, tmp_path) for s in (3, 3, 4))
    assert len(a.tasks) >= 40
    assert [(t.id, t.question, t.reference) for t in a.tasks] == \
        [(t.id, t.question, t.reference) for t in b.tasks]
    differ = sum(x.reference != y.reference or x.question != y.question
                 for x, y in zip(a.tasks, c.tasks, strict=True))
    assert differ >= 30, differ  # a few (e.g. an SLA's hours) may coincide
    for t in a.tasks:
        (value,) = t.reference.values()
        assert value is not None and value != [] and value != {}, t.id
        assert set(t.reference) == set(t.answer["properties"])
        assert grade(t.reference, t.reference, t.grader, tolerance=t.tolerance)
    tags = {tag for t in a.tasks for tag in t.tags}
    assert {"lookup", "aggregate", "grounding", "funnel", "cohort"} <= tags


def test_warehouse_tables_and_tools(tmp_path: Path) -> None:
    ws = _build("warehouse", 0, tmp_path)
    tables = _tool(ws, "list_tables")()
    assert len(tables) >= 25 and tables["domain"].nunique() >= 3
    assert {"orders_legacy", "customers_archive", "revenue_monthly"} <= set(tables["table"])
    cols = _tool(ws, "describe_table")("revenue_monthly")
    assert list(cols["column"]) == ["month", "region", "value", "status", "published_at"]
    assert "revised" in cols.set_index("column").loc["status", "description"]
    with pytest.raises(ValueError, match="no table 'nope'"):
        _tool(ws, "describe_table")("nope")
    hits = _tool(ws, "search_columns")("discount")
    assert set(hits["table"]) == {"order_items", "orders"}  # net_amount; "before discounts"
    sql = _tool(ws, "sql")
    statuses = sql("SELECT DISTINCT status FROM revenue_monthly ORDER BY 1")
    assert list(statuses["status"]) == ["preliminary", "revised"]
    with pytest.raises(ValueError, match=r"read-only|Cannot execute"):
        sql("DELETE FROM orders")
    with pytest.raises(ValueError, match=r"Catalog|does not exist"):
        sql("SELECT * FROM no_such_table")


def test_big_outputs_tools_return_thousands_of_records(tmp_path: Path) -> None:
    a, b = _build("big-outputs", 0, tmp_path), _build("big-outputs", 1, tmp_path)
    assert len(_tool(a, "transactions")()) == 5000
    assert len(_tool(a, "web_log")()) == 8000
    assert len(_tool(a, "inventory")()) == 3000
    assert [t.reference for t in a.tasks] != [t.reference for t in b.tasks]
    again = _build("big-outputs", 0, tmp_path)
    assert [t.reference for t in again.tasks] == [t.reference for t in a.tasks]


@pytest.mark.slow
def test_a_rollout_through_the_real_warehouse_tools_is_graded_correct(tmp_path: Path) -> None:
    ws = _build("warehouse", 0, tmp_path)
    task = next(t for t in ws.tasks if t.id == "cancelled_orders")
    code = ("df = sql(\"SELECT count(*) AS n FROM orders WHERE status = 'cancelled'\")\n"
            "submit({'count': int(df['n'].iloc[0])})")
    with ScriptedLLM([f"```python\n{code}\n```", f"```python\n{code}\n```"]) as srv:
        run = run_eval(SUITES["warehouse"], llm=LLMClient("scripted", base_url=srv.base_url),
                       out=tmp_path / "run", seeds=[0], tasks=["cancelled_orders"],
                       spaces=["code"], backend="inprocess")
    (r,) = run.results
    assert r.correct and r.answer == task.reference and r.tool_calls == 1


def test_bulletins_corpus_tools_and_tasks(tmp_path: Path) -> None:
    a, b, c = (_build("bulletins", s, tmp_path) for s in (0, 0, 1))
    assert len(a.tasks) >= 30
    assert [(t.question, t.reference) for t in a.tasks] == [(t.question, t.reference)
                                                            for t in b.tasks]
    assert [t.reference for t in a.tasks] != [t.reference for t in c.tasks]
    search, read = _tool(a, "search"), _tool(a, "read")
    hits = search("March 2020")
    assert hits[0]["id"] in ("MSB-2020-03", "MSB-2020-02", "MSB-2020-04") and len(hits) == 10
    text = read("MSB-2020-03")
    assert "Table 1. Labour market by region" in text and "Revisions to earlier issues" in text
    ids = {h["id"] for y in range(2013, 2026) for h in search(str(y))}
    assert len(ids) >= 100  # the corpus is far larger than one context
    with pytest.raises(ValueError, match="no bulletin 'MSB-1999-01'"):
        read("MSB-1999-01")
    with pytest.raises(ValueError, match="no words"):
        search("  ?! ")
    # a figure "as last revised" differs from the first published one, and a later issue
    # says so
    final = next(t for t in a.tasks if "as last revised? Give" in t.question)
    month = final.question.split(" in ")[2].split(",")[0]
    region = final.question.split("in the ")[1].split(" region")[0]
    later = [read(h["id"]) for h in search(f"{month} revised {region}")]
    assert any(f"- {month}: {region} unemployment rate revised from" in x and
               f"to {final.reference['rate']:.1f}%." in x for x in later)


def test_bulletins_nested_table_answers_its_questions(tmp_path: Path) -> None:
    """Table 3 nests branches two levels under Services; a branch question's reference is
    the row of that branch in that month's bulletin, and the levels add up (to rounding)."""
    ws = _build("bulletins", 0, tmp_path)
    read = _tool(ws, "read")
    branch = [t for t in ws.tasks if t.tags == ("branch",)]
    assert len(branch) == 4 and all(t.id == f"branch_{k}" for k, t in zip(
        range(len(ws.tasks) - 3, len(ws.tasks) + 1), branch, strict=True))
    months = {m: i for i, m in enumerate(
        ["January", "February", "March", "April", "May", "June", "July", "August",
         "September", "October", "November", "December"], start=1)}
    for t in branch:
        name = t.question.split(" in ")[1].split(" (")[0]
        month, year = t.question.split(") in ")[1].split(",")[0].split()
        text = read(f"MSB-{year}-{months[month]:02d}")
        table = text[text.index("Table 3."):text.index("Footnotes")]
        rows = {line.split("|")[0].strip().removeprefix("of which: "):
                float(line.split("|")[1].replace(",", ""))
                for line in table.splitlines()[3:] if "|" in line}
        assert rows[name] == t.reference["employed"]
        assert abs(rows["Public services"] + rows["Private services"]
                   - rows["Services (all branches)"]) <= 0.15
        assert abs(rows["Health"] + rows["Education"] - rows["Public services"]) <= 0.15
        assert rows["Services (all branches)"] == float(
            text.split("Services         |")[1].split()[0].replace(",", ""))
