"""memex eval end to end against a scripted model on 127.0.0.1: both action spaces graded,
resume after an interrupted run (no rollout twice), the report's numbers against the JSONL,
the Pareto PNG, the audit agent's typed verdicts, the export, and every bad input."""

from __future__ import annotations

import io
import json
import textwrap
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from memex.cli import main as cli
from memex.errors import ConfigError, LLMError
from memex.eval import (
    SUITES,
    EvalTask,
    Suite,
    Workspace,
    audit,
    by_task,
    export_rollouts,
    format_by_task,
    format_summaries,
    load_audit,
    load_results,
    load_suite,
    load_tasks,
    pareto_plot,
    run_eval,
    summarise,
)
from memex.eval.internal import wilson
from memex.executor.llm import (
    LLMClient,
    ScriptedError,
    ScriptedLLM,
    ScriptedReply,
    ScriptedToolCall,
)
from memex.host_tools import tool


@tool
def numbers(n: int) -> list[int]:
    """The first n squares.

    Args:
        n: how many.
    """
    return [i * i for i in range(n)]


SCHEMA = {"type": "object", "properties": {"total": {"type": "integer"}},
          "required": ["total"], "additionalProperties": False}


def build(seed: int, workdir: Path) -> Workspace:
    n = 3 + seed  # each seed its own reference answers
    return Workspace(tools=(numbers,), preload=(), tasks=(
        EvalTask(id="sum", question=f"What is the sum of numbers({n})?", answer=SCHEMA,
                 reference={"total": sum(i * i for i in range(n))}),
        EvalTask(id="max", question=f"What is the largest of numbers({n})?", answer=SCHEMA,
                 reference={"total": (n - 1) ** 2}),
    ))


SUITE = Suite(name="squares", build=build)


def _task(body: dict[str, Any]) -> str:
    return next(m["content"] for m in body["messages"] if m["role"] == "user")


def model(body: dict[str, Any]) -> ScriptedReply | str:
    """Right on "sum", wrong on "max", in both action spaces."""
    task = _task(body)
    n = int(task.split("numbers(")[1].split(")")[0])
    right = "sum" in task
    value = sum(i * i for i in range(n)) if right else -1
    if any(t["function"]["name"] == "python_exec" for t in body.get("tools") or ()):
        return ScriptedReply(tool_calls=(ScriptedToolCall(
            name="submit", arguments={"answer": {"total": value}}),))
    code = f"xs = numbers({n})\nsubmit({{'total': {'sum(xs)' if right else '-1'}}})"
    return f"Computing.\n```python\n{code}\n```"


@pytest.fixture
def srv() -> Any:
    with ScriptedLLM(model) as s:
        yield s


def client(srv: ScriptedLLM) -> LLMClient:
    return LLMClient("scripted", base_url=srv.base_url, max_retries=0, timeout=30)


def test_both_spaces_run_graded_on_the_pool(srv: ScriptedLLM, tmp_path: Path) -> None:
    run = run_eval(SUITE, llm=client(srv), out=tmp_path, seeds=[0, 1], concurrency=2,
                   backend="pool")
    assert run.ran == 8 and run.skipped == 0
    got = {(r.space, r.seed, r.task): r.correct for r in run.results}
    assert got == {(s, seed, t): t == "sum" for s in ("code", "tools") for seed in (0, 1)
                   for t in ("sum", "max")}
    sums = {r.seed: r.reference for r in run.results if r.task == "sum"}
    assert sums == {0: {"total": 5}, 1: {"total": 14}}  # per-seed references
    code = next(r for r in run.results if r.space == "code" and r.task == "sum")
    assert code.answer == {"total": 5} or code.answer == {"total": 14}
    assert code.tool_calls == 1 and code.turns == 1 and code.end_reason == "submitted"
    tools = next(r for r in run.results if r.space == "tools" and r.task == "sum")
    assert tools.tool_calls == 0 and tools.end_reason == "submitted"
    # each result's trajectory is in the trajectory file
    from memex.executor import load_trajectories
    ids = {t.id for t in load_trajectories(tmp_path / "trajectories.jsonl")}
    assert {r.trajectory for r in run.results} == ids
    assert load_results(tmp_path) == list(run.results)


