"""Incremental images: checkpoints built from the pages a turn wrote (deltas on an earlier
image), in place or as a chain, must reproduce the exact guest state on every path a whole
copy does: rollback after a trap, restore, fork, fork of a fork, growth, save. Every test
runs with write tracking on (when this host has it) and off (the whole-copy fallback)."""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from memex import Limits, Sandbox, TurnStatus
from memex.runtime_wasm import dirty_tracking
from memex.runtime_wasm.images._dirty import PAGE, TRACKER, DirtyTracker, MemoryWatch

MakeSandbox = Callable[..., Sandbox]

# A guest state with a large buffer, a dict and a list, and its digest.
SETUP = ("import hashlib\nbuf = bytearray(24 << 20)\nstate = {'n': 0}\nlog = []\n"
         "def digest():\n"
         "    h = hashlib.sha256(buf)\n"
         "    h.update(repr((state, log)).encode())\n"
         "    return h.hexdigest()\n")


def _step(i: int) -> str:
    """A turn that changes a little: a few bytes far apart, the dict, the list."""
    return (f"buf[{(i * 7919) % (24 << 20)}] = {i % 251}\nbuf[{(i * 104729) % (24 << 20)}:"
            f"{(i * 104729) % (24 << 20) + 10}] = b'x' * 10\nstate['n'] += {i}\n"
            f"state['k{i}'] = 'v' * {i}\nlog.append({i})")


def _digest(sb: Sandbox) -> str:
    r = sb.run("digest()")
    assert r.status is TurnStatus.OK, r
    assert r.value is not None
    return r.value


