"""Tool definitions: a typed Python callable (``@tool`` / :meth:`Tool.from_function`) or an
OpenAI function-tool definition plus a handler (:meth:`Tool.from_openai`).

A tool owns the checks of its calls: arguments are validated before the handler runs (a
pydantic model built from the signature, or the JSON Schema for OpenAI tools) and the return
is validated against the declared return type, so a guest never receives a value its stub did
not promise.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, overload

import pydantic
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from ..errors import ToolDefinitionError
from ._docstrings import parse_docstring
from ._params import (
    ArgumentsInvalid,
    Checker,
    ParamKind,
    ReturnInvalid,
    ToolParam,
    is_async,
)
from ._schema import openai_tool
from ._types import numpy_pandas_name

__all__ = ["NO_RETURN", "Tool", "tool"]

_KINDS: dict[Any, ParamKind] = {
    inspect.Parameter.POSITIONAL_ONLY: "positional_only",
    inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional_or_keyword",
    inspect.Parameter.KEYWORD_ONLY: "keyword_only",
}
NO_RETURN = inspect.Parameter.empty  # a tool without a declared return type
_ARBITRARY = ConfigDict(arbitrary_types_allowed=True)


@dataclass(frozen=True, kw_only=True, eq=False)
class Tool:
    """A host function offered to the guest. Calling it calls the handler directly.

    ``timeout`` bounds one call (never past the turn's deadline); ``inline=True`` runs a sync
    handler on the guest's own thread (no hand-off: fastest, but then nothing can stop it, so
    only for handlers that cannot block)."""

    name: str
    handler: Callable[..., Any] = field(repr=False)
    summary: str = ""
    description: str = ""
    params: tuple[ToolParam, ...] = ()
    returns: Any = NO_RETURN
    returns_doc: str = ""
    is_async: bool = False
    timeout: float | None = None
    inline: bool = False
    origin: Literal["function", "openai", "mcp"] = "function"
    checker: Checker = field(repr=False)
    openai: dict[str, Any] | None = field(default=None, repr=False)
    # Hints about what calling it does, in MCP's vocabulary (readOnlyHint, destructiveHint,
    # idempotentHint, openWorldHint, title): what a gate may decide on. Untrusted when they
    # come from a server MemEx does not control.
    annotations: Mapping[str, Any] = field(default_factory=dict, repr=False)
    # Record classes its values may hold that its return annotation does not name (an MCP
    # tool's images, for one): the guest stub defines them too, so they arrive typed.
    records: tuple[type, ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        _check_name(self.name)
        if self.timeout is not None and not self.timeout > 0:
            raise ToolDefinitionError(f"tool {self.name!r}: timeout must be > 0")
        if self.inline and self.is_async:
            raise ToolDefinitionError(f"tool {self.name!r}: inline= is for sync handlers")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.handler(*args, **kwargs)

    def renamed(self, name: str) -> Tool:
        """The same tool under another name (e.g. with a ToolSet prefix)."""
        return dataclasses.replace(self, name=name)

    def invoke(self, arguments: Mapping[str, Any]) -> Any:
        """Call the handler with validated arguments (a coroutine for async handlers)."""
        if self.params and self.params[0].kind == "positional_only":
            args = [arguments[p.name] for p in self.params
                    if p.kind == "positional_only" and p.name in arguments]
            kwargs = {k: v for k, v in arguments.items()
                      if k not in {p.name for p in self.params[: len(args)]}}
            return self.handler(*args, **kwargs)
        return self.handler(**arguments)

    def to_openai(self) -> dict[str, Any]:
        """This tool as an OpenAI function-tool definition (for JSON tool calling)."""
        if self.openai is not None:
            return {"type": "function", "function": dict(self.openai)}
        desc = "\n\n".join(x for x in (self.summary, self.description) if x)
        return {"type": "function", "function": {"name": self.name, "description": desc,
                                                  "parameters": self.checker.json_schema()}}

    # ---- constructors -----------------------------------------------------------------------
    @classmethod
    def from_function(cls, fn: Callable[..., Any], *, name: str | None = None,
                      description: str | None = None, timeout: float | None = None,
                      inline: bool = False) -> Tool:
        """A tool from a typed callable with a Google-style docstring (``Args:`` entries
        describe parameters). ``*args``/``**kwargs`` are refused: the guest stub needs names."""
        if isinstance(fn, Tool):
            return fn
        if not callable(fn):
            raise ToolDefinitionError(f"a tool needs a callable, got {type(fn).__name__}")
        tname = name if name is not None else getattr(fn, "__name__", None)
        if not isinstance(tname, str) or tname == "<lambda>":
            raise ToolDefinitionError(f"{fn!r} has no usable name: pass name=")
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError) as exc:
            raise ToolDefinitionError(f"tool {tname!r}: no signature ({exc})") from exc
        hints = _hints(fn, tname)
        doc = parse_docstring(inspect.getdoc(fn))
        params: list[ToolParam] = []
        for p in sig.parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise ToolDefinitionError(
                    f"tool {tname!r}: *{p.name} / **{p.name} cannot be described to the guest")
            ann = hints.get(p.name, Any if p.annotation is p.empty else p.annotation)
            params.append(ToolParam(
                name=p.name, py_name=p.name if p.name != "_mx" else "_mx_",
                kind=_KINDS[p.kind], annotation=ann,
                required=p.default is p.empty,
                default=None if p.default is p.empty else p.default,
                description=_annotated_description(ann) or doc.params.get(p.name, ""),
            ))
        ret = hints.get("return", NO_RETURN if sig.return_annotation is sig.empty
                        else sig.return_annotation)
        summary, text = doc.summary, doc.description
        if description is not None:
            summary, _, text = description.strip().partition("\n")
            text = text.strip()
        return cls(name=tname, handler=fn, summary=summary, description=text,
                   params=tuple(params), returns=ret, returns_doc=doc.returns,
                   is_async=is_async(fn), timeout=timeout, inline=inline,
                   checker=_PydanticChecker(tname, params, ret))

    @classmethod
    def from_openai(cls, definition: Mapping[str, Any], handler: Callable[..., Any], *,
                    timeout: float | None = None, inline: bool = False,
                    returns_schema: Mapping[str, Any] | None = None) -> Tool:
        """A tool from ``{"type": "function", "function": {name, description, parameters}}``
        (or the inner ``function`` map); the handler is called as ``handler(**arguments)``
        with arguments validated against ``parameters`` (JSON Schema). ``returns_schema``, if
        given, validates the handler's value the same way."""
        return openai_tool(cls, definition, handler, timeout=timeout, inline=inline,
                           returns_schema=returns_schema)


