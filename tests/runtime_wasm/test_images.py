"""Memory images: checkpoint/restore, fork, save/load to disk, corrupt images, preload."""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memex import Checkpoint, ConfigError, ImageError, Limits, Mount, Sandbox, TurnStatus
from memex.runtime_wasm.images._dirty import PAGE
from memex.runtime_wasm.images._image import _extents, _read_extents

MakeSandbox = Callable[..., Sandbox]
HEADER = struct.Struct("<8sII")  # magic, format version, header length
CHUNK_HEAD = struct.Struct("<QIII")  # offset, bytes, stored bytes, CRC-32 of the stored ones


# ---- checkpoint / restore -----------------------------------------------------------------
def test_checkpoint_and_restore(sandbox: Sandbox) -> None:
    sandbox.run("x = 1\nitems = [1, 2]")
    cp = sandbox.checkpoint()
    assert isinstance(cp, Checkpoint)
    assert cp.size >= 40 << 20
    sandbox.run("x = 2\nitems.append(3)\ny = 'new'")
    assert sandbox.run("x").value == "2"
    sandbox.restore(cp)
    r = sandbox.run("x, items, 'y' in globals()")
    assert r.status is TurnStatus.OK, r
    assert r.value == "(1, [1, 2], False)"


def test_checkpoint_can_be_restored_twice(sandbox: Sandbox) -> None:
    sandbox.run("n = 10")
    cp = sandbox.checkpoint()
    for _ in range(2):
        sandbox.run("n += 1")
        sandbox.restore(cp)
        assert sandbox.run("n").value == "10"


@pytest.mark.slow
def test_rollback_after_restore_goes_to_restored_state(make_sandbox: MakeSandbox) -> None:
    sb = make_sandbox(limits=Limits(timeout=1))
    sb.run("x = 'checkpointed'")
    cp = sb.checkpoint()
    sb.run("x = 'later'")
    sb.restore(cp)
    r = sb.run("x = 'doomed'\nwhile True:\n    pass")
    assert r.status is TurnStatus.KILLED and r.rolled_back
    assert sb.run("x").value == "'checkpointed'"


@pytest.mark.slow
def test_checkpoint_survives_later_turns_and_traps(make_sandbox: MakeSandbox) -> None:
    """Images are shared copy-on-write: the rollback image recaptured in place after later
    good turns must never be the one a checkpoint holds."""
    sb = make_sandbox(limits=Limits(timeout=1))
    sb.run("x = 'cp'")
    sb.run("y = 1")  # the rollback image is now owned by the sandbox alone
    cp = sb.checkpoint()
    for i in range(4):
        assert sb.run(f"x = 'later-{i}'\ny += 1").status is TurnStatus.OK
    r = sb.run("x = 'doomed'\nwhile True:\n    pass")
    assert r.rolled_back
    assert sb.run("x, y").value == "('later-3', 5)"
    sb.restore(cp)
    assert sb.run("x, y").value == "('cp', 1)"
    sb.run("x = 'after-restore'")
    sb.run("x += '!'")
    sb.restore(cp)
    assert sb.run("x, y").value == "('cp', 1)"


def test_restore_rejects_non_checkpoints(sandbox: Sandbox) -> None:
    with pytest.raises(ConfigError):
        sandbox.restore("not a checkpoint")  # type: ignore[arg-type]


def test_restore_rejects_checkpoint_from_differently_mounted_sandbox(
    make_sandbox: MakeSandbox, tmp_path: Path
) -> None:
    plain = make_sandbox()
    mounted = make_sandbox(mounts=[Mount(host_path=tmp_path, guest_path="/data")])
    cp = mounted.checkpoint()
    with pytest.raises(ConfigError):
        plain.restore(cp)


# ---- fork ---------------------------------------------------------------------------------
def test_fork_is_independent(make_sandbox: MakeSandbox) -> None:
    parent = make_sandbox()
    parent.run("x = 1\nshared = ['p']\nopen('/tmp/f.txt', 'w').write('parent')")
    child = parent.fork()
    try:
        assert child.run("x, shared").value == "(1, ['p'])"
        assert child.run("open('/tmp/f.txt').read()").value == "'parent'"  # /tmp copied
        child.run("x = 100\nshared.append('c')\nopen('/tmp/f.txt', 'w').write('child')")
        parent.run("x += 1")
        assert parent.run("x, shared, open('/tmp/f.txt').read()").value == (
            "(2, ['p'], 'parent')")
        assert child.run("x, shared, open('/tmp/f.txt').read()").value == (
            "(100, ['p', 'c'], 'child')")
        # closing the child leaves the parent alone
        child.close()
        assert parent.run("x").value == "2"
    finally:
        child.close()


