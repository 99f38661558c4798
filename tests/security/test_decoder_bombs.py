"""Decoders of outside bytes cost what the input may cost, bounded before they allocate
(SECURITY.md, "The runtime's own bookkeeping"): checkpoint blobs and image files (zlib and LZ4
runs), door frames, worker frames, the driver's control frames. Each bomb is refused with the
decoder's documented error while the host allocates a few MiB (measured with tracemalloc,
which sees every allocation of the interpreter's allocators: msgpack's, zlib's and json's
objects included); each has a positive control, a real input of the same kind decoded whole.
"""

from __future__ import annotations

import functools
import json
import struct
import tracemalloc
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest

from memex import Door, ImageError, Limits, Sandbox
from memex.backends.internal import FrameDecoder, ProtocolError, encode_frame
from memex.runtime_wasm.internal import (
    DecodeCost,
    checkpoint_from_bytes,
    checkpoint_to_bytes,
    unpack_bounded,
)

MiB = 1 << 20


def _peak(fn: Callable[[], Any]) -> tuple[Any, int]:
    """(what ``fn`` returned or raised, the peak bytes it allocated)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        try:
            out: Any = fn()
        except Exception as exc:
            out = exc
        return out, tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def _zeros_stream(n: int) -> bytes:
    """A zlib stream of ``n`` zero bytes (~1/1000 of that)."""
    c = zlib.compressobj(9)
    block = bytes(MiB)
    parts = [c.compress(block) for _ in range(n // MiB)]
    return b"".join(parts) + c.flush()


@functools.cache
def _bomb() -> bytes:
    """~500 KiB that inflate to 512 MiB: made when a test first asks (1.5 s of compressing,
    which every worker paid at collection as a module constant)."""
    return _zeros_stream(512 * MiB)


def _blob(chunks: list[tuple[int, bytes]], size: int = 64 * MiB) -> bytes:
    head = msgpack.packb({"size": size, "turns": 1,
                          "key": ["plain", [["/usr/local/lib", False]], []]})
    body = b"".join(struct.pack("<QI", off, len(c)) + c for off, c in chunks)
    return b"MEMEXCP1" + struct.pack("<I", len(head)) + head + body


def test_a_checkpoint_blob_bomb_is_refused_before_it_inflates() -> None:
    bomb = _bomb()
    assert len(bomb) < 600 << 10
    out, peak = _peak(lambda: checkpoint_from_bytes(_blob([(0, bomb)])))
    assert isinstance(out, ImageError) and "expands past" in str(out), out
    assert peak < 8 * MiB, peak
    # many small chunks at one offset would each inflate to 1 MiB: refused as out of order
    one = zlib.compress(bytes(MiB))
    out, peak = _peak(lambda: checkpoint_from_bytes(_blob([(0, one)] * 400)))
    assert isinstance(out, ImageError) and "out of order" in str(out), out
    assert peak < 8 * MiB, peak
    # and a memory larger than the caller allows is refused from the header
    out, _ = _peak(lambda: checkpoint_from_bytes(_blob([], size=2 << 30), max_memory=1 << 30))
    assert isinstance(out, ImageError) and "at most" in str(out), out


def test_a_real_checkpoint_blob_still_round_trips(make_sandbox: Callable[..., Sandbox]
                                                  ) -> None:
    sb = make_sandbox()
    sb.run("kept = list(range(1000))")
    blob = checkpoint_to_bytes(sb.checkpoint())
    sb.run("kept = None")
    sb.restore(checkpoint_from_bytes(blob))
    assert sb.run("sum(kept)").value == str(sum(range(1000)))


def _v2_file(path: Path, chunks: list[tuple[int, bytes]], sha: str) -> None:
    header = json.dumps({"binary_sha256": sha, "memory_size": 64 * MiB, "chunks": len(chunks),
                         "meta": {}}).encode()
    body = b"".join(struct.pack("<QI", off, len(c)) + c for off, c in chunks)
    path.write_bytes(b"MEMEXIMG" + struct.pack("<II", 2, len(header)) + header + body
                     + b"MEMEXEND")


def test_an_image_file_bomb_is_refused_before_it_inflates(
        make_sandbox: Callable[..., Sandbox], tmp_path: Path) -> None:
    sb = make_sandbox()
    sb.run("x = 41")
    good = tmp_path / "good.img"
    sb.save(good, portable=True)
    sha = json.loads(good.read_bytes()[16:16 + struct.unpack_from("<I", good.read_bytes(), 12)[
        0]])["binary_sha256"]
    bad = tmp_path / "bomb.img"
    _v2_file(bad, [(0, _bomb())], sha)
    out, peak = _peak(lambda: Sandbox.load(bad))
    assert isinstance(out, ImageError) and "expands past" in str(out), out
    assert peak < 8 * MiB, peak
    # an image whose header nests arrays 100,000 deep: refused, not a RecursionError
    deep = tmp_path / "deep.img"
    header = b"[" * 100_000
    deep.write_bytes(b"MEMEXIMG" + struct.pack("<II", 3, len(header)) + header + b"MEMEXEND")
    out, _ = _peak(lambda: Sandbox.load(deep))
    assert isinstance(out, ImageError) and "corrupt header" in str(out), out
    # positive control: the real file loads
    again = Sandbox.load(good)
    try:
        assert again.run("x + 1").value == "42"
    finally:
        again.close()


def test_a_door_frame_costs_what_its_values_are_worth() -> None:
    door = Door()
    door.register("take", lambda *a: len(a), inline=True)
    n = 16 << 20
    bombs = {
        "16M empty arrays": b"\xdd" + (n - 5).to_bytes(4, "big") + b"\x90" * (n - 5),
        "256 x 64K empty arrays": b"\xdd" + (255).to_bytes(4, "big")
        + (b"\xdd" + (65535).to_bytes(4, "big") + b"\x90" * 65535) * 255,
        "5M two-letter strings": b"\xdd" + (5 << 20).to_bytes(4, "big") + b"\xa2ab" * (5 << 20),
    }
    for name, frame in bombs.items():
        reply, peak = _peak(lambda f=frame: door.dispatch(f))  # type: ignore[misc]
        assert msgpack.unpackb(reply)["error"]["kind"] == "too_large", (name, reply)
        assert peak < 64 * MiB, (name, peak)
    # positive control: a frame of real values as large as the budget allows is answered
    frame = msgpack.packb({"v": 1, "id": 2, "op": "take",
                           "args": [list(range(400_000)), [{"k": i} for i in range(20_000)]]})
    reply = msgpack.unpackb(door.dispatch(frame))
    assert reply == {"v": 1, "id": 2, "ok": True, "value": 2}, reply


def test_nested_ext_payloads_share_one_budget() -> None:
    """A payload holding a payload holding a payload...: each level would copy the bytes
    again; one budget for the frame stops it at twice the frame."""
    inner = b"y" * (4 * MiB)
    for _ in range(12):
        inner = msgpack.packb(msgpack.ExtType(7, inner))
    cost = DecodeCost.for_bytes(16 * MiB)
    obj = unpack_bounded(inner, cost)
    seen = 0
    with pytest.raises(ValueError, match="too large"):
        while isinstance(obj, msgpack.ExtType):
            seen += 1
            obj = unpack_bounded(obj.data, cost)
    assert 4 <= seen < 12
    # positive control: with a budget per decode (the old way) every level decodes
    obj, levels = unpack_bounded(inner, DecodeCost.for_bytes(16 * MiB)), 1
    while isinstance(obj, msgpack.ExtType):
        if obj.data == b"y" * (4 * MiB):
            break
        levels += 1
        obj = unpack_bounded(obj.data, DecodeCost.for_bytes(16 * MiB))
    assert levels == 12 and isinstance(obj, msgpack.ExtType) and obj.data == b"y" * (4 * MiB)


def test_a_worker_frame_bomb_is_a_protocol_error() -> None:
    body = b"\xdd" + (8 << 20).to_bytes(4, "big") + b"\x90" * (8 << 20)
    dec = FrameDecoder()
    dec.feed(struct.pack("!IH", len(body), 0) + body)
    out, peak = _peak(dec.next)
    assert isinstance(out, ProtocolError), out
    assert peak < 8 * MiB + 8 * MiB, peak  # the body's one copy, and a bounded decode
    # positive control: a real frame of the same size
    dec.feed(encode_frame(["ok", 1, b"z" * (8 << 20)]))
    msg, fds = dec.next()  # type: ignore[misc]
    assert msg[:2] == ["ok", 1] and len(msg[2]) == 8 << 20 and fds == []


@pytest.mark.parametrize("frame", [
    b"\x00MXEj" + b"[" * 500_000,          # nesting: bounded before json sees it
    b"\x00MXEj" + b"[]," * 300_000,        # many containers, within the byte cap
    b'\x00MX{"op": "end", "report": ' + b"[" * 100_000 + b"}",
])
def test_a_forged_control_frame_costs_nothing(make_sandbox: Callable[..., Sandbox],
                                              frame: bytes) -> None:
    sb = make_sandbox(limits=Limits(timeout=20))
    r = sb.run(f"import _host\n_host.call({frame!r})\n'after'")
    assert r.ok and r.value == "'after'" and r.trap is None, r
