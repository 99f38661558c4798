"""Guests below the server's own threads (memex.runtime_wasm.internal.set_guest_nice): the
threads that run guests take the asked nice steps above the process's own, in this process
and in the worker processes a backend starts after it (their threads read from /proc, as the
kernel sees them)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from memex.backends import get_backend
from memex.runtime_wasm import Limits, Sandbox
from memex.runtime_wasm.engine._runner import Runner, RunnerPool
from memex.runtime_wasm.internal import guest_nice, set_guest_nice

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="setpriority of a thread: Linux")


@pytest.fixture
def nice() -> Iterator[None]:
    """The process's guest nice as it was (a server made in this process sets its own)."""
    before = guest_nice()
    set_guest_nice(0)
    yield
    set_guest_nice(before)


def _runner_nice(pool: RunnerPool) -> int:
    return Runner("probe", pool).call(lambda: os.getpriority(os.PRIO_PROCESS, 0))


def _threads_nice(pid: int) -> list[int]:
    """The nice value of each thread of a process (Python 3.11 names no OS thread, so the
    values tell them apart)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue  # the thread ended
        out.append(int(stat.rsplit(")", 1)[1].split()[16]))  # field 19: nice
    return out


def test_a_runner_thread_takes_the_guest_nice_from_its_next_job(nice: None) -> None:
    base = os.getpriority(os.PRIO_PROCESS, 0)
    pool = RunnerPool()  # threads of its own, started by this one (at the process's nice)
    assert _runner_nice(pool) == base  # positive control: at 0, the process's own
    set_guest_nice(5)
    assert _runner_nice(pool) == min(19, base + 5)
    with Sandbox(limits=Limits(timeout=30)) as sb:  # a guest's turn on such a thread
        assert sb.run("print(sum(range(10)))").stdout == "45\n"


def test_a_worker_process_runs_its_guests_at_its_callers_nice(nice: None) -> None:
    base = os.getpriority(os.PRIO_PROCESS, 0)
    set_guest_nice(7)
    backend = get_backend("subprocess")
    try:
        with backend.open(limits=Limits(timeout=30)) as sb:
            sb.run("x = sum(range(1000))")
            seen = _threads_nice(sb.worker_pid)
        # its guest's runner thread below; its own threads (main, reader, ticker) stay
        assert set(seen) == {base, min(19, base + 7)}
        assert seen.count(base) >= 2
    finally:
        backend.close()


@pytest.mark.parametrize("bad", [-1, 20, True, 2.5])
def test_a_guest_nice_out_of_range_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="0 to 19"):
        set_guest_nice(bad)  # type: ignore[arg-type]
