"""Faults of the worker backends: a worker killed mid-turn or between turns (SIGKILL as the
OOM killer sends it, SIGABRT as an abort in the engine), a stuck worker, a guest exhausting
its memory, the caller dying with sandboxes live (no orphans), and the pool under load:
1,000 short rollouts without leaks, a flooding tenant, quotas and recycling.

Waits for an asynchronous outcome poll a condition with a generous bound: they assert what
happens, never how fast."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from memex import Limits, TurnResult, TurnStatus
from memex.backends import PoolBackend, SubprocessBackend
from memex.backends.internal import Ledger, ProcessSandbox, TenantQuota
from memex.errors import BackendBusy, SandboxLost
from memex.host_tools import ToolHost

ROOT = Path(__file__).resolve().parents[2]


def wait_for(cond: Callable[[], bool], what: str, bound: float = 30.0) -> None:
    end = time.monotonic() + bound
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.02)


def pid_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie is dead
    except OSError:
        return True


@pytest.fixture
def sub() -> Iterator[SubprocessBackend]:
    b = SubprocessBackend(workers=1, grace=2.0)
    yield b
    b.close()


@pytest.fixture
def sub_noresume() -> Iterator[SubprocessBackend]:
    b = SubprocessBackend(workers=1, resume=False)
    yield b
    b.close()


def running_turn(sb: ProcessSandbox, code: str) -> tuple[threading.Thread, list[TurnResult],
                                                         threading.Event]:
    """Start ``code`` on a thread; the returned event is set once the guest is running it
    (the guest calls the door op ``started`` first)."""
    started = threading.Event()
    sb.door.register("started", started.set)
    out: list[Any] = []

    def go() -> None:
        try:
            out.append(sb.run("import memex_guest\nmemex_guest.call('started')\n" + code))
        except BaseException as exc:
            out.append(exc)

    t = threading.Thread(target=go)
    t.start()
    assert started.wait(30), "the turn never started"
    return t, out, started


# ---- a worker dies ------------------------------------------------------------------------------
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGABRT])
def test_worker_killed_mid_turn_resumes(sub: SubprocessBackend, sig: signal.Signals) -> None:
    sb = sub.open(limits=Limits(timeout=60))
    sb.run("x = 1")
    sb.write_file("/tmp/kept.txt", b"files too")
    wait_for(lambda: sb.resumable, "the resume image")
    old = sb.worker_pid
    t, out, _ = running_turn(sb, "x = 2\nwhile True:\n    pass")
    os.kill(old, sig)
    t.join(30)
    assert not t.is_alive(), "the caller hung on a dead worker"
    r = out[0]
    assert isinstance(r, TurnResult), r
    assert r.status is TurnStatus.KILLED
    assert r.limit == "lost"
    assert r.rolled_back is True
    assert sig.name in (r.trap or "")
    assert sb.worker_pid != old
    assert sb.run("x").value == "1"
    assert sb.read_file("/tmp/kept.txt") == b"files too"
    assert sb.run("open('/tmp/kept.txt').read()").value == "'files too'"
    assert pid_gone(old)


def test_worker_killed_between_turns_resumes(sub: SubprocessBackend) -> None:
    calls: list[int] = []

    def ping(i: int) -> int:
        """Count calls."""
        calls.append(i)
        return i

    sb = sub.open(limits=Limits(timeout=20))
    with ToolHost([ping]).attach(sb):
        sb.run("total = ping(1)")
        wait_for(lambda: sb.resumable, "the resume image")
        old = sb.worker_pid
        os.kill(old, signal.SIGKILL)
        wait_for(lambda: pid_gone(old), "the worker to die")
        r = sb.run("total += ping(2)\ntotal")
        assert r.value == "3", r
        assert calls == [1, 2]  # the tools installed before the death still reach us
        assert sb.worker_pid != old
        assert sb.turns == 3
        cp = sb.checkpoint()
        sb.run("total = 0")
        sb.restore(cp)
        assert sb.run("total").value == "3"


def test_worker_killed_without_resume_is_sandbox_lost(sub_noresume: SubprocessBackend) -> None:
    sb = sub_noresume.open(limits=Limits(timeout=60))
    other = sub_noresume.open(limits=Limits(timeout=60))
    sb.run("x = 1")
    t, out, _ = running_turn(sb, "while True:\n    pass")
    os.kill(sb.worker_pid, signal.SIGKILL)
    t.join(30)
    assert not t.is_alive()
    assert isinstance(out[0], SandboxLost)
    assert "SIGKILL" in str(out[0])
    assert sb.closed
    with pytest.raises(SandboxLost):
        sb.run("x")
    with pytest.raises(SandboxLost):
        other.run("1")  # the same worker held it
    sb.close()
    sb.close()
    fresh = sub_noresume.open()
    assert fresh.run("1 + 1").value == "2"  # the backend starts a new worker
    fresh.close()


def test_explicit_checkpoint_survives_its_worker(sub_noresume: SubprocessBackend) -> None:
    sb = sub_noresume.open()
    sb.run("state = {'k': [1, 2]}")
    cp = sb.checkpoint()
    os.kill(sb.worker_pid, signal.SIGKILL)
    with pytest.raises(SandboxLost):
        sb.run("state")
    again = sub_noresume.open()
    again.restore(cp)
    assert again.run("state").value == "{'k': [1, 2]}"
    cp.close()
    again.close()


@pytest.mark.slow
def test_stuck_worker_is_killed_and_resumed(sub: SubprocessBackend) -> None:
    sb = sub.open(limits=Limits(timeout=1.0))
    sb.run("x = 'before'")
    wait_for(lambda: sb.resumable, "the resume image")
    old = sb.worker_pid
    t, out, _ = running_turn(sb, "while True:\n    pass")
    os.kill(old, signal.SIGSTOP)  # neither dead nor answering
    try:
        t.join(60)
    finally:
        with pytest.raises(ProcessLookupError):
            os.kill(old, signal.SIGCONT)
    assert not t.is_alive()
    r = out[0]
    assert isinstance(r, TurnResult) and r.limit == "lost", r
    assert "no answer" in (r.trap or "")
    assert sb.run("x").value == "'before'"


def test_repeated_losses_give_up(sub: SubprocessBackend) -> None:
    sb = sub.open(limits=Limits(timeout=60))
    sb.run("x = 1")
    for _ in range(sub.max_resumes):
        wait_for(lambda: sb.resumable, "the resume image")
        t, out, _ = running_turn(sb, "while True:\n    pass")
        os.kill(sb.worker_pid, signal.SIGKILL)
        t.join(30)
        assert isinstance(out[0], TurnResult) and out[0].limit == "lost"
    t, out, _ = running_turn(sb, "while True:\n    pass")
    os.kill(sb.worker_pid, signal.SIGKILL)
    t.join(30)
    assert isinstance(out[0], SandboxLost)
    assert "in a row" in str(out[0])


# ---- memory -------------------------------------------------------------------------------------
def test_guest_exhausting_memory_leaves_the_worker_alone(sub: SubprocessBackend) -> None:
    neighbour = sub.open()
    neighbour.run("n = 'fine'")
    sb = sub.open(limits=Limits(timeout=20, memory=192 << 20))
    pid = sb.worker_pid
    assert neighbour.worker_pid == pid
    r = sb.run("chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))")
    assert r.status is TurnStatus.ERROR, r
    assert r.exception is not None and r.exception.type == "MemoryError"
    assert r.limit == "memory"
    sb.run("chunks = None")
    assert sb.run("len(bytearray(1 << 20))").value == str(1 << 20)
    assert sb.worker_pid == pid
    assert neighbour.run("n").value == "'fine'"


# ---- no orphans ---------------------------------------------------------------------------------
CHILD = textwrap.dedent("""
    import os, sys, time
    from memex import Limits
    from memex.backends import SubprocessBackend
    from memex.backends import PoolBackend
    sub = SubprocessBackend(workers=2)
    pool = PoolBackend(workers=1, warm=1, limits=Limits(timeout=10))
    live = [sub.open(), sub.open(), pool.open()]
    for sb in live:
        assert sb.run("1 + 1").value == "2"
    print(" ".join(map(str, sub.worker_pids() + pool.worker_pids())), flush=True)
    if sys.argv[1] == "exit":
        sys.exit(0)  # without closing anything: atexit must end the workers
    time.sleep(600)