@pytest.mark.slow
def test_fork_state_is_not_disturbed_by_parent_turns(make_sandbox: MakeSandbox) -> None:
    parent = make_sandbox(limits=Limits(timeout=1))
    parent.run("v = 'at fork'")
    child = parent.fork()
    try:
        for i in range(4):  # the parent recaptures its rollback image several times
            parent.run(f"v = 'parent-{i}'\nbig = bytearray({i + 1} << 20)")
        r = child.run("v = 'doomed'\nwhile True:\n    pass")  # rolls back to its base
        assert r.rolled_back
        assert child.run("v, 'big' in globals()").value == "('at fork', False)"
        assert parent.run("v, len(big)").value == f"('parent-3', {4 << 20})"
    finally:
        child.close()


@pytest.mark.slow
def test_fork_keeps_limits_and_rolls_back_to_fork_point(make_sandbox: MakeSandbox) -> None:
    parent = make_sandbox(limits=Limits(timeout=1))
    parent.run("v = 'at fork'")
    child = parent.fork()
    try:
        assert child.limits == parent.limits
        r = child.run("v = 'doomed'\nwhile True:\n    pass")
        assert r.status is TurnStatus.KILLED and r.limit == "deadline" and r.rolled_back
        assert child.run("v").value == "'at fork'"
    finally:
        child.close()


# ---- save / load --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def saved_image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An image of a guest with variables, a function and a numpy array."""
    path = tmp_path_factory.mktemp("images") / "state.memex"
    with Sandbox(limits=Limits(timeout=20)) as sb:
        r = sb.run(
            "import numpy as np\n"
            "answer = 42\nname = 'memex'\n"
            "def double(v):\n    return v * 2\n"
            "arr = np.arange(12, dtype=np.int64).reshape(3, 4) * 3\n"
        )
        assert r.status is TurnStatus.OK, r
        size = sb.save(path)
    assert size == path.stat().st_size
    assert size < 40 << 20  # compressed (zero pages skipped)
    return path


def test_save_load_round_trip(saved_image: Path) -> None:
    with Sandbox.load(saved_image, limits=Limits(timeout=20)) as sb:
        r = sb.run("answer, name, double(21), arr.shape, int(arr.sum()), arr[2].tolist()")
        assert r.status is TurnStatus.OK, r
        assert r.value == "(42, 'memex', 42, (3, 4), 198, [24, 27, 30, 33])"
        # and the loaded guest keeps working, including numpy
        r = sb.run("arr2 = np.linalg.inv(np.eye(3) * 2)\nfloat(arr2[0, 0])")
        assert r.value == "0.5"


def test_two_loads_are_independent(saved_image: Path) -> None:
    with Sandbox.load(saved_image) as a, Sandbox.load(saved_image) as b:
        a.run("answer = 0")
        assert b.run("answer").value == "42"


def test_load_with_other_mounts_raises(saved_image: Path, tmp_path: Path) -> None:
    with pytest.raises(ImageError):
        Sandbox.load(saved_image, mounts=[Mount(host_path=tmp_path, guest_path="/data")])


def _parse(blob: bytes) -> tuple[int, dict[str, object], list[int]]:
    """(end of header, header, end offset of each chunk record)."""
    magic, version, hlen = HEADER.unpack_from(blob)
    assert (magic, version) == (b"MEMEXIMG", 3)
    assert blob.endswith(b"MEMEXEND")
    header = json.loads(blob[HEADER.size : HEADER.size + hlen])
    pos = HEADER.size + hlen
    ends = []
    body_end = len(blob) - len(b"MEMEXEND")
    while pos < body_end:
        _off, _raw, n, _crc = CHUNK_HEAD.unpack_from(blob, pos)
        pos += CHUNK_HEAD.size + n
        ends.append(pos)
    assert pos == body_end
    assert header["runs"] == len(ends)
    return HEADER.size + hlen, header, ends


