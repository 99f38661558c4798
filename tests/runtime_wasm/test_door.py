"""The door: framed msgpack calls from the guest to host handlers, with caps and time bounds.
Nothing a guest sends can raise in the host."""

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

from memex import ConfigError, Door, Limits, Sandbox, TurnStatus

MakeSandbox = Callable[..., Sandbox]
KINDS = {"protocol", "too_large", "unknown_op", "handler_error", "timeout", "unencodable"}

# Guest helper: call an op and report (kind, message) of a DoorError, or ('ok', value).
GUEST_TRY = (
    "import memex_guest\n"
    "def attempt(op, *args, **kwargs):\n"
    "    try:\n"
    "        return ('ok', memex_guest.call(op, *args, **kwargs))\n"
    "    except memex_guest.DoorError as e:\n"
    "        return (e.kind, e.message)\n"
)


def door_sandbox(make_sandbox: MakeSandbox, door: Door, timeout: float = 10) -> Sandbox:
    sb = make_sandbox(limits=Limits(timeout=timeout), door=door)
    r = sb.run(GUEST_TRY)
    assert r.status is TurnStatus.OK, r
    return sb


def guest_eval(sb: Sandbox, code: str) -> Any:
    """Run ``code`` whose final expression is a literal-safe value and return it."""
    r = sb.run(code)
    assert r.status is TurnStatus.OK, r
    assert r.value is not None
    return ast.literal_eval(r.value)


# ---- round trips --------------------------------------------------------------------------
def test_door_round_trip(make_sandbox: MakeSandbox) -> None:
    door = Door()
    seen: list[tuple[Any, ...]] = []

    def add(a: int, b: int, *, scale: int = 1) -> int:
        seen.append((a, b, scale))
        return (a + b) * scale

    door.register("add", add)
    door.register("echo", lambda *a, **k: {"args": list(a), "kwargs": k})
    sb = door_sandbox(make_sandbox, door)
    assert guest_eval(sb, "attempt('add', 2, 3)") == ("ok", 5)
    assert guest_eval(sb, "attempt('add', 2, 3, scale=10)") == ("ok", 50)
    assert seen == [(2, 3, 1), (2, 3, 10)]
    value = guest_eval(
        sb,
        "attempt('echo', 1, 'two', b'three', [4.5, None, True], {'k': [1]}, flag=False)",
    )
    assert value == ("ok", {"args": [1, "two", b"three", [4.5, None, True], {"k": [1]}],
                            "kwargs": {"flag": False}})
    assert door.ops == ("add", "echo")
    ok_calls = [c for c in door.calls if c.ok]
    assert len(ok_calls) == 3
    assert ok_calls[0].op == "add" and ok_calls[0].request_bytes > 0


def test_inline_handler_round_trip(make_sandbox: MakeSandbox) -> None:
    door = Door()
    threads: list[str] = []

    def where() -> str:
        threads.append(threading.current_thread().name)
        return "here"

    door.register("where", where, inline=True)
    sb = door_sandbox(make_sandbox, door)
    assert guest_eval(sb, "attempt('where')") == ("ok", "here")
    assert threads and threads[0].startswith("memex-runner-")  # the guest's own thread


def test_large_reply_round_trip(make_sandbox: MakeSandbox) -> None:
    door = Door()
    door.register("blob", lambda n: b"z" * n)
    sb = door_sandbox(make_sandbox, door)
    assert guest_eval(sb, "r = memex_guest.call('blob', 5_000_000)\nlen(r), r[:3]") == (
        5_000_000, b"zzz")


def test_many_calls_in_one_turn(make_sandbox: MakeSandbox) -> None:
    door = Door()
    door.register("inc", lambda n: n + 1)
    sb = door_sandbox(make_sandbox, door)
    code = "n = 0\nfor _ in range(500):\n    n = memex_guest.call('inc', n)\nn"
    assert guest_eval(sb, code) == 500


