"""Golden bytes of docs/abi.md: the host's frames and typed values, byte for byte; and (needs
the guest side) the frames the guest's stubs send, compared with the host encoder's bytes."""

from __future__ import annotations

import ast
import datetime
import decimal
import math
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lanes import examples

from memex import Door, Limits, Sandbox, TurnStatus
from memex.host_tools import ToolHost, tool
from memex.host_tools._codec import encode, packb


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def echo(value: Any) -> Any:
    """Returns its argument."""
    return value


def h(text: str) -> bytes:
    return bytes.fromhex(text.replace("\n", " "))


def served() -> Door:
    door = Door()
    ToolHost([add, echo]).register(door)
    return door


# {"v": 1, "id": 7, "op": "tools.call", "args": ["add", {"a": 2, "b": 40}], "kwargs": {}}
CALL = h("85 a1 76 01 a2 69 64 07 a2 6f 70 aa 74 6f 6f 6c 73 2e 63 61 6c 6c a4 61 72 67 73 92"
         " a3 61 64 64 82 a1 61 02 a1 62 28 a6 6b 77 61 72 67 73 80")
# {"v": 1, "id": 7, "ok": true, "value": 42}
CALL_OK = h("84 a1 76 01 a2 69 64 07 a2 6f 6b c3 a5 76 61 6c 75 65 2a")
# {"v": 1, "id": 8, "op": "tools.call", "args": ["sub", {}], "kwargs": {}}
UNKNOWN = h("85 a1 76 01 a2 69 64 08 a2 6f 70 aa 74 6f 6f 6c 73 2e 63 61 6c 6c a4 61 72 67 73 92"
            " a3 73 75 62 80 a6 6b 77 61 72 67 73 80")
# A failed tools.call is a door error whose map is the tool error (docs/abi.md, Layer 3):
# {"v": 1, "id": 8, "ok": false, "error": {"kind": "unknown_tool",
#                                           "message": "no tool named 'sub'"}}
UNKNOWN_REPLY = h(
    "84 a1 76 01 a2 69 64 08 a2 6f 6b c2 a5 65 72 72 6f 72 82 a4 6b 69 6e 64 ac 75 6e 6b 6e 6f"
    " 77 6e 5f 74 6f 6f 6c a7 6d 65 73 73 61 67 65 b3 6e 6f 20 74 6f 6f 6c 20 6e 61 6d 65 64 20"
    " 27 73 75 62 27")
# {"v": 1, "id": 9, "op": "tools.batch", "args": [[[0, "add", {"a": 1, "b": 2}],
#                                                  [1, "nope", {}]]], "kwargs": {}}
BATCH = h("85 a1 76 01 a2 69 64 09 a2 6f 70 ab 74 6f 6f 6c 73 2e 62 61 74 63 68 a4 61 72 67 73"
          " 91 92 93 00 a3 61 64 64 82 a1 61 01 a1 62 02 93 01 a4 6e 6f 70 65 80 a6 6b 77 61 72"
          " 67 73 80")
# {"v": 1, "id": 9, "ok": true,
#  "value": [[0, true, 3], [1, false, {"kind": "unknown_tool", "message": "no tool named 'nope'"}]]}
BATCH_REPLY = h(
    "84 a1 76 01 a2 69 64 09 a2 6f 6b c3 a5 76 61 6c 75 65 92 93 00 c3 03 93 01 c2 82 a4 6b 69"
    " 6e 64 ac 75 6e 6b 6e 6f 77 6e 5f 74 6f 6f 6c a7 6d 65 73 73 61 67 65 b4 6e 6f 20 74 6f 6f"
    " 6c 20 6e 61 6d 65 64 20 27 6e 6f 70 65 27")


def test_golden_request_and_reply_frames() -> None:
    door = served()
    assert msgpack.packb({"v": 1, "id": 7, "op": "tools.call",
                          "args": ["add", {"a": 2, "b": 40}], "kwargs": {}},
                         use_bin_type=True) == CALL
    assert door.dispatch(CALL) == CALL_OK
    assert door.dispatch(UNKNOWN) == UNKNOWN_REPLY
    assert door.dispatch(BATCH) == BATCH_REPLY


