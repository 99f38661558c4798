"""The tools as the guest sees them: the installed module ``tools``, signatures and help() that
match the catalogue, typed values and typed errors, concurrent awaits as one batch.

Everything here except ``test_failed_install_is_a_tool_install_error`` runs the generated stub
module, which imports ``memex_guest.tools`` (the guest side of docs/abi.md)."""

import dataclasses
import datetime
import enum
from collections.abc import Callable, Iterator
from typing import Annotated, Any, Literal

import numpy as np
import pandas as pd
import pytest
from pydantic import BaseModel, Field

from memex import Limits, Sandbox, TurnStatus
from memex.errors import ServiceError, ToolDefinitionError, ToolInstallError
from memex.host_tools import Tool, ToolHost, ToolSet

Eval = Callable[[Sandbox, str], Any]


class Unit(enum.Enum):
    C = "c"
    F = "f"


class Forecast(BaseModel):
    """One day of weather."""

    day: datetime.date
    high: float = Field(description="degrees")
    notes: list[str] = []


@dataclasses.dataclass
class Place:
    name: str
    lat: float


def get_forecast(city: str, days: int = 2, unit: Unit = Unit.C, *,
                 near: Place | None = None,
                 since: datetime.date = datetime.date(2024, 1, 1)) -> list[Forecast]:
    """Forecast for a city.

    Args:
        city: The city's name.
        days: How many days ahead.
        unit: Degrees in Celsius or Fahrenheit.
        near: A place to prefer.
        since: First day.

    Returns:
        One record per day.
    """
    return [Forecast(day=since + datetime.timedelta(days=i), high=20.0 + i)
            for i in range(days)]


def grid(rows: int, cols: int, dtype: Literal["float32", "int64"] = "float32") -> np.ndarray:
    """A rows x cols array counting up."""
    return np.arange(rows * cols, dtype=dtype).reshape(rows, cols)