""")


@pytest.mark.parametrize("how", ["killed", "exit"])
def test_no_orphans_when_the_parent_goes(how: str) -> None:
    proc = subprocess.Popen([sys.executable, "-c", CHILD, how], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        pids = [int(p) for p in line.split()]
        assert len(pids) == 3, (line, proc.stderr.read() if proc.stderr else "")
        if how == "killed":
            proc.kill()
        assert proc.wait(60) is not None
        wait_for(lambda: all(pid_gone(p) for p in pids), "the workers to exit")
        tmp = Path(tempfile.gettempdir())
        wait_for(lambda: not list(tmp.glob(f"memex-worker-{proc.pid}-*")),
                 "the workers' scratch roots to go")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# ---- the pool ----------------------------------------------------------------------------------
def _children() -> set[int]:
    me = str(os.getpid())
    found = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if fields[1] == me and fields[0] != "Z":
                found.add(int(d.name))
    return found


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.slow
def test_thousand_rollouts_leak_nothing() -> None:
    """1,000 short rollouts (open, a turn, close; every tenth also serves a host tool)
    through a pool that recycles its workers every 150 sandboxes. Bounds, after a warm-up: no
    extra worker processes, at most 8 more fds and 16 more threads (a recycled worker may be
    exiting), 64 MiB more caller RSS, no scratch directories left behind."""

    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    tmp = Path(tempfile.gettempdir())
    others = _children()  # other backends of this test session keep their workers
    pool = PoolBackend(workers=2, warm=4, recycle_after=150, limits=Limits(timeout=20))
    try:
        def rollout(i: int) -> None:
            with pool.open(tenant=f"t{i % 3}") as sb:
                if i % 10:
                    assert sb.run(f"x = {i}\nx + 1").value == str(i + 1)
                    return
                with ToolHost([add]).attach(sb):
                    assert sb.run(f"add({i}, 1)").value == str(i + 1)

        for i in range(40):
            rollout(i)
        fds0 = len(os.listdir("/proc/self/fd"))
        threads0 = threading.active_count()
        rss0 = _rss()
        for i in range(40, 1000):
            rollout(i)
        stats = pool.stats()
        assert stats.handed_out == 1000
        assert stats.workers_recycled >= 5
        assert stats.live == 0
        wait_for(lambda: len(_children() - others) <= 2, "recycled workers to exit")
        wait_for(lambda: len(os.listdir("/proc/self/fd")) <= fds0 + 8, "fds to settle")
        assert threading.active_count() <= threads0 + 16
        assert _rss() - rss0 < 64 << 20
    finally:
        pool.close()
    assert not _children() - others
    assert len(list(tmp.glob(f"memex-worker-{os.getpid()}-*"))) <= len(others)


@pytest.fixture
def small_pool() -> Iterator[PoolBackend]:
    p = PoolBackend(workers=1, warm=2, max_sandboxes=2, queue_size=20, acquire_timeout=30,
                    limits=Limits(timeout=10),
                    default_quota=TenantQuota(queued=6),
                    quotas={"tiny": TenantQuota(sandboxes=1, queued=0),
                            "mem": TenantQuota(memory=256 << 20),
                            "slow": TenantQuota(turns_per_second=0.001)})
    yield p
    p.close()


def test_a_pool_keeps_each_tenants_sandboxes_in_the_ledger_it_is_handed() -> None:
    """A server hands its ledger to the pool, so the one account of a principal says what it
    holds of the pool too: its sandboxes and their memory while they live, and its quota is
    read against the same account (a second sandbox over a quota of one is refused). The
    control: another tenant's account stays empty."""
    ledger = Ledger()
    pool = PoolBackend(workers=1, warm=1, max_sandboxes=2, limits=Limits(timeout=10),
                       quotas={"a": TenantQuota(sandboxes=1, queued=0)}, ledger=ledger)
    try:
        sb = pool.open(tenant="a")
        held = ledger.held("a")
        assert (held["pool_sandboxes"], held["pool_sandbox_memory"]) == (1, sb.limits.memory)
        assert pool.stats().live_by_tenant == {"a": 1}
        with pytest.raises(BackendBusy) as busy:
            pool.open(tenant="a")
        assert busy.value.reason == "queue_full"
        assert ledger.held("b") == {}
        sb.close()
        held = ledger.held("a")
        assert (held["pool_sandboxes"], held["pool_sandbox_memory"]) == (0, 0)
        pool.open(tenant="a").close()  # its slot came back
    finally:
        pool.close()
        pool.close()


