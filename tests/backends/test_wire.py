"""The wire of the worker backends: frames (any split, any garbage), fd passing, records and
errors across the process boundary, and checkpoints as fds or bytes (corrupt input is a
clear error, never a crash or a wrong state)."""

from __future__ import annotations

import array
import os
import socket
import threading
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lanes import examples

from memex import ConfigError, GuestFileError, Limits, Mount, Sandbox, SandboxClosed
from memex.backends.internal import (
    FrameDecoder,
    ProtocolError,
    encode_frame,
    error_from_wire,
    limits_from_wire,
    limits_to_wire,
    mounts_from_wire,
    mounts_to_wire,
    result_from_wire,
    result_to_wire,
)
from memex.backends.worker._wire import (
    HEADER,
    MAX_FDS,
    MAX_FRAME,
    Channel,
    ChannelClosed,
    error_to_wire,
)
from memex.errors import BackendBusy, ImageError, SandboxError, SandboxLost
from memex.runtime_wasm import dirty_tracking
from memex.runtime_wasm.internal import (
    checkpoint_from_bytes,
    checkpoint_from_fds,
    checkpoint_to_bytes,
    checkpoint_to_fds,
)

leaves = st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(
    allow_nan=False) | st.text(max_size=20) | st.binary(max_size=40)
values = st.recursive(leaves, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    st.text(max_size=8), inner, max_size=4), max_leaves=12)
messages = st.tuples(st.text(min_size=1, max_size=10), st.lists(values, max_size=4)).map(
    lambda t: [t[0], *t[1]])


# ---- frames -------------------------------------------------------------------------------------
@pytest.mark.slow
@given(st.lists(messages, min_size=1, max_size=5), st.data())
@settings(max_examples=examples(200), deadline=None)
def test_frames_survive_any_split(msgs: list[list[Any]], data: st.DataObject) -> None:
    blob = b"".join(encode_frame(m) for m in msgs)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(blob)), max_size=6)))
    dec = FrameDecoder()
    got = []
    prev = 0
    for cut in [*cuts, len(blob)]:
        dec.feed(blob[prev:cut])
        prev = cut
        while (frame := dec.next()) is not None:
            got.append(frame)
    assert [m for m, _ in got] == msgs
    assert all(fds == [] for _, fds in got)


@given(st.binary(max_size=200))
@settings(max_examples=examples(300), deadline=None)
def test_garbage_is_a_protocol_error_or_incomplete(blob: bytes) -> None:
    dec = FrameDecoder()
    dec.feed(blob)
    try:
        while dec.next() is not None:
            pass
    except ProtocolError:
        pass


def test_frame_header_bounds() -> None:
    dec = FrameDecoder()
    dec.feed(HEADER.pack(MAX_FRAME + 1, 0))
    with pytest.raises(ProtocolError, match="out of bounds"):
        dec.next()
    dec = FrameDecoder()
    dec.feed(HEADER.pack(2, MAX_FDS + 1) + b"\x91\xa1")
    with pytest.raises(ProtocolError):
        dec.next()


def test_frame_announcing_missing_fds() -> None:
    dec = FrameDecoder()
    dec.feed(encode_frame(["x"], nfds=1))
    with pytest.raises(ProtocolError, match="fds"):
        dec.next()


@pytest.mark.parametrize("body", [msgpack.packb({"not": "a list"}), msgpack.packb([]),
                                  msgpack.packb([1, 2]), b"\xc1"])
def test_bodies_that_are_not_messages(body: bytes) -> None:
    dec = FrameDecoder()
    dec.feed(HEADER.pack(len(body), 0) + body)
    with pytest.raises(ProtocolError):
        dec.next()


def test_channel_passes_fds_and_large_frames() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    left, right = Channel(a), Channel(b)
    fd = os.memfd_create("wire-test")
    os.write(fd, b"shared pages")
    big = os.urandom(3 << 20)
    try:
        left.send(["image", {"n": 1}], [fd])
        sender = threading.Thread(target=left.send, args=(["big", big],))
        sender.start()  # larger than the socket buffer: someone must read meanwhile
        msg, fds = right.recv()
        assert msg == ["image", {"n": 1}] and len(fds) == 1
        assert os.pread(fds[0], 100, 0) == b"shared pages"
        os.close(fds[0])
        msg, fds = right.recv()
        assert msg == ["big", big] and fds == []
        sender.join()
        with pytest.raises(TimeoutError):
            right.recv(timeout=0.05)
        left.close()
        with pytest.raises(ChannelClosed):
            right.recv()
        with pytest.raises(ChannelClosed):
            left.send(["after close"])
    finally:
        os.close(fd)
        right.close()
        left.close()


