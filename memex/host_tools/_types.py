"""Host type annotations rendered for the guest: as stub source (readable names: ``Literal``,
``Optional``, record class names; numpy/pandas as strings since the guest may not import them)
and as what the guest's ``inspect.signature`` prints for that source (CPython 3.15 reprs), so
the catalogue shows exactly what the guest exposes.

The guest stub module does ``from typing import Any, Literal, Optional, TypedDict, Union`` and
``import datetime, decimal``; records are classes of the guest module ``tools``.
"""

from __future__ import annotations

import ast
import collections.abc as cabc
import dataclasses
import datetime
import decimal
import enum
import inspect
import ipaddress
import keyword
import math
import pathlib
import re
import sys
import types
import typing
import uuid
from dataclasses import dataclass
from typing import Any

import typing_extensions

__all__ = [
    "GUEST_MODULE",
    "RESERVED",
    "RecordDef",
    "Rendered",
    "TypeRenderer",
    "is_record_type",
    "render_default",
    "safe_identifier",
]

GUEST_MODULE = "tools"
# Names the stub module defines itself: a tool or record may not take them.
RESERVED = frozenset({
    "Any", "Literal", "Optional", "TypedDict", "Union", "datetime", "decimal", "ALIASES",
    "ToolError", "ToolArgumentError", "ToolExecutionError", "ToolReturnError",
    "ToolNotFoundError", "ToolDeniedError", "ToolBudgetError", "ToolTimeoutError",
})

_SEQUENCES = {list, cabc.Sequence, cabc.MutableSequence, cabc.Iterable, cabc.Collection,
              cabc.Iterator, cabc.Generator}
_SETS = {set, cabc.Set, cabc.MutableSet}
_MAPPINGS = {dict, cabc.Mapping, cabc.MutableMapping}
_AS_STR = (uuid.UUID, pathlib.PurePath, ipaddress.IPv4Address, ipaddress.IPv6Address,
           ipaddress.IPv4Network, ipaddress.IPv6Network, re.Pattern)
_DATETIMES = (datetime.datetime, datetime.date, datetime.time, datetime.timedelta)


@dataclass(frozen=True)
class Rendered:
    """One annotation: ``src`` for the stub, ``plain`` (numpy/pandas unquoted, for inside a
    string annotation), ``rep`` the guest's repr of the object, ``typing_top`` whether that
    object lives in ``typing`` (inspect then strips every ``typing.``), ``stringy`` whether it
    is a string annotation (cannot take part in ``|``)."""

    src: str
    plain: str
    rep: str
    typing_top: bool = False
    stringy: bool = False

    @property
    def display(self) -> str:
        """What ``inspect.formatannotation`` prints in the guest."""
        return self.rep.replace("typing.", "") if self.typing_top else self.rep


@dataclass(frozen=True, kw_only=True)
class RecordDef:
    """A guest record class for a pydantic model or dataclass (``typed_dict``: a TypedDict)."""

    name: str
    cls: type
    doc: str
    fields: tuple[tuple[str, Rendered, str], ...]  # name, type, description
    typed_dict: bool = False
    total: bool = True


_ANY = Rendered("Any", "Any", "typing.Any", typing_top=True)
_NONE = Rendered("None", "None", "None")


def _simple(name: str) -> Rendered:
    return Rendered(name, name, name)


def _string(name: str) -> Rendered:
    return Rendered(repr(name), name, repr(name), stringy=True)


def safe_identifier(name: str, taken: cabc.Container[str] = (),
                    reserved: cabc.Container[str] = RESERVED) -> str:
    """A Python identifier for ``name`` that is no keyword, not reserved, not in ``taken``."""
    alias = re.sub(r"\W", "_", name, flags=re.ASCII) or "_"
    if alias[0].isdigit():
        alias = "_" + alias
    if keyword.iskeyword(alias) or alias in reserved:
        alias += "_"
    base, n = alias, 2
    while alias in taken:
        alias, n = f"{base}_{n}", n + 1
    return alias


def _module_class(tp: object, module: str, name: str) -> bool:
    mod = sys.modules.get(module)
    return mod is not None and tp is getattr(mod, name, None)


