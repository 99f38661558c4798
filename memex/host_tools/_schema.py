"""OpenAI function tools: the definition checked (pydantic), its JSON Schema checked and used
to validate arguments (``jsonschema``), and turned into typed parameters for the guest stub."""

from __future__ import annotations

import functools
import inspect
import json
import types
import typing
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import jsonschema
import jsonschema.validators
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import ToolDefinitionError
from ._params import ArgumentsInvalid, ReturnInvalid, ToolParam, is_async
from ._types import render_default, safe_identifier

__all__ = ["openai_tool", "schema_type", "validator_errors", "validator_for"]

if TYPE_CHECKING:
    from ._tool import Tool

T = TypeVar("T", bound="Tool")

_JSON_TYPES: dict[str, Any] = {"string": str, "integer": int, "number": float,
                               "boolean": bool, "null": type(None)}


class _Function(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object",
                                                                "properties": {}})
    strict: bool | None = None


def validator_for(schema: Mapping[str, Any], what: str) -> jsonschema.protocols.Validator:
    """A checked validator of ``schema``. Adapters rebuild their tools every step from the
    same schemas, so validators are kept by the schema's canonical JSON (checking a schema
    costs milliseconds)."""
    try:
        key = json.dumps(schema, sort_keys=True)
    except (TypeError, ValueError):
        return _build_validator(schema, what)
    try:
        return _cached_validator(key)
    except jsonschema.SchemaError:
        return _build_validator(schema, what)  # raises with the tool's name in the message


@functools.lru_cache(maxsize=1024)
def _cached_validator(key: str) -> jsonschema.protocols.Validator:
    schema = json.loads(key)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)
    return typing.cast(jsonschema.protocols.Validator, _with_tuples(cls)(schema))


def _build_validator(schema: Mapping[str, Any], what: str) -> jsonschema.protocols.Validator:
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ToolDefinitionError(f"{what}: invalid JSON Schema at "
                                  f"{'/'.join(map(str, exc.absolute_path)) or '(root)'}: "
                                  f"{exc.message}") from exc
    return typing.cast(jsonschema.protocols.Validator, _with_tuples(cls)(schema))


@functools.cache
def _with_tuples(cls: type[Any]) -> type[Any]:
    """``cls`` with tuples (msgpack ext 7) counted as JSON arrays (one class per draft)."""
    checker = cls.TYPE_CHECKER.redefine(
        "array", lambda _c, inst: isinstance(inst, list | tuple))
    return typing.cast(type[Any], jsonschema.validators.extend(cls, type_checker=checker))


def validator_errors(validator: jsonschema.protocols.Validator, instance: object
                     ) -> list[dict[str, Any]]:
    out = []
    for err in sorted(validator.iter_errors(instance), key=lambda e: list(map(str, e.path))):
        path: list[Any] = list(err.absolute_path)
        if err.validator == "required" and isinstance(err.instance, dict):
            missing = [p for p in err.validator_value
                       if p not in err.instance and repr(p) in err.message]
            path += missing[:1]
        out.append({"path": path, "message": _short_message(err.message, err.instance)})
    return out


def _short_message(message: str, instance: object) -> str:
    """jsonschema's message with a long value (a whole DataFrame's repr) shortened to its
    type and first line: the message is read by a model, whose context it would fill."""
    text = repr(instance)
    if len(text) <= 120 or text not in message:
        return message
    t = type(instance)
    kind = t.__name__ if t.__module__ == "builtins" else f"{t.__module__.partition('.')[0]}." \
        f"{t.__name__}"
    return message.replace(text, f"<{kind}: {text.splitlines()[0][:60]}...>")


class _SchemaChecker:
    def __init__(self, name: str, parameters: Mapping[str, Any],
                 returns: Mapping[str, Any] | None) -> None:
        self._schema = dict(parameters)
        self._args = validator_for(parameters, f"tool {name!r} parameters")
        self._ret = validator_for(returns, f"tool {name!r} returns_schema") if returns else None

    def arguments(self, given: dict[str, Any]) -> dict[str, Any]:
        errors = validator_errors(self._args, given)
        if errors:
            raise ArgumentsInvalid(errors)
        return dict(given)

    def returns(self, value: object) -> Any:
        if self._ret is not None:
            errors = validator_errors(self._ret, value)
            if errors:
                raise ReturnInvalid(errors)
        return value

    def json_schema(self) -> dict[str, Any]:
        return dict(self._schema)