def _with_header(blob: bytes, **changes: object) -> bytes:
    start, header, _ = _parse(blob)
    header.update(changes)
    raw = json.dumps(header).encode()
    return HEADER.pack(b"MEMEXIMG", 3, len(raw)) + raw + blob[start:]


def _corruptions(blob: bytes) -> dict[str, bytes]:
    start, _, ends = _parse(blob)
    mid = start + CHUNK_HEAD.size + 50
    return {
        "empty": b"",
        "too-short": blob[:10],
        "header-only-prefix": blob[: HEADER.size],
        "half-header": blob[: start - 20],
        "mid-chunk-truncation": blob[: len(blob) // 2 + 7],
        "cut-in-chunk-head": blob[: ends[0] + 5],
        "last-byte-missing": blob[:-1],
        "wrong-magic": b"NOTMEMEX" + blob[8:],
        "wrong-version": blob[:8] + struct.pack("<I", 99) + blob[12:],
        "garbled-header": blob[:HEADER.size] + b"{" * (start - HEADER.size) + blob[start:],
        "flipped-compressed-bytes": blob[:mid] + bytes(b ^ 0xFF for b in blob[mid:mid + 64])
        + blob[mid + 64:],
        "other-binary-sha": _with_header(blob, binary_sha256="0" * 64),
        "bad-memory-size": _with_header(blob, memory_size=12345),
        "chunk-past-memory": _with_header(blob, memory_size=1 << 20),
        "not-an-image": b"PK\x03\x04" + b"\x00" * 4096,
    }


CORRUPTION_NAMES = [
    "empty", "too-short", "header-only-prefix", "half-header", "mid-chunk-truncation",
    "cut-in-chunk-head", "last-byte-missing", "wrong-magic", "wrong-version", "garbled-header",
    "flipped-compressed-bytes", "other-binary-sha", "bad-memory-size", "chunk-past-memory",
    "not-an-image",
]


@pytest.mark.parametrize("name", CORRUPTION_NAMES)
def test_load_of_bad_image_raises_image_error(saved_image: Path, tmp_path: Path,
                                               name: str) -> None:
    bad = tmp_path / f"{name}.memex"
    bad.write_bytes(_corruptions(saved_image.read_bytes())[name])
    with pytest.raises(ImageError):
        Sandbox.load(bad)


def test_other_binary_message_names_it(saved_image: Path, tmp_path: Path) -> None:
    bad = tmp_path / "other.memex"
    bad.write_bytes(_with_header(saved_image.read_bytes(), binary_sha256="ab" * 32))
    with pytest.raises(ImageError, match="another guest binary"):
        Sandbox.load(bad)


def test_load_of_missing_file_raises_image_error(tmp_path: Path) -> None:
    with pytest.raises(ImageError):
        Sandbox.load(tmp_path / "nope.memex")


@pytest.mark.parametrize("where", ["no-chunks", "first-chunk-only", "all-but-last"])
def test_load_of_image_truncated_at_chunk_boundary_raises(
    saved_image: Path, tmp_path: Path, where: str
) -> None:
    blob = saved_image.read_bytes()
    start, _, ends = _parse(blob)
    cut = {"no-chunks": start, "first-chunk-only": ends[0], "all-but-last": ends[-2]}[where]
    bad = tmp_path / "cut.memex"
    bad.write_bytes(blob[:cut])
    with pytest.raises(ImageError):
        sb = Sandbox.load(bad)
        sb.close()


def test_image_error_leaves_no_sandbox(saved_image: Path, tmp_path: Path) -> None:
    from memex.runtime_wasm._sandbox import _LIVE

    before = len(_LIVE)
    bad = tmp_path / "bad.memex"
    bad.write_bytes(b"NOTMEMEX" + saved_image.read_bytes()[8:])
    with pytest.raises(ImageError):
        Sandbox.load(bad)
    assert len(_LIVE) == before
    with Sandbox.load(saved_image):  # positive control: a good load is registered
        assert len(_LIVE) == before + 1


# ---- preload ------------------------------------------------------------------------------
def test_preload_numpy_is_imported_before_the_first_turn(make_sandbox: MakeSandbox) -> None:
    sb = make_sandbox(preload=["numpy"], limits=Limits(timeout=20))
    r = sb.run("import sys\n'numpy' in sys.modules")
    assert r.status is TurnStatus.OK, r
    assert r.value == "True"
    r = sb.run("import numpy\nint(numpy.arange(5).sum())")
    assert r.value == "10"


def test_preloaded_sandboxes_are_independent(make_sandbox: MakeSandbox) -> None:
    a = make_sandbox(preload=["numpy"])
    b = make_sandbox(preload=["numpy"])
    a.run("import numpy\nnumpy.mine = 'a'")
    assert b.run("import numpy\nhasattr(numpy, 'mine')").value == "False"


def test_without_preload_numpy_is_not_imported(sandbox: Sandbox) -> None:
    assert sandbox.run("import sys\n'numpy' in sys.modules").value == "False"


@pytest.mark.parametrize("bad", ["not a module", "1abc", "", "a..b", 5])
def test_preload_rejects_bad_names(bad: object) -> None:
    with pytest.raises(ConfigError):
        Sandbox(preload=[bad])  # type: ignore[list-item]


def test_a_refused_restore_leaves_the_sandbox_as_it_was(make_sandbox: MakeSandbox) -> None:
    """A checkpoint whose memory is over this sandbox's Limits.memory is refused before
    anything changes; the sandbox keeps its state and goes on (a fitting one restores)."""
    big = make_sandbox(limits=Limits(timeout=20, memory=1 << 30))
    big.run("blob = bytearray(300 << 20)\nmark = 'big'")
    too_big = big.checkpoint()
    small = make_sandbox(limits=Limits(timeout=20, memory=256 << 20))
    small.run("mark = 'small'")
    fits = small.checkpoint()
    small.run("mark = 'later'")
    with pytest.raises(ConfigError, match=r"more than this sandbox's Limits\.memory"):
        small.restore(too_big)
    assert small.run("mark").value == "'later'"
    small.restore(fits)
    assert small.run("mark").value == "'small'"


# ---- restoring a delta's pages (images/_image.py, _read_extents) ---------------------------
def _page_file(pages: int) -> int:
    """A memfd of ``pages`` host pages, page i filled with the byte i % 251 + 1."""
    fd = os.memfd_create("pages")
    os.write(fd, b"".join(bytes([i % 251 + 1]) * PAGE for i in range(pages)))
    return fd


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 63), min_size=1, max_size=40, unique=True))
def test_a_deltas_pages_land_where_they_belong(pages: list[int]) -> None:
    """Pages stored in the file in page order (as a delta stores them) land at their memory
    pages, whatever the runs on either side; nothing else is written."""
    where = sorted(pages)
    fd = _page_file(len(where))
    try:
        memory = bytearray(PAGE * 64)
        _read_extents(fd, memoryview(memory), _extents({p: i * PAGE
                                                       for i, p in enumerate(where)}))
        for rank, p in enumerate(where):
            assert memory[p * PAGE] == memory[(p + 1) * PAGE - 1] == rank % 251 + 1
        assert sum(1 for i in range(0, len(memory), PAGE) if memory[i]) == len(where)
    finally:
        os.close(fd)


def test_many_scattered_pages_and_a_page_past_the_size() -> None:
    n = 1500  # every other page: 1,500 pieces contiguous in the file, past one call's 1,024
    fd = _page_file(n)
    try:
        memory = bytearray(PAGE * 2 * n)
        _read_extents(fd, memoryview(memory), _extents({2 * i: i * PAGE for i in range(n)}))
        assert all(memory[2 * i * PAGE] == i % 251 + 1 and memory[(2 * i + 1) * PAGE] == 0
                   for i in range(n))
        small = bytearray(PAGE * 3)  # a hostile image: a page past the memory's size
        with pytest.raises(ImageError, match="past its size"):
            _read_extents(fd, memoryview(small), _extents({0: 0, 3: PAGE}))
        assert small == bytearray(len(small))  # checked before anything was read
        with pytest.raises(ImageError, match="short read"):  # a file cut short: no hang
            _read_extents(fd, memoryview(memory), _extents({0: (n - 1) * PAGE, 1: n * PAGE}))
    finally:
        os.close(fd)