@pytest.fixture(params=["tracked", "whole-copy"])
def tracking(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "tracked":
        if TRACKER.mode == "off":
            pytest.skip(f"this host cannot track written pages ({dirty_tracking()})")
    else:
        monkeypatch.setattr(TRACKER, "mode", "off")
    yield request.param


@contextlib.contextmanager
def _area(pages: int) -> Iterator[tuple[ctypes.Array[ctypes.c_char], int]]:
    """Fresh anonymous memory to watch (skips the test where nothing can be watched)."""
    if TRACKER.mode == "off":
        pytest.skip(dirty_tracking())
    area = mmap.mmap(-1, pages * PAGE)
    buf = (ctypes.c_char * (pages * PAGE)).from_buffer(area)
    yield buf, ctypes.addressof(buf)
    del buf
    with contextlib.suppress(BufferError):  # the test still holds the buffer: freed with it
        area.close()


def test_tracker_reports_exactly_the_written_pages() -> None:
    size = 64 * PAGE
    with _area(64) as (buf, addr):
        assert TRACKER.start(addr, size)
        assert TRACKER.take(addr, size) == []
        buf[0] = b"a"
        buf[10 * PAGE + 5] = b"b"
        buf[11 * PAGE] = b"c"
        buf[63 * PAGE + PAGE - 1] = b"d"
        assert TRACKER.take(addr, size) == [(0, PAGE), (10 * PAGE, 2 * PAGE),
                                            (63 * PAGE, PAGE)]
        assert TRACKER.take(addr, size) == []  # protected again by the look
        buf[10 * PAGE] = b"e"
        assert TRACKER.take(addr, size) == [(10 * PAGE, PAGE)]
        TRACKER.stop(addr, size)
        assert TRACKER.take(addr, size) is None  # not watched: unknown, never "nothing"


def test_tracking_can_be_switched_off_by_the_environment(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    monkeypatch.setenv("MEMEX_DIRTY_TRACKING", "off")
    off = DirtyTracker()
    assert off.mode == "off" and "MEMEX_DIRTY_TRACKING" in off.reason
    assert off.take(0, PAGE) is None and not off.start(0, PAGE)


@pytest.mark.slow
def test_a_trap_after_many_checkpoints_restores_the_exact_state(
        make_sandbox: MakeSandbox, tracking: str) -> None:
    sb = make_sandbox(limits=Limits(timeout=2))
    assert sb.run(SETUP).status is TurnStatus.OK
    for i in range(1, 31):
        assert sb.run(_step(i)).status is TurnStatus.OK
    want = _digest(sb)
    r = sb.run("buf[:] = b'z' * len(buf)\nstate.clear()\nwhile True:\n    pass")
    assert r.status is TurnStatus.KILLED and r.rolled_back, r
    assert _digest(sb) == want
    assert sb.run("state['n'], len(log)").value == f"({sum(range(1, 31))}, 30)"
    # and on again: later turns build on the restored state
    assert sb.run(_step(31)).status is TurnStatus.OK
    r = sb.run("del buf\nwhile True:\n    pass")
    assert r.rolled_back
    assert sb.run("state['n'], len(log)").value == f"({sum(range(1, 32))}, 31)"


@pytest.mark.slow
def test_held_checkpoints_each_restore_their_own_state(
        make_sandbox: MakeSandbox, tracking: str) -> None:
    """Twenty held checkpoints: each one after the first is a delta on the one before (or
    merged onto the root once the chain is deep); every one restores exactly."""
    sb = make_sandbox(rollback=False)
    sb.run(SETUP)
    held = []
    for i in range(1, 21):
        sb.run(_step(i))
        held.append((sb.checkpoint(), _digest(sb), i))
    for cp, want, i in reversed(held):
        sb.restore(cp)
        assert _digest(sb) == want
        assert sb.run("len(log)").value == str(i)
    if tracking == "tracked":
        depths = [cp._image.depth for cp, _, _ in held]
        assert max(depths) <= 8 and max(depths) >= 2, depths
        sizes = [cp._image.layer_bytes for cp, _, _ in held[1:]]
        assert all(n < (2 << 20) for n in sizes), sizes


def test_fork_of_a_fork_of_a_delta_chain_is_independent(
        make_sandbox: MakeSandbox, tracking: str) -> None:
    parent = make_sandbox(rollback=False)
    parent.run(SETUP)
    for i in range(1, 6):
        parent.run(_step(i))
        parent.checkpoint()  # a chain of deltas under the live state
    child = parent.fork()
    parent_digest = _digest(parent)
    assert _digest(child) == parent_digest
    child.run(_step(100))
    grandchild = child.fork()
    child_digest = _digest(child)
    grandchild.run(_step(200))
    parent.run(_step(300))
    assert _digest(child) == child_digest
    assert _digest(grandchild) != child_digest
    assert parent.run("len(log), 100 in log, 200 in log").value == "(6, False, False)"
    assert child.run("len(log), 100 in log, 200 in log, 300 in log").value == \
        "(6, True, False, False)"
    assert grandchild.run("len(log), 100 in log, 200 in log, 300 in log").value == \
        "(7, True, True, False)"
    for sb in (child, grandchild):
        sb.close()


@pytest.mark.slow
def test_growth_between_checkpoints(make_sandbox: MakeSandbox, tracking: str) -> None:
    """Memory grown by a turn is not watched yet: its pages must land in the next image."""
    # the loop below is ended by its own 2 s deadline; the other turns have the sandbox's
    # (hashing 64 MiB took past 2 s beside a CPU hog, and ``want`` was then None)
    sb = make_sandbox(limits=Limits(timeout=120))
    assert sb.run(SETUP).ok
    before = sb.memory_bytes
    assert sb.run("big = bytearray(range(256)) * (64 << 12)\nbig[-1] = 7").ok  # 64 MiB
    assert sb.memory_bytes > before
    assert sb.run("big[12345] = 99").ok
    want = sb.run("hashlib.sha256(big).hexdigest()").value
    assert want is not None
    assert sb.run("big[:] = bytes(len(big))\nwhile True:\n    pass", timeout=2).rolled_back
    assert sb.run("hashlib.sha256(big).hexdigest()").value == want
    cp = sb.checkpoint()
    fork = sb.fork()
    assert fork.run("hashlib.sha256(big).hexdigest()").value == want
    fork.close()
    sb.run("big[0] = 1")
    sb.restore(cp)
    assert sb.run("hashlib.sha256(big).hexdigest()").value == want


@pytest.mark.slow
def test_a_turn_that_rewrites_most_of_memory(make_sandbox: MakeSandbox, tracking: str) -> None:
    """Past half of the memory a delta is not worth it: the image goes flat, same state."""
    sb = make_sandbox(limits=Limits(timeout=2))
    sb.run(SETUP)
    sb.run("import os\nbuf[:] = os.urandom(len(buf))")
    sb.run("buf2 = bytearray(os.urandom(len(buf)))")
    want = _digest(sb)
    assert sb.run("buf[:] = bytes(len(buf))\nwhile True:\n    pass").rolled_back
    assert _digest(sb) == want


@pytest.mark.slow
def test_pages_written_by_the_host_are_in_the_image(
        make_sandbox: MakeSandbox, tracking: str, tmp_path: Path) -> None:
    """A file read lands in guest memory through the host (WASI fd_read): tracked too."""
    sb = make_sandbox(limits=Limits(timeout=2))
    sb.run(SETUP)
    sb.write_file("/tmp/data.bin", bytes(range(256)) * 4096)
    sb.run("with open('/tmp/data.bin', 'rb') as f:\n    f.readinto(buf)")
    want = _digest(sb)
    assert sb.run("buf[:] = bytes(len(buf))\nwhile True:\n    pass").rolled_back
    assert _digest(sb) == want


def test_save_and_load_of_a_delta(make_sandbox: MakeSandbox, tracking: str,
                                  tmp_path: Path) -> None:
    sb = make_sandbox(rollback=False)
    sb.run(SETUP)
    sb.checkpoint()
    sb.run(_step(1))
    want = _digest(sb)
    sb.save(tmp_path / "s.memex")
    loaded = Sandbox.load(tmp_path / "s.memex")
    try:
        assert _digest(loaded) == want
    finally:
        loaded.close()


@pytest.mark.slow
@pytest.mark.parametrize("portable", [False, True])
def test_a_loaded_session_is_whole_on_every_path(make_sandbox: MakeSandbox, tracking: str,
                                                 portable: bool, tmp_path: Path) -> None:
    """A load writes the saved pages straight into the new guest and leaves its image
    unwritten until something needs it: a fork, a rollback after a trap, a checkpoint
    restored, a save, a move to another process, and each sees the loaded state."""
    from memex.runtime_wasm.internal import checkpoint_from_fds, checkpoint_to_fds

    sb = make_sandbox(rollback=False)
    sb.run(SETUP + "buf[-1] = 7\nbig = bytearray(range(256)) * (40 << 12)")  # grows: 10 MiB
    sb.run(_step(3))
    want = _digest(sb)
    sb.save(tmp_path / "s.memex", portable=portable)
    sb.close()

    def load() -> Sandbox:
        return Sandbox.load(tmp_path / "s.memex")

    with load() as a:  # the first turn after a load
        assert _digest(a) == want
        assert a.run("bytes(big[-4:]), len(big)").value == repr((bytes([252, 253, 254, 255]),
                                                                  256 * (40 << 12)))
    with load() as b:  # a fork before any turn, then both go their own way
        fork = b.fork()
        b.run(_step(4))
        assert _digest(fork) == want and _digest(b) != want
        fork.close()
    with load() as c:  # a trap in the first turn rolls back to the loaded state
        r = c.run("state['n'] = -1\nwhile True: pass", timeout=0.5)
        assert r.limit == "deadline" and r.rolled_back
        assert _digest(c) == want
        cp = c.checkpoint()
        c.run(_step(5))
        c.restore(cp)
        assert _digest(c) == want
        c.save(tmp_path / "again.memex")
        fds, meta = checkpoint_to_fds(cp)
        moved = checkpoint_from_fds(fds, meta)
        with c.fork() as d:
            d.restore(moved)
            assert _digest(d) == want
    with Sandbox.load(tmp_path / "again.memex") as e:
        assert _digest(e) == want


def test_a_watch_that_lost_its_memory_says_so() -> None:
    """A memory that moved or was remapped is never reported as unwritten."""
    size = 16 * PAGE
    with _area(16) as (buf, addr):
        watch = MemoryWatch(TRACKER, addr, size)
        assert watch.active
        assert watch.take(addr, size) == []
        assert watch.take(addr + PAGE, size) is None  # moved: unknown from now on
        assert not watch.active and watch.take(addr, size) is None
        TRACKER.stop(addr, size)
        watch = MemoryWatch(TRACKER, addr, 8 * PAGE)  # grown: the new part counts if used
        buf[2 * PAGE] = b"a"
        buf[12 * PAGE] = b"b"
        assert watch.take(addr, size) == [(2 * PAGE, PAGE), (12 * PAGE, PAGE)]
        buf[13 * PAGE] = b"c"  # the grown part is watched from then on
        assert watch.take(addr, size) == [(13 * PAGE, PAGE)]
        TRACKER.stop(addr, size)


def test_a_forked_child_tracks_its_own_memory() -> None:
    """After os.fork the parent's pagemap and userfaultfd are useless to the child."""
    if TRACKER.mode == "off":
        pytest.skip(dirty_tracking())
    pid = os.fork()
    if pid == 0:  # the child: report through the exit code only
        ok = False
        with contextlib.suppress(BaseException):
            size = 4 * PAGE
            area = mmap.mmap(-1, size)
            buf = (ctypes.c_char * size).from_buffer(area)
            addr = ctypes.addressof(buf)
            ok = (TRACKER.mode == "uffd-wp" and TRACKER.start(addr, size)
                  and TRACKER.take(addr, size) == [])
            buf[PAGE] = b"x"
            ok = ok and TRACKER.take(addr, size) == [(PAGE, PAGE)]
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