F = TypeVar("F", bound=Callable[..., Any])


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...
@overload
def tool(*, name: str | None = None, description: str | None = None,
         timeout: float | None = None, inline: bool = False) -> Callable[[Callable[..., Any]],
                                                                           Tool]: ...
def tool(fn: Callable[..., Any] | None = None, /, *, name: str | None = None,
         description: str | None = None, timeout: float | None = None,
         inline: bool = False) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Decorator: ``@tool`` or ``@tool(name=..., timeout=...)`` makes a :class:`Tool` (still
    callable on the host)."""
    def make(f: Callable[..., Any]) -> Tool:
        return Tool.from_function(f, name=name, description=description, timeout=timeout,
                                  inline=inline)
    return make(fn) if fn is not None else make


# ---- helpers ----------------------------------------------------------------------------------
def _check_name(name: object) -> None:
    if not isinstance(name, str) or not name or len(name) > 128:
        raise ToolDefinitionError(f"a tool name is a string of 1 to 128 characters, got "
                                  f"{name!r}")
    if not name.isprintable() or any(c.isspace() for c in name):
        raise ToolDefinitionError(f"tool name {name!r} has whitespace or control characters")


def _hints(fn: object, name: str) -> dict[str, Any]:
    target = fn
    if not (inspect.isfunction(fn) or inspect.ismethod(fn)) and callable(fn):
        target = getattr(fn, "__init__" if isinstance(fn, type) else "__call__")
    try:
        return typing.get_type_hints(target, include_extras=True)
    except Exception as exc:
        if getattr(target, "__annotations__", None):
            raise ToolDefinitionError(f"tool {name!r}: cannot resolve its type hints: "
                                      f"{exc}") from exc
        return {}


def _annotated_description(ann: Any) -> str:
    if typing.get_origin(ann) is typing.Annotated:
        for meta in ann.__metadata__:
            if isinstance(meta, str):
                return meta
            desc = getattr(meta, "description", None)
            if isinstance(desc, str):
                return desc
    return ""


def plain_numpy(tp: Any) -> Any:
    """``ndarray[shape, dtype]`` (numpy.typing.NDArray) -> ``ndarray``: pydantic checks it
    with isinstance, which a parametrized class cannot do."""
    origin = typing.get_origin(tp)
    if origin is None:
        return tp
    if numpy_pandas_name(origin):
        return origin
    args = typing.get_args(tp)
    if origin is typing.Literal:
        return tp
    new = tuple(plain_numpy(a) for a in args)
    if new == args:
        return tp
    if origin is typing.Annotated:
        return typing.Annotated[(new[0], *tp.__metadata__)]
    if origin is typing.Union or origin is types.UnionType:
        return typing.Union[new]  # noqa: UP007 - built from a tuple
    if isinstance(tp, types.GenericAlias):
        return types.GenericAlias(origin, new)
    copy_with = getattr(tp, "copy_with", None)
    return copy_with(new) if copy_with is not None else tp


def _typed_dict_validator(name: str, params: list[ToolParam], cfg: ConfigDict) -> Any:
    """The validator of a TypedDict of the parameters (optional ones NotRequired), or None
    when pydantic cannot build it."""
    from typing import NotRequired

    from typing_extensions import TypedDict  # pydantic wants it on Python < 3.12

    keys = {p.name: plain_numpy(p.annotation) if p.required
            else NotRequired[plain_numpy(p.annotation)] for p in params}
    make: Any = TypedDict
    try:
        td = make(f"{name}_arguments", keys)
        td.__pydantic_config__ = cfg
        return TypeAdapter(td).validator
    except Exception:  # any failure: the model validates instead
        return None


def pydantic_errors(exc: ValidationError) -> list[dict[str, Any]]:
    return [{"path": list(e["loc"]), "message": e["msg"]} for e in exc.errors()]


def _adapter(tp: Any) -> TypeAdapter[Any]:
    try:
        return TypeAdapter(tp, config=_ARBITRARY)
    except pydantic.PydanticUserError:  # models/dataclasses/TypedDicts carry their own config
        return TypeAdapter(tp)


class _PydanticChecker:
    """Arguments through a model built from the signature (fields ``p0..`` aliased to the
    parameter names, so that any name works); returns through a TypeAdapter.

    Calls validate through a TypedDict of the same fields when pydantic can build one (the
    same rules and error entries, no model instance: ~3 us less per call); the model stays
    the source of the JSON Schema and the fallback."""

    def __init__(self, name: str, params: list[ToolParam], ret: object) -> None:
        fields: dict[str, Any] = {}
        self._names: dict[str, str] = {}
        for i, p in enumerate(params):
            default = ... if p.required else p.default
            fields[f"p{i}"] = (plain_numpy(p.annotation),
                               pydantic.Field(default, alias=p.name,
                                              description=p.description or None))
            self._names[f"p{i}"] = p.name
        cfg = ConfigDict(arbitrary_types_allowed=True, extra="forbid", validate_default=False,
                         populate_by_name=False)
        try:
            self.model: type[BaseModel] = pydantic.create_model(
                f"{name}_arguments", __config__=cfg, **fields)
            self._ret = None if ret is NO_RETURN else _adapter(plain_numpy(ret)).validator
        except (pydantic.PydanticSchemaGenerationError, pydantic.PydanticUserError,
                TypeError, NameError) as exc:
            raise ToolDefinitionError(f"tool {name!r}: unsupported types: {exc}") from exc
        self._fast = _typed_dict_validator(name, params, cfg)

    def arguments(self, given: dict[str, Any]) -> dict[str, Any]:
        try:
            if self._fast is not None:
                checked: dict[str, Any] = self._fast.validate_python(given)
                return checked
            m = self.model.model_validate(given)
        except ValidationError as exc:
            raise ArgumentsInvalid(pydantic_errors(exc)) from None
        return {self._names[f]: getattr(m, f) for f in self._names if f in m.model_fields_set}

    def returns(self, value: object) -> Any:
        if self._ret is None:
            return value
        try:
            return self._ret.validate_python(value)
        except ValidationError as exc:
            raise ReturnInvalid(pydantic_errors(exc)) from None

    def json_schema(self) -> dict[str, Any]:
        try:
            schema = self.model.model_json_schema(by_alias=True)
        except Exception:  # arbitrary types (ndarray, DataFrame) have no JSON Schema
            props: dict[str, Any] = {}
            required = []
            for f, info in self.model.model_fields.items():
                name = self._names[f]
                props[name] = {"description": info.description} if info.description else {}
                if info.is_required():
                    required.append(name)
            schema = {"type": "object", "properties": props, "required": required}
        schema.pop("title", None)
        for prop in schema.get("properties", {}).values():
            if isinstance(prop, dict):
                prop.pop("title", None)
        schema["additionalProperties"] = False
        return schema