def test_handler_registered_after_start_is_reachable(make_sandbox: MakeSandbox) -> None:
    door = Door()
    sb = door_sandbox(make_sandbox, door)
    assert guest_eval(sb, "attempt('late')")[0] == "unknown_op"
    door.register("late", lambda: "now here")
    assert guest_eval(sb, "attempt('late')") == ("ok", "now here")
    door.unregister("late")
    assert guest_eval(sb, "attempt('late')")[0] == "unknown_op"


# ---- errors -------------------------------------------------------------------------------
def test_handler_raising_is_handler_error(make_sandbox: MakeSandbox) -> None:
    door = Door()

    def boom() -> None:
        raise RuntimeError("handler exploded")

    door.register("boom", boom)
    sb = door_sandbox(make_sandbox, door)
    kind, message = guest_eval(sb, "attempt('boom')")
    assert kind == "handler_error"
    assert "handler exploded" in message
    assert door.calls[-1].error_kind == "handler_error"
    # an uncaught DoorError is an ordinary guest exception
    r = sb.run("memex_guest.call('boom')")
    assert r.status is TurnStatus.ERROR
    assert r.exception is not None and "DoorError" in r.exception.type
    assert "handler_error" in r.exception.message


def test_handler_wrong_arguments_is_handler_error(make_sandbox: MakeSandbox) -> None:
    door = Door()
    door.register("one", lambda a: a)
    sb = door_sandbox(make_sandbox, door)
    assert guest_eval(sb, "attempt('one', 1, 2)")[0] == "handler_error"
    assert guest_eval(sb, "attempt('one', b=2)")[0] == "handler_error"


def test_unknown_op(make_sandbox: MakeSandbox) -> None:
    door = Door()
    sb = door_sandbox(make_sandbox, door)
    kind, message = guest_eval(sb, "attempt('no_such_op', 1)")
    assert kind == "unknown_op"
    assert "no_such_op" in message


def test_unencodable_result(make_sandbox: MakeSandbox) -> None:
    door = Door()
    door.register("obj", lambda: object())
    sb = door_sandbox(make_sandbox, door)
    assert guest_eval(sb, "attempt('obj')")[0] == "unencodable"


@pytest.mark.parametrize(
    "frame",
    [
        b"",
        b"\xc1",
        b"\xc1garbage",
        b"not msgpack at all",
        msgpack.packb([1, 2, 3]),
        msgpack.packb({"v": 2, "id": 1, "op": "echo", "args": [], "kwargs": {}}),
        msgpack.packb({"v": 1, "id": 1, "op": 5, "args": [], "kwargs": {}}),
        msgpack.packb({"v": 1, "id": 1, "op": "echo", "args": {}, "kwargs": {}}),
        msgpack.packb({"v": 1, "id": 1, "op": "echo", "args": [], "kwargs": {1: 2}}),
        msgpack.packb({"v": 1, "id": 1, "op": "echo", "args": [], "kwargs": {}}) + b"\x00",
        msgpack.packb({"v": 1, "id": 1, "op": "echo", "args": [], "kwargs": {}})[:-3],
    ],
    ids=["empty", "reserved-byte", "garbage", "text", "list", "version", "op-type",
         "args-type", "kwargs-keys", "extra-data", "truncated"],
)
def test_malformed_frame_via_raw_host_call_gets_protocol_error(
    make_sandbox: MakeSandbox, frame: bytes
) -> None:
    door = Door()
    door.register("echo", lambda *a: a)
    sb = door_sandbox(make_sandbox, door)
    r = sb.run(
        "import _host, msgpack\n"
        f"raw = _host.call({frame!r})\n"
        "reply = msgpack.unpackb(raw, raw=False, strict_map_key=False)\n"
        "type(raw).__name__, reply.get('ok'), reply.get('error', {}).get('kind')"
    )
    assert r.status is TurnStatus.OK, r  # the guest got a reply; nothing raised anywhere
    assert r.value == "('bytes', False, 'protocol')"
    assert door.calls[-1].error_kind == "protocol"
    # the door (and the sandbox) keep working
    assert guest_eval(sb, "attempt('echo', 1)") == ("ok", [1])


