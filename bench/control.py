"""The cluster control actor's admission of a create against the tenant's quota (sessions,
memory, disk), with N sessions in the directory: this build beside BASELINE, in one run.
Then its restart with N saved sessions in the storage: this build beside RESTART_BASELINE.

The control actor is made in this process (no Ray cluster: only its directory and ledger are
exercised) and filled with N sessions of many tenants; each sample is one create's check and
reservation and its release, under the actor's lock, as ``Control.create`` does before it
asks a slab. At BASELINE the check walked every session in the cluster under that one lock,
so it grew with the cluster (issue 47: 8.7 ms at 100,000 sessions, ~115 creates/s for the
whole cluster); now it reads the tenant's account.

A restart is timed as the actor's making (``Control(...)`` returns: it answers) and then a
tenant's first request (``of(tenant)``: its saved sessions read back), against a storage
folder holding N saved sessions' records of 100 tenants (and the per-tenant index this build
writes at each create). At RESTART_BASELINE the making read every record first (issue 47:
21-34 s with 1,000 records in S3). Both builds run with no Ray cluster, so no slab is
adopted (their slab adoption is skipped alike); the folder is a local one, where a read
costs far less than an S3 GET.

Then a rate-bounded tenant's turns (a rate, no ``max_running``) and a ``max_running``
tenant's: the control actor's calls and its CPU per 1,000 turns of one front, four at once,
as built (the front spends batches of tokens, ``cluster._tokens.RateTokens``, and keeps its
running slots, ``cluster._slots.RunningSlots``) beside what every such turn cost before (two
calls of the actor a turn, to begin and to end it: made here as a slot taken and given back,
calls of the same lock-held kind, on the same actor in the same run; the Ray call itself,
1-2 ms a call on a cluster, is left out of both).

    python bench/control.py            # needs memex[cluster] (Ray, fsspec)
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINE = "b593d3c"
"""The last commit whose control actor walked every session for a create's check."""
RESTART_BASELINE = "511af78"
"""The last commit whose restarted control actor read every saved record before answering."""
SIZES = (1_000, 10_000, 100_000)
TENANTS = 100


def fill(root: Path, n: int) -> None:
    """N saved sessions' records (as a slab writes them at open) and their index entries."""
    from memex import Limits
    from memex.backends.internal import limits_to_wire

    spec = {"limits": limits_to_wire(Limits(memory=64 << 20)), "mounts": [], "preload": []}
    for i in range(n):
        sid, tenant = f"s-{i}", f"t-{i % TENANTS}"
        (root / "sessions" / sid).mkdir(parents=True, mode=0o700)
        (root / "sessions" / sid / "record").write_text(json.dumps(
            {"id": sid, "tenant": tenant, "spec": spec, "turns": 2, "seq": 1, "image": None,
             "files": None, "files_kept": True, "door": False}))
        (root / "owners" / tenant).mkdir(parents=True, exist_ok=True, mode=0o700)
        (root / "owners" / tenant / sid).write_bytes(b"")
    (root / "owners-indexed").write_bytes(b"1")


def restart(root: str) -> dict[str, float]:
    """One restart against the filled folder: seconds to the actor's making, then to a
    tenant's first answer."""
    from memex.cluster.internal import Control, Storage

    Control._adopt_slabs = lambda self: None  # type: ignore[method-assign]  # no Ray here
    t0 = time.perf_counter()
    c = Control(Storage(root), namespace="bench", slab_memory=1 << 30, slab_cpus=1,
                save_interval=0, monitor=3600)
    t1 = time.perf_counter()
    listed = c.of("t-7")
    t2 = time.perf_counter()
    assert listed, "the tenant's saved sessions were not found"
    return {"made": t1 - t0, "first": t2 - t1, "listed": len(listed)}


def child(n: int, samples: int) -> dict[str, float]:
    from memex import Limits
    from memex.backends.internal import limits_to_wire
    from memex.cluster.internal import Control, Storage

    try:  # this build: the directory is a part of its own
        from memex.cluster._directory import Entry
    except ImportError:  # a baseline before the control actor was split by concern
        from memex.cluster._control import _Entry as Entry  # type: ignore[attr-defined,no-redef]

    with tempfile.TemporaryDirectory() as tmp:
        c = Control(Storage(str(Path(tmp) / "storage")), namespace="bench", slab_memory=1 << 30,
                    slab_cpus=1, save_interval=0, monitor=3600)
        spec = {"limits": limits_to_wire(Limits())}
        directory = getattr(c, "directory", None)
        put = directory.put if directory is not None else getattr(c, "_put", None)
        reserve = directory.reserve if directory is not None else c._reserve
        unreserve = directory.unreserve if directory is not None else c._unreserve
        for i in range(n):
            e = Entry(id=f"s-{i}", tenant=f"t-{i % TENANTS}", memory=1 << 20, disk=0,
                      slab="slab-x", spec=spec)
            if put is not None:
                put(e)
            else:
                c.sessions[e.id] = e
        bounds = {"max_sessions": n, "max_memory": None, "max_disk": None}
        times = []
        for k in range(samples):
            tenant = f"t-{k % TENANTS}"
            t = time.perf_counter()
            with c.lock:
                reserve(tenant, bounds, 1 << 20, 0)
                unreserve(tenant, 1 << 20, 0)
            times.append(time.perf_counter() - t)
    times.sort()
    return {"p50": times[len(times) // 2], "p99": times[int(0.99 * (len(times) - 1))]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--restart", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--samples", type=int, default=300, help="creates timed per row")
    ap.add_argument("--only", choices=["creates", "restart", "tokens"], default=None,
                    help="run one of the three parts (tokens: a rate's batches of tokens "
                    "and a bound's running slots)")
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args.samples)))
        return
    if args.restart is not None:
        print(json.dumps(restart(args.restart)))
        return
    if args.only in (None, "creates"):
        creates(args.samples)
    if args.only in (None, "restart"):
        restarts()
    if args.only in (None, "tokens"):
        tokens()


