"""Tool definitions, three ways in: typed callables, OpenAI function tools, tool sets. Host
only: what a tool is, how its arguments and returns are checked, what the guest will be shown.

No ``from __future__ import annotations`` here: tools defined inside test functions annotate
with local names, which string annotations could not resolve."""

import dataclasses
import datetime
import decimal
import enum
from typing import Annotated, Any, Literal, Optional

import numpy as np
import pandas as pd
import pytest
from pydantic import BaseModel, Field
from typing_extensions import TypedDict

from memex.errors import ConfigError, ToolDefinitionError
from memex.host_tools import ArgumentsInvalid, ReturnInvalid, Tool, ToolSet, tool
from memex.host_tools._types import render_default


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Item(BaseModel):
    """A thing for sale."""

    name: str = Field(description="what it is called")
    price: float
    tags: list[str] = []


@dataclasses.dataclass
class Point:
    x: float
    y: float


class Options(TypedDict, total=False):
    verbose: bool


@tool
def search(query: str, limit: int = 10, color: Color = Color.RED, *,
           since: datetime.date | None = None, near: Point | None = None,
           options: Options | None = None) -> list[Item]:
    """Search the catalogue.

    Matches names and tags.

    Args:
        query: What to look for.
        limit: At most this many
            results (continued line).
        color (Color): Only items of this color.

    Returns:
        list[Item]: the matches, best first.
    """
    return [Item(name=query, price=1.5)]


# ---- from_function ----------------------------------------------------------------------------
def test_from_function_reads_signature_and_docstring() -> None:
    assert isinstance(search, Tool)
    assert search.name == "search" and search.origin == "function" and not search.is_async
    assert search.summary == "Search the catalogue."
    assert search.description == "Matches names and tags."
    assert search.returns_doc == "the matches, best first."
    assert search.returns == list[Item]
    by = {p.name: p for p in search.params}
    assert list(by) == ["query", "limit", "color", "since", "near", "options"]
    assert by["query"].required and by["query"].description == "What to look for."
    assert by["limit"].default == 10 and not by["limit"].required
    assert by["limit"].description == "At most this many results (continued line)."
    assert by["since"].kind == "keyword_only"
    assert search("hat")[0].name == "hat"  # still callable on the host


def test_annotated_descriptions_and_decorator_options() -> None:
    @tool(name="db.query", timeout=2.5, description="Run SQL.\n\nRead-only.")
    async def q(sql: Annotated[str, "the statement"],
                n: Annotated[int, Field(description="row cap", gt=0)] = 5) -> pd.DataFrame:
        return pd.DataFrame()

    assert q.name == "db.query" and q.is_async and q.timeout == 2.5
    assert (q.summary, q.description) == ("Run SQL.", "Read-only.")
    assert [p.description for p in q.params] == ["the statement", "row cap"]
    with pytest.raises(ArgumentsInvalid) as e:
        q.checker.arguments({"sql": "x", "n": 0})
    assert e.value.errors[0]["path"] == ["n"]


@pytest.mark.parametrize("bad", [
    lambda x: x,                      # no usable name
    "not callable",
])
def test_unusable_callables_are_refused(bad: Any) -> None:
    with pytest.raises(ToolDefinitionError):
        Tool.from_function(bad)


def test_var_args_and_bad_names_are_refused() -> None:
    def star(*args: int) -> int:
        return 0

    def ok(x: int) -> int:
        return x

    with pytest.raises(ToolDefinitionError, match=r"\*args"):
        Tool.from_function(star)
    for name in ("", "has space", "tab\there", "x" * 200):
        with pytest.raises(ToolDefinitionError):
            Tool.from_function(ok, name=name)
    with pytest.raises(ToolDefinitionError):
        Tool.from_function(ok, timeout=0)
    assert issubclass(ToolDefinitionError, ConfigError)