def test_reply_echoes_request_id(make_sandbox: MakeSandbox) -> None:
    door = Door()
    door.register("echo", lambda x: x)
    sb = door_sandbox(make_sandbox, door)
    frame = msgpack.packb({"v": 1, "id": 4242, "op": "echo", "args": ["v"], "kwargs": {}})
    r = sb.run(
        "import _host, msgpack\n"
        f"reply = msgpack.unpackb(_host.call({frame!r}), raw=False)\n"
        "reply['id'], reply['ok'], reply['value']"
    )
    assert r.value == "(4242, True, 'v')"


def test_huge_frame_is_too_large(make_sandbox: MakeSandbox) -> None:
    door = Door(max_request_bytes=64 << 10)
    got: list[int] = []
    door.register("take", lambda data: got.append(len(data)) or len(data))
    sb = door_sandbox(make_sandbox, door)
    assert guest_eval(sb, "attempt('take', b'x' * 1000)") == ("ok", 1000)
    kind, message = guest_eval(sb, "attempt('take', b'x' * (1 << 20))")
    assert kind == "too_large"
    assert str(64 << 10) in message
    assert got == [1000]  # the handler never saw the big one
    # raw frames beyond the cap are refused before they are decoded
    r = sb.run(
        "import _host, msgpack\n"
        "msgpack.unpackb(_host.call(b'\\xc1' * (1 << 17)), raw=False)['error']['kind']"
    )
    assert r.value == "'too_large'"


def test_reply_beyond_cap_is_too_large(make_sandbox: MakeSandbox) -> None:
    door = Door(max_reply_bytes=1 << 16)
    door.register("blob", lambda n: b"z" * n)
    sb = door_sandbox(make_sandbox, door)
    assert guest_eval(sb, "attempt('blob', 10)") == ("ok", b"z" * 10)
    assert guest_eval(sb, "attempt('blob', 1 << 20)")[0] == "too_large"


# ---- time bounds --------------------------------------------------------------------------
def test_slow_handler_past_call_timeout_is_timeout_and_turn_continues(
    make_sandbox: MakeSandbox,
) -> None:
    door = Door(call_timeout=0.2)
    release = threading.Event()
    finished: list[bool] = []

    def slow() -> str:
        release.wait(30)
        finished.append(True)
        return "late"

    door.register("slow", slow)
    sb = door_sandbox(make_sandbox, door, timeout=5)
    try:
        r = sb.run("res = attempt('slow')\nprint('continued')\nres[0]")
        still_running = not finished  # the answer came while the handler was running
    finally:
        release.set()
    assert r.status is TurnStatus.OK, r
    assert "continued" in r.stdout
    assert r.value == "'timeout'" and still_running
    last = door.calls[-1]
    assert last.error_kind == "timeout"
    assert last.op == "slow"
    assert last.may_still_run


def test_slow_handler_past_turn_deadline_kills_and_rolls_back(make_sandbox: MakeSandbox) -> None:
    door = Door(call_timeout=30)
    release = threading.Event()
    finished: list[bool] = []

    def slow() -> str:
        release.wait(30)
        finished.append(True)
        return "late"

    door.register("slow", slow)
    sb = door_sandbox(make_sandbox, door, timeout=0.5)
    sb.run("z = 1")
    try:
        r = sb.run("z = 2\nmemex_guest.call('slow')")
        still_running = not finished  # the turn ended at its deadline, not the handler's end
    finally:
        release.set()
    assert still_running
    assert r.status is TurnStatus.KILLED
    assert r.limit == "deadline"
    assert r.rolled_back is True
    assert sb.run("z").value == "1"


