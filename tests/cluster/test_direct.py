"""The slab's outcomes and its direct path's messages (``memex.cluster._direct``): every
record crosses its wire and comes back equal, and the decoder turns anything that is not
exactly a record into a ProtocolError (what arrives on a slab's port is untrusted)."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from memex.backends.internal import ProtocolError
from memex.cluster.internal import (
    Answer,
    Call,
    Done,
    Hello,
    NotHeld,
    Raised,
    Started,
    Welcome,
    from_wire,
    to_wire,
)
from memex.errors import GuestFileError, SandboxClosed

seqs = st.integers(0, (1 << 63) - 1)
sids = st.text(min_size=1, max_size=20)
values = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 63), (1 << 63) - 1) | st.text()
    | st.binary() | st.floats(allow_nan=False),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)
outcomes = (st.builds(Done, values)
            | st.builds(Raised, st.tuples(st.text(), st.text(), st.none() | st.text()).map(list))
            | st.builds(NotHeld, sids, st.booleans()))
messages = (st.builds(Hello, st.binary(min_size=32, max_size=32))
            | st.just(Welcome())
            | st.builds(Call, seqs, st.sampled_from(["run", "read_file", "save"]),
                        st.tuples(sids, values).map(list))
            | st.builds(Started, seqs)
            | st.builds(Answer, seqs, outcomes))


def crossed(wire: list[Any]) -> Any:
    """What the other end decodes (msgpack turns tuples into lists, as the Channel does)."""
    return msgpack.unpackb(msgpack.packb(wire, use_bin_type=True), raw=False,
                           strict_map_key=False)


@given(messages)
def test_every_message_crosses_its_wire_and_comes_back_equal(msg: Any) -> None:
    assert from_wire(crossed(to_wire(msg))) == msg


@given(values)
def test_anything_else_is_a_protocol_error_or_exactly_a_message(junk: Any) -> None:
    try:
        msg = from_wire(junk)
    except ProtocolError:
        return
    assert to_wire(msg) == junk  # it was exactly one: nothing was dropped or coerced


@pytest.mark.parametrize("junk", [
    ["hello", b"short"],  # a secret of the wrong size
    ["hello", "x" * 32],  # not bytes
    ["call", 1, "close", ["s_a", True]],  # not a method of the direct path
    ["call", 1, "run", []],  # no session
    ["call", True, "run", ["s_a"]],  # a bool is not a number here
    ["call", -1, "run", ["s_a"]],
    ["call", 1, "run", ["s_a"], "extra"],
    ["reply", 1, ["ok"]],
    ["reply", 1, ["err", ["SandboxError", "m"]]],
    ["reply", 1, ["not_held", "s_a", 1]],
    ["reply", 1, ["maybe", 1]],
    ["started"],
    ["welcome", 1],
    [],
    "hello",
    None,
])
def test_the_decoder_refuses_near_misses(junk: Any) -> None:
    with pytest.raises(ProtocolError):
        from_wire(junk)


def test_an_outcome_unwraps_to_its_value_or_its_error() -> None:
    assert Done({"turns": 1}).unwrap() == {"turns": 1}
    with pytest.raises(GuestFileError, match="no such file"):
        Raised(["GuestFileError", "no such file", None]).unwrap()
    with pytest.raises(SandboxClosed, match="lease"):
        NotHeld("s_a", lease=True).unwrap()
    with pytest.raises(SandboxClosed, match="not held by this slab"):
        NotHeld("s_a", lease=False).unwrap()
