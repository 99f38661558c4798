"""Every bad input of the issue, through the guest's own tool client (the installed ``tools``
module and ``memex_guest.tools``): each one gets a clear, typed error in the guest, a call
record on the host where the host saw the call, and loses nothing (the sandbox and the host
go on serving). The raw-frame forms of the same inputs are in test_tool_dispatch.py,
test_tool_governance.py and test_abi.py."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from memex import Door, Limits, Sandbox, TurnStatus
from memex.host_tools import ToolBudget, ToolHost, ToolSet, tool

Eval = Callable[[Sandbox, str], Any]


@tool
def add(a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


@tool
def echo(value: Any = None) -> Any:
    """Returns its value."""
    return value


@tool
def size(data: bytes) -> int:
    """The length of ``data``."""
    return len(data)


@tool
def half(x: float) -> float:
    """Halves a float."""
    return x / 2


@tool
def explode(message: str) -> None:
    """Raises with ``message``."""
    raise PermissionError(message)


@tool(timeout=0.3)
def stall(secs: float) -> str:
    """Sleeps ``secs`` seconds (bound: 0.3 s)."""
    time.sleep(secs)
    return "done"


@tool
def liar() -> int:
    """Declares int, returns a str."""
    return "three"  # type: ignore[return-value]


@tool
def surrogate() -> str:
    """Returns a str that is not valid Unicode."""
    return "bad \udcff"


@tool
def deep_return(levels: int) -> Any:
    """Returns a list nested ``levels`` deep."""
    v: Any = 1
    for _ in range(levels):
        v = [v]
    return v


_SANDBOX: list[Sandbox] = []


@tool
def reenter() -> str:
    """Tries to run code in the sandbox waiting for it."""
    return str(_SANDBOX[0].run("1").value)


@tool(inline=True)
def reenter_inline() -> str:
    """The same on the guest's own thread."""
    return str(_SANDBOX[0].run("1").value)


# Guest helper: ('ok', value) or (error class name, kind, message, paths, ran) of a ToolError,
# or ('raised', type name, message) of any other exception (raised before anything was sent).
TRY = '''
import memex_guest.tools as mt
def attempt(f, *a, **k):
    try:
        return ('ok', f(*a, **k))
    except tools.ToolError as e:
        ran = getattr(e, 'ran', None)
        return (type(e).__name__, e.kind, e.message, [x.get('path') for x in e.errors], ran)
    except Exception as e:
        return ('raised', type(e).__name__, str(e)[:200])
def nest(k):
    v = 1
    for _ in range(k):
        v = [v]
    return v
'''


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[Sandbox, ToolHost]]:
    door = Door(max_request_bytes=1 << 20)  # 1 MiB frames, to keep "enormous" cheap
    sb = Sandbox(limits=Limits(timeout=20), door=door)
    _SANDBOX[:] = [sb]
    host = ToolHost(ToolSet([add, echo, size, half, explode, stall, liar, surrogate,
                             deep_return, reenter, reenter_inline]),
                    budget=ToolBudget(max_depth=32)).attach(sb)
    r = sb.run(TRY)
    assert r.status is TurnStatus.OK, r
    yield sb, host
    host.close()
    sb.close()


def still_serving(sb: Sandbox, guest_eval: Eval) -> None:
    assert guest_eval(sb, "add(20, 22)") == 42


def test_wrong_types(served: tuple[Sandbox, ToolHost], guest_eval: Eval) -> None:
    sb, host = served
    got = guest_eval(sb, "attempt(add, 'one', [2])")
    assert got[:2] == ("ToolArgumentError", "invalid_arguments")
    assert got[3] == [["a"], ["b"]] and "valid integer" in got[2]
    assert host.calls[-1].outcome == "invalid_arguments" and not host.calls[-1].ran
    still_serving(sb, guest_eval)


def test_missing_and_extra_arguments(served: tuple[Sandbox, ToolHost],
                                     guest_eval: Eval) -> None:
    sb, host = served
    # the stub is a real function: Python refuses the call before anything is sent
    n = len(host.calls)
    got = guest_eval(sb, "[attempt(add, 1), attempt(add, 1, 2, c=3)]")
    assert [g[:2] for g in got] == [("raised", "TypeError")] * 2
    assert "missing 1 required positional argument: 'b'" in got[0][2]
    assert len(host.calls) == n
    # the same through tools.call: the host's validation names each argument
    got = guest_eval(sb, "[attempt(mt.call, 'add', {'a': 1}),"
                         " attempt(mt.call, 'add', {'a': 1, 'b': 2, 'c': 3})]")
    assert got[0][:2] == ("ToolArgumentError", "invalid_arguments") and got[0][3] == [["b"]]
    assert "Field required" in got[0][2]
    assert got[1][3] == [["c"]] and "Extra inputs are not permitted" in got[1][2]
    still_serving(sb, guest_eval)


