"""Saves and loads through the in-place LZ4 codec: the same files as ``lz4.block`` makes,
runs decompressed on several threads, and damage inside a valid-looking run refused."""

from __future__ import annotations

import json
import os
import struct
import threading
import zlib
from pathlib import Path

import lz4.block
import pytest

from memex import ImageError, Limits, Sandbox, TurnStatus
from memex.runtime_wasm.images import _lz4

HEADER = struct.Struct("<8sII")
RUN = struct.Struct("<QIII")

# 24 MiB of incompressible bytes (above the codec's threshold for threads), a digest to check
GROW = ("import hashlib, random\n"
        "random.seed(7)\n"
        "blob = bytearray(random.randbytes(24 << 20))\n"
        "digest = hashlib.sha256(blob).hexdigest()\n")


def _runs(blob: bytes) -> tuple[int, list[tuple[int, int, int, int, int]]]:
    """(end of header, [(record start, offset, bytes, stored, crc)])."""
    _, _, hlen = HEADER.unpack_from(blob)
    pos = start = HEADER.size + hlen
    out = []
    while pos < len(blob) - 8:
        off, n, stored, crc = RUN.unpack_from(blob, pos)
        out.append((pos, off, n, stored, crc))
        pos += RUN.size + stored
    return start, out


def _replace_run(blob: bytes, index: int, packed: bytes) -> bytes:
    """``blob`` with run ``index``'s block replaced by ``packed``, its head (size, CRC) made
    to match, so only decompression can tell."""
    _, runs = _runs(blob)
    pos, off, n, stored, _ = runs[index]
    head = RUN.pack(off, n, len(packed), zlib.crc32(packed))
    return blob[:pos] + head + packed + blob[pos + RUN.size + stored:]


@pytest.fixture(scope="module")
def grown(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """A session that grew past its warm image, saved both ways: (delta save, portable save,
    digest of its data)."""
    tmp = tmp_path_factory.mktemp("codec")
    with Sandbox(limits=Limits(timeout=60)) as sb:
        r = sb.run(GROW + "digest")
        assert r.status is TurnStatus.OK, r
        digest = str(r.value).strip("'")
        sb.run("blob[5] ^= 1")  # a small delta above whatever image the first turn left
        sb.run("blob[5] ^= 1")
        delta, portable = tmp / "delta.memex", tmp / "portable.memex"
        sb.save(delta)
        sb.save(portable, portable=True)
    return delta, portable, digest


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["delta", "portable"])
def test_large_save_round_trips(grown: tuple[Path, Path, str], kind: str) -> None:
    path = grown[0] if kind == "delta" else grown[1]
    with Sandbox.load(path, limits=Limits(timeout=60)) as sb:
        r = sb.run("hashlib.sha256(blob).hexdigest() == digest == "
                   f"{grown[2]!r}, len(blob)")
        assert r.value == f"(True, {24 << 20})", r


def test_portable_save_has_no_base(grown: tuple[Path, Path, str]) -> None:
    blob = grown[1].read_bytes()
    _, _, hlen = HEADER.unpack_from(blob)
    assert json.loads(blob[HEADER.size:HEADER.size + hlen])["base"] is None


def test_files_match_the_lz4_module_byte_for_byte(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    with Sandbox() as sb:
        sb.run("xs = list(range(200_000))")
        direct = tmp_path / "direct.memex"
        sb.save(direct, portable=True)
        monkeypatch.setattr(_lz4, "_C", None)  # the lz4.block fallback
        fallback = tmp_path / "fallback.memex"
        sb.save(fallback, portable=True)
        assert direct.read_bytes() == fallback.read_bytes()
        with Sandbox.load(direct) as lb:  # and the fallback reads it
            assert lb.run("sum(xs)").value == str(sum(range(200_000)))


@pytest.mark.slow
def test_runs_that_pass_their_checksum_but_do_not_decode_are_refused(
        grown: tuple[Path, Path, str], tmp_path: Path) -> None:
    blob = grown[1].read_bytes()
    _, runs = _runs(blob)
    n = runs[3][2]
    cases = {
        "garbage": bytes(range(256)) * 16,
        "short": lz4.block.compress(bytes(n - 4096), store_size=False),
        "long": lz4.block.compress(bytes(n + 4096), store_size=False),
    }
    fds = len(os.listdir("/proc/self/fd"))
    for name, packed in cases.items():
        bad = tmp_path / f"{name}.memex"
        bad.write_bytes(_replace_run(blob, 3, packed))
        with pytest.raises(ImageError, match=f"the run at offset {runs[3][1]}"):
            Sandbox.load(bad)
    assert len(os.listdir("/proc/self/fd")) <= fds  # the half-built images were closed


def test_parallel_map_keeps_order_and_uses_threads() -> None:
    seen: set[str] = set()

    def f(x: int) -> int:
        seen.add(threading.current_thread().name)
        return x * x

    items = list(range(64))
    assert _lz4.parallel_map(f, items, _lz4.PARALLEL_MIN) == [x * x for x in items]
    if (os.cpu_count() or 1) > 1:
        assert "memex-lz4" in seen
    seen.clear()
    assert _lz4.parallel_map(f, items, 1) == [x * x for x in items]
    assert seen == {threading.current_thread().name}  # small work stays on this thread


def test_parallel_map_raises_the_first_failure_in_item_order() -> None:
    def f(x: int) -> int:
        if x in (5, 40):
            raise ValueError(f"item {x}")
        return x

    with pytest.raises(ValueError, match="item 5"):
        _lz4.parallel_map(f, list(range(64)), _lz4.PARALLEL_MIN)
    assert not [t for t in threading.enumerate() if t.name == "memex-lz4"]


def test_compress_at_matches_lz4_block() -> None:
    import ctypes

    data = (b"memex " * 50_000)[: 1 << 18]
    buf = ctypes.create_string_buffer(data, len(data))
    assert _lz4.compress_at(ctypes.addressof(buf), len(data)) == \
        lz4.block.compress(data, store_size=False)
    out = ctypes.create_string_buffer(len(data))
    _lz4.decompress_into(lz4.block.compress(data, store_size=False),
                         ctypes.addressof(out), len(data))
    assert out.raw == data