def schema_type(schema: object, root: Mapping[str, Any], depth: int = 0) -> Any:
    """The Python annotation a JSON Schema describes, for the guest stub (``Any`` when the
    schema says more than an annotation can)."""
    if not isinstance(schema, dict) or depth > 16:
        return Any
    ref = schema.get("$ref")
    if isinstance(ref, str):
        for prefix in ("#/$defs/", "#/definitions/"):
            if ref.startswith(prefix):
                defs = root.get(prefix[2:-1], {})
                return schema_type(defs.get(ref[len(prefix):]), root, depth + 1)
        return Any
    if "const" in schema:
        return _literal([schema["const"]])
    if isinstance(schema.get("enum"), list):
        return _literal(schema["enum"])
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            members = [schema_type(s, root, depth + 1) for s in schema[key]]
            return Any if Any in members else typing.Union[tuple(members)]  # noqa: UP007
    t = schema.get("type")
    if isinstance(t, list):
        members = [schema_type({**schema, "type": x}, root, depth + 1) for x in t]
        return typing.Union[tuple(members)] if members else Any  # noqa: UP007
    if t in _JSON_TYPES:
        return _JSON_TYPES[t]
    if t == "array":
        items = schema.get("items")
        return (types.GenericAlias(list, (schema_type(items, root, depth + 1),))
                if isinstance(items, dict) else list)
    if t == "object":
        extra = schema.get("additionalProperties")
        value = schema_type(extra, root, depth + 1) if isinstance(extra, dict) else Any
        return types.GenericAlias(dict, (str, value))
    return Any


def _literal(values: list[Any]) -> Any:
    if values and all(v is None or isinstance(v, str | int) for v in values):
        return Literal[tuple(values)]
    return Any


def openai_tool(cls: type[T], definition: Mapping[str, Any], handler: Callable[..., Any], *,
                timeout: float | None, inline: bool,
                returns_schema: Mapping[str, Any] | None) -> T:
    if not isinstance(definition, Mapping):
        raise ToolDefinitionError("an OpenAI tool definition is a mapping")
    inner: Any = definition
    if definition.get("type") == "function" and isinstance(definition.get("function"), Mapping):
        inner = definition["function"]
    elif "type" in definition and definition.get("type") != "function":
        raise ToolDefinitionError(f"only function tools are supported, got type "
                                  f"{definition.get('type')!r}")
    try:
        fn = _Function.model_validate(
            {k: v for k, v in inner.items() if k != "type"} if "name" in inner else inner)
    except ValidationError as exc:
        raise ToolDefinitionError(f"invalid OpenAI tool definition: {exc}") from exc
    if not callable(handler):
        raise ToolDefinitionError(f"tool {fn.name!r}: the handler is not callable")
    schema = fn.parameters
    if schema.get("type", "object") != "object":
        raise ToolDefinitionError(f"tool {fn.name!r}: parameters must be an object schema")
    checker = _SchemaChecker(fn.name, schema, returns_schema)
    props = schema.get("properties", {})
    required = schema.get("required", [])
    if not isinstance(props, dict) or not isinstance(required, list):
        raise ToolDefinitionError(f"tool {fn.name!r}: properties must be a map, required a list")
    taken: set[str] = {"_mx"}
    params: list[ToolParam] = []
    order = [p for p in props if p in required] + [p for p in props if p not in required]
    for pname in order:
        prop = props[pname] if isinstance(props[pname], dict) else {}
        py = safe_identifier(pname, taken, reserved=())
        taken.add(py)
        has_default = "default" in prop and render_default(prop["default"]) is not None
        params.append(ToolParam(
            name=pname, py_name=py, kind="positional_or_keyword",
            annotation=schema_type(prop, schema), required=pname in required,
            default=prop.get("default") if has_default else inspect.Parameter.empty,
            description=str(prop.get("description", "")),
        ))
    summary, _, text = fn.description.strip().partition("\n")
    openai = fn.model_dump(exclude_none=True)
    return cls(name=fn.name, handler=handler, summary=summary.strip(), description=text.strip(),
               params=tuple(params),
               returns=schema_type(returns_schema, returns_schema) if returns_schema else Any,
               is_async=is_async(handler), timeout=timeout,
               inline=inline, origin="openai", checker=checker, openai=openai)