def table(n: int) -> pd.DataFrame:
    """A small frame of mixed columns."""
    return pd.DataFrame({
        "i": np.arange(n), "x": np.linspace(0, 1, n),
        "t": pd.date_range("2024-01-01", periods=n, freq="h", tz="UTC"),
        "k": pd.array([None if i % 2 else i for i in range(n)], dtype="Int64"),
        "c": pd.Categorical(["a", "b"] * (n // 2) + ["a"] * (n % 2)),
    })


_STAMP = object()


def scale(values: list[float], factor: Annotated[float, "multiplier"] = 2.0,
          stamp: Any = _STAMP) -> list[float]:
    """Multiply values (``stamp`` has a default the stub cannot write)."""
    return [v * factor for v in values]


def fail(message: str) -> None:
    """Raises with ``message``."""
    raise ValueError(message)


_TOGETHER: list[Any] = []  # the Rendezvous of a concurrency test, while it runs


def nap(i: int) -> int:
    """Waits for the calls running alongside (a worker thread), then echoes."""
    if _TOGETHER:
        _TOGETHER[0].meet()
    return i


async def anap(i: int) -> int:
    """Waits for the calls running alongside (the host's loop), then echoes."""
    if _TOGETHER:
        await _TOGETHER[0].ameet()
    return i


@pytest.fixture
def meeting(together: Any) -> Iterator[Any]:
    """nap/anap calls wait until ``n`` of them run at once (``meeting.arm(n)``)."""
    _TOGETHER[:] = [together]
    yield together
    _TOGETHER.clear()


def _tools() -> ToolSet:
    ts = ToolSet([get_forecast, grid, table, scale, fail, nap, anap])
    ts.add(Tool.from_openai({"type": "function", "function": {
        "name": "weather.now", "description": "Current weather.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}, lambda city: {"city": city, "temp": 21}))
    return ts


@pytest.fixture(scope="module")
def stubbed() -> Iterator[tuple[Sandbox, ToolHost]]:
    sb = Sandbox(limits=Limits(timeout=20))
    host = ToolHost(_tools()).attach(sb)
    yield sb, host
    host.close()
    sb.close()


def test_module_installed(stubbed: tuple[Sandbox, ToolHost], guest_eval: Eval) -> None:
    sb, _ = stubbed
    got = guest_eval(sb, (
        "import sys\n"
        "(sys.modules['tools'] is tools, tools.ALIASES, get_forecast is tools.get_forecast,"
        " weather_now.__name__, issubclass(tools.ToolArgumentError, tools.ToolError),"
        " tools.Forecast.__fields__, tools.Place.__fields__, tools.Forecast.__doc__)"))
    assert got[:5] == (True, {"weather.now": "weather_now"}, True, "weather_now", True)
    assert got[5:7] == (("day", "high", "notes"), ("name", "lat"))
    assert got[7].startswith("One day of weather.") and "high (float): degrees" in got[7]


def test_signatures_match_the_catalogue(stubbed: tuple[Sandbox, ToolHost],
                                        guest_eval: Eval) -> None:
    sb, host = stubbed
    ts = host.tools
    shown = guest_eval(sb, "import inspect\n[f.__name__ + str(inspect.signature(f)) for f in "
                           "(get_forecast, grid, table, scale, fail, nap, anap, weather_now)]")
    lines = ts.catalogue().splitlines()
    for text, line, entry in zip(shown, lines, ts.describe(), strict=False):
        assert line.startswith(text + ":") or line == text
        assert entry["alias"] + entry["signature"] == text
    assert shown[0] == (
        "get_forecast(city: str, days: int = 2, unit: Literal['c', 'f'] = 'c', *, "
        "near: tools.Place | None = None, since: datetime.date = datetime.date(2024, 1, 1)) "
        "-> list[tools.Forecast]")
    assert shown[3] == "scale(values: list[float], factor: float = 2.0, stamp: Any = ...) " \
                       "-> list[float]"
    assert shown[1].endswith("-> 'numpy.ndarray'")


def test_help_shows_parameter_descriptions(stubbed: tuple[Sandbox, ToolHost]) -> None:
    sb, _ = stubbed
    r = sb.run("help(get_forecast)")
    assert r.status is TurnStatus.OK, r
    for text in ("Forecast for a city.", "city (str): The city's name.",
                 "days (int, optional): How many days ahead.",
                 "list[tools.Forecast]: One record per day."):
        assert text in r.stdout, r.stdout


@pytest.mark.slow
def test_typed_values_arrive_as_objects(stubbed: tuple[Sandbox, ToolHost],
                                        guest_eval: Eval) -> None:
    sb, _ = stubbed
    got = guest_eval(sb, (
        "fc = get_forecast('Oslo', days=3, near=tools.Place(name='x', lat=1.0))\n"
        "a = grid(2, 3, 'int64')\n"
        "df = table(5)\n"
        "(type(fc[0]).__name__, isinstance(fc[0], tools.Forecast), str(fc[1].day), fc[2].high,"
        " fc[0].to_dict()['notes'], a.dtype.str, a.shape, int(a.sum()),"
        " [str(t) for t in df.dtypes], int(df['k'].isna().sum()), str(df['t'].iloc[1]),"
        " weather_now('Rome'))"))
    assert got[:5] == ("Forecast", True, "2024-01-02", 22.0, [])
    assert got[5:8] == ("<i8", (2, 3), 15)
    assert got[8] == [str(t) for t in table(5).dtypes]
    assert got[9:] == (2, "2024-01-01 01:00:00+00:00", {"city": "Rome", "temp": 21})


def test_missing_defaults_are_not_sent(stubbed: tuple[Sandbox, ToolHost],
                                       guest_eval: Eval) -> None:
    sb, host = stubbed
    assert guest_eval(sb, "scale([1.0, 2.5])") == [2.0, 5.0]
    assert host.calls[-1].arguments == "values=[1.0, 2.5], factor=2.0"


def test_errors_are_typed(stubbed: tuple[Sandbox, ToolHost], guest_eval: Eval) -> None:
    sb, host = stubbed
    got = guest_eval(sb, (
        "import memex_guest.tools as mt\n"
        "def attempt(f, *a, **k):\n"
        "    try:\n"
        "        return ('ok', f(*a, **k))\n"
        "    except tools.ToolError as e:\n"
        "        return (type(e).__name__, e.kind, e.message, e.errors)\n"
        "[attempt(get_forecast, 5, days='many'), attempt(fail, 'no such file'),"
        " attempt(mt.call, 'nope', {}), attempt(grid, 1, 1, 'complex')]"))
    arg, failed, unknown, literal = got
    assert arg[:2] == ("ToolArgumentError", "invalid_arguments")
    assert [e["path"] for e in arg[3]] == [["city"], ["days"]]
    assert failed[:3] == ("ToolExecutionError", "tool_failed", "no such file")
    assert unknown[:2] == ("ToolNotFoundError", "unknown_tool")
    assert literal[0] == "ToolArgumentError" and literal[3][0]["path"] == ["dtype"]
    assert "ValueError" in (host.calls[-3].traceback or "")


def test_concurrent_awaits_are_one_batch(stubbed: tuple[Sandbox, ToolHost],
                                         guest_eval: Eval, meeting: Any) -> None:
    sb, host = stubbed
    before = len(host.calls)
    meeting.arm(10)  # all 10 calls must run at once on the host
    got = guest_eval(sb, "import asyncio\n"
                         "await asyncio.gather(*[nap(i) for i in range(5)],"
                         " *[anap(i) for i in range(5, 10)])")
    assert got == list(range(10))
    recs = host.calls[before:]
    assert len(recs) == 10 and all(r.batch for r in recs)
    meeting.arm(1)
    assert guest_eval(sb, "nap(3)") == 3 and not host.calls[-1].batch


def test_gather_under_asyncio_run_is_one_batch(stubbed: tuple[Sandbox, ToolHost],
                                               guest_eval: Eval, meeting: Any) -> None:
    sb, host = stubbed
    before = len(host.calls)
    meeting.arm(20)
    got = guest_eval(sb, "import asyncio\n"
                         "async def main():\n"
                         "    return await asyncio.gather(*[anap(i) for i in range(10)],"
                         " *[nap(i) for i in range(10, 20)])\n"
                         "asyncio.run(main())")
    assert got == list(range(20))
    assert [r.batch for r in host.calls[before:]] == [True] * 20


def test_reinstall_replaces_the_names(make_sandbox: Callable[..., Sandbox],
                                      guest_eval: Eval) -> None:
    sb = make_sandbox()
    host = ToolHost([nap, fail]).attach(sb)
    host.tools = ToolSet([nap])
    host.install(sb)
    assert guest_eval(sb, "('nap' in dir(), 'fail' in dir(), hasattr(tools, 'fail'))") == (
        True, False, False)
    host.close()


def test_failed_install_is_a_tool_install_error(make_sandbox: Callable[..., Sandbox]) -> None:
    sb = make_sandbox()
    sb.run("import sys\nsys.modules['memex_guest.tools'] = None")  # importing it now fails
    with pytest.raises(ToolInstallError, match="installing the tools module"):
        ToolHost([nap]).attach(sb)



def test_a_pinned_install_stays_under_later_ones(make_sandbox: Callable[..., Sandbox],
                                                guest_eval: Eval) -> None:
    """``pin=True`` (a service operator's tools): every later install keeps its tools, its
    record classes and its help text; a later tool of the same name replaces the pinned one,
    and a third install still holds the pinned layer, not the second one's tools."""
    sb = make_sandbox()
    r = sb.run(ToolSet([get_forecast, scale]).install_source(pin=True))
    assert r.status is TurnStatus.OK, r
    sb.run(ToolSet([nap, Tool.from_function(grid, name="scale")]).install_source())
    assert guest_eval(sb, "(sorted(n for n in ('get_forecast', 'scale', 'nap', 'Forecast')"
                          " if n in globals()), tools.scale.__doc__.split(chr(10))[0],"
                          " 'Forecast for a city' in tools.__doc__)") == (
        ["Forecast", "get_forecast", "nap", "scale"], (grid.__doc__ or "").split("\n")[0],
        True)
    sb.run(ToolSet([fail]).install_source())
    assert guest_eval(sb, "sorted(n for n in ('get_forecast', 'scale', 'nap', 'fail') "
                          "if n in globals())") == ["fail", "get_forecast", "scale"]
    assert guest_eval(sb, "tools.scale.__doc__.split(chr(10))[0]") == (
        scale.__doc__ or "").split("\n")[0]
    assert guest_eval(sb, "sorted(n for n in list(globals()) if n.startswith('__memex'))") == []


def test_tools_from_a_service_description() -> None:
    """``ToolSet.from_service``: what ``GET /v1/tools`` sends becomes stubs and catalogue
    lines the model is shown; their handlers only say where the tool runs."""
    served = ToolSet([get_forecast, grid])
    entries = [{"definition": t.to_openai(), "returns": t.returns_doc, "catalogue": ""}
               for t in served]
    again = ToolSet.from_service(entries)
    assert again.names == served.names
    assert [p.name for p in again["get_forecast"].params][:2] == ["city", "days"]
    assert "Forecast for a city." in again.catalogue()
    compile(again.install_source(), "<install>", "exec")
    with pytest.raises(ServiceError, match="runs on the memex serve service"):
        again["grid"].handler(rows=1, cols=1)
    with pytest.raises(ToolDefinitionError, match="service tool entry"):
        ToolSet.from_service([{"catalogue": "x"}])
