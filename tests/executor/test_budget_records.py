"""One budget checker (Caps.over) for a rollout's Budget and the tree's TreeBudget, and one
EndReason enum for every way a rollout ends."""

from __future__ import annotations

import json

import pytest

from memex import Budget, EndReason, TreeBudget
from memex.errors import ConfigError
from memex.executor import Caps


def test_both_budgets_are_caps_checked_by_one_checker() -> None:
    for b in (Budget(max_turns=3, max_tokens=100, max_seconds=5, max_cost=1.0),
              TreeBudget(max_turns=3, max_tokens=100, max_seconds=5, max_cost=1.0)):
        assert isinstance(b, Caps)
        assert b.over(turns=2, tokens=99, seconds=4.9, cost=0.99) is None
        assert b.over(turns=3) is EndReason.MAX_TURNS
        assert b.over(tokens=100) is EndReason.MAX_TOKENS
        assert b.over(seconds=5.0) is EndReason.MAX_SECONDS
        assert b.over(cost=1.0) is EndReason.MAX_COST
        assert b.over(turns=None, tokens=10**9) is EndReason.MAX_TOKENS  # turns not checked
        # the order when several ran out at once: turns, tokens, seconds, cost
        assert b.over(turns=9, tokens=10**9, seconds=99, cost=9) is EndReason.MAX_TURNS
        assert b.over(tokens=10**9, seconds=99, cost=9) is EndReason.MAX_TOKENS
    assert TreeBudget().over(turns=10**6, tokens=10**12, seconds=1e8, cost=1e9) is None


def test_caps_refuse_what_is_not_a_positive_number_naming_the_record() -> None:
    for cls in (Budget, TreeBudget):
        for bad in (0, -1, True, float("inf"), "5"):
            with pytest.raises(ConfigError, match=rf"{cls.__name__}.max_tokens must be > 0"):
                cls(max_tokens=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"Budget.max_turns must be an int >= 1"):
        Budget(max_turns=0)
    with pytest.raises(ConfigError, match=r"TreeBudget.max_depth"):
        TreeBudget(max_depth=-1)


def test_an_end_reason_says_which_cap_and_whose() -> None:
    assert EndReason.MAX_TOKENS.cap == EndReason.TREE_MAX_TOKENS.cap == "max_tokens"
    assert EndReason.MAX_COST.of_tree() is EndReason.TREE_MAX_COST
    assert EndReason.TREE_MAX_SECONDS.tree and not EndReason.MAX_SECONDS.tree
    assert EndReason.SUBMITTED.cap is None and EndReason.LLM_ERROR.cap is None
    with pytest.raises(ValueError):
        EndReason.CANCELLED.of_tree()
    # a str: compares, formats and serializes as its value
    assert EndReason.MAX_TURNS == "max_turns" and f"{EndReason.MAX_TURNS}" == "max_turns"
    assert json.dumps({"end": EndReason.TREE_MAX_TURNS}) == '{"end": "tree_max_turns"}'
    assert [e.cap for e in EndReason if e.cap] == ["max_turns", "max_tokens", "max_seconds",
                                                   "max_cost"] * 2
