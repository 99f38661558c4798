"""What a rollout may spend (:class:`Budget`, and the :class:`Caps` it shares with the agent
tree's budget), why a rollout ended (:class:`EndReason`) and which help a small model gets
(:class:`Aids`): plain records shared by the agent, its run, the loops and the spawn tree."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from ..errors import ConfigError

__all__ = ["Aids", "Budget", "Caps", "EndReason"]

_CAPS = ("max_turns", "max_tokens", "max_seconds", "max_cost")


class EndReason(StrEnum):
    """Why a rollout ended (a ``str``: it compares and serializes as its value)."""

    SUBMITTED = "submitted"  # a valid answer was submitted
    MAX_TURNS = "max_turns"  # its own budget ran out: model calls...
    MAX_TOKENS = "max_tokens"  # ...prompt + completion tokens...
    MAX_SECONDS = "max_seconds"  # ...wall time...
    MAX_COST = "max_cost"  # ...USD
    TREE_MAX_TURNS = "tree_max_turns"  # the agent tree's budget ran out (TreeBudget)
    TREE_MAX_TOKENS = "tree_max_tokens"
    TREE_MAX_SECONDS = "tree_max_seconds"
    TREE_MAX_COST = "tree_max_cost"
    LLM_ERROR = "llm_error"  # a model call failed past its retries
    SANDBOX_ERROR = "sandbox_error"  # the sandbox could not go on
    CANCELLED = "cancelled"  # a sub-agent cancelled by its parent, or its parent ended
    ERROR = "error"  # a sub-agent that could not start
    RUNNING = "running"  # not ended yet
    INCOMPLETE = "incomplete"  # a trajectory file whose end event is missing (the run died)

    @property
    def cap(self) -> str | None:
        """The budget field that ran out (``max_tokens`` for both MAX_TOKENS and
        TREE_MAX_TOKENS), else None."""
        name = self.value.removeprefix("tree_")
        return name if name in _CAPS else None

    @property
    def tree(self) -> bool:
        """Whether the agent tree's budget (not the rollout's own) ran out."""
        return self.value.startswith("tree_")

    def of_tree(self) -> EndReason:
        """The same cap, run out in the tree's budget."""
        if self.cap is None:
            raise ValueError(f"{self.value} is not a budget's end")
        return EndReason(f"tree_{self.cap}")


@dataclass(frozen=True, kw_only=True)
class Caps:
    """The four things a rollout spends, each bounded or not (None): model calls, tokens,
    wall seconds and USD. :meth:`over` is the one checker; :class:`Budget` (one rollout) and
    ``TreeBudget`` (a root and its sub-agents) are Caps with more fields."""

    max_turns: int | None = None
    max_tokens: int | None = None
    max_seconds: float | None = None
    max_cost: float | None = None

    def __post_init__(self) -> None:
        for name in _CAPS:
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)
                                  or not 0 < v < math.inf):
                raise ConfigError(f"{type(self).__name__}.{name} must be > 0 or None, "
                                  f"got {v!r}")

    def over(self, *, turns: int | None = None, tokens: int = 0, seconds: float = 0.0,
             cost: float | None = None) -> EndReason | None:
        """The first cap reached by what was spent (``turns`` None: not checked here), in
        the order turns, tokens, seconds, cost; None while all hold."""
        if turns is not None and self.max_turns is not None and turns >= self.max_turns:
            return EndReason.MAX_TURNS
        if self.max_tokens is not None and tokens >= self.max_tokens:
            return EndReason.MAX_TOKENS
        if self.max_seconds is not None and seconds >= self.max_seconds:
            return EndReason.MAX_SECONDS
        if self.max_cost is not None and cost is not None and cost >= self.max_cost:
            return EndReason.MAX_COST
        return None


@dataclass(frozen=True, kw_only=True)
class Budget(Caps):
    """When a rollout stops without an answer (None: no bound). ``max_turns`` counts model
    calls (turns; one more when a submit is rejected on the last turn, see
    ``Aids.grace_turn``)."""

    max_turns: int = 12

    def __post_init__(self) -> None:
        if isinstance(self.max_turns, bool) or not isinstance(self.max_turns, int) \
                or self.max_turns < 1:
            raise ConfigError(f"Budget.max_turns must be an int >= 1, got {self.max_turns!r}")
        super().__post_init__()


@dataclass(frozen=True, kw_only=True)
class Aids:
    """Help for small models, each switchable so its effect can be measured (bench/agent.py,
    ``memex eval``): a worked example in the prompt (built from the rollout's real tools
    and answer shape), a nudge after a reply with no code, a note when a reply repeats an
    earlier one verbatim, a preview of the variables a block created, a reminder to submit
    when few turns remain, stop sequences that cut a reply where the model starts writing
    the output it imagines its code will print, and re-asking (seeded, at
    ``repeat_temperature``) when a reply repeats an earlier failed one: at temperature 0 a
    small model copies its failing block turn after turn, and every copy left in the
    context makes the next one likelier, so a repeat is asked again before it runs and only
    a fresh reply (or the last try) enters the context. Errors are explained (a NameError
    with the names that do exist; a tool used as if it were its result with how to call it;
    a rejected submit with the type each field got and how to convert it); a submit
    rejected on the last turn gets one more turn; the text after a reply's last code block,
    which never runs and is often the model writing the user's side, is left out of the
    context; pandas prints frames up to 160 characters wide instead of folding their
    columns into "..."; in tool calling, a submit that comes in the same reply as other
    calls is not run (its arguments were written before their results existed); in code, a
    one-statement block that fails on a name a later block of the same reply defines
    (``submit({"count": count})`` above the block computing ``count``) runs again after
    that block instead of stopping the reply; in code, a tool (or ``submit``) that a reply
    rebinds (``orders = orders()``: every later call then fails) is put back after the
    reply, its value kept as ``orders_result``, and the observation says so."""

    example: bool = True
    example_from_tools: bool = True  # the example uses the rollout's tools and answer shape
    explain_errors: bool = True  # NameError: what is defined; rejected submit: what was sent
    grace_turn: bool = True  # a submit rejected on the last turn gets one more turn
    cut_after_code: bool = True  # drop a reply's text after its last code block
    wide_tables: bool = True  # pandas prints frames up to 160 characters wide, not folded
    hold_blind_submit: bool = True  # tool calling: a submit after other calls in one reply waits
    defer_forward_use: bool = True  # a block using a name a later block defines runs after it
    keep_tool_names: bool = True  # a tool a reply rebinds comes back; the value moves
    nudge: bool = True
    repeat_note: bool = True
    preview_variables: bool = True
    submit_reminder: bool = True
    stop_sequences: bool = True  # end a reply where a model starts inventing the output
    resample_repeats: bool = True
    repeat_temperature: float = 0.8
    resample_tries: int = 2

    def __post_init__(self) -> None:
        if not 0.0 < self.repeat_temperature <= 2.0:
            raise ConfigError("Aids.repeat_temperature must be in (0, 2]")
        if not 0 <= self.resample_tries <= 10:
            raise ConfigError("Aids.resample_tries must be between 0 and 10")