def test_a_stopped_run_resumes_without_running_a_rollout_twice(srv: ScriptedLLM,
                                                               tmp_path: Path) -> None:
    seen: list[str] = []

    def stop_after_three(r: Any, done: int, total: int) -> None:
        seen.append(r.task)
        if done == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_eval(SUITE, llm=client(srv), out=tmp_path, seeds=[0, 1], backend="inprocess",
                 progress=stop_after_three)
    assert len(load_results(tmp_path)) == 3
    asked = len(srv.requests)
    # a run killed while writing leaves half a line: the next run cuts it and goes on
    with open(tmp_path / "results.jsonl", "a") as f:
        f.write('{"suite": "squares", "mod')
    run = run_eval(SUITE, llm=client(srv), out=tmp_path, seeds=[0, 1], backend="inprocess")
    assert run.ran == 5 and run.skipped == 3 and len(run.results) == 8
    assert len(srv.requests) - asked == 5  # one model call per rollout, none repeated
    keys = [r.key for r in load_results(tmp_path)]
    assert len(keys) == len(set(keys)) == 8
    again = run_eval(SUITE, llm=client(srv), out=tmp_path, seeds=[0, 1], backend="inprocess")
    assert again.ran == 0 and again.skipped == 8
    # another variant is another set of rollouts in the same folder
    other = run_eval(SUITE, llm=client(srv), out=tmp_path, seeds=[0], spaces=["code"],
                     variant="no_example", backend="inprocess")
    assert other.ran == 2 and {r.variant for r in other.results} == {"no_example"}


