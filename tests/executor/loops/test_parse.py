"""Reading replies: fenced code and tool calls written as text."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from memex.executor.loops._parse import extract_code, extract_tool_calls


def test_python_blocks_in_order() -> None:
    text = "Let me look.\n```python\nx = 1\n```\nthen\n```py\nprint(x)\n```\n"
    assert extract_code(text) == ["x = 1\n", "print(x)\n"]


def test_untagged_block_counts_only_without_tagged_ones() -> None:
    assert extract_code("```\nprint(1)\n```") == ["print(1)\n"]
    assert extract_code("```\nnot this\n```\n```python\nprint(2)\n```") == ["print(2)\n"]


def test_unclosed_last_block_counts() -> None:
    assert extract_code("ok\n```python\nprint(3)\n") == ["print(3)\n"]


def test_other_languages_and_json_are_not_code() -> None:
    assert extract_code("```sql\nSELECT 1\n```") == []
    assert extract_code('```\n{"name": "sql", "arguments": {}}\n```') == []
    assert extract_code("no code here") == []


def test_pasted_session_prompts_are_stripped() -> None:
    assert extract_code("```python\n>>> x = 2\n>>> x\n2\n```") == ["x = 2\nx\n"]


def test_longer_fences_and_tildes() -> None:
    text = "````python\nprint('```')\n````\n~~~python\ny = 1\n~~~"
    assert extract_code(text) == ["print('```')\n", "y = 1\n"]


def test_tool_calls_in_json_fences_and_tags() -> None:
    text = '```json\n{"name": "sql", "arguments": {"query": "SELECT 1"}}\n```'
    [c] = extract_tool_calls(text)
    assert (c.name, json.loads(c.arguments), c.source) == ("sql", {"query": "SELECT 1"},
                                                          "json_fence")
    text = '<tool_call>\n{"name": "a", "arguments": "{\\"x\\": 1}"}\n</tool_call> and ' \
           '<tool_call>{"name": "b", "parameters": {}}</tool_call>'
    calls = extract_tool_calls(text)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("a", {"x": 1}), ("b", {})]


def test_bare_json_list_and_openai_shape() -> None:
    text = '[{"function": {"name": "f", "arguments": "{}"}}, {"name": "g", "arguments": {}}]'
    assert [c.name for c in extract_tool_calls(text)] == ["f", "g"]


def test_bad_arguments_are_reported_not_raised() -> None:
    [c] = extract_tool_calls('{"name": "f", "arguments": "[1, 2]"}')
    assert c.error and "not a JSON object" in c.error
    assert extract_tool_calls('{"arguments": {}}') == []  # no name: not a call
    assert extract_tool_calls("```json\n{broken\n```") == []  # a JSON fence may be data
    # a block marked as a tool call is one: unreadable, it is an error call, not nothing
    [c] = extract_tool_calls("<tool_call>{broken</tool_call>")
    assert c.error and "not valid JSON" in c.error and c.arguments == "{broken"
    [c] = extract_tool_calls("```tool_call\n{broken\n```")
    assert c.error and "not valid JSON" in c.error
    [c] = extract_tool_calls('<tool_call>{"arguments": {}}</tool_call>')
    assert c.error and "needs a" in c.error


@given(st.text())
def test_parsers_never_raise(text: str) -> None:
    assert isinstance(extract_code(text), list)
    assert isinstance(extract_tool_calls(text), list)


@given(st.lists(st.text(alphabet=st.characters(blacklist_characters="`~\r"), min_size=1)
                .filter(lambda s: s.strip() and not s.lstrip().startswith(">>>")),
                min_size=1, max_size=4))
def test_code_round_trips_through_fences(bodies: list[str]) -> None:
    text = "".join(f"step {i}\n```python\n{b}\n```\n" for i, b in enumerate(bodies))
    assert extract_code(text) == [b.strip("\n") + "\n" for b in bodies]


@given(st.dictionaries(st.text(min_size=1), st.integers() | st.text()), st.text(min_size=1))
def test_tool_call_json_round_trips(args: dict[str, object], name: str) -> None:
    text = "```json\n" + json.dumps({"name": name, "arguments": args}) + "\n```"
    [c] = extract_tool_calls(text)
    assert c.name == name and json.loads(c.arguments) == args


def test_traceback_trim_keeps_cells_and_the_raising_frame() -> None:
    from memex.executor.loops._observe import trim_traceback

    tb = ('Traceback (most recent call last):\n'
          '  File "/lib/pandas/base.py", line 3641, in get_loc\n'
          "KeyError: 'segment'\n\n"
          "The above exception was the direct cause of the following exception:\n\n"
          "Traceback (most recent call last):\n"
          '  File "<cell-3>", line 12, in <module>\n'
          "    x = rates['segment']\n"
          '  File "/lib/pandas/series.py", line 959, in __getitem__\n'
          '  File "/lib/pandas/series.py", line 1046, in _get_value\n'
          '  File "/lib/pandas/base.py", line 3648, in get_loc\n'
          "KeyError: 'segment'\n")
    assert trim_traceback(tb) == (
        "Traceback (most recent call last):\n"
        '  File "<cell-3>", line 12, in <module>\n'
        "    x = rates['segment']\n"
        "  [... 2 library frames ...]\n"
        '  File "/lib/pandas/base.py", line 3648, in get_loc\n'
        "KeyError: 'segment'")
    assert trim_traceback("ValueError: x") == "ValueError: x"


def test_traceback_trim_drops_memex_plumbing_silently() -> None:
    from memex.executor.loops._observe import trim_traceback

    tb = ("Traceback (most recent call last):\n"
          '  File "<cell-5>", line 1, in <module>\n'
          "    submit({'total': 'x'})\n"
          '  File "<memex-agent-prelude>", line 43, in submit\n'
          "    raise tools.error_from_map(exc.error, 'submit') from None\n"
          '  File "/memex/site/memex_guest/tools.py", line 386, in call\n'
          "    raise error_from_map(exc.error, name) from None\n"
          "memex_guest.tools.ToolArgumentError: invalid arguments for submit\n")
    assert trim_traceback(tb) == (
        "Traceback (most recent call last):\n"
        '  File "<cell-5>", line 1, in <module>\n'
        "    submit({'total': 'x'})\n"
        "memex_guest.tools.ToolArgumentError: invalid arguments for submit")