def numpy_pandas_name(tp: object) -> str | None:
    """``numpy.ndarray``/``pandas.DataFrame``/``pandas.Series`` when ``tp`` is one (without
    importing numpy or pandas: an annotation naming them means they are loaded)."""
    origin = typing.get_origin(tp) or tp
    for module, name in (("numpy", "ndarray"), ("pandas", "DataFrame"), ("pandas", "Series")):
        if _module_class(origin, module, name):
            return f"{module}.{name}"
    return None


def is_record_type(tp: object) -> bool:
    """Pydantic models, dataclasses and TypedDicts become guest record classes."""
    if not isinstance(tp, type):
        return False
    if dataclasses.is_dataclass(tp) or typing_extensions.is_typeddict(tp):
        return True
    pyd = sys.modules.get("pydantic")
    return pyd is not None and issubclass(tp, pyd.BaseModel)


def _literal_values(values: cabc.Iterable[Any]) -> list[Any] | None:
    out = []
    for v in values:
        if isinstance(v, enum.Enum):
            v = v.value
        if v is not None and not isinstance(v, str | int | bytes):  # bool is an int
            return None
        out.append(v)
    return out


def _literal(values: list[Any]) -> Rendered:
    inner = ", ".join(repr(v) for v in values)
    return Rendered(f"Literal[{inner}]", f"Literal[{inner}]", f"typing.Literal[{inner}]",
                    typing_top=True)


def _own_doc(cls: type) -> str:
    doc = cls.__dict__.get("__doc__") or ""
    if dataclasses.is_dataclass(cls) and doc.startswith(cls.__name__ + "("):
        return ""  # the signature dataclasses writes when there is no docstring
    return inspect.cleandoc(doc) if doc else ""


class TypeRenderer:
    """Renders annotations, collecting the record classes they use (named once each, never
    clashing with ``taken``: tool aliases and reserved names)."""

    def __init__(self, taken: cabc.Iterable[str] = ()) -> None:
        self._taken = set(taken) | RESERVED
        self.names: dict[type, str] = {}
        self.records: list[RecordDef] = []  # in dependency order (fields first)

    def render(self, tp: object) -> Rendered:
        if tp is None or tp is type(None):
            return _NONE
        if tp is Any or tp is inspect.Parameter.empty or isinstance(tp, str | typing.TypeVar):
            return _ANY
        if isinstance(tp, typing.NewType):
            return self.render(tp.__supertype__)
        np_pd = numpy_pandas_name(tp)
        if np_pd is not None:
            return _string(np_pd)
        origin = typing.get_origin(tp)
        if origin is not None:
            return self._generic(tp, origin, typing.get_args(tp))
        if not isinstance(tp, type):
            return _ANY
        if tp in (bytearray, memoryview):
            return _simple("bytes")
        if issubclass(tp, enum.Enum):
            values = _literal_values(tp)
            return _literal(values) if values else _ANY
        if is_record_type(tp):
            name = self._record(tp)
            return Rendered(name, name, f"{GUEST_MODULE}.{name}")
        if tp in _DATETIMES:
            return _simple(f"datetime.{tp.__name__}")
        if tp is decimal.Decimal:
            return _simple("decimal.Decimal")
        if issubclass(tp, _AS_STR):
            return _simple("str")
        if tp.__module__ == "builtins":
            return _simple(tp.__qualname__)
        return _ANY

    def _generic(self, tp: object, origin: object, args: tuple[Any, ...]) -> Rendered:
        if origin is typing.Annotated:
            return self.render(args[0])
        if origin is typing.Union or origin is types.UnionType:
            return self._union([self.render(a) for a in args])
        if origin is typing.Literal:
            values = _literal_values(args)
            return _literal(values) if values is not None else _ANY
        if origin in _SEQUENCES or origin in _SETS or origin is frozenset:
            name = "list" if origin in _SEQUENCES else "frozenset" if origin is frozenset else "set"
            return self._alias(name, [self.render(args[0])] if args else [])
        if origin in _MAPPINGS:
            return self._alias("dict", [self.render(a) for a in args])
        if origin is tuple:
            if args == ():
                return _simple("tuple[()]")
            items = [_simple("...") if a is Ellipsis else self.render(a) for a in args]
            return self._alias("tuple", items)
        if isinstance(origin, type):
            return self.render(origin)
        return _ANY

    @staticmethod
    def _alias(name: str, items: list[Rendered]) -> Rendered:
        if not items:
            return _simple(name)
        return Rendered(f"{name}[{', '.join(i.src for i in items)}]",
                        f"{name}[{', '.join(i.plain for i in items)}]",
                        f"{name}[{', '.join(i.rep for i in items)}]")

    @staticmethod
    def _union(members: list[Rendered]) -> Rendered:
        seen: dict[str, Rendered] = {}
        for m in members:
            seen.setdefault(m.rep, m)
        members = list(seen.values())
        if len(members) == 1:
            return members[0]
        plain = " | ".join(m.plain for m in members)
        if any(m.stringy for m in members):
            # 'numpy.ndarray' | None is a TypeError: the whole union becomes one string.
            return Rendered(repr(plain), plain, repr(plain), stringy=True)
        others = [m for m in members if m is not _NONE]
        if len(others) == 1:
            src = f"Optional[{others[0].src}]"
        else:
            src = f"Union[{', '.join(m.src for m in members)}]"
        return Rendered(src, plain, " | ".join(m.rep for m in members), typing_top=True)

    def _record(self, cls: type) -> str:
        if cls in self.names:
            return self.names[cls]
        name = safe_identifier(cls.__name__, self._taken)
        self._taken.add(name)
        self.names[cls] = name
        fields: list[tuple[str, Rendered, str]] = []
        total = True
        if typing_extensions.is_typeddict(cls):
            hints = typing.get_type_hints(cls)
            total = bool(getattr(cls, "__total__", True))
            for fname, ftp in hints.items():
                fields.append((fname, self.render(ftp), ""))
        elif dataclasses.is_dataclass(cls):
            hints = typing.get_type_hints(cls)
            for f in dataclasses.fields(cls):
                desc = str(f.metadata.get("description", "")) if f.metadata else ""
                fields.append((f.name, self.render(hints.get(f.name, Any)), desc))
        else:
            for fname, info in cls.model_fields.items():  # type: ignore[attr-defined]
                fields.append((fname, self.render(info.annotation), info.description or ""))
        self.records.append(RecordDef(
            name=name, cls=cls, doc=_own_doc(cls), fields=tuple(fields),
            typed_dict=typing_extensions.is_typeddict(cls), total=total))
        return name