def _dead_endpoint() -> str:
    """A 127.0.0.1 address nothing listens on (the port was just free)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


@pytest.mark.slow
def test_an_endpoint_that_is_down_stops_the_run_and_loses_nothing(
        srv: ScriptedLLM, tmp_path: Path) -> None:
    dead = LLMClient("scripted", base_url=_dead_endpoint(), max_retries=0, timeout=5)
    with pytest.raises(LLMError, match="failed 3 rollouts in a row") as err:
        run_eval(SUITE, llm=dead, out=tmp_path, seeds=[0, 1], backend="inprocess")
    assert str(tmp_path) in str(err.value)
    written = load_results(tmp_path)
    assert len(written) == 3 and all(r.endpoint_failed for r in written)
    rows = summarise(written)  # nothing about the model: no rollout counted
    assert [(r.rollouts, r.endpoint_errors) for r in rows] == [(0, 2), (0, 1)]
    assert "3 rollouts not counted: the model endpoint failed" in format_summaries(rows)
    with pytest.raises(ConfigError, match="no results"):
        pareto_plot(rows, tmp_path / "p.png")
    assert audit(tmp_path, llm=dead) == []  # no model failure to classify
    assert list(export_rollouts(tmp_path)) == []
    # the endpoint is back: the same command runs every rollout, the failed ones included
    run = run_eval(SUITE, llm=client(srv), out=tmp_path, seeds=[0, 1], backend="inprocess")
    assert run.ran == 8 and run.skipped == 0 and len(run.results) == 8
    assert not any(r.endpoint_failed for r in run.results)
    assert len(load_results(tmp_path, every=True)) == 11  # the failed lines stay on record
    assert len(load_results(tmp_path)) == 8
    assert [(r.rollouts, r.correct, r.endpoint_errors)
            for r in summarise(load_results(tmp_path, every=True))] == [(4, 2, 0), (4, 2, 0)]


def test_an_endpoint_failing_now_and_then_is_left_out_of_the_figures(tmp_path: Path) -> None:
    def flaky(body: dict[str, Any]) -> ScriptedReply | ScriptedError | str:
        if "largest" in _task(body) and not body.get("tools"):
            return ScriptedError(status=500, message="overloaded")
        return model(body)

    with ScriptedLLM(flaky) as s:
        llm = LLMClient("scripted", base_url=s.base_url, max_retries=0, timeout=30)
        run = run_eval(SUITE, llm=llm, out=tmp_path, seeds=[0, 1, 2], spaces=["code"],
                       backend="inprocess")
    assert run.ran == 6
    failed = [r for r in run.results if r.endpoint_failed]
    assert [r.task for r in failed] == ["max"] * 3
    assert all("500" in (r.error or "") for r in failed)
    (row,) = summarise(run.results)
    assert (row.rollouts, row.correct, row.endpoint_errors) == (3, 3, 3)
    assert row.accuracy == 1.0
    assert len(list(export_rollouts(tmp_path))) == 3


def test_the_report_matches_the_results(srv: ScriptedLLM, tmp_path: Path) -> None:
    run_eval(SUITE, llm=client(srv), out=tmp_path, seeds=[0, 1, 2], backend="inprocess")
    results = load_results(tmp_path)
    rows = summarise(results)
    assert [(r.space, r.rollouts, r.correct) for r in rows] == [("code", 6, 3), ("tools", 6, 3)]
    for row in rows:
        mine = [r for r in results if r.space == row.space]
        assert row.prompt_tokens == sum(r.prompt_tokens for r in mine) / 6
        assert row.completion_tokens == sum(r.completion_tokens for r in mine) / 6
        assert row.tokens_per_correct == sum(r.tokens for r in mine) / 3
        assert (row.ci_low, row.ci_high) == wilson(3, 6)
        assert row.cost is None  # no price known for this model
    priced = summarise(results, {"scripted": (1.0, 2.0)})
    code = [r for r in results if r.space == "code"]
    assert priced[0].cost == pytest.approx(
        sum(r.prompt_tokens * 1.0 + r.completion_tokens * 2.0 for r in code) / 1e6)
    md = format_summaries(rows, "md")
    assert "| squares | scripted | code | default | 3/6 | 50% (19%-81%) |" in md
    js = json.loads(format_summaries(rows, "json"))
    assert js[1]["space"] == "tools" and js[1]["correct"] == 3
    csv = format_summaries(rows, "csv").splitlines()
    assert csv[0].startswith("suite,model,space,variant,rollouts,correct") and len(csv) == 3
    with pytest.raises(ConfigError, match="formats"):
        format_summaries(rows, "xml")
    png = pareto_plot(rows, tmp_path / "p.png", width=640, height=400)
    import matplotlib.image

    assert matplotlib.image.imread(png).shape[:2] == (400, 640)
    with pytest.raises(ConfigError, match="no results"):
        pareto_plot([], tmp_path / "q.png")


def test_the_report_by_task_matches_the_results(srv: ScriptedLLM, tmp_path: Path) -> None:
    run_eval(SUITE, llm=client(srv), out=tmp_path, seeds=[0, 1, 2], backend="inprocess")
    run_eval(SUITE, llm=client(srv), out=tmp_path, seeds=[0, 1], spaces=["code"],
             variant="again", backend="inprocess")
    results = load_results(tmp_path)
    cells = by_task(results)
    for c in cells:
        mine = [r for r in results if (r.space, r.variant, r.task) == (c.space, c.variant, c.task)]
        assert (c.correct, c.rollouts) == (sum(r.correct for r in mine), len(mine))
    assert {(c.space, c.variant, c.task): f"{c.correct}/{c.rollouts}" for c in cells} == {
        ("code", "default", "sum"): "3/3", ("code", "default", "max"): "0/3",
        ("tools", "default", "sum"): "3/3", ("tools", "default", "max"): "0/3",
        ("code", "again", "sum"): "2/2", ("code", "again", "max"): "0/2"}
    md = format_by_task(cells)
    assert "| task | code default | code again | tools default |" in md
    assert "| sum | 3/3 | 2/2 | 3/3 |" in md and "| max | 0/3 | 0/2 | 0/3 |" in md
    assert len(json.loads(format_by_task(cells, "json"))) == 6
    assert format_by_task(cells, "csv").splitlines()[0] == \
        "suite,model,space,variant,task,correct,rollouts"
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli(["eval", "report", str(tmp_path), "--by-task", "--plot", "none"]) == 0
    assert "| sum | 3/3 | 2/2 | 3/3 |" in out.getvalue()


def test_wilson_interval() -> None:
    assert wilson(0, 0) == (0.0, 1.0)
    lo, hi = wilson(0, 10)
    assert lo == 0.0 and 0.25 < hi < 0.35
    lo, hi = wilson(10, 10)
    assert 0.65 < lo < 0.75 and hi == 1.0


def test_the_audit_agent_classifies_each_failure(tmp_path: Path) -> None:
    with ScriptedLLM(model) as s:
        run_eval(SUITE, llm=client(s), out=tmp_path, seeds=[0], backend="inprocess")
    failed = [r for r in load_results(tmp_path) if not r.correct]
    assert len(failed) == 2

    def auditor(body: dict[str, Any]) -> str:
        system = body["messages"][0]["content"]
        assert "no_answer" in system or "wrong_table" in body["messages"][1]["content"]
        if "python_exec" in json.dumps(body.get("tools") or []):
            raise AssertionError("the auditor works in code")
        return ("Looking at the trajectory.\n```python\n"
                "print(question, reference, submitted, len(trajectory.steps))\n"
                "submit({'kind': 'transcription_error', 'evidence': "
                "'step 1 submitted -1 ' + str(trajectory.steps[0].status)})\n```")

    with ScriptedLLM(auditor) as s:
        verdicts = audit(tmp_path, llm=client(s))
        assert len(verdicts) == 2 and len(s.requests) == 2
        assert {v.kind for v in verdicts} == {"transcription_error"}
        assert all(v.evidence == "step 1 submitted -1 submitted" for v in verdicts)
        assert audit(tmp_path, llm=client(s)) == []  # audited ones are not audited again
    assert load_audit(tmp_path) == verdicts
    # each verdict traces to the auditor's own rollout, saved beside the verdicts
    from memex.executor import load_trajectories
    mine = {t.id: t for t in load_trajectories(tmp_path / "audit-trajectories.jsonl")}
    assert {v.audit_trajectory for v in verdicts} == set(mine)
    assert all("print(question" in mine[v.audit_trajectory].steps[0].code[0]
               for v in verdicts)


def test_an_audit_that_gives_no_valid_verdict_is_recorded_as_such(tmp_path: Path) -> None:
    with ScriptedLLM(model) as s:
        run_eval(SUITE, llm=client(s), out=tmp_path, seeds=[0], spaces=["code"],
                 backend="inprocess")
    bad = "```python\nsubmit({'kind': 'cosmic_rays', 'evidence': 'x'})\n```"
    with ScriptedLLM([bad] * 10) as s:
        (v,) = audit(tmp_path, llm=client(s), max_turns=2)
    assert v.kind is None and v.end_reason == "max_turns"


def test_export_gives_chat_records_with_rewards(srv: ScriptedLLM, tmp_path: Path) -> None:
    run_eval(SUITE, llm=client(srv), out=tmp_path, seeds=[0], backend="inprocess")
    every = list(export_rollouts(tmp_path))
    assert len(every) == 4 and {r["reward"] for r in every} == {0.0, 1.0}
    good = list(export_rollouts(tmp_path, correct=True, space="code"))
    assert len(good) == 1 and good[0]["task"] == "sum"
    roles = [m["role"] for m in good[0]["messages"]]
    assert roles[:3] == ["system", "user", "assistant"] and "submit(" in json.dumps(good[0])
    with pytest.raises(ConfigError, match="formats"):
        list(export_rollouts(tmp_path, fmt="parquet"))


def test_the_cli_runs_reports_and_exports(srv: ScriptedLLM, tmp_path: Path) -> None:
    suite_file = tmp_path / "mysuite.py"
    suite_file.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_harness import SUITE
    """))
    out = tmp_path / "run"
    stdout, stderr = io.StringIO(), io.StringIO()
    with redirect_stdout(stdout), redirect_stderr(stderr):
        code = cli(["eval", "run", str(suite_file), "--base-url", srv.base_url, "--model",
                    "scripted", "--seeds", "2", "--out", str(out), "--backend", "inprocess",
                    "--quiet"])
    assert code == 0, stderr.getvalue()
    assert "8 rollouts run, 0 already done" in stderr.getvalue()
    assert "| squares | scripted | code | default | 2/4 |" in stdout.getvalue()
    assert "[8/8]" in stderr.getvalue()
    stdout = io.StringIO()
    with redirect_stdout(stdout), redirect_stderr(io.StringIO()):
        assert cli(["eval", "report", str(out), "--format", "json"]) == 0
    rows = json.loads(stdout.getvalue())
    assert sum(r["rollouts"] for r in rows) == 8 and (out / "pareto.png").is_file()
    stdout = io.StringIO()
    with redirect_stdout(stdout), redirect_stderr(io.StringIO()):
        assert cli(["eval", "export", str(out), "--wrong"]) == 0
    lines = stdout.getvalue().splitlines()
    assert len(lines) == 4 and all(json.loads(x)["reward"] == 0.0 for x in lines)


