"""Fuzzing the parsers a guest or a peer feeds (SECURITY.md): the door's frame decoder and
dispatch, the host codec, the worker wire protocol, the egress policy loader, saved image files
and the description of a checkpoint's image chain that crosses between processes.

Each harness replays the committed seeds (``seeds/``, written by ``make_seeds.py``), then
hypothesis mutates them (inserted, overwritten and deleted bytes) and also tries raw bytes.
The property is the same everywhere: bad input gives the documented error of that parser and
nothing else — no other exception, no hang, no state left behind. CI runs a bounded number of
examples (``MEMEX_FUZZ_EXAMPLES``, default 150); ``./build.sh fuzz`` runs a long one.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lanes import examples

from memex import Door, MemexError, Sandbox
from memex.backends.internal import (
    FrameDecoder,
    ProtocolError,
    error_from_wire,
    limits_from_wire,
    mounts_from_wire,
    result_from_wire,
)
from memex.errors import ImageError, PolicyError
from memex.host_tools import DecodeError, EgressPolicy, ToolHost, decode
from memex.runtime_wasm.internal import checkpoint_from_fds

SEEDS = Path(__file__).resolve().parent / "seeds"
EXAMPLES = int(os.environ.get("MEMEX_FUZZ_EXAMPLES") or examples(150))
FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def seeds(kind: str) -> list[bytes]:
    found = sorted((SEEDS / kind).iterdir())
    assert found, f"no seeds in {SEEDS / kind}"
    return [p.read_bytes() for p in found]


def _mutate(seed: bytes, ops: list[tuple[int, int, bytes]]) -> bytes:
    data = bytearray(seed)
    for kind, pos, blob in ops:
        at = pos % (len(data) + 1)
        if kind == 0:
            data[at:at] = blob
        elif kind == 1:
            data[at:at + len(blob)] = blob
        else:
            del data[at:at + len(blob) + 1]
    return bytes(data)


def inputs(kind: str) -> st.SearchStrategy[bytes]:
    ops = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 1 << 16),
                             st.binary(min_size=1, max_size=8)), max_size=8)
    return st.one_of(st.builds(_mutate, st.sampled_from(seeds(kind)), ops),
                     st.binary(max_size=512))


# ---- the door -----------------------------------------------------------------------------------
def _door() -> Door:
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    door = Door(max_request_bytes=1 << 16, keep_calls=10)
    door.register("echo", lambda *a, **k: [list(a), k], inline=True)
    ToolHost([add]).register(door)
    return door


DOOR = _door()
ERROR_KINDS = {"protocol", "too_large", "unknown_op", "handler_error", "unencodable", "timeout",
               "invalid_arguments", "unknown_tool", "tool_failed", "budget", "denied",
               "invalid_return", "tool_error"}


def _check_reply(reply: bytes) -> None:
    msg = msgpack.unpackb(reply, raw=False, strict_map_key=False)
    assert isinstance(msg, dict) and msg["v"] == 1 and msg["ok"] in (True, False)
    if not msg["ok"]:
        assert msg["error"]["kind"] in ERROR_KINDS, msg


@pytest.mark.parametrize("seed", seeds("door"), ids=lambda b: f"{len(b)}B")
def test_door_seeds(seed: bytes) -> None:
    _check_reply(DOOR.dispatch(seed))


@FUZZ
@given(inputs("door"))
def test_door_dispatch_answers_every_frame(frame: bytes) -> None:
    _check_reply(DOOR.dispatch(frame))


# ---- the host codec -----------------------------------------------------------------------------
def _decode(data: bytes) -> None:
    try:
        tree = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception:  # not msgpack at all: the door refuses it before the codec
        return
    with contextlib.suppress(DecodeError):
        decode(tree)


@pytest.mark.parametrize("seed", seeds("codec"), ids=lambda b: f"{len(b)}B")
def test_codec_seeds_decode(seed: bytes) -> None:
    decode(msgpack.unpackb(seed, raw=False, strict_map_key=False))


@FUZZ
@given(inputs("codec"))
def test_codec_raises_only_decode_error(data: bytes) -> None:
    _decode(data)


_TREES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(1 << 64), 1 << 64), st.floats(),
              st.text(max_size=8), st.binary(max_size=16)),
    lambda kids: st.one_of(st.lists(kids, max_size=4),
                           st.dictionaries(st.text(max_size=6), kids, max_size=4)),
    max_leaves=20)


def _packed(tree: Any) -> bytes:
    try:
        out: bytes = msgpack.packb(tree, use_bin_type=True)
    except (OverflowError, ValueError):
        return b""
    return out


@FUZZ
@given(st.integers(0, 127), st.one_of(st.binary(max_size=256), _TREES.map(_packed)))
def test_codec_ext_payloads(code: int, payload: bytes) -> None:
    with contextlib.suppress(DecodeError):
        decode(msgpack.ExtType(code, payload))


# ---- the worker wire ----------------------------------------------------------------------------
def _wire(data: bytes, split: int) -> None:
    dec = FrameDecoder()
    try:
        for part in (data[:split], data[split:]):
            dec.feed(part)
            while True:
                got = dec.next()
                if got is None:
                    break
                msg, fds = got
                assert isinstance(msg, list) and isinstance(msg[0], str) and fds == []
                for parse in (result_from_wire, limits_from_wire, mounts_from_wire,
                              error_from_wire):
                    for item in msg[1:]:
                        with contextlib.suppress(ProtocolError, MemexError):
                            parse(item)
    except ProtocolError:
        pass
    finally:
        dec.close()


@pytest.mark.parametrize("seed", seeds("wire"), ids=lambda b: f"{len(b)}B")
def test_wire_seeds(seed: bytes) -> None:
    _wire(seed, len(seed) // 2)


@FUZZ
@given(inputs("wire"), st.integers(0, 600))
def test_wire_decoder_raises_only_protocol_error(data: bytes, split: int) -> None:
    _wire(data, split)


# ---- the egress policy loader -------------------------------------------------------------------
def _policy(data: bytes, fmt: Any) -> None:
    text = data.decode("utf-8", "replace")
    try:
        EgressPolicy.loads(text, format=fmt)
    except PolicyError as exc:
        assert str(exc)  # every refusal says what is wrong


@pytest.mark.parametrize("name", sorted(p.name for p in (SEEDS / "policy").iterdir()))
def test_policy_seeds_load(name: str) -> None:
    fmt = "yaml" if name.endswith(".yaml") else "toml"
    EgressPolicy.loads((SEEDS / "policy" / name).read_text(), format=fmt)


@FUZZ
@given(inputs("policy"), st.sampled_from(["toml", "yaml"]))
def test_policy_loader_raises_only_policy_error(data: bytes, fmt: str) -> None:
    _policy(data, fmt)


# ---- saved images and checkpoint descriptions ---------------------------------------------------
def _saved() -> bytes:
    """A real save (the pages a session changed on its warm image, format 3), made once."""
    with tempfile.TemporaryDirectory() as tmp, Sandbox(rollback=False) as sb:
        sb.run("state = {'k': list(range(100))}")
        sb.save(Path(tmp) / "s.memex")
        return (Path(tmp) / "s.memex").read_bytes()


SAVED = _saved()


def _load(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "x.memex"
        path.write_bytes(data)
        try:
            sb = Sandbox.load(path, rollback=False)
        except ImageError as exc:
            assert str(exc)  # every refusal says what is wrong
            return
        sb.close()  # a change that kept the file valid (e.g. in its metadata) loads


def test_the_saved_seed_loads() -> None:
    _load(SAVED)


@FUZZ
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, len(SAVED)),
                          st.binary(min_size=1, max_size=8)), max_size=6))
def test_image_loader_raises_only_image_error(ops: list[tuple[int, int, bytes]]) -> None:
    _load(_mutate(SAVED, ops))


_LEAVES = st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=8) \
    | st.binary(max_size=32)
_META = st.recursive(_LEAVES, lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.sampled_from(["size", "turns", "key", "layers",
                                                        "offset", "pages"]), inner, max_size=5),
                     max_leaves=12)


@FUZZ
@given(_META, st.integers(1, 3))
def test_checkpoint_descriptions_raise_only_image_error(meta: Any, count: int) -> None:
    """A peer's description of an image chain: refused with ImageError, every fd closed."""
    fds = [os.memfd_create("fuzz") for _ in range(count)]
    for fd in fds:
        os.ftruncate(fd, 65536)
    try:
        cp = checkpoint_from_fds(fds, meta if isinstance(meta, dict) else {"layers": meta})
    except ImageError:
        for fd in fds:
            with pytest.raises(OSError):
                os.fstat(fd)
        return
    assert cp.size > 0
    del cp
