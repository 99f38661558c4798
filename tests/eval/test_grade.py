"""The graders on their edge cases, and properties that hold for any JSON-like value."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memex.errors import ConfigError
from memex.eval import grade
from memex.eval.internal import normalise_text


@pytest.mark.parametrize(("got", "want", "kind", "ok"), [
    ("  North  America. ", "north america", "exact", True),
    ("'Enterprise'", "Enterprise", "exact", True),
    ("Mid Market", "Mid-Market", "exact", False),
    (3, 3.0, "exact", True),
    (3.0000001, 3, "exact", False),
    (True, 1, "exact", False),  # a bool is not a number
    (1, True, "exact", False),
    (None, None, "exact", True),
    (None, 0, "numeric", False),
    ("42", 42, "numeric", False),  # the schema says what a number is
    (100.005, 100.0, "numeric", True),  # within 1e-4 relative
    (100.02, 100.0, "numeric", False),
    (0.00005, 0.0, "numeric", True),  # absolute below 1
    (float("nan"), 1.0, "numeric", False),
    ([1, 2, 3], [1, 2, 3], "exact", True),
    ([3, 2, 1], [1, 2, 3], "exact", False),
    ([3, 2, 1], [1, 2, 3], "set", True),
    (["b", "a", "a"], ["A", "B"], "set", True),  # repeats and case ignored
    (["a"], ["a", "b"], "set", False),
    (["a", "b", "c"], ["a", "b"], "set", False),
    ({"Web": 3, "sales ": 2}, {"web": 3, "sales": 2}, "dict", True),
    ({"web": 3}, {"web": 3, "sales": 2}, "dict", False),  # a missing key fails
    ({"web": 3, "sales": 2, "x": 0}, {"web": 3, "sales": 2}, "dict", False),  # an extra too
    ({"a": {"b": [1.00001]}}, {"a": {"b": [1]}}, "numeric", True),
    ({"a": 1}, [("a", 1)], "exact", False),
    ("x", {"a": 1}, "dict", False),
])
def test_graders(got: Any, want: Any, kind: str, ok: bool) -> None:
    assert grade(got, want, kind, tolerance=1e-4) is ok


def test_tolerance_is_relative_to_the_reference() -> None:
    assert grade(1_000_100, 1_000_000, "numeric", tolerance=1e-4)
    assert not grade(1_000_200, 1_000_000, "numeric", tolerance=1e-4)
    assert not grade(1.5, 1.0, "numeric", tolerance=0)


def test_bad_grader_settings_are_refused() -> None:
    with pytest.raises(ConfigError, match="unknown grader"):
        grade(1, 1, "fuzzy")
    with pytest.raises(ConfigError, match="tolerance"):
        grade(1, 1, "numeric", tolerance=-1)
    with pytest.raises(ConfigError, match="mapping"):
        grade(1, 1, "dict")


def test_normalise_text() -> None:
    assert normalise_text("  The\tAnswer:  ") == "the answer"
    assert normalise_text("\"Self-Serve\".") == "self-serve"


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6)
    | st.floats(allow_nan=False, allow_infinity=False, width=32) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner,
                                                                max_size=4),
    max_leaves=12)


@given(_json, st.sampled_from(["exact", "numeric", "set"]))
def test_every_value_matches_itself(v: Any, kind: str) -> None:
    assert grade(v, v, kind)


@given(_json, _json)
def test_grading_never_raises(a: Any, b: Any) -> None:
    for kind in ("exact", "numeric", "set"):
        assert isinstance(grade(a, b, kind), bool)


def test_deep_nesting_is_bounded() -> None:
    v: Any = 1
    for _ in range(100):
        v = [v]
    # past the depth bound (32) nothing matches, and nothing recurses without end
    assert grade(v, v) is False


def test_a_reference_the_agent_could_not_submit_is_refused_when_the_workspace_is_built(
) -> None:
    """A scalar reference under an object schema would grade every answer wrong: the
    workspace refuses it, naming the task; a fitting reference (positive control) builds."""
    import pydantic

    from memex.errors import ConfigError
    from memex.eval import EvalTask, Workspace

    class Total(pydantic.BaseModel):
        total: int

    schema = {"type": "object", "properties": {"total": {"type": "integer"}},
              "required": ["total"]}
    Workspace(tasks=(EvalTask(id="ok", question="q", answer=Total, reference={"total": 3}),
                     EvalTask(id="js", question="q", answer=schema, reference={"total": 3}),
                     EvalTask(id="any", question="q", answer=None, reference=3)))
    for answer in (Total, schema):
        with pytest.raises(ConfigError, match=r"task 'bad': its reference 3 does not fit"):
            Workspace(tasks=(EvalTask(id="bad", question="q", answer=answer, reference=3),))