def test_a_pool_of_its_own_keeps_no_account_for_a_tenant_that_holds_nothing() -> None:
    """A pool used on its own (no ledger handed in), with a tenant name per rollout, keeps
    no account per name it ever saw: an account that holds nothing is dropped. The control:
    a tenant holding a sandbox keeps its account; a handed-in ledger (a server's, shared
    with its other keepers) is never pruned by the pool."""
    pool = PoolBackend(workers=1, warm=1, max_sandboxes=2, limits=Limits(timeout=10))
    shared = Ledger()
    handed = PoolBackend(workers=1, warm=1, max_sandboxes=2, limits=Limits(timeout=10),
                         ledger=shared)
    try:
        held = pool.open(tenant="kept")
        for i in range(20):
            pool.open(tenant=f"rollout-{i}").close()
        assert [a.name for a in pool.ledger.accounts()] == ["kept"]
        held.close()
        assert pool.ledger.accounts() == []
        handed.open(tenant="t").close()
        assert [a.name for a in shared.accounts()] == ["t"]
    finally:
        pool.close()
        handed.close()


def test_flooding_tenant_does_not_starve_another(small_pool: PoolBackend) -> None:
    """Tenant A holds the whole pool and queues six more opens; B asks once and gets the
    first freed slot; A's seventh waiting request is refused at once (back-pressure)."""
    held = [small_pool.open(tenant="A"), small_pool.open(tenant="A")]
    got: list[tuple[str, ProcessSandbox | BaseException]] = []
    lock = threading.Lock()

    def ask(tenant: str) -> None:
        try:
            sb = small_pool.open(tenant=tenant)
        except BaseException as exc:
            sb = exc  # type: ignore[assignment]
        with lock:
            got.append((tenant, sb))

    flood = [threading.Thread(target=ask, args=("A",)) for _ in range(6)]
    for t in flood:
        t.start()
    wait_for(lambda: small_pool.stats().waiting_by_tenant.get("A") == 6, "A's queue")
    with pytest.raises(BackendBusy) as busy:
        small_pool.open(tenant="A")
    assert busy.value.reason == "queue_full"
    b = threading.Thread(target=ask, args=("B",))
    b.start()
    wait_for(lambda: small_pool.stats().waiting_by_tenant.get("B") == 1, "B's request")
    before = len(small_pool.stats().admissions)
    held.pop().close()  # one slot frees: B's turn, not A's next
    b.join(30)
    assert not b.is_alive()
    assert small_pool.stats().admissions[before] == "B"
    assert got[0][0] == "B" and isinstance(got[0][1], ProcessSandbox)
    assert got[0][1].run("'b runs'").value == "'b runs'"
    # everything else drains in order as slots free up
    for sb in [held.pop(), got[0][1]]:
        sb.close()
    while any(t.is_alive() for t in flood):
        with lock:
            done = [s for _, s in got[1:] if isinstance(s, ProcessSandbox) and not s.closed]
        for s in done:
            s.close()
        time.sleep(0.02)
    assert all(isinstance(s, ProcessSandbox) for _, s in got)
    for _, s in got:
        assert isinstance(s, ProcessSandbox)
        s.close()
    assert small_pool.stats().live == 0


