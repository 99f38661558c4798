"""A cluster's slab (``memex.cluster.internal.Slab``) in this process, without Ray running:
its direct path opens only with its secret and bounds what a stranger can make it hold, and
a slab whose lease from the control actor ran out neither serves nor saves
(docs/scaling.md)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray")
pytest.importorskip("fsspec")

from memex import Limits
from memex.backends.internal import HEADER, Channel, ChannelClosed, limits_to_wire, mounts_to_wire
from memex.cluster.internal import (
    Answer,
    Call,
    Done,
    Hello,
    NotHeld,
    Outcome,
    Raised,
    Slab,
    Started,
    Storage,
    Welcome,
    from_wire,
    session_key,
    to_wire,
)

SID = "s_test"


@pytest.fixture
def slab(tmp_path: Path) -> Iterator[Slab]:
    s = Slab("memex-slab-test", Storage(str(tmp_path / "store")), save_interval=0)
    spec = {"limits": limits_to_wire(Limits(timeout=10)), "mounts": mounts_to_wire([]),
            "preload": [], "env": None}
    assert isinstance(s.open(SID, "a", spec, False), Done)
    yield s
    s.close(SID, True)
    s._listener.close()


def connect(slab: Slab) -> socket.socket:
    return socket.create_connection(tuple(slab.endpoint), timeout=10)


def proven(slab: Slab) -> Channel:
    ch = Channel(connect(slab))
    ch.send(to_wire(Hello(slab._secret)))
    assert from_wire(ch.recv(10)[0]) == Welcome()
    return ch


def call(ch: Channel, method: str, *args: Any) -> Outcome:
    ch.send(to_wire(Call(7, method, [SID, *args])))
    msg = from_wire(ch.recv(30)[0])
    if msg == Started(7):  # a turn that begins (one refused never does)
        msg = from_wire(ch.recv(30)[0])
    assert isinstance(msg, Answer) and msg.seq == 7, msg
    return msg.outcome


def closed_unheard(sock: socket.socket) -> bool:
    sock.settimeout(10)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_a_turn_over_the_direct_path_with_the_secret(slab: Slab) -> None:
    ch = proven(slab)
    out = call(ch, "run", "x = 6 * 7\nx", None, None)
    assert isinstance(out, Done), out
    assert out.value["result"]["value"] == "42" and out.value["turns"] == 1
    ch.close()


def test_a_stranger_cannot_make_it_hold_more_than_a_hello(slab: Slab) -> None:
    """A header announcing a 1 GiB frame is refused before any of it is read; so is a
    hello without the secret; and a call sent first does not run."""
    for first in (HEADER.pack(1 << 30, 0), HEADER.pack(300, 0) + b"\0" * 300):
        sock = connect(slab)
        sock.sendall(first)
        assert closed_unheard(sock)
        sock.close()
    ch = Channel(connect(slab))
    ch.send(to_wire(Call(1, "run", [SID, "ran = True", None, None])))
    with pytest.raises(ChannelClosed):
        ch.recv(10)
    ch.close()
    out = call(proven(slab), "run", "'ran' in globals()", None, None)  # the positive control
    assert isinstance(out, Done) and out.value["result"]["value"] == "False"


@pytest.mark.slow
def test_connections_that_have_not_said_the_secret_are_bounded(slab: Slab) -> None:
    from memex.cluster._slab import MAX_UNPROVEN

    idle = [connect(slab) for _ in range(MAX_UNPROVEN)]
    time.sleep(0.5)
    extra = connect(slab)
    assert closed_unheard(extra)  # closed at once: MAX_UNPROVEN strangers are waiting
    for s in idle:
        s.close()
    time.sleep(0.5)
    assert isinstance(call(proven(slab), "run", "1", None, None), Done)  # room again


def test_a_slab_past_its_lease_neither_serves_nor_saves(slab: Slab) -> None:
    ch = proven(slab)
    assert isinstance(call(ch, "run", "v = 1", None, None), Done)
    record = slab.storage.get(session_key(SID, "record"), 1 << 20)
    assert record is not None and json.loads(record)["turns"] == 1
    slab._lease_until = 0.0  # the control actor has not reached it for SLAB_LEASE seconds
    out = call(ch, "run", "v = 2", None, None)
    assert out == NotHeld(SID, lease=True), out
    slab.held[SID].gen += 1  # as if changed: a save is due
    assert isinstance(slab.save(SID), Done)
    assert json.loads(slab.storage.get(session_key(SID, "record"), 1 << 20) or b"{}"
                      )["turns"] == 1  # not written
    slab.renew()
    out = call(ch, "run", "v", None, None)
    assert isinstance(out, Done) and out.value["result"]["value"] == "1"  # v = 2 never ran
    ch.close()


def test_a_session_the_slab_does_not_hold_is_answered_not_held(slab: Slab) -> None:
    """A call for another session is answered ``NotHeld`` (a front asks the control actor
    where it is now), by type, not by the words of an error; an error of the guest's call
    is ``Raised`` and the connection serves on."""
    ch = proven(slab)
    ch.send(to_wire(Call(3, "read_file", ["s_other", "/tmp/x", None])))
    assert from_wire(ch.recv(30)[0]) == Answer(3, NotHeld("s_other", lease=False))
    out = call(ch, "read_file", "/tmp/missing", None)
    assert isinstance(out, Raised) and out.error[0] == "GuestFileError", out
    assert isinstance(call(ch, "run", "1", None, None), Done)  # the positive control
    ch.close()


def test_a_proven_connection_that_sends_anything_but_a_call_is_closed(slab: Slab) -> None:
    """After the hello, a message that is not a call (a second hello, an unknown method, a
    call without its session) closes the connection without running anything."""
    for wrong in (to_wire(Hello(slab._secret)), ["call", 1, "close", [SID, True]],
                  ["call", 1, "run", []], ["call", 1, "run", [SID, "gone = 1", None, None], 5]):
        ch = proven(slab)
        ch.send(wrong)
        with pytest.raises(ChannelClosed):
            ch.recv(10)
        ch.close()
    out = call(proven(slab), "run", "'gone' in globals()", None, None)
    assert isinstance(out, Done) and out.value["result"]["value"] == "False"
    assert SID in slab.held
