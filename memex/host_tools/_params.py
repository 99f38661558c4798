"""What a tool's parts are made of, shared by both ways of defining one (``_tool`` from a
typed callable, ``_schema`` from an OpenAI definition): parameters as the guest sees them, the
checker protocol and the validation failures it raises."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from ..errors import MemexError, ToolDefinitionError

__all__ = ["ArgumentsInvalid", "Checker", "ParamKind", "ReturnInvalid", "ToolParam", "is_async"]

ParamKind = Literal["positional_only", "positional_or_keyword", "keyword_only"]


class ArgumentsInvalid(MemexError):
    """Validation of a call's arguments failed; ``errors`` are ``{"path", "message"}`` maps."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__("; ".join(_fmt(e) for e in errors))
        self.errors = errors


class ReturnInvalid(ArgumentsInvalid):
    """The handler's value violates the declared return type."""


def _fmt(err: Mapping[str, Any]) -> str:
    path = ".".join(str(p) for p in err.get("path", ()))
    return f"{path}: {err['message']}" if path else str(err["message"])


class Checker(Protocol):
    """What validates a tool's calls: its arguments, its return, and its JSON Schema."""

    def arguments(self, given: dict[str, Any]) -> dict[str, Any]: ...
    def returns(self, value: object) -> Any: ...
    def json_schema(self) -> dict[str, Any]: ...


@dataclass(frozen=True, kw_only=True)
class ToolParam:
    """One parameter as the guest sees it: ``name`` is the key in the arguments map,
    ``py_name`` the parameter name of the guest function (differs only for names that are no
    Python identifier, from JSON Schemas)."""

    name: str
    py_name: str
    kind: ParamKind = "positional_or_keyword"
    annotation: Any = Any
    required: bool = True
    default: Any = None
    description: str = ""


def is_async(fn: object) -> bool:
    """Whether calling ``fn`` gives a coroutine (async generators are refused)."""
    if inspect.isasyncgenfunction(fn):
        raise ToolDefinitionError(f"{fn!r}: async generators cannot be tools")
    call = getattr(fn, "__call__", None)  # noqa: B004 - callable objects with async __call__
    return inspect.iscoroutinefunction(fn) or (
        not inspect.isfunction(fn) and inspect.iscoroutinefunction(call))