def test_quota_on_live_sandboxes(small_pool: PoolBackend) -> None:
    first = small_pool.open(tenant="tiny")
    with pytest.raises(BackendBusy) as busy:
        small_pool.open(tenant="tiny")  # at its quota and allowed no queue
    assert busy.value.reason == "queue_full"
    other = small_pool.open(tenant="someone")  # others are not affected
    first.close()
    again = small_pool.open(tenant="tiny")
    for sb in (other, again):
        sb.close()


def test_memory_quota(small_pool: PoolBackend) -> None:
    with pytest.raises(BackendBusy) as busy:
        small_pool.open(tenant="mem", limits=Limits(timeout=10, memory=512 << 20))
    assert busy.value.reason == "quota"
    a = small_pool.open(tenant="mem", limits=Limits(timeout=10, memory=128 << 20))
    b = small_pool.open(tenant="mem", limits=Limits(timeout=10, memory=128 << 20))
    assert small_pool.stats().made_on_demand >= 2  # not the pool's profile
    assert b.run("1").ok
    b.close()
    a.close()


def test_acquire_timeout(small_pool: PoolBackend) -> None:
    small_pool.acquire_timeout = 0.2
    held = [small_pool.open(), small_pool.open()]
    with pytest.raises(BackendBusy) as busy:
        small_pool.open()
    assert busy.value.reason == "timeout"
    for sb in held:
        sb.close()
    assert small_pool.stats().waiting == 0


def test_turn_rate_quota(small_pool: PoolBackend) -> None:
    sb = small_pool.open(tenant="slow")
    assert sb.run("1").ok  # the bucket's one token
    with pytest.raises(BackendBusy) as busy:
        sb.run("2")  # the next token is ~1000 s away, past acquire_timeout
    assert busy.value.reason == "timeout"
    sb.close()


def test_fork_counts_against_the_quota(small_pool: PoolBackend) -> None:
    small_pool.acquire_timeout = 0.2
    sb = small_pool.open(tenant="tiny")
    with pytest.raises(BackendBusy):
        sb.fork()
    sb.close()
    parent = small_pool.open()
    child = parent.fork()
    assert small_pool.stats().live == 2
    child.close()
    parent.close()
    assert small_pool.stats().live == 0