# ---- records and errors -----------------------------------------------------------------------
def test_turn_results_round_trip() -> None:
    with Sandbox(limits=Limits(timeout=5, stdout_bytes=100)) as sb:
        for code in ["print('x' * 500)", "1 / 0", "import sys\nsys.exit(2)", "41 + 1",
                     "while True: pass"]:
            r = sb.run(code, timeout=0.5 if "while" in code else None)
            assert result_from_wire(msgpack.unpackb(msgpack.packb(result_to_wire(r)))) == r


@pytest.mark.parametrize("bad", [None, [], {"status": "nope"}, {"stdout": "x"},
                                 {"status": "error", "exception": {"type": "X"}}])
def test_malformed_results(bad: Any) -> None:
    with pytest.raises(ProtocolError):
        result_from_wire(bad)


def test_limits_and_mounts_round_trip(tmp_path: Any) -> None:
    lim = Limits(timeout=3, memory=256 << 20, fuel=10**8, stdout_bytes=5, idle_timeout=9.5)
    assert limits_from_wire(limits_to_wire(lim)) == lim
    mounts = [Mount(host_path=tmp_path, guest_path="/data", writable=True)]
    back = mounts_from_wire(mounts_to_wire(mounts))
    assert [(str(m.host_path), m.guest_path, m.writable) for m in back] == [
        (str(tmp_path), "/data", True)]
    with pytest.raises(ConfigError):
        limits_from_wire({**limits_to_wire(lim), "timeout": -1})
    with pytest.raises(ProtocolError):
        limits_from_wire([1])
    with pytest.raises(ProtocolError):
        limits_from_wire({"no_such_limit": 1})
    with pytest.raises(ProtocolError):
        mounts_from_wire("x")
    with pytest.raises(ProtocolError):
        mounts_from_wire([["only two", "/x"]])


@pytest.mark.parametrize("exc", [SandboxClosed("idle timeout"), SandboxLost("worker died"),
                                 GuestFileError("/x is not under /tmp"),
                                 ConfigError("bad"), ImageError("torn"),
                                 BackendBusy("queue_full", "the queue is full")])
def test_errors_keep_their_class_and_message(exc: Exception) -> None:
    back = error_from_wire(msgpack.unpackb(msgpack.packb(error_to_wire(exc))))
    assert type(back) is type(exc)
    assert str(back) == str(exc)
    assert getattr(back, "reason", None) == getattr(exc, "reason", None)


@pytest.mark.parametrize("item", [["KeyError", "k", None], ["os", "x", None], "junk",
                                  ["ToolInstallError", "m", None, "extra"]])
def test_foreign_errors_become_sandbox_errors(item: Any) -> None:
    assert type(error_from_wire(item)) is SandboxError


# ---- checkpoints across processes ---------------------------------------------------------------
@pytest.fixture(scope="module")
def state_sandbox() -> Any:
    with Sandbox(limits=Limits(timeout=10)) as sb:
        sb.run("data = {'rows': list(range(1000)), 'name': 'kept'}")
        yield sb


def test_checkpoint_through_fds(state_sandbox: Sandbox) -> None:
    fds, meta = checkpoint_to_fds(state_sandbox.checkpoint())
    cp = checkpoint_from_fds(fds, meta)
    with Sandbox(limits=Limits(timeout=10)) as other:
        other.restore(cp)
        assert other.run("data['name'], len(data['rows'])").value == "('kept', 1000)"