def test_enormous_arguments(served: tuple[Sandbox, ToolHost], guest_eval: Eval) -> None:
    sb, host = served
    n = len(host.calls)
    got = guest_eval(sb, "attempt(size, b'x' * (2 << 20))")
    assert got[:2] == ("ToolArgumentError", "too_large") and "1048576-byte cap" in got[2]
    assert len(host.calls) == n  # the door refused the frame before the tool layer saw it
    assert sb.door.calls[-1].error_kind == "too_large"
    assert guest_eval(sb, "size(b'x' * 1000)") == 1000
    # many arguments, none large: also refused as a whole frame
    got = guest_eval(sb, "attempt(mt.call, 'echo', {'value': ['y' * 100] * 20000})")
    assert got[1] == "too_large"
    still_serving(sb, guest_eval)


def test_unknown_tool(served: tuple[Sandbox, ToolHost], guest_eval: Eval) -> None:
    sb, host = served
    got = guest_eval(sb, "attempt(mt.call, 'ad', {'a': 1, 'b': 2})")
    assert got[:2] == ("ToolNotFoundError", "unknown_tool") and "did you mean add" in got[2]
    assert host.calls[-1].tool == "ad" and host.calls[-1].outcome == "unknown_tool"
    got = guest_eval(sb, "[attempt(mt.call, 3, {})[:2], attempt(mt.call, 'add', {1: 2})[:2],"
                         " attempt(mt.call, 'add', 5)[:2],"
                         " attempt(mt.call, 'add', [('a', 1), ('b', 2)])]")
    assert got == [("raised", "TypeError")] * 3 + [("ok", 3)]  # pairs make a mapping
    still_serving(sb, guest_eval)


def test_tool_raising(served: tuple[Sandbox, ToolHost], guest_eval: Eval) -> None:
    sb, host = served
    got = guest_eval(sb, "attempt(explode, '/etc/secret is locked')")
    assert got[:3] == ("ToolExecutionError", "tool_failed", "/etc/secret is locked")
    rec = host.calls[-1]
    assert rec.ran and rec.traceback is not None and "PermissionError" in rec.traceback
    r = sb.run("explode('x' * 10000)")  # uncaught: a guest exception, the message bounded
    assert r.status is TurnStatus.ERROR and r.exception is not None
    assert r.exception.type.endswith("ToolExecutionError")
    assert len(r.exception.message) <= 4000 and "characters cut" in r.exception.message
    still_serving(sb, guest_eval)


def test_tool_hanging_past_its_bound(served: tuple[Sandbox, ToolHost],
                                     guest_eval: Eval) -> None:
    sb, host = served
    got = guest_eval(sb, "attempt(stall, 5)")
    assert got[:2] == ("ToolTimeoutError", "timeout") and got[4] is True  # it did start
    rec = host.calls[-1]
    assert rec.outcome == "timeout" and rec.ran and rec.may_still_run
    assert guest_eval(sb, "stall(0.01)") == "done"
    still_serving(sb, guest_eval)


def test_tool_returning_the_wrong_type(served: tuple[Sandbox, ToolHost],
                                       guest_eval: Eval) -> None:
    sb, host = served
    got = guest_eval(sb, "attempt(liar)")
    assert got[:2] == ("ToolReturnError", "invalid_return") and "valid integer" in got[2]
    assert host.calls[-1].ran
    still_serving(sb, guest_eval)


@pytest.mark.parametrize("name", ["reenter", "reenter_inline"])
def test_recursion_through_the_door_is_refused(served: tuple[Sandbox, ToolHost],
                                               guest_eval: Eval, name: str) -> None:
    sb, host = served
    got = guest_eval(sb, f"attempt({name})")
    assert got[:2] == ("ToolExecutionError", "tool_failed")
    assert "cannot run code in the sandbox" in got[2]
    assert "SandboxError" in (host.calls[-1].traceback or "")
    still_serving(sb, guest_eval)