def test_sandboxes_are_never_reused(small_pool: PoolBackend) -> None:
    with small_pool.open() as sb:
        sb.run("secret = 'rollout 1'")
        sb.write_file("/tmp/left.txt", b"x")
    for _ in range(4):
        with small_pool.open() as sb:
            assert sb.run("'secret' in globals()").value == "False"
            assert sb.run("import os\nos.path.exists('/tmp/left.txt')").value == "False"


def test_workers_recycle_after_n_sandboxes() -> None:
    pool = PoolBackend(workers=1, warm=1, recycle_after=3, limits=Limits(timeout=10))
    try:
        first_pid = pool.worker_pids()[0]
        keep = pool.open()  # lives on its worker while that worker retires
        keep.run("v = 'still here'")
        for _ in range(4):
            with pool.open() as sb:
                sb.run("1")
        assert pool.stats().workers_recycled >= 1
        assert keep.worker_pid == first_pid
        assert keep.run("v").value == "'still here'"
        keep.close()
        wait_for(lambda: pid_gone(first_pid), "the retired worker to exit")
        with pool.open() as sb:
            assert sb.worker_pid != first_pid
    finally:
        pool.close()


@pytest.mark.slow
def test_workers_recycle_above_an_rss_bound() -> None:
    pool = PoolBackend(workers=1, warm=1, max_worker_rss=1, limits=Limits(timeout=10))
    try:
        first = pool.worker_pids()[0]
        wait_for(lambda: pool.stats().workers_recycled >= 1, "an RSS recycle")
        wait_for(lambda: pid_gone(first), "the retired worker to exit")
    finally:
        pool.close()


def test_pool_worker_death_loses_its_rollouts_and_recovers() -> None:
    pool = PoolBackend(workers=1, warm=2, limits=Limits(timeout=10))
    try:
        sb = pool.open(tenant="t")
        sb.run("x = 1")
        os.kill(sb.worker_pid, signal.SIGKILL)
        with pytest.raises(SandboxLost):
            sb.run("x")
        assert pool.stats().live_by_tenant.get("t") is None  # its slot came back
        with pool.open(tenant="t") as fresh:
            assert fresh.run("2 * 21").value == "42"
    finally:
        pool.close()


def test_closed_pool_refuses() -> None:
    pool = PoolBackend(workers=1, warm=1, limits=Limits(timeout=10))
    sb = pool.open()
    pool.close()
    pool.close()
    assert sb.closed
    with pytest.raises(Exception) as exc:
        pool.open()
    assert "closed" in str(exc.value)


# ---- Ray ----------------------------------------------------------------------------------------
@pytest.mark.ray
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is not installed")
def test_ray_actor_death_is_sandbox_lost_and_checkpoints_move() -> None:
    from memex.backends import RayBackend

    b = RayBackend(actors=2, init_options={"num_cpus": 2})
    try:
        first = b.open(limits=Limits(timeout=60))
        second = b.open(limits=Limits(timeout=60))
        assert first._host is not second._host  # placed on the least loaded actor
        first.run("state = {'moved': True}")
        cp = first.checkpoint()
        second.restore(cp)  # a checkpoint crosses actors (and nodes) through the store
        assert second.run("state").value == "{'moved': True}"
        t, out, _ = running_turn(first, "while True:\n    pass")  # type: ignore[arg-type]
        os.kill(first._host.pid, signal.SIGKILL)
        t.join(60)
        assert not t.is_alive()
        assert isinstance(out[0], SandboxLost), out
        with pytest.raises(SandboxLost):
            first.run("1")
        first.close()
        assert second.run("state['moved']").value == "True"  # the other actor lives on
    finally:
        b.close()


def test_a_saved_checkpoint_is_decoded_at_the_depth_its_session_may_hold() -> None:
    """A state file is outside input: the keeper reads a session's saved image with the
    session's own memory limit as the bound, so one declaring more is refused before it
    inflates (the restore would refuse it only after); at the limit it loads (control)."""
    from memex import Sandbox
    from memex.backends.worker._client import ProcessCheckpoint
    from memex.errors import ImageError
    from memex.runtime_wasm.internal import checkpoint_from_bytes, checkpoint_to_bytes

    with Sandbox(limits=Limits(memory=256 << 20)) as sb:
        sb.run("ballast = bytearray(96 << 20)")
        blob = checkpoint_to_bytes(sb.checkpoint())
    for read in (lambda m: checkpoint_from_bytes(blob, max_memory=m),
                 lambda m: ProcessCheckpoint.from_bytes(blob, max_memory=m)):
        with pytest.raises(ImageError):
            read(64 << 20)  # a session of 64 MiB could never hold it
        cp = read(256 << 20)
        close = getattr(cp, "close", None)
        if close is not None:
            close()