def test_a_delta_chain_crosses_as_its_layers(state_sandbox: Sandbox) -> None:
    """Each held checkpoint after the first is a delta: it crosses as the root's fd plus one
    memfd and page map per delta, never flattened into a copy of the whole memory."""
    state_sandbox.run("data['more'] = 'x' * 100000")
    first = state_sandbox.checkpoint()
    state_sandbox.run("data['last'] = 1")
    second = state_sandbox.checkpoint()
    fds, meta = checkpoint_to_fds(second)
    if not dirty_tracking().startswith("off"):
        assert len(fds) >= 2 and len(meta["layers"]) == len(fds)
        assert all(os.fstat(fd).st_size < (8 << 20) for fd in fds[1:])
    cp = checkpoint_from_fds(fds, meta)
    with Sandbox(limits=Limits(timeout=10)) as other:
        other.restore(cp)
        assert other.run("len(data['more']), data['last']").value == "(100000, 1)"
    del first


def _chain_meta(state_sandbox: Sandbox) -> tuple[list[int], dict[str, Any]]:
    state_sandbox.run("data['n'] = data.get('n', 0) + 1")
    return checkpoint_to_fds(state_sandbox.checkpoint())


@pytest.mark.parametrize("damage", ["fewer-fds", "more-layers", "page-outside", "size-lies",
                                    "file-too-small"])
def test_checkpoint_fds_that_do_not_fit_are_refused(state_sandbox: Sandbox,
                                                    damage: str) -> None:
    state_sandbox.checkpoint()  # the next one is a delta on this
    fds, meta = _chain_meta(state_sandbox)
    layers = meta["layers"]
    if damage == "fewer-fds":
        os.close(fds.pop())
    elif damage == "more-layers":
        layers.append(dict(layers[-1]))
    elif damage == "page-outside":
        bad = array.array("Q", [meta["size"] // 4096 + 5, 0])
        layers.append({"size": meta["size"], "pages": bad.tobytes()})
        fds.append(os.memfd_create("extra"))
    elif damage == "size-lies":
        meta["size"] = meta["size"] + 65536
    else:
        layers[0]["size"] = layers[0]["size"] + (64 << 20)
    kept = list(fds)
    with pytest.raises(ImageError):
        checkpoint_from_fds(fds, meta)
    for fd in kept:
        with pytest.raises(OSError):
            os.fstat(fd)  # closed: nothing leaks


@pytest.mark.parametrize("meta", [{}, {"size": 7, "turns": 0, "key": ["plain", [], []]},
                                  {"size": 65536 * 4096, "turns": 0, "key": ["plain", [], []]},
                                  {"size": 65536, "turns": "x", "key": None},
                                  {"size": 65536, "turns": 0, "key": ["plain", [], []],
                                   "layers": [{"size": 65536 * 4096}]}])
def test_checkpoint_fd_with_bad_meta(meta: dict[str, Any]) -> None:
    fd = os.memfd_create("bad-meta")
    with pytest.raises(ImageError):
        checkpoint_from_fds([fd], meta)
    with pytest.raises(OSError):
        os.fstat(fd)  # closed: nothing leaks


def test_checkpoint_bytes_round_trip(state_sandbox: Sandbox) -> None:
    blob = checkpoint_to_bytes(state_sandbox.checkpoint())
    cp = checkpoint_from_bytes(blob)
    with Sandbox(limits=Limits(timeout=10)) as other:
        other.restore(cp)
        assert other.run("sum(data['rows'])").value == str(sum(range(1000)))


@given(st.data())
@settings(max_examples=examples(60), deadline=None)
def test_corrupt_checkpoint_bytes_are_image_errors(state_blob: bytes, data: st.DataObject
                                                   ) -> None:
    blob = bytearray(state_blob)
    how = data.draw(st.sampled_from(["cut", "flip", "garbage"]))
    if how == "cut":
        blob = blob[: data.draw(st.integers(0, len(blob) - 1))]
    elif how == "flip":
        at = data.draw(st.integers(0, min(len(blob) - 1, 4000)))
        blob[at] ^= data.draw(st.integers(1, 255))
    else:
        blob = bytearray(data.draw(st.binary(max_size=300)))
    try:
        cp = checkpoint_from_bytes(bytes(blob))
    except ImageError:
        return
    assert cp.size % 65536 == 0  # a flip inside compressed data can still decode: sized sane


@pytest.fixture(scope="module")
def state_blob(state_sandbox: Sandbox) -> bytes:
    return checkpoint_to_bytes(state_sandbox.checkpoint())
