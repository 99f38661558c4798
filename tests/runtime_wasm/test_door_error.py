"""``DoorError``: a handler answering with a typed error of its own kind, through real guests
and straight through ``Door.dispatch``. Extras are kept when encodable and small, dropped
otherwise; kinds and messages always arrive, bounded and encodable."""

from __future__ import annotations

import ast
import threading
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lanes import examples

from memex import Door, DoorError, Limits, MemexError, Sandbox, TurnStatus

MakeSandbox = Callable[..., Sandbox]

# Guest helper: (kind, message, whole error map) of a DoorError, or ('ok', value).
GUEST_TRY = (
    "import memex_guest\n"
    "def attempt(op, *args, **kwargs):\n"
    "    try:\n"
    "        return ('ok', memex_guest.call(op, *args, **kwargs))\n"
    "    except memex_guest.DoorError as e:\n"
    "        return (e.kind, e.message, e.error)\n"
)


def guest_eval(sb: Sandbox, code: str) -> Any:
    r = sb.run(code)
    assert r.status is TurnStatus.OK, r
    assert r.value is not None
    return ast.literal_eval(r.value)


def frame(op: str, *args: Any) -> bytes:
    data: bytes = msgpack.packb({"v": 1, "id": 5, "op": op, "args": list(args), "kwargs": {}},
                                use_bin_type=True)
    return data


def reply(door: Door, op: str, *args: Any) -> dict[str, Any]:
    out: dict[str, Any] = msgpack.unpackb(door.dispatch(frame(op, *args)), raw=False,
                                          strict_map_key=False)
    return out


def raiser(kind: Any, message: Any = "", **extra: Any) -> Callable[..., Any]:
    def handler(*args: Any) -> Any:
        raise DoorError(kind, message, **extra)
    return handler


@pytest.mark.parametrize("inline", [False, True])
def test_door_error_reaches_the_guest_with_its_extras(make_sandbox: MakeSandbox,
                                                      inline: bool) -> None:
    door = Door()
    door.register("deny", raiser("denied", "not today", path=["a", 0], tool="t", ran=False),
                  inline=inline)
    sb = make_sandbox(limits=Limits(timeout=10), door=door)
    assert sb.run(GUEST_TRY).status is TurnStatus.OK
    kind, message, err = guest_eval(sb, "attempt('deny', 1)")
    assert (kind, message) == ("denied", "not today")
    assert err == {"kind": "denied", "message": "not today", "path": ["a", 0], "tool": "t",
                   "ran": False}
    assert list(err) == ["kind", "message", "path", "tool", "ran"]  # the order given
    call = door.calls[-1]
    assert (call.op, call.ok, call.error_kind) == ("deny", False, "denied")
    # uncaught in the guest: memex_guest.DoorError with the kind in its text
    r = sb.run("memex_guest.call('deny')")
    assert r.status is TurnStatus.ERROR and r.exception is not None
    assert r.exception.type.endswith("DoorError") and "denied: not today" in r.exception.message


def test_unencodable_and_oversized_extras_are_dropped() -> None:
    door = Door()
    door.register("odd", raiser("odd", "m", lock=threading.Lock(), big=b"x" * (70 << 10),
                                surrogate="\udcff", fine=[1, 2], small=b"ok"))
    err = reply(door, "odd")["error"]
    assert err == {"kind": "odd", "message": "m", "fine": [1, 2], "small": b"ok"}


def test_extras_cannot_replace_kind_or_message() -> None:
    exc = DoorError("k", "m", errors=[{"path": [], "message": "x"}])
    assert exc.error_map() == {"kind": "k", "message": "m",
                               "errors": [{"path": [], "message": "x"}]}
    with pytest.raises(TypeError):
        DoorError("k", "m", **{"kind": "other"})  # type: ignore[misc]


@pytest.mark.parametrize("kind", ["", None, 3, "k" * 65])
def test_a_bad_kind_is_a_handler_error(kind: Any) -> None:
    door = Door()
    door.register("bad", raiser(kind, "m"))
    err = reply(door, "bad")["error"]
    assert err["kind"] == "handler_error" and "ValueError" in err["message"]
    assert door.calls[-1].error_kind == "handler_error"


def test_messages_are_bounded_and_encodable() -> None:
    door = Door()
    door.register("long", raiser("long", "x" * 100_000))
    door.register("lone", raiser("lone", "bad \udcff text"))
    door.register("num", raiser("num", 42))  # not a str: its str()

    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    def unprintable() -> None:
        raise Unprintable

    def lone_plain() -> None:
        raise ValueError("plain \ud800 error")

    door.register("unprintable", unprintable)
    door.register("lone_plain", lone_plain)
    err = reply(door, "long")["error"]
    assert len(err["message"]) <= 4096 and "characters cut" in err["message"]
    assert reply(door, "lone")["error"]["message"] == "bad \\udcff text"
    assert reply(door, "num")["error"]["message"] == "42"
    assert reply(door, "unprintable")["error"] == {"kind": "handler_error",
                                                   "message": "Unprintable: <unprintable>"}
    assert reply(door, "lone_plain")["error"]["message"] == "ValueError: plain \\ud800 error"


def test_door_error_is_not_a_memex_error() -> None:
    # a signal from handler to door, caught by dispatch; never raised to a MemEx caller
    assert not issubclass(DoorError, MemexError)
    assert str(DoorError("denied", "why")) == "denied: why"
    assert str(DoorError("denied")) == "denied"


_EXTRA = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats()
    | st.text(max_size=20) | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=4),
    max_leaves=12,
)


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.text(min_size=1, max_size=64), message=st.text(max_size=300),
       extra=st.dictionaries(st.text(min_size=1, max_size=8).filter(
           lambda k: k not in ("kind", "message")), _EXTRA, max_size=5))
@pytest.mark.slow
def test_any_door_error_gets_a_decodable_reply(kind: str, message: str,
                                               extra: dict[str, Any]) -> None:
    door = Door()
    door.register("op", raiser(kind, message, **extra))
    raw = door.dispatch(frame("op"))
    got = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    assert got["ok"] is False and got["id"] == 5
    err = got["error"]
    assert err["kind"] == kind.encode("utf-8", "backslashreplace").decode("utf-8")
    assert isinstance(err["message"], str)
    for key, value in err.items():
        if key not in ("kind", "message"):
            assert key in extra and msgpack.packb(value) == msgpack.packb(extra[key])


def test_door_records_and_contexts_are_complete_frozen_dataclasses() -> None:
    import dataclasses

    from memex import DoorCall, DoorContext

    seen: list[DoorContext] = []
    door = Door()
    door.register("ctx", lambda ctx: seen.append(ctx), context=True)
    door.register("deny", raiser("denied", "no"))
    reply(door, "ctx")
    reply(door, "deny")
    for obj, cls in [(door.calls[-1], DoorCall), (door.calls[-2], DoorCall),
                     (seen[0], DoorContext)]:
        assert set(vars(obj)) == {f.name for f in dataclasses.fields(cls)}
        assert dataclasses.replace(obj) == obj
        with pytest.raises(dataclasses.FrozenInstanceError):
            obj.op = "x"  # type: ignore[misc]
    assert seen[0].request_bytes == len(frame("ctx")) and seen[0].op == "ctx"
