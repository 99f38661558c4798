"""The one config style of the front ends' files (serve.toml, the MCP config): pydantic models
that refuse unknown keys and values of the wrong type (no str-to-int coercion), sizes and
durations in the runtime's one grammar, and errors that name the table and the key."""

from __future__ import annotations

import os
import tomllib
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, create_model
from pydantic.json_schema import SkipJsonSchema

from ..errors import ConfigError
from ..runtime_wasm import Limits
from ..runtime_wasm.internal import LIMIT_FIELDS, LimitField, parse_seconds, parse_size

__all__ = ["FileModel", "LimitsModel", "LimitsTable", "Seconds", "SecondsOrZero", "Size",
           "config_error", "limits_model", "read_toml"]



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


class LimitsModel(FileModel):
    """The base of every model of :class:`~memex.Limits` fields (a config file's table, a
    request body): the fields themselves are made from :data:`~memex.runtime_wasm.LIMIT_FIELDS`
    by :func:`limits_model`, never written out again."""

    def given(self) -> dict[str, Any]:
        """The fields the input sets."""
        return self.model_dump(exclude_unset=True)

    def limits(self, *, base: Limits | None = None, where: str = "limits") -> Limits:
        """These fields over ``base`` (unset and None-valued bounded fields from it), read by
        :meth:`Limits.from_mapping`, the one reader every entry point shares."""
        given = self.model_dump(exclude_unset=True)
        for name, value in self.model_dump().items():  # a default this model sets
            if name not in given and value is not None:
                given[name] = value
        return Limits.from_mapping(given, base=base, where=where)


def integral(value: Any) -> Any:
    """JSON Schema's integer: 5.0 is one (its value is integral), so it is taken as 5; any
    other type still meets the strict check (``true`` and ``"5"`` are not integers)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2 ** 63:
        return int(value)
    return value


def _wire_type(f: LimitField) -> Any:
    bounds: dict[str, float] = {"gt" if f.low_open else "ge": f.low,
                                "lt" if f.high_open else "le": f.high}
    if f.kind == "seconds":
        return Annotated[float, Field(**bounds)]  # type: ignore[call-overload]
    ints = {k: int(v) for k, v in bounds.items()}
    return Annotated[Annotated[int, Field(**ints)], BeforeValidator(integral)]  # type: ignore[call-overload]


def _file_type(f: LimitField) -> Any:
    return {"seconds": Seconds, "bytes": Size, "count": int}[f.kind]


M = TypeVar("M", bound=BaseModel)


def limits_model(name: str, base: type[M], *, style: Literal["file", "wire"] = "file",
                 defaults: Mapping[str, Any] | None = None, doc: str = "") -> type[M]:
    """A model of every :class:`~memex.Limits` field, made from ``LIMIT_FIELDS``: each
    optional (unset: the reader's base, or ``defaults``). ``style="file"``: a config table,
    sizes and durations in the one grammar (``'512M'``, ``'2min'``), ranges checked by
    Limits itself. ``style="wire"``: a JSON body, numbers only, each field's range stated in
    the schema (what Limits admits), null only where Limits takes None."""
    defaults = dict(defaults or {})
    unknown = sorted(set(defaults) - {f.name for f in LIMIT_FIELDS})
    if unknown:
        raise ConfigError(f"{name}: defaults for unknown Limits fields {unknown}")
    fields: dict[str, Any] = {}
    for f in LIMIT_FIELDS:
        kind = _wire_type(f) if style == "wire" else _file_type(f)
        # a bounded field on the wire: null is not in the document, and is refused when sent
        nothing: Any = None if f.nullable or style == "file" \
            else SkipJsonSchema[None]  # type: ignore[misc]
        annotation = kind | nothing
        default = defaults.get(f.name)
        fields[f.name] = (annotation, Field(default=default, description=f.doc))
    model: type[M] = create_model(name, __base__=base, __doc__=doc or None,
                                  __module__=base.__module__, **fields)
    return model


if TYPE_CHECKING:
    LimitsTable = LimitsModel
else:
    LimitsTable = limits_model(
        "LimitsTable", LimitsModel, doc="A table of :class:`~memex.Limits` fields in a config "
        "file, each optional: what is left out comes from elsewhere (the defaults, a "
        "ceiling).")


def read_toml(path: str | os.PathLike[str], what: str = "file") -> dict[str, Any]:
    """A config file's tables: the one reading of serve.toml and the MCP config (a file that
    cannot be read, or is not TOML, is a ConfigError naming it)."""
    try:
        return tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the {what}: {exc.strerror}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc


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
