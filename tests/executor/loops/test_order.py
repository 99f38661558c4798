"""Which later block defines a name a block used too early (the parse behind
``Aids.defer_forward_use``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memex.executor.loops._order import defined_by_later, missing_name


@pytest.mark.parametrize(("later", "found"), [
    ("count = 3", True),
    ("count: int = 3", True),
    ("count += 1", True),
    ("a, (b, count) = 1, (2, 3)", True),
    ("for count in range(3):\n    pass", True),
    ("with open('f') as count:\n    pass", True),
    ("def count():\n    return 1", True),
    ("class count:\n    pass", True),
    ("import numpy as count", True),
    ("import count.sub", True),
    ("from x import y as count", True),
    ("if True:\n    count = 1\nelse:\n    pass", True),
    ("try:\n    pass\nexcept Exception:\n    count = 0", True),
    ("print(count := 3)", True),
    ("print(count)", False),
    ("def f():\n    count = 1", False),   # a local of f, not the session's
    ("counts = 3", False),
    ("count = (", False),                  # does not parse
])
def test_what_binds_a_name(later: str, found: bool) -> None:
    blocks = ["submit({'n': count})", "x = 1", later]
    assert defined_by_later(blocks, 0, "count") == (2 if found else None)


def test_only_a_one_statement_block_is_deferred_and_only_to_a_later_block() -> None:
    assert defined_by_later(["# a comment\nsubmit(count)", "count = 1"], 0, "count") == 1
    assert defined_by_later(["x = 1\nsubmit(count)", "count = 1"], 0, "count") is None
    assert defined_by_later(["count = 1", "submit(count)"], 1, "count") is None
    assert defined_by_later(["submit(count", "count = 1"], 0, "count") is None


def test_the_missing_name_is_read_from_a_name_error_only() -> None:
    assert missing_name("NameError", "name 'count' is not defined") == "count"
    assert missing_name("NameError", "name 'x' is not defined. Did you mean: 'y'?") == "x"
    assert missing_name("KeyError", "name 'count' is not defined") is None
    assert missing_name("NameError", "free variable 'x' referenced") is None


@given(st.text(max_size=200), st.text(max_size=200))
def test_the_parse_never_raises_on_any_text(a: str, b: str) -> None:
    defined_by_later([a, b], 0, "x")
    missing_name("NameError", a)
