"""The one config style of the front ends' files (serve.toml, the MCP config): pydantic models
that refuse unknown keys and values of the wrong type (no str-to-int coercion), sizes and
durations in the runtime's one grammar, and errors that name the table and the key."""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError

from ..errors import ConfigError
from ..runtime_wasm import Limits, parse_seconds, parse_size

__all__ = ["FileModel", "LimitsTable", "Seconds", "SecondsOrZero", "Size", "config_error"]



class FileModel(BaseModel):
    """The base of a config file's tables: unknown keys refused, no coercion between types
    (``port = '80'`` is an error, not 80), frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def _field(parse: Callable[..., Any]) -> Callable[[object], Any]:
    """The runtime's parser as a pydantic validator (its ConfigError a ValueError, so that
    pydantic names the table and the key)."""
    def validate(value: object) -> Any:
        if value is None:
            return None
        try:
            return parse(value, what="")
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
    return validate


_size = _field(parse_size)
_seconds = _field(parse_seconds)


def _seconds_or_zero(value: object) -> Any:
    if value == 0 and not isinstance(value, bool):
        return 0.0
    try:
        return _seconds(value)
    except ValueError:
        raise ValueError(f"expected seconds >= 0 such as 0, 30 or '500ms', got "
                         f"{value!r:.80}") from None


Size = Annotated[int, BeforeValidator(_size)]  # bytes, or '512M'
Seconds = Annotated[float, BeforeValidator(_seconds)]  # > 0, or '500ms', '2min'
SecondsOrZero = Annotated[float, BeforeValidator(_seconds_or_zero)]  # 0 means "at once"


class LimitsTable(FileModel):
    """A table of :class:`~memex.Limits` fields in a config file, each optional: what is
    left out comes from elsewhere (the defaults, a ceiling). :meth:`limits` builds them with
    :meth:`Limits.from_mapping`, the one reader every entry point shares."""

    timeout: Seconds | None = None
    memory: Size | None = None
    fuel: int | None = None
    fuel_total: int | None = None
    stdout_bytes: Size | None = None
    stderr_bytes: Size | None = None
    idle_timeout: Seconds | None = None
    lifetime: Seconds | None = None
    disk_bytes: Size | None = None
    disk_files: int | None = None
    open_files: int | None = None

    def given(self) -> dict[str, Any]:
        """The fields the file sets."""
        return self.model_dump(exclude_unset=True)

    def limits(self, *, base: Limits | None = None, where: str = "limits") -> Limits:
        return Limits.from_mapping(self.given(), base=base, where=where)


def _inner(annotation: object) -> Any:
    """The model or mapping inside ``X | None`` and ``Annotated[X, ...]``."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(args) != 1:
                return annotation
            annotation = args[0]
        else:
            return annotation


def _known(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The keys the table at ``loc`` (a path into ``model``) accepts."""
    current: Any = model
    parts = list(loc)
    while parts:
        current = _inner(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(parts.pop(0)))
            if field is None:
                return []
            current = field.annotation
        elif typing.get_origin(current) in (dict, list):
            parts.pop(0)
            current = typing.get_args(current)[-1]
        else:
            return []
    current = _inner(current)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return sorted(current.model_fields)
    return []


def config_error(source: str | None, model: type[BaseModel], exc: ValidationError,
                 style: str = "toml") -> ConfigError:
    """One ConfigError naming every problem by table and key: ``[tenants.a.ceiling] memroy:
    unknown key (known: ...)``; ``style="dotted"`` writes ``limits.memory``."""
    problems = []
    for e in exc.errors(include_url=False):
        loc = tuple(e["loc"])
        if style == "toml" and len(loc) > 1:
            where = f"[{'.'.join(str(x) for x in loc[:-1])}] {loc[-1]}"
        else:
            where = ".".join(str(x) for x in loc) or "(top)"
        if e["type"] == "extra_forbidden":
            known = _known(model, loc[:-1])
            msg = f"unknown key (known: {', '.join(known)})" if known else "unknown key"
        else:
            msg = str(e["msg"]).removeprefix("Value error, ")
            if "input" in e and e["type"] not in ("missing", "value_error"):
                msg += f", got {e['input']!r:.60}"
        problems.append(f"{where}: {msg}")
    return ConfigError(f"{source}: " * bool(source) + "; ".join(problems))