def test_argument_validation_reports_paths() -> None:
    @tool
    def order(items: list[Item], when: datetime.datetime, mode: Literal["a", "b"] = "a") -> int:
        return len(items)

    assert order.checker.arguments({"items": [{"name": "x", "price": "2"}],
                                    "when": "2024-01-02T03:04:05"}) == {
        "items": [Item(name="x", price=2.0)], "when": datetime.datetime(2024, 1, 2, 3, 4, 5)}
    with pytest.raises(ArgumentsInvalid) as e:
        order.checker.arguments({"items": [{"name": "x", "price": "cheap"}], "mode": "c",
                                 "extra": 1})
    paths = {tuple(err["path"]): err["message"] for err in e.value.errors}
    assert set(paths) == {("items", 0, "price"), ("when",), ("mode",), ("extra",)}
    assert "Field required" in paths[("when",)]
    assert "Extra inputs are not permitted" in paths[("extra",)]
    assert "'a' or 'b'" in paths[("mode",)]


def test_only_given_arguments_reach_the_handler() -> None:
    @tool
    def f(a: int, b: list[int] | None = None) -> int:
        return a

    assert f.checker.arguments({"a": 1}) == {"a": 1}  # the handler applies its own default


def test_numpy_pandas_parameters_are_isinstance_checked() -> None:
    import numpy.typing as npt

    @tool
    def stats(a: npt.NDArray[np.float64], df: pd.DataFrame) -> dict[str, float]:
        return {"n": float(len(df))}

    arr, df = np.zeros(3), pd.DataFrame({"x": [1]})
    got = stats.checker.arguments({"a": arr, "df": df})
    assert got["a"] is arr and got["df"] is df
    with pytest.raises(ArgumentsInvalid) as e:
        stats.checker.arguments({"a": [1.0], "df": {"x": [1]}})
    assert [err["path"] for err in e.value.errors] == [["a"], ["df"]]


def test_return_validation() -> None:
    assert search.checker.returns([{"name": "a", "price": 1}]) == [Item(name="a", price=1.0)]
    with pytest.raises(ReturnInvalid) as e:
        search.checker.returns([{"name": "a"}])
    assert e.value.errors[0]["path"] == [0, "price"]

    @tool
    def arr() -> np.ndarray:
        return np.zeros(1)

    @tool
    def untyped():  # type: ignore[no-untyped-def]
        return object()

    assert arr.checker.returns(np.ones(2)).shape == (2,)
    with pytest.raises(ReturnInvalid):
        arr.checker.returns([1.0])
    sentinel = object()
    assert untyped.checker.returns(sentinel) is sentinel