# ---- validation ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs",
    [{"max_request_bytes": 0}, {"max_reply_bytes": -1}, {"call_timeout": 0},
     {"call_timeout": -1.0}],
)
def test_door_rejects_bad_caps(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        Door(**kwargs)


@pytest.mark.parametrize("op", ["", None, 5])
def test_register_rejects_bad_op_names(op: Any) -> None:
    with pytest.raises(ConfigError):
        Door().register(op, lambda: None)


# ---- property: dispatch never raises ------------------------------------------------------
def _fuzz_door() -> Door:
    door = Door(max_request_bytes=1 << 16, max_reply_bytes=1 << 16, call_timeout=2)
    door.register("echo", lambda *a, **k: [list(a), k])
    door.register("boom", lambda *a, **k: 1 / 0)
    door.register("obj", lambda *a, **k: object())
    door.register("inline_echo", lambda *a, **k: list(a), inline=True)
    door.register("big", lambda *a, **k: b"x" * (1 << 17))
    return door


FUZZ_DOOR = _fuzz_door()

leaves = (
    st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False) | st.text(max_size=20) | st.binary(max_size=20)
)
values = st.recursive(
    leaves,
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
frames = st.fixed_dictionaries(
    {"v": st.just(1), "id": st.integers(min_value=0, max_value=2**31), "op": st.sampled_from(
        ["echo", "boom", "obj", "inline_echo", "big", "missing", ""]),
     "args": st.lists(values, max_size=4),
     "kwargs": st.dictionaries(st.text(max_size=8), values, max_size=3)},
    optional={"extra": values},
)


def _check_reply(reply: object) -> dict[str, Any]:
    assert isinstance(reply, bytes)
    decoded = msgpack.unpackb(reply, raw=False, strict_map_key=False)
    assert isinstance(decoded, dict)
    assert decoded.get("ok") in (True, False)
    if decoded["ok"] is False:
        assert decoded["error"]["kind"] in KINDS
        assert isinstance(decoded["error"]["message"], str)
    return decoded


@settings(max_examples=examples(300), deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=512))
def test_dispatch_random_bytes_never_raises(frame: bytes) -> None:
    _check_reply(FUZZ_DOOR.dispatch(frame))


@settings(max_examples=examples(150), deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@pytest.mark.slow
@given(frames)
def test_dispatch_valid_frames_always_reply(req: dict[str, Any]) -> None:
    decoded = _check_reply(FUZZ_DOOR.dispatch(msgpack.packb(req, use_bin_type=True)))
    assert decoded["id"] == req["id"]
    if req["op"] == "echo":
        if decoded["ok"]:
            assert decoded["value"] == [req["args"], req["kwargs"]]
        else:
            assert decoded["error"]["kind"] == "handler_error"  # kwargs named like nothing
    elif req["op"] == "boom":
        assert decoded["error"]["kind"] == "handler_error"
    elif req["op"] == "obj":
        assert decoded["error"]["kind"] == "unencodable"
    elif req["op"] == "big":
        assert decoded["error"]["kind"] == "too_large"
    elif req["op"] in ("missing", ""):
        assert decoded["error"]["kind"] == "unknown_op"


@settings(max_examples=examples(200), deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@pytest.mark.slow
@given(frames, st.data())
def test_dispatch_mutated_frames_never_raises(req: dict[str, Any], data: st.DataObject) -> None:
    frame = bytearray(msgpack.packb(req, use_bin_type=True))
    for _ in range(data.draw(st.integers(min_value=1, max_value=6), label="mutations")):
        how = data.draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate",
                                         "duplicate"]), label="how")
        if not frame:
            frame.extend(data.draw(st.binary(min_size=1, max_size=4)))
            continue
        i = data.draw(st.integers(min_value=0, max_value=len(frame) - 1), label="index")
        if how == "flip":
            frame[i] ^= 1 << data.draw(st.integers(min_value=0, max_value=7))
        elif how == "set":
            frame[i] = data.draw(st.integers(min_value=0, max_value=255))
        elif how == "insert":
            frame[i:i] = data.draw(st.binary(min_size=1, max_size=8))
        elif how == "delete":
            del frame[i]
        elif how == "truncate":
            del frame[i:]
        else:
            frame[i:i] = frame[i:i + data.draw(st.integers(min_value=1, max_value=16))]
    _check_reply(FUZZ_DOOR.dispatch(bytes(frame)))


def test_dispatch_deeply_nested_frame_replies() -> None:
    nested = b"\x91" * 100_000 + b"\xc0"  # fixarray(1) x 100k around nil
    _check_reply(FUZZ_DOOR.dispatch(nested))
    req = msgpack.packb({"v": 1, "id": 1, "op": "echo", "args": [], "kwargs": {}})
    _check_reply(FUZZ_DOOR.dispatch(req[:-1] + b"\x91" * 1000))
