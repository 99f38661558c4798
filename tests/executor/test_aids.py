"""The aids for small models, each on and off: the worked example built from the rollout's
own tools and answer schema, errors explained (an undefined name, a missing DataFrame
column, a rejected submit with the type each field got), one more turn for a submit
rejected on the last one, the text after a reply's last code block left out of the context,
wide DataFrames printed whole, and a tool-calling submit written before the results came."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest
from pydantic import BaseModel, Field

from memex.executor import Aids, Budget, MemexAgent, SandboxSpec
from memex.executor.llm import LLMClient, ScriptedLLM, ScriptedReply, ScriptedToolCall
from memex.executor.loops._parse import cut_after_code
from memex.host_tools import tool
from memex.runtime_wasm import Limits


class Funnel(BaseModel):
    conversion: dict[str, float] = Field(description="segment -> rate")
    worst_segment: str


@tool
def sql(query: str) -> pd.DataFrame:
    """Run a query.

    Args:
        query: one SELECT.

    Returns:
        The rows (segment, rate).
    """
    return pd.DataFrame({"segment": ["a", "b"], "rate": [0.25, 0.5]})


@tool
def list_tables() -> list[str]:
    """The tables."""
    return ["segments"]


def py(code: str) -> str:
    return f"Running.\n```python\n{code}\n```"


def agent(srv: ScriptedLLM, **kw: Any) -> MemexAgent:
    kw.setdefault("tools", [sql, list_tables])
    kw.setdefault("submit", Funnel)
    return MemexAgent(model=LLMClient("scripted", base_url=srv.base_url, max_retries=0),
                      sandbox=SandboxSpec(limits=Limits(timeout=30), preload=("pandas",)),
                      **kw)


def test_the_example_uses_the_rollouts_own_tools_and_answer_fields() -> None:
    with ScriptedLLM([]) as srv:
        a = agent(srv)
        system = a.system_prompt({})
        assert "result = list_tables()" in system  # a tool that needs no arguments first
        assert 'submit({"conversion": conversion, "worst_segment": worst_segment})' in system
        assert "orders()" not in system and '"count": 42' not in system
        assert '"conversion": dict of str -> float' in system  # dict types rendered
        assert "Returns: The rows (segment, rate)." in system  # what a tool returns
        tools = agent(srv, action_space="tools").system_prompt({})
        assert "call `list_tables` with {}" in tools
        assert '{"answer": {"conversion": <dict of str -> float>, "worst_segment": <str>}}' \
            in tools
        only_sql = agent(srv, tools=[sql]).system_prompt({})
        assert 'result = sql(query="...")' in only_sql
        plain = agent(srv, submit=int).system_prompt({})
        assert "# first compute answer from the results (answer: int)" in plain
        old = agent(srv, aids=Aids(example_from_tools=False)).system_prompt({})
        assert "orders()" in old and 'submit({"count": 42})' in old


def test_a_rejected_submit_says_what_each_field_got_and_how_to_convert_it() -> None:
    code = ("df = sql('q')\nsubmit({'conversion': df.set_index('segment')['rate'], "
            "'worst_segment': df['segment'].head(1)})")
    fixed = ("submit({'conversion': df.set_index('segment')['rate'].to_dict(), "
             "'worst_segment': df['segment'].iloc[0]})")
    with ScriptedLLM([py(code), py(fixed)]) as srv:
        r = agent(srv).run("t")
    first = r.trajectory.steps[0]
    assert first.status == "rejected"
    assert ("You sent: {'conversion': a pandas Series of 2 values (use .to_dict() for a "
            "dict") in first.observation
    assert "'worst_segment': a pandas Series of 1 value (" in first.observation
    assert '[submit(answer) takes: {"conversion": dict of str -> float' in first.observation
    assert r.answer == Funnel(conversion={"a": 0.25, "b": 0.5}, worst_segment="a")
    with ScriptedLLM([py(code), py(fixed)]) as srv:
        r = agent(srv, aids=Aids(explain_errors=False)).run("t")
    assert "You sent" not in r.trajectory.steps[0].observation
    assert "[submit(answer) takes" not in r.trajectory.steps[0].observation


def test_a_placeholder_in_the_answer_is_named() -> None:
    with ScriptedLLM([py("submit({'conversion': ..., 'worst_segment': 'a'})")]) as srv:
        r = agent(srv, budget=Budget(max_turns=1), aids=Aids(grace_turn=False)).run("t")
    obs = r.trajectory.steps[0].observation
    assert "cannot send a value of type builtins.ellipsis" in obs
    assert "'conversion': ... (a placeholder: compute this value from your results)" in obs


def test_an_undefined_name_is_answered_with_what_exists() -> None:
    with ScriptedLLM([py("rows = sql('q')"), py("customers()"), py("x")]) as srv:
        r = agent(srv, budget=Budget(max_turns=3)).run("t")
    obs = r.trajectory.steps[1].observation
    assert "NameError: name 'customers' is not defined" in obs
    assert ("['customers' is not defined in this session. What is: the tools sql(), "
            "list_tables(), submit(); your variables: rows.]") in obs
    with ScriptedLLM([py("customers()")]) as srv:
        r = agent(srv, budget=Budget(max_turns=1), aids=Aids(explain_errors=False)).run("t")
    assert "What is:" not in r.trajectory.steps[0].observation


def test_a_missing_column_is_answered_with_the_frames_columns() -> None:
    with ScriptedLLM([py("df = sql('q')"), py("df['transaction_type']")]) as srv:
        r = agent(srv, budget=Budget(max_turns=2)).run("t")
    obs = r.trajectory.steps[1].observation
    assert "KeyError: 'transaction_type'" in obs
    assert "[a key that does not exist. Your DataFrames: df: DataFrame 2 rows x 2 cols " \
           "[segment, rate]]" in obs


def test_a_submit_rejected_on_the_last_turn_gets_one_more() -> None:
    bad, good = py("submit({'count': 3})"), py(
        "submit({'conversion': {'a': 0.25}, 'worst_segment': 'a'})")
    with ScriptedLLM([py("1"), bad, good]) as srv:
        r = agent(srv, budget=Budget(max_turns=2)).run("t")
    assert r.end_reason == "submitted" and len(r.trajectory.steps) == 3
    assert ("[Your answer was rejected on the last turn: you get one more turn."
            in r.trajectory.steps[1].observation)
    with ScriptedLLM([py("1"), bad, py("submit({'count': 4})"), good]) as srv:  # once only
        r = agent(srv, budget=Budget(max_turns=2)).run("t")
    assert r.end_reason == "max_turns" and len(r.trajectory.steps) == 3
    with ScriptedLLM([py("1"), bad, good]) as srv:
        r = agent(srv, budget=Budget(max_turns=2), aids=Aids(grace_turn=False)).run("t")
    assert r.end_reason == "max_turns" and len(r.trajectory.steps) == 2
    with ScriptedLLM([py("1"), py("1 / 0"), good]) as srv:  # an error is not a rejection
        r = agent(srv, budget=Budget(max_turns=2)).run("t")
    assert r.end_reason == "max_turns"


def test_the_text_after_the_last_block_stays_out_of_the_context() -> None:
    reply = py("print(1)") + "\nUser: Output:\n1\nYour answer is correct."
    with ScriptedLLM([reply, py("print(2)")]) as srv:
        agent(srv, budget=Budget(max_turns=2)).run("t")
        kept = srv.requests[1].messages[2]["content"]
        assert kept.endswith("print(1)\n```") and "correct" not in kept
        assert srv.requests[0].body["stop"] == ["```output", "\nOutput:", "\nUser:",
                                                "\nAssistant:"]
    with ScriptedLLM([reply, py("print(2)")]) as srv:
        agent(srv, budget=Budget(max_turns=2), aids=Aids(cut_after_code=False)).run("t")
        assert "Your answer is correct." in srv.requests[1].messages[2]["content"]


@pytest.mark.parametrize(("text", "kept"), [
    ("no code at all", "no code at all"),
    ("a\n```python\nx = 1\n```\ntail", "a\n```python\nx = 1\n```"),
    ("```python\nx\n```\nmid\n```py\ny\n```\nAssistant: more", "```python\nx\n```\nmid\n"
     "```py\ny\n```"),
    ("```python\nunclosed = 1\nstill going", "```python\nunclosed = 1\nstill going"),
    ("```json\n{}\n```\nafter", "```json\n{}\n```\nafter"),  # not code
])
def test_cut_after_code(text: str, kept: str) -> None:
    assert cut_after_code(text) == kept


def test_wide_frames_print_whole() -> None:
    @tool
    def wide() -> pd.DataFrame:
        """A wide frame."""
        return pd.DataFrame({f"column_number_{i}": [i] for i in range(9)})

    with ScriptedLLM([py("print(wide())")]) as srv:
        r = agent(srv, tools=[wide], budget=Budget(max_turns=1)).run("t")
    assert "column_number_4" in r.trajectory.steps[0].observation
    with ScriptedLLM([py("print(wide())")]) as srv:
        r = agent(srv, tools=[wide], budget=Budget(max_turns=1),
                  aids=Aids(wide_tables=False)).run("t")
    assert "column_number_4" not in r.trajectory.steps[0].observation  # folded into "..."


def test_a_blind_submit_waits_for_the_results_it_could_not_have_seen() -> None:
    calls = ScriptedReply(tool_calls=(
        ScriptedToolCall(name="sql", arguments={"query": "q"}),
        ScriptedToolCall(name="submit", arguments={"answer": {"conversion": {"a": 1.0},
                                                              "worst_segment": "z"}})))
    read = ScriptedReply(tool_calls=(ScriptedToolCall(name="submit", arguments={
        "answer": {"conversion": {"a": 0.25, "b": 0.5}, "worst_segment": "a"}}),))
    with ScriptedLLM([calls, read]) as srv:
        r = agent(srv, action_space="tools").run("t")
    first = r.trajectory.steps[0]
    assert first.status == "ok" and [c.outcome for c in first.tool_calls] == ["ok", "held"]
    assert "[submit not run: it came in the same reply as calls" in first.observation
    assert r.answer.worst_segment == "a" and len(r.trajectory.steps) == 2
    with ScriptedLLM([calls]) as srv:
        r = agent(srv, action_space="tools", aids=Aids(hold_blind_submit=False)).run("t")
    assert r.answer.worst_segment == "z" and len(r.trajectory.steps) == 1


def test_a_repeat_of_code_that_worked_is_offered_the_submit_it_needs() -> None:
    count = {"type": "object", "properties": {"count": {"type": "integer"}},
             "required": ["count"]}
    block = py("total = len(list_tables())\nprint(total)")
    with ScriptedLLM([block, block, block]) as srv:
        r = agent(srv, submit=count, budget=Budget(max_turns=2)).run("t")
    second = r.trajectory.steps[1]
    assert second.status == "repeated"
    assert ('[If total answers the task, submit it instead of running this again: '
            'submit({"count": total})]') in second.observation
    assert "submit it instead" not in r.trajectory.steps[0].observation
    with ScriptedLLM([block, block]) as srv:  # a bare schema: the value itself
        r = agent(srv, submit=int, budget=Budget(max_turns=2)).run("t")
    assert "submit(total)]" in r.trajectory.steps[1].observation
    with ScriptedLLM([block, block]) as srv:  # two fields: no single value to offer
        r = agent(srv, budget=Budget(max_turns=2)).run("t")
    assert "submit it instead" not in r.trajectory.steps[1].observation
    with ScriptedLLM([block, block]) as srv:
        r = agent(srv, submit=count, budget=Budget(max_turns=2),
                  aids=Aids(repeat_note=False)).run("t")
    assert "submit it instead" not in r.trajectory.steps[1].observation


def test_a_long_value_in_a_schema_error_is_shortened() -> None:
    count = {"type": "object", "properties": {"count": {"type": "integer"}},
             "required": ["count"]}
    code = "import pandas as pd\nsubmit({'count': pd.Series(range(500))})"
    with ScriptedLLM([py(code)]) as srv:
        r = agent(srv, submit=count, budget=Budget(max_turns=1),
                  aids=Aids(grace_turn=False)).run("t")
    obs = r.trajectory.steps[0].observation
    assert "answer.count: <pandas.Series: 0        0...> is not of type 'integer'" in obs, obs
    assert "499" not in obs


def blocks(*codes: str) -> str:
    return "Running.\n" + "\n".join(f"```python\n{c}\n```" for c in codes)


def test_a_block_using_a_name_a_later_block_defines_runs_after_it() -> None:
    early = blocks("# first compute worst_segment\nsubmit({'conversion': conv, "
                   "'worst_segment': worst_segment})",
                   "df = sql('q')\nconv = dict(zip(df.segment, df.rate))\nprint(len(conv))",
                   "worst_segment = min(conv, key=conv.get)")
    with ScriptedLLM([early]) as srv:
        r = agent(srv).run("t")
    step = r.trajectory.steps[0]
    assert r.end_reason == "submitted" and r.answer.worst_segment == "a"
    assert step.status == "submitted" and len(r.trajectory.steps) == 1
    assert "[block 1] [it uses conv before block 2 defines it: run again after block 2]" \
        in step.observation
    assert "[block 2]\n2" in step.observation
    # again after block 2 it fails on worst_segment, which block 3 defines: after block 3
    assert "[block 1, again after block 2] [it uses worst_segment before block 3 defines " \
        "it: run again after block 3]" in step.observation
    assert "[block 1, again after block 3]\n[answer accepted]" in step.observation
    assert "NameError" not in step.observation
    assert step.code == (step.code[0], step.code[1], step.code[0], step.code[3],
                         step.code[0])
    with ScriptedLLM([early]) as srv:  # off: the reply stops at its first block
        r = agent(srv, budget=Budget(max_turns=1), aids=Aids(defer_forward_use=False)).run("t")
    step = r.trajectory.steps[0]
    assert step.status == "error" and len(step.code) == 1
    assert "[2 later block(s) not run]" in step.observation


def test_a_deferred_submit_runs_right_after_the_block_that_defines_its_value() -> None:
    early = blocks("submit({'conversion': conv, 'worst_segment': 'a'})",
                   "df = sql('q')\nconv = dict(zip(df.segment, df.rate))",
                   "print('not reached')")
    with ScriptedLLM([early]) as srv:
        r = agent(srv).run("t")
    step = r.trajectory.steps[0]
    assert r.answer.conversion == {"a": 0.25, "b": 0.5} and step.status == "submitted"
    assert "[block 1, again after block 2]\n[answer accepted]" in step.observation
    assert "not reached" not in step.observation


@pytest.mark.parametrize("first", [
    "x = 1\nsubmit({'conversion': conv, 'worst_segment': 'a'})",  # two statements
    "submit({'conversion': conv, 'worst_segment': 'a'})",          # nothing later defines it
])
def test_a_block_is_not_deferred_when_running_it_again_could_differ(first: str) -> None:
    later = "print('later')" if "x = 1" not in first else "conv = {'a': 1.0}"
    with ScriptedLLM([blocks(first, later)]) as srv:
        r = agent(srv, budget=Budget(max_turns=1)).run("t")
    step = r.trajectory.steps[0]
    assert step.status == "error" and "NameError" in step.observation
    assert "run again" not in step.observation and len(step.code) == 1


def test_a_tool_a_reply_rebinds_comes_back_and_its_value_moves() -> None:
    replies = [
        py("sql = sql('q')\nprint(len(sql))"),              # the tool's name bound to its result
        py("df = sql('q2')\nprint(type(sql_result).__name__, len(df))"),
        py("list_tables_result = 'mine'\nlist_tables = 7\nsql = 5\nsubmit = None"),
        py("print(sql_result, list_tables_result, list_tables_result2, list_tables())\n"
           "del list_tables"),
        py("submit({'conversion': dict(zip(df.segment, df.rate)), 'worst_segment': 'a'})"),
    ]
    with ScriptedLLM(replies) as srv:
        r = agent(srv).run("t")
    assert r.end_reason == "submitted" and r.answer.conversion == {"a": 0.25, "b": 0.5}
    obs = [s.observation for s in r.trajectory.steps]
    assert "[sql is a tool, so it stays one: the value this reply assigned to it is now " \
        "sql_result]" in obs[0]
    assert "DataFrame 2" in obs[1] and "is a tool" not in obs[1]
    # a later value replaces the one moved before; a name the model made is not overwritten
    assert "now sql_result]" in obs[2] and "now list_tables_result2]" in obs[2]
    assert "[submit is a tool, so it stays one: the value this reply assigned to it is now " \
        "submit_result]" in obs[2]
    assert "5 mine 7 ['segments']" in obs[3]
    assert "[list_tables is a tool, so it is back]" in obs[3]


def test_without_keep_tool_names_a_rebound_tool_stays_its_value() -> None:
    replies = [py("sql = sql('q')\nprint(len(sql))"), py("df = sql('q2')")]
    with ScriptedLLM(replies) as srv:
        r = agent(srv, budget=Budget(max_turns=2), aids=Aids(keep_tool_names=False)).run("t")
    obs = [s.observation for s in r.trajectory.steps]
    assert "is a tool" not in obs[0]
    assert "TypeError" in obs[1] and "not callable" in obs[1]


def test_what_the_guest_reports_of_kept_tools_is_checked_and_bounded() -> None:
    # the model's code can replace the guest's reporter: the host takes only [str, str] pairs
    fake = ("import memex_guest.door as door\n"
            "def __memex_keep_tools__():\n"
            "    door.request('agent.kept', [[['sql', 1], 'junk', ['x' * 500, 'y'], "
            "['a', 'b', 'c']]], {}, False)")
    replies = [py(fake), py("def __memex_keep_tools__():\n"
                            "    door.request('agent.kept', ['not a list of pairs'], {}, False)")]
    with ScriptedLLM(replies) as srv:
        r = agent(srv, budget=Budget(max_turns=2)).run("t")
    first, second = (s.observation for s in r.trajectory.steps)
    assert f"[{'x' * 100} is a tool, so it stays one: the value this reply assigned to it is " \
        "now y]" in first
    assert first.count("is a tool") == 1 and "is a tool" not in second
    assert r.end_reason == "max_turns"


def test_a_broken_reporter_loses_only_its_own_report() -> None:
    # both reports come from one guest call after the turn; the model's code can break either
    def observe(code: str) -> tuple[str, tuple[str, ...]]:
        with ScriptedLLM([py(code)]) as srv:
            step = agent(srv, budget=Budget(max_turns=1)).run("t").trajectory.steps[0]
        return step.observation, step.new_variables

    obs, new = observe("def __memex_keep_tools__():\n    raise ValueError('broken')\n"
                       "sql = sql('q')")
    assert "is a tool" not in obs and "sql: DataFrame" in obs and "sql" in new
    obs, new = observe("def __memex_new_variables__():\n    raise ValueError('broken')\n"
                       "list_tables = 3\nrows = 4")
    assert "[list_tables is a tool, so it stays one: the value this reply assigned to it is " \
        "now list_tables_result]" in obs
    assert "new variables" not in obs and new == ()


@pytest.mark.parametrize(("code", "name"), [
    ("rows = sql[sql['rate'] > 0]", "sql"),             # 'function' object is not subscriptable
    ("top = sql.head()", "sql"),                         # ... has no attribute 'head'
    ("x = 1\nfor t in list_tables:\n    print(t)", "list_tables"),  # ... is not iterable
    ("def f():\n    pass\nprint(f[0])", None),            # not a tool: no hint
    ("def f():\n    pass\nprint(sql('q'), f[0])", None),  # the tool is called on that line
])
def test_a_tool_used_as_its_own_result_is_explained(code: str, name: str | None) -> None:
    hint = (f"[{name} is a tool, not its result: call it, keep what it returns "
            f"(result = {name}(...)) and use that]")
    for explain in (True, False):
        with ScriptedLLM([py(code)]) as srv:
            r = agent(srv, budget=Budget(max_turns=1),
                      aids=Aids(explain_errors=explain)).run("t")
        obs = r.trajectory.steps[0].observation
        assert "'function' object" in obs, obs
        assert (hint in obs) is (explain and name is not None), obs
        assert name is not None or "is a tool, not" not in obs