def _baseline(commit: str, into: str) -> None:
    blob = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "memex"],
                          check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        tar.extractall(into, filter="data")


def _run(path: str, *argv: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, __file__, *argv],
                         env={**os.environ, "PYTHONPATH": path}, check=True,
                         capture_output=True, text=True).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def restarts() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        _baseline(RESTART_BASELINE, tmp)
        print(f"a restarted control actor with N saved sessions of {TENANTS} tenants (local "
              "folder storage): seconds until it answers, then until a tenant's first "
              "answer (its sessions read back):")
        print(f"  {'sessions':>9}  {'as built answers':>17} {'first':>8}   "
              f"{'landed ' + RESTART_BASELINE + ' answers':>23} {'first':>8}")
        for n in SIZES:
            with tempfile.TemporaryDirectory() as store:
                fill(Path(store), n)
                row = [_run(path, "--restart", store) for path in (str(ROOT), tmp)]
            print(f"  {n:>9,}  {row[0]['made']:>15.3f} s {row[0]['first']:>6.3f} s"
                  f"   {row[1]['made']:>21.3f} s {row[1]['first']:>6.3f} s")


def creates(samples: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        _baseline(BASELINE, tmp)
        print(f"a create's quota check and reservation in the control actor, "
              f"{samples} each, {TENANTS} tenants:")
        print(f"  {'sessions':>9}  {'as built p50':>13} {'p99':>9}   "
              f"{'landed ' + BASELINE + ' p50':>19} {'p99':>9}")
        for n in SIZES:
            row = [_run(path, "--child", str(n), "--samples", str(samples))
                   for path in (str(ROOT), tmp)]
            print(f"  {n:>9,}  {row[0]['p50'] * 1e6:>10.1f} us {row[0]['p99'] * 1e6:>6.1f} us"
                  f"   {row[1]['p50'] * 1e6:>16.1f} us {row[1]['p99'] * 1e6:>6.1f} us")


def tokens(turns: int = 1000) -> None:
    import asyncio

    from memex.backends.internal import limits_to_wire
    from memex.cluster._directory import Entry
    from memex.cluster.internal import Control, RateTokens, RunningSlots, Storage
    from memex.runtime_wasm import Limits

    rate, burst = 1e6, 1000  # well within: every turn admitted
    with tempfile.TemporaryDirectory() as tmp:
        c = Control(Storage(tmp), namespace="b", slab_memory=1 << 30, slab_cpus=1,
                    save_interval=0, monitor=3600)
        for sid, tenant in (("s-1", "t"), ("s-2", "u"), ("s-3", "v"), ("s-4", "w")):  # each
            # a tenant of its own (its own bucket and slots)
            c.directory.put(Entry(id=sid, tenant=tenant, memory=64, disk=8, slab="slab-x",
                                  spec={"limits": limits_to_wire(Limits())}))
        calls = [0]

        async def ask(want: int, returned: int) -> object:
            calls[0] += 1
            await asyncio.sleep(0)  # a round trip: turns at once pile up behind it
            return c.take_tokens("t", rate, burst, want, returned)

        async def built() -> None:
            front = RateTokens()

            async def worker() -> None:
                for _ in range(turns // 4):
                    assert await front.take("t", rate, burst, ask) is None
                    await asyncio.sleep(0)  # the turn itself
            await asyncio.gather(*(worker() for _ in range(4)))

        async def before(tenant: str, sid: str) -> None:
            """Every turn asks the actor twice: to begin it (its slot and its token) and to
            end it, as fronts did before e4245e0 (a rate) and before the slots (a bound):
            here as a slot of this build's actor taken and given back, the same two calls
            of the same lock-held kind."""
            async def worker() -> None:
                for _ in range(turns // 4):
                    calls[0] += 1
                    await asyncio.sleep(0)
                    assert type(c.take_slots(tenant, 4, 1, "f")).__name__ == "Slots"
                    await asyncio.sleep(0)  # the turn itself
                    calls[0] += 1
                    c.give_back_slots(tenant, 1, "f")
            await asyncio.gather(*(worker() for _ in range(4)))

        async def ask_slots(want: int) -> object:
            calls[0] += 1
            await asyncio.sleep(0)
            return c.take_slots("v", 4, want, "g")

        async def slots_built() -> None:
            front = RunningSlots()

            async def worker() -> None:
                for _ in range(turns // 4):
                    assert await front.take("v", 4, ask_slots, 5.0)
                    await asyncio.sleep(0)  # the turn itself
                    front.release("v")
            await asyncio.gather(*(worker() for _ in range(4)))

        for title, rows in (
                (f"a rate-bounded tenant's {turns:,} turns through one front, 4 at once (rate "
                 f"{rate:g}/s): the control actor's calls, and the front's and actor's CPU:",
                 (("as built (batches of tokens)", built),
                  ("before e4245e0 (begin and end a turn)", lambda: before("u", "s-2")))),
                (f"a max_running = 4 tenant's {turns:,} turns through one front, 4 at once: "
                 "the control actor's calls, and the front's and actor's CPU:",
                 (("as built (running slots kept)", slots_built),
                  ("before (begin and end a turn)", lambda: before("w", "s-4"))))):
            print(title)
            for label, fn in rows:
                calls[0] = 0
                t = time.process_time()
                asyncio.run(fn())
                cpu = time.process_time() - t
                print(f"  {label:40s} {calls[0]:>6,} calls  {cpu * 1e3:8.1f} ms of CPU")


if __name__ == "__main__":
    main()