def _literal_ok(value: Any, depth: int = 0) -> bool:
    """Values whose repr is a Python literal that evaluates back to an equal value (sets are
    left out: their repr order depends on the guest's hash seed)."""
    if depth > 8:
        return False
    if value is None or isinstance(value, bool | int | str | bytes):
        return type(value) in (type(None), bool, int, str, bytes)
    if type(value) is float:
        return math.isfinite(value)
    if type(value) in (list, tuple):
        return all(_literal_ok(v, depth + 1) for v in value)
    if type(value) is dict:
        return all(_literal_ok(k, depth + 1) and _literal_ok(v, depth + 1)
                   for k, v in value.items())
    return False


def render_default(value: object) -> tuple[str, str] | None:
    """``(source, guest repr)`` of a default the stub can carry, or None (then the stub uses
    the MISSING sentinel and the host applies the default)."""
    if isinstance(value, enum.Enum):
        value = value.value
    if _literal_ok(value):
        text = repr(value)
        try:
            if ast.literal_eval(text) == value:
                return text, text
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return None
        return None
    if type(value) in _DATETIMES:
        tz = getattr(value, "tzinfo", None)
        if tz is not None and not isinstance(tz, datetime.timezone):
            return None
        text = repr(value)
    elif type(value) is decimal.Decimal and value.is_finite():
        text = f"decimal.Decimal({str(value)!r})"
        return (text, f"Decimal({str(value)!r})") if _evals_to(text, value) else None
    else:
        return None
    return (text, text) if _evals_to(text, value) else None


def _evals_to(text: str, value: object) -> bool:
    try:
        got = eval(text, {"__builtins__": {}, "datetime": datetime, "decimal": decimal})
    except Exception:
        return False
    return bool(type(got) is type(value) and got == value)