@pytest.mark.parametrize(("argv", "message"), [
    (["eval", "run", "nosuch", "--out", "X", "--base-url", "http://127.0.0.1:9/v1"],
     "no suite 'nosuch'"),
    (["eval", "run", "warehouse", "--out", "X", "--aid", "bogus=1", "--base-url",
      "http://127.0.0.1:9/v1"], "--aid takes NAME=VALUE"),
    (["eval", "run", "warehouse", "--out", "X", "--aid", "example=maybe", "--base-url",
      "http://127.0.0.1:9/v1"], "takes on|off"),
    (["eval", "run", "warehouse", "--out", "X", "--seeds", "a-b", "--base-url",
      "http://127.0.0.1:9/v1"], "--seeds takes"),
    (["eval", "report", "/nonexistent/run"], "cannot read eval results"),
    (["eval", "report", "R", "--price", "m=1"], "--price takes"),
])
def test_cli_misuse_is_one_clear_line(argv: list[str], message: str, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    (tmp_path / "R").mkdir()
    (tmp_path / "R" / "results.jsonl").write_text("")
    monkeypatch.chdir(tmp_path)
    stderr = io.StringIO()
    with redirect_stderr(stderr), redirect_stdout(io.StringIO()):
        code = cli(argv)
    assert code == 2 and message in stderr.getvalue(), stderr.getvalue()


def test_bad_suites_and_task_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="bundled are"):
        load_suite("nosuch", SUITES)
    (tmp_path / "empty.py").write_text("x = 1\n")
    with pytest.raises(ConfigError, match="defines no Suite named 'SUITE'"):
        load_suite(str(tmp_path / "empty.py"), SUITES)
    (tmp_path / "broken.py").write_text("raise RuntimeError('boom')\n")
    with pytest.raises(ConfigError, match="RuntimeError: boom"):
        load_suite(str(tmp_path / "broken.py"), SUITES)
    tasks = tmp_path / "tasks.yaml"
    tasks.write_text(textwrap.dedent("""
        - id: a
          question: How many?
          answer: {type: object, properties: {n: {type: integer}}}
          reference: {n: 3}
          grader: numeric
          tolerance: 0.01
          tags: [easy]
    """))
    (t,) = load_tasks(tasks)
    assert (t.id, t.grader, t.tolerance, t.tags, t.reference) == ("a", "numeric", 0.01,
                                                                  ("easy",), {"n": 3})
    for text, msg in [("{}", "a list of tasks"), ("- 3", "not a mapping"),
                      ("- {id: a, question: q}", "no reference"),
                      ("- {id: a, question: q, reference: 1, color: red}", "unknown keys"),
                      ("- {id: a, question: q, reference: 1, grader: fuzzy}", "unknown grader"),
                      ("- {id: a, question: q, reference: 1, answer: 3}", "JSON Schema"),
                      ("- {id: '', question: q, reference: 1}", "non-empty string id"),
                      (": : :", "cannot read")]:
        tasks.write_text(text)
        with pytest.raises(ConfigError, match=msg):
            load_tasks(tasks)
    with pytest.raises(ConfigError, match="unique"):
        Workspace(tasks=(EvalTask(id="a", question="q", answer=None, reference=1),) * 2)