def test_tools_list_frame() -> None:
    reply = msgpack.unpackb(served().dispatch(msgpack.packb(
        {"v": 1, "id": 1, "op": "tools.list", "args": [], "kwargs": {}})))
    assert reply["value"][0] == {"name": "add", "alias": "add",
                                 "signature": "(a: int, b: int) -> int",
                                 "doc": "Add two integers.\n\nArgs:\n    a (int)\n    b (int)"
                                        "\n\nReturns:\n    int"}


GOLDEN_VALUES: list[tuple[Any, str]] = [
    ((1, 2), "c7 03 07 92 01 02"),
    ({3}, "c7 07 08 92 a3 73 65 74 91 03"),
    (frozenset({"a"}), "c7 0e 08 92 a9 66 72 6f 7a 65 6e 73 65 74 91 a1 61"),
    (datetime.datetime(2024, 5, 6, 7, 8, 9),
     "c7 1e 04 92 a8 64 61 74 65 74 69 6d 65 b3 32 30 32 34 2d 30 35 2d 30 36 54 30 37 3a 30 38"
     " 3a 30 39"),
    (datetime.date(2024, 5, 6), "c7 11 04 92 a4 64 61 74 65 aa 32 30 32 34 2d 30 35 2d 30 36"),
    (datetime.timedelta(seconds=90), "d8 04 92 a9 74 69 6d 65 64 65 6c 74 61 a4 39 30 2e 30"),
    (decimal.Decimal("1.50"), "c7 05 06 a4 31 2e 35 30"),
    (np.array([1, 2, 3], dtype="<i4"),
     "c7 15 01 93 a3 3c 69 34 91 03 c4 0c 01 00 00 00 02 00 00 00 03 00 00 00"),
    (pd.DataFrame({"a": [1, 2]}),
     "c7 6b 02 83 a7 63 6f 6c 75 6d 6e 73 91 83 a4 6b 69 6e 64 a5 6e 75 6d 70 79 a5 64 74 79 70"
     " 65 a3 3c 69 38 a4 64 61 74 61 c4 10 01 00 00 00 00 00 00 00 02 00 00 00 00 00 00 00 a5 69"
     " 6e 64 65 78 85 a4 6b 69 6e 64 a5 72 61 6e 67 65 a5 73 74 61 72 74 00 a4 73 74 6f 70 02 a4"
     " 73 74 65 70 01 a4 6e 61 6d 65 c0 a5 6e 61 6d 65 73 91 a1 61"),
]


@pytest.mark.parametrize(("value", "golden"), GOLDEN_VALUES, ids=lambda x: type(x).__name__)
def test_golden_typed_values(value: Any, golden: str) -> None:
    assert packb(value) == h(golden)


def test_record_wire_form() -> None:
    from pydantic import BaseModel

    class Place(BaseModel):
        name: str
        lat: float

    ext = encode(Place(name="x", lat=1.5))
    assert ext.code == 5 and msgpack.unpackb(ext.data) == ["Place", {"name": "x", "lat": 1.5}]
    assert encode(Place(name="x", lat=1.5), names={Place: "Place_2"}).data.startswith(
        b"\x92\xa7Place_2")


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(
    st.binary(max_size=64),
    st.sampled_from([CALL, UNKNOWN, BATCH]).flatmap(
        lambda f: st.lists(st.tuples(st.integers(0, len(f) - 1), st.integers(0, 255)),
                           min_size=1, max_size=4).map(lambda muts: _mutate(f, muts))),
))
def test_random_and_mutated_frames_always_get_a_reply(frame: bytes) -> None:
    reply = msgpack.unpackb(_DOOR.dispatch(frame), raw=False, strict_map_key=False)
    assert reply["v"] == 1 and isinstance(reply["ok"], bool)
    if not reply["ok"]:
        assert isinstance(reply["error"]["kind"], str)