# ---- from_openai ------------------------------------------------------------------------------
WEATHER = {
    "type": "function",
    "function": {
        "name": "get-weather",
        "description": "Get the weather.\nFor one city.",
        "parameters": {
            "type": "object",
            "properties": {
                "days": {"type": ["integer", "null"], "description": "How far ahead."},
                "city": {"type": "string", "description": "City name."},
                "unit": {"type": "string", "enum": ["c", "f"], "default": "c"},
                "class": {"type": "array", "items": {"type": "number"}},
                "opts": {"type": "object", "additionalProperties": {"type": "boolean"}},
            },
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


def test_from_openai_definition() -> None:
    t = Tool.from_openai(WEATHER, lambda **kw: kw)
    assert t.name == "get-weather" and t.origin == "openai"
    assert (t.summary, t.description) == ("Get the weather.", "For one city.")
    assert [(p.name, p.py_name, p.required) for p in t.params] == [
        ("city", "city", True), ("days", "days", False), ("unit", "unit", False),
        ("class", "class_", False), ("opts", "opts", False)]
    assert t.params[2].annotation == Literal["c", "f"] and t.params[2].default == "c"
    assert t.params[1].annotation == Optional[int]  # noqa: UP045
    assert t.to_openai() == {"type": "function", "function": dict(WEATHER["function"])}
    inner = Tool.from_openai(WEATHER["function"], lambda **kw: kw)  # the bare function map
    assert inner.params == t.params


def test_openai_argument_errors_have_paths() -> None:
    t = Tool.from_openai(WEATHER, lambda **kw: kw)
    assert t.checker.arguments({"city": "Oslo", "class": (1, 2.5)}) == {
        "city": "Oslo", "class": (1, 2.5)}
    with pytest.raises(ArgumentsInvalid) as e:
        t.checker.arguments({"unit": "k", "class": [1, "a"], "zzz": 1})
    errors = {tuple(err["path"]): err["message"] for err in e.value.errors}
    assert errors[("city",)] == "'city' is a required property"
    assert "is not of type 'number'" in errors[("class", 1)]
    assert "is not one of" in errors[("unit",)]
    assert "Additional properties" in errors[()]


def test_openai_bad_definitions() -> None:
    with pytest.raises(ToolDefinitionError, match="invalid JSON Schema at properties/x"):
        Tool.from_openai({"name": "t", "parameters": {"type": "object",
                                                      "properties": {"x": {"type": 5}}}},
                         lambda: 0)
    with pytest.raises(ToolDefinitionError, match="only function tools"):
        Tool.from_openai({"type": "web_search"}, lambda: 0)
    with pytest.raises(ToolDefinitionError):
        Tool.from_openai({"type": "function", "function": {"description": "no name"}},
                         lambda: 0)
    with pytest.raises(ToolDefinitionError):
        Tool.from_openai({"name": "t", "parameters": {"type": "array"}}, lambda: 0)


def test_openai_returns_schema() -> None:
    t = Tool.from_openai({"name": "n", "parameters": {"type": "object"}}, lambda: 1,
                         returns_schema={"type": "integer"})
    assert t.checker.returns(3) == 3
    with pytest.raises(ReturnInvalid):
        t.checker.returns("three")


def test_function_tool_round_trips_through_openai_form() -> None:
    d = search.to_openai()
    assert d["function"]["name"] == "search"
    props = d["function"]["parameters"]["properties"]
    assert props["query"] == {"description": "What to look for.", "type": "string"}
    again = Tool.from_openai(d, lambda **kw: kw)
    assert [p.name for p in again.params][:1] == ["query"]
    again.checker.arguments({"query": "x", "limit": 3, "color": "blue"})

    @tool
    def arrays(a: np.ndarray) -> int:
        """Sum."""
        return 0

    schema = arrays.to_openai()["function"]["parameters"]  # no JSON Schema for ndarray
    assert schema["required"] == ["a"] and schema["additionalProperties"] is False


# ---- ToolSet ----------------------------------------------------------------------------------
def _ping() -> str:
    """Answer pong."""
    return "pong"


def test_toolset_collection() -> None:
    ts = ToolSet([search, _ping], prefix="db_")
    assert ts.names == ("db_search", "db__ping") and len(ts) == 2
    assert "db_search" in ts and ts["db_search"].handler is search.handler
    assert ts.get("nope") is None

    @ts.tool
    def later(x: int) -> int:
        return x

    @ts.tool(name="named", timeout=1.0)
    def other(x: int) -> int:
        return x

    assert later.name == "db_later" and ts["db_named"].timeout == 1.0
    assert [t.name for t in ts] == ["db_search", "db__ping", "db_later", "db_named"]
    with pytest.raises(ToolDefinitionError, match="two tools"):
        ts.add(search)
    only = ts.filter(names=["db_later", "db_search"])
    assert only.names == ("db_search", "db_later")
    asyncs = ts.filter(predicate=lambda t: t.summary.startswith("Answer"))
    assert asyncs.names == ("db__ping",)
    with pytest.raises(ToolDefinitionError, match="no tools named"):
        ts.filter(names=["missing"])
    merged = ToolSet([_ping]) | ToolSet([search]).prefixed("x.")
    assert merged.names == ("_ping", "x.search")
    with pytest.raises(ToolDefinitionError):
        merged.merge(ToolSet([_ping]))
    assert ToolSet(prefix="p_").add(_ping, name="p").name == "p_p"


def test_aliases_for_names_that_are_not_identifiers() -> None:
    def f() -> None:
        """F."""

    ts = ToolSet([Tool.from_function(f, name=n) for n in
                  ("get-weather", "db.run", "class", "2fast", "Any", "get_weather", "__x")])
    assert ts.aliases == {"get-weather": "get_weather_2", "db.run": "db_run",
                          "class": "class_", "2fast": "_2fast", "Any": "Any_", "__x": "x"}
    cat = ts.catalogue()
    assert cat.splitlines()[0] == "get_weather_2() -> None: F."
    assert "aliases: 'get-weather' -> get_weather_2" in cat


def test_catalogue_and_stub_source() -> None:
    @tool
    def blob(data: bytes, when: datetime.datetime = datetime.datetime(2024, 1, 1),
             cost: decimal.Decimal = decimal.Decimal("1.5"), x: float = float("nan"),
             arr: np.ndarray | None = None, tags: set[str] = frozenset(),  # type: ignore[assignment]
             ) -> dict[str, Any]:
        """Store a blob."""
        return {}

    ts = ToolSet([search, blob])
    lines = ts.catalogue().splitlines()
    assert lines[0] == (
        "search(query: str, limit: int = 10, color: Literal['red', 'blue'] = 'red', *, "
        "since: datetime.date | None = None, near: tools.Point | None = None, "
        "options: tools.Options | None = None) -> list[tools.Item]: Search the catalogue. "
        "Returns: the matches, best first.")
    assert lines[1] == (
        "blob(data: bytes, when: datetime.datetime = datetime.datetime(2024, 1, 1, 0, 0), "
        "cost: decimal.Decimal = Decimal('1.5'), x: float = ..., "
        "arr: 'numpy.ndarray | None' = None, tags: set[str] = ...) -> dict[str, typing.Any]: "
        "Store a blob.")
    assert lines[2:] == ["class tools.Point(x: float, y: float)",
                         "class tools.Options(verbose: bool)",
                         "class tools.Item(name: str, price: float, tags: list[str]): "
                         "A thing for sale."]
    src = ts.guest_module()
    compile(src, "<tools>", "exec")  # valid Python (3.11 syntax is a subset of the guest's)
    assert "class Item(_mx.Record):" in src and "__fields__ = ('name', 'price', 'tags')" in src
    assert "class Options(TypedDict, total=False):" in src
    assert "x: float = _mx.MISSING" in src and "Defaults to nan (on the host)." in src
    assert "return _mx.call('search', {'query': query" in src
    assert ts.record_names == {Point: "Point", Options: "Options", Item: "Item"}
    entry = ts.describe()[0]
    assert entry["name"] == entry["alias"] == "search"
    assert entry["signature"] == lines[0][len("search"):lines[0].index(": Search")]
    assert "query (str): What to look for." in entry["doc"]
    compile(ts.install_source(), "<install>", "exec")


def test_record_name_clashes_get_suffixes() -> None:
    def make(name: str) -> type:
        return dataclasses.make_dataclass(name, [("v", int)])

    a, b = make("Item"), make("Item")

    @tool
    def f(x: a, y: b) -> None:  # type: ignore[valid-type]
        """F."""

    ts = ToolSet([f])
    assert ts.record_names == {a: "Item", b: "Item_2"}


@pytest.mark.parametrize(("value", "expected"), [
    (3, ("3", "3")), ("a'b", ('"a\'b"', '"a\'b"')), (None, ("None", "None")),
    ((1, [2, {"k": b"v"}]), ("(1, [2, {'k': b'v'}])",) * 2), (Color.BLUE, ("'blue'",) * 2),
    (datetime.date(2024, 2, 3), ("datetime.date(2024, 2, 3)",) * 2),
    (decimal.Decimal("2.50"), ("decimal.Decimal('2.50')", "Decimal('2.50')")),
    (float("inf"), None), ({1, 2}, None), (object(), None), (np.int64(3), None),
    (datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone(datetime.timedelta(hours=2))),
     ("datetime.datetime(2024, 1, 1, 0, 0, tzinfo=datetime.timezone("
      "datetime.timedelta(seconds=7200)))",) * 2),
])
def test_defaults_the_stub_can_carry(value: Any, expected: tuple[str, str] | None) -> None:
    assert render_default(value) == expected
