"""What a loop's turn needs from the rollout it runs in, as two small protocols: the rollout
(:class:`TurnContext`: the conversation, model calls, budgets, repeat bookkeeping) and its
sandbox session (:class:`TurnSession`). The executor's ``Run`` and ``AgentSession`` implement
them; a loop never sees more of a rollout than this.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from ...runtime_wasm import TurnResult
from .._config import Aids
from .._session import HostCall
from .._trajectory import ToolCallInfo
from ..llm import Completion

__all__ = ["TurnContext", "TurnSession"]


class TurnSession(Protocol):
    """The rollout's sandbox, as a turn uses it."""

    @property
    def submitted(self) -> bool: ...

    def run(self, code: str, *, timeout: float | None = None) -> TurnResult: ...

    def after_turn(self, *, keep_tools: bool, variables: bool
                   ) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]: ...

    def call_tool(self, name: str, arguments: Mapping[str, Any]) -> HostCall: ...


class TurnContext(Protocol):
    """The rollout a turn belongs to."""

    messages: list[dict[str, Any]]
    """The conversation: a turn appends the model's reply and the observation."""

    variables: dict[str, str]
    """Names the rollout's blocks have bound so far, each with a short description."""

    @property
    def aids(self) -> Aids: ...

    @property
    def observation_chars(self) -> int:
        """The bound on one observation (characters)."""
        ...

    @property
    def native_code(self) -> bool:
        """Code comes as native ``python`` function calls rather than fenced blocks."""
        ...

    @property
    def turn(self) -> int:
        """The index of the turn being run (turns finished so far)."""
        ...

    def complete(self, key_of: Callable[[Completion], str | None], **kwargs: Any
                 ) -> tuple[Completion, dict[str, Any]]:
        """The model's reply (asked again while ``key_of(reply)`` names an earlier failed
        reply) and the usage of every call made for it, as ``Step`` fields."""
        ...

    def tool_definitions(self) -> list[dict[str, Any]]:
        """The JSON function tools of the tool-calling action space."""
        ...

    def seen(self, key: str) -> bool:
        """An earlier turn's reply had this repeat key."""
        ...

    def remember(self, key: str, outcome: str, message: dict[str, Any] | None, *,
                 failed: bool) -> None:
        """How this turn's reply ended (its message may later be taken out of the context);
        ``failed``: the same reply would fail again."""
        ...

    def take_calls(self, kind: str = "code") -> tuple[ToolCallInfo, ...]:
        """The tool calls made since the last take, as trajectory records."""
        ...

    def drop_calls(self) -> None:
        """Forget the tool calls made since the last take (recorded by the loop itself)."""
        ...

    def turn_timeout(self) -> float | None:
        """The wall-time bound for code run now (None: the sandbox's own limit)."""
        ...

    def reminder(self, *, rejected: bool = False) -> str:
        """A note to append to the observation when few turns remain ("" otherwise);
        ``rejected``: this turn's submit was rejected (on the last turn, one more is given)."""
        ...

    def submit_hint(self, blocks: list[str]) -> str:
        """For a repeat of code that worked: how the last plain value those blocks assign
        would be submitted in the answer's shape, or ""."""
        ...

    def explain(self, status: str, error: str | None, text: str) -> str:
        """A line that explains this turn's failure from what the host knows (the answer
        schema, the names that exist), or "" (see ``Aids.explain_errors``)."""
        ...