def _mutate(frame: bytes, muts: list[tuple[int, int]]) -> bytes:
    b = bytearray(frame)
    for i, v in muts:
        b[i] = v
    return bytes(b)


_DOOR = served()


# ---- the guest's frames (needs the guest side: memex_guest.tools) -----------------------------
class RecordingDoor(Door):
    """A real door that keeps the request frames it answers."""

    def __init__(self) -> None:
        super().__init__()
        self.frames: list[bytes] = []

    def dispatch(self, frame: bytes, deadline: float = math.inf) -> bytes:
        self.frames.append(bytes(frame))
        return super().dispatch(frame, deadline)


GUEST_VALUES = [
    ("(1, 2)", (1, 2)),
    ("{3}", {3}),
    ("datetime.datetime(2024, 5, 6, 7, 8, 9)", datetime.datetime(2024, 5, 6, 7, 8, 9)),
    ("datetime.date(2024, 5, 6)", datetime.date(2024, 5, 6)),
    ("decimal.Decimal('1.50')", decimal.Decimal("1.50")),
    ("numpy.array([1, 2, 3], dtype='<i4')", np.array([1, 2, 3], dtype="<i4")),
    ("pandas.DataFrame({'a': [1, 2]})", pd.DataFrame({"a": [1, 2]})),
    ("{'k': [1, 'two', b'3', None, 4.5]}", {"k": [1, "two", b"3", None, 4.5]}),
]


@pytest.mark.slow
def test_guest_frames_are_the_host_encoders_bytes(
        make_sandbox: Callable[..., Sandbox]) -> None:
    door = RecordingDoor()
    sb = make_sandbox(limits=Limits(timeout=20), door=door)
    host = ToolHost([echo]).attach(sb)
    r = sb.run("import datetime, decimal, numpy, pandas")
    assert r.status is TurnStatus.OK, r
    for src, value in GUEST_VALUES:
        door.frames.clear()
        r = sb.run(f"echo({src})")
        assert r.status is TurnStatus.OK, r
        frame = next(f for f in door.frames if not f.startswith(b"\x00MX"))
        rid = msgpack.unpackb(frame, raw=False, strict_map_key=False)["id"]
        want = msgpack.packb({"v": 1, "id": rid, "op": "tools.call",
                              "args": ["echo", encode({"value": value})], "kwargs": {}},
                             use_bin_type=True)
        assert frame == want, src
    host.close()


def test_guest_fast_tool_frames_match_the_host_encoder(
        make_sandbox: Callable[..., Sandbox]) -> None:
    """The guest's tools.call fast path (arguments packed once, frame spliced) writes the
    bytes the host's encoder writes, at every size of request id."""
    sb = make_sandbox()
    rids = [0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1]
    r = sb.run(
        "import memex_guest._codec as C\n"
        f"rids = {rids!r}\n"
        "args = [{'a': 1, 'b': 2}, {}, {'x': [1, (2, 3)], 'y': 'z' * 40, 'n': None},"
        " {str(i): i for i in range(20)}]\n"
        "skip = object()\n"
        "[[C.pack_tool_call(rid, 'add', C.pack_arguments(a, skip)) for a in args]"
        " for rid in rids]")
    assert r.status is TurnStatus.OK, r
    got = ast.literal_eval(r.value or "None")  # a list of lists of bytes literals
    args: list[dict[str, Any]] = [{"a": 1, "b": 2}, {}, {"x": [1, (2, 3)], "y": "z" * 40,
                                                        "n": None},
                                  {str(i): i for i in range(20)}]
    for rid, frames in zip(rids, got, strict=True):
        for a, frame in zip(args, frames, strict=True):
            assert frame == msgpack.packb({"v": 1, "id": rid, "op": "tools.call",
                                           "args": ["add", encode(a)], "kwargs": {}},
                                          use_bin_type=True), (rid, a)
