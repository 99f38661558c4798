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
from memex.cluster.internal import Slab, Storage, session_key

SID = "s_test"


@pytest.fixture
def slab(tmp_path: Path) -> Iterator[Slab]:
    s = Slab("memex-slab-test", Storage(str(tmp_path / "store")), save_interval=0)
    spec = {"limits": limits_to_wire(Limits(timeout=10)), "mounts": mounts_to_wire([]),
            "preload": [], "env": None}
    assert s.open(SID, "a", spec, False)[0] == "ok"
    yield s
    s.close(SID, True)
    s._listener.close()


def connect(slab: Slab) -> socket.socket:
    return socket.create_connection(tuple(slab.endpoint), timeout=10)


def proven(slab: Slab) -> Channel:
    ch = Channel(connect(slab))
    ch.send(["hello", slab._secret])
    assert ch.recv(10)[0] == ["hello"]
    return ch


def call(ch: Channel, method: str, *args: Any) -> list[Any]:
    ch.send(["call", 7, method, [SID, *args]])
    msg, _ = ch.recv(30)
    if msg[0] == "started":
        msg, _ = ch.recv(30)
    assert msg[0] == "reply" and msg[1] == 7, msg
    out: list[Any] = msg[2]
    return out


def closed_unheard(sock: socket.socket) -> bool:
    sock.settimeout(10)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_a_turn_over_the_direct_path_with_the_secret(slab: Slab) -> None:
    ch = proven(slab)
    out = call(ch, "run", "x = 6 * 7\nx", None, None)
    assert out[0] == "ok" and out[1]["result"]["value"] == "42" and out[1]["turns"] == 1
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
    ch.send(["call", 1, "run", [SID, "ran = True", None, None]])
    with pytest.raises(ChannelClosed):
        ch.recv(10)
    ch.close()
    out = call(proven(slab), "run", "'ran' in globals()", None, None)  # the positive control
    assert out[1]["result"]["value"] == "False"


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
    assert call(proven(slab), "run", "1", None, None)[0] == "ok"  # room again


def test_a_slab_past_its_lease_neither_serves_nor_saves(slab: Slab) -> None:
    ch = proven(slab)
    assert call(ch, "run", "v = 1", None, None)[0] == "ok"
    record = slab.storage.get(session_key(SID, "record"), 1 << 20)
    assert record is not None and json.loads(record)["turns"] == 1
    slab._lease_until = 0.0  # the control actor has not reached it for SLAB_LEASE seconds
    out = call(ch, "run", "v = 2", None, None)
    assert out[0] == "err" and "lease" in out[1][1], out
    slab.held[SID].gen += 1  # as if changed: a save is due
    assert slab.save(SID)[0] == "ok"
    assert json.loads(slab.storage.get(session_key(SID, "record"), 1 << 20) or b"{}"
                      )["turns"] == 1  # not written
    slab.renew()
    assert call(ch, "run", "v", None, None)[1]["result"]["value"] == "1"  # v = 2 never ran
    ch.close()