def test_forged_frames(served: tuple[Sandbox, ToolHost], guest_eval: Eval) -> None:
    sb, host = served
    n = len(host.calls)
    got = guest_eval(sb, (
        "import _host, msgpack\n"
        "def raw(frame):\n"
        "    r = msgpack.unpackb(_host.call(frame), raw=False, strict_map_key=False)\n"
        "    return (r.get('id'), r['ok'], (r.get('error') or {}).get('kind'))\n"
        "def f(**kw):\n"
        "    base = {'v': 1, 'id': 9, 'op': 'tools.call', 'args': [], 'kwargs': {}}\n"
        "    base.update(kw)\n"
        "    return msgpack.packb(base)\n"
        "[raw(f(args=['add', {'a': 1, 'b': 2}], id=-5)),\n"
        " raw(f(v=2, args=['add', {'a': 1, 'b': 2}])),\n"
        " raw(f(args=['add'], kwargs={'arguments': {'a': 1, 'b': 2}})),\n"
        " raw(f(args=['add', {'a': 1, 'b': 2}], kwargs={'evil': 1})),\n"
        " raw(f(op='tools.batch', args=[[[0, 'add', {'a': 1, 'b': 2}]] * 3])),\n"
        " raw(f(op='tools.batch', args=['not a list'])),\n"
        " raw(f(args=[{'not': 'a name'}, {}])),\n"
        " raw(msgpack.packb([1, 2, 3])),\n"
        " raw(f(args=['add', {'a': msgpack.ExtType(5, b'\\xff'), 'b': 2}]))]\n"))
    assert got == [
        (-5, True, None),  # any int id is echoed
        (9, False, "protocol"),  # unknown frame version
        (9, True, None),  # arguments given by keyword reach the same handler
        (9, False, "handler_error"),  # an unknown keyword: the handler refuses it
        (9, True, None),  # a batch may repeat call ids; each call runs
        (9, False, "protocol"),
        (9, False, "unknown_tool"),
        (None, False, "protocol"),
        (9, False, "invalid_arguments"),  # a malformed record (ext 5)
    ]
    # every call the tool layer saw is recorded: 2 single calls, 3 batched, 2 refused ones
    assert len(host.calls) == n + 7
    still_serving(sb, guest_eval)


def test_strings_that_are_not_utf8(served: tuple[Sandbox, ToolHost],
                                   guest_eval: Eval) -> None:
    sb, host = served
    n = len(host.calls)
    got = guest_eval(sb, "attempt(echo, 'lone \\udcff surrogate')")
    assert got[:2] == ("raised", "UnicodeEncodeError")  # at the call, nothing sent
    assert len(host.calls) == n
    got = guest_eval(sb, "attempt(surrogate)")  # the host's value cannot be sent
    assert got[:2] == ("ToolReturnError", "invalid_return") and "cannot be sent" in got[2]
    assert guest_eval(sb, "echo(b'\\xff\\xfe')") == b"\xff\xfe"  # bytes are bytes
    still_serving(sb, guest_eval)


def test_nan_and_inf(served: tuple[Sandbox, ToolHost], guest_eval: Eval) -> None:
    sb, _ = served
    got = guest_eval(sb, "import math\n"
                         "r = [half(float('inf')), half(float('-inf')), half(float('nan')),"
                         " echo([float('nan')])]\n"
                         "[repr(r[0]), repr(r[1]), math.isnan(r[2]), math.isnan(r[3][0]),"
                         " attempt(add, float('nan'), 1)[:2], attempt(add, float('inf'), 1)[:2]]")
    assert got == ["inf", "-inf", True, True, ("ToolArgumentError", "invalid_arguments"),
                   ("ToolArgumentError", "invalid_arguments")]
    still_serving(sb, guest_eval)


def test_deeply_nested_values(served: tuple[Sandbox, ToolHost], guest_eval: Eval) -> None:
    sb, host = served
    got = guest_eval(sb, "[attempt(echo, nest(31))[0], attempt(echo, nest(32))[:2],"
                         " attempt(echo, nest(5000))[:2]]")
    assert got[0] == "ok"
    # the host's bound (max_depth=32; the arguments map is the first level)
    assert got[1] == ("ToolArgumentError", "too_deep")
    assert got[2][0] == "raised"  # the guest's encoder gives up before sending
    assert host.calls[-1].outcome == "too_deep"
    got = guest_eval(sb, "[attempt(deep_return, 200)[0], attempt(deep_return, 300)[:2]]")
    assert got == ["ok", ("ToolReturnError", "invalid_return")]  # the host's encoder bound
    still_serving(sb, guest_eval)