def test_bad_run_settings_are_refused(srv: ScriptedLLM, tmp_path: Path) -> None:
    llm = client(srv)
    with pytest.raises(ConfigError, match="action spaces"):
        run_eval(SUITE, llm=llm, out=tmp_path, spaces=["json"])
    with pytest.raises(ConfigError, match="concurrency"):
        run_eval(SUITE, llm=llm, out=tmp_path, concurrency=0)
    with pytest.raises(ConfigError, match="variant"):
        run_eval(SUITE, llm=llm, out=tmp_path, variant="a b")
    with pytest.raises(ConfigError, match="none of the tasks"):
        run_eval(SUITE, llm=llm, out=tmp_path, tasks=["nope"], backend="inprocess")

    def broken(seed: int, workdir: Path) -> Workspace:
        raise OSError("disk full")

    with pytest.raises(ConfigError, match="could not build seed 0: OSError: disk full"):
        run_eval(Suite(name="b", build=broken), llm=llm, out=tmp_path)
    assert srv.requests == []


def test_the_llm_judge_grades_free_text_answers_only_when_asked(tmp_path: Path) -> None:
    text = {"type": "string"}

    def free(seed: int, workdir: Path) -> Workspace:
        return Workspace(tools=(), preload=(), tasks=(
            EvalTask(id="capital", question="Capital of France?", answer=text,
                     reference="Paris", grader="judge"),
            EvalTask(id="river", question="Longest river in France?", answer=text,
                     reference="the Loire", grader="judge")))

    suite = Suite(name="free", build=free)
    answers = ["```python\nsubmit('It is Paris.')\n```",
               "```python\nsubmit('The Seine')\n```"]
    with ScriptedLLM(answers) as srv:
        with pytest.raises(ConfigError, match="graded by an LLM judge"):
            run_eval(suite, llm=client(srv), out=tmp_path, spaces=["code"])
        assert srv.requests == []
        with ScriptedLLM(["CORRECT", "Verdict: WRONG (INCORRECT river)"]) as judge:
            run = run_eval(suite, llm=client(srv), out=tmp_path, spaces=["code"],
                           backend="inprocess", judge=client(judge))
            prompt = judge.requests[0].messages[0]["content"]
            assert 'Reference answer: "Paris"' in prompt and "It is Paris." in prompt
    got = {r.task: (r.correct, r.judged) for r in run.results}
    assert got == {"capital": (True, "CORRECT"),
                   "river": (False, "Verdict: WRONG (INCORRECT river)")}
    from memex.executor.llm import ScriptedError

    with ScriptedLLM(answers) as srv, ScriptedLLM([ScriptedError(status=500)] * 4) as judge:
        run = run_eval(suite, llm=client(srv), out=tmp_path / "down", spaces=["code"],
                       backend="inprocess", judge=client(judge))
    assert all(not r.correct and r.judged and r.judged.startswith("judge call failed")
               for r in run.results)
    with pytest.raises(ConfigError, match="judge grader asks a model"):
        from memex.eval import grade

        grade("a", "a", "judge")


