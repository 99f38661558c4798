"""Idle sandboxes past the awake limit give their instance up and keep their state as an
image (runtime_wasm/_awake.py): nothing a caller or a guest can see changes."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from memex import ConfigError, Limits, Sandbox, TurnStatus
from memex.runtime_wasm._awake import AWAKE, awake_limit
from memex.runtime_wasm.images._dirty import TRACKER


@pytest.fixture
def awake_one() -> Iterator[None]:
    """Only the most recently used idle sandbox keeps its instance."""
    was = AWAKE.limit
    AWAKE.limit = 1
    try:
        yield
    finally:
        AWAKE.limit = was


def asleep(sb: Sandbox) -> bool:
    _ = sb.memory_bytes  # after the queued sleep, if any (and it does not wake it)
    return sb._inst is None and not sb.closed


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_the_least_recently_used_sleeps_and_wakes_as_it_was(awake_one: None) -> None:
    with Sandbox(limits=Limits(timeout=30)) as a, Sandbox(limits=Limits(timeout=30)) as b:
        a.run("x = [1, 2]\nimport json")
        b.run("y = 2")
        assert asleep(a) and not asleep(b)
        assert a.memory_bytes > 0 and asleep(a)  # reading its size does not wake it
        r = a.run("x.append(3)\n(x, json.dumps(x))")
        assert r.value == "([1, 2, 3], '[1, 2, 3]')", r
        assert a.turns == 2
        assert asleep(b) and not asleep(a)
        assert b.run("y").value == "2"


@pytest.mark.skipif(TRACKER.mode == "off", reason="written pages are not tracked here")
def test_going_to_sleep_starts_no_watch_of_the_memory_it_lets_go(
        awake_one: None, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[int] = []
    real = TRACKER.start

    def start(addr: int, size: int) -> bool:
        started.append(size)
        return real(addr, size)

    monkeypatch.setattr(TRACKER, "start", start)
    with Sandbox(limits=Limits(timeout=30)) as a, Sandbox(limits=Limits(timeout=30)) as b:
        a.run("x = 1")
        b.run("1")  # a sleeps: its first turn recorded, its memory let go
        assert asleep(a) and started == []
        # positive control: the record at an awake sandbox's next turn starts the watch
        assert b.run("2").value == "2" and len(started) == 1
        assert a.run("x").value == "1"


def test_a_trap_after_waking_rolls_back_to_the_state_it_slept_in(awake_one: None) -> None:
    with Sandbox(limits=Limits(timeout=30)) as a, Sandbox(limits=Limits(timeout=30)) as b:
        a.run("x = 1")
        b.run("1")
        assert asleep(a)
        r = a.run("x = 5\nimport os\nos.abort()")
        assert r.status is TurnStatus.KILLED and r.rolled_back, r
        assert a.run("x").value == "1"


def test_a_sandbox_without_rollback_keeps_its_state_asleep(awake_one: None) -> None:
    with Sandbox(limits=Limits(timeout=30), rollback=False) as a, Sandbox() as b:
        a.run("x = 'kept'")
        b.run("1")
        assert asleep(a)
        assert a.run("x").value == "'kept'"


def test_a_guest_holding_a_file_open_stays_awake(awake_one: None) -> None:
    with Sandbox(limits=Limits(timeout=30)) as a, Sandbox(limits=Limits(timeout=30)) as b:
        a.run("f = open('/tmp/log', 'w')\nf.write('a')")
        b.run("1")
        assert not asleep(a)  # a new instance would not have f open
        assert a.run("f.write('b')\nf.close()").ok
        c = Sandbox(limits=Limits(timeout=30))
        try:
            c.run("1")
            assert asleep(a)  # positive control: once closed, it may sleep
            assert a.read_file("/tmp/log") == b"ab"
        finally:
            c.close()


def test_fork_checkpoint_and_save_of_a_sleeping_sandbox(awake_one: None, tmp_path: Path
                                                        ) -> None:
    with Sandbox(limits=Limits(timeout=30)) as a, Sandbox(limits=Limits(timeout=30)) as b:
        a.run("x = 41")
        b.run("1")
        assert asleep(a)
        cp = a.checkpoint()
        assert a._inst is None  # taken from its image, without waking it
        kids = a.fork_many(2)
        try:
            assert [k.run("x + 1").value for k in kids] == ["42", "42"]
        finally:
            for k in kids:
                k.close()
        a.save(tmp_path / "a.memex")
        a.run("x = 0")
        a.restore(cp)
        assert a.run("x").value == "41"
        with Sandbox.load(tmp_path / "a.memex") as loaded:
            assert loaded.run("x").value == "41"


def test_sleepers_hold_one_descriptor_each(awake_one: None) -> None:
    Sandbox().close()  # the shared warm image opened once
    before = _fds()
    sbs = [Sandbox(limits=Limits(timeout=30)) for _ in range(20)]
    try:
        for sb in sbs:
            sb.run("x = 1")
        assert all(asleep(sb) for sb in sbs[:-1])
        # each sleeper: its image; the one awake: its WASI folders and ledger view too
        assert _fds() - before <= 20 + 6, _fds() - before
        AWAKE.limit = 100
        for sb in sbs:
            sb.run("x")  # positive control: awake, each holds five more
        assert _fds() - before >= 20 * 5
    finally:
        for sb in sbs:
            sb.close()


def test_the_limit_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMEX_AWAKE_SANDBOXES", "7")
    assert awake_limit() == 7
    for bad in ("0", "-3", "many"):
        monkeypatch.setenv("MEMEX_AWAKE_SANDBOXES", bad)
        with pytest.raises(ConfigError, match="MEMEX_AWAKE_SANDBOXES"):
            awake_limit()
    monkeypatch.delenv("MEMEX_AWAKE_SANDBOXES")
    assert awake_limit() >= 32