def test_a_damaged_results_file_is_refused_with_the_line(srv: ScriptedLLM, tmp_path: Path
                                                         ) -> None:
    run_eval(SUITE, llm=client(srv), out=tmp_path, seeds=[0], spaces=["code"],
             backend="inprocess")
    good = (tmp_path / "results.jsonl").read_text().splitlines()
    (tmp_path / "results.jsonl").write_text("\n".join([good[0], "[1, 2]", good[1]]) + "\n")
    with pytest.raises(ConfigError, match=r"results.jsonl:2: not a valid eval result"):
        load_results(tmp_path)
    (tmp_path / "results.jsonl").write_text(good[0] + '\n{"suite": 1}\n' + good[1] + "\n")
    with pytest.raises(ConfigError, match=r":2: not a valid eval result \(missing fields"):
        load_results(tmp_path)
    (tmp_path / "audit.jsonl").write_text('{"trajectory": "x"}\n{}\n')
    with pytest.raises(ConfigError, match=r"audit.jsonl:1: not a valid audit verdict"):
        load_audit(tmp_path)


@pytest.mark.parametrize(("order", "want"), [
    ("interleaved", ["code", "tools", "code", "tools"]),
    ("by_space", ["code", "code", "tools", "tools"]),
])
def test_the_run_order_is_selectable(srv: ScriptedLLM, tmp_path: Path, order: str,
                                     want: list[str]) -> None:
    seen: list[str] = []
    run_eval(SUITE, llm=client(srv), out=tmp_path, backend="inprocess", order=order,
             progress=lambda r, _d, _t: seen.append(r.space))
    assert seen == want
    with pytest.raises(ConfigError, match="order is one of"):
        run_eval(SUITE, llm=client(srv), out=tmp_path / "x", order="random")
