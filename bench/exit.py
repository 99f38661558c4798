"""Exit-path stress: run the CLI many times and count every run that did not end cleanly.

    python bench/exit.py                   # 10,000 runs of `memex run -c pass`
    python bench/exit.py -n 2000 --load 2  # with two busy processes beside it

A clean run exits 0 and writes nothing. Counted apart: runs killed by a signal (SIGABRT,
SIGSEGV...), other non-zero exits, and runs that printed anything (a wasmtime/tokio panic at
exit prints "panicked at ..."). The baseline in the same run is the same command through
``python -c`` calling ``memex.cli.main`` and exiting normally (through the interpreter's
finalization), which is what the entry point avoids (memex/cli/_main.py, ``run``).
"""

from __future__ import annotations

import argparse
import multiprocessing
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
CLI = [PY, "-m", "memex", "run", "-c", "pass"]
FINALIZING = [PY, "-c", "import sys\nfrom memex.cli import main\n"
              "sys.exit(main(['run', '-c', 'pass']))"]


def _busy(stop: float) -> None:
    x = 0
    while time.monotonic() < stop:
        x += 1


def _classify(p: subprocess.CompletedProcess[str]) -> str:
    if p.returncode < 0:
        return f"signal {signal.Signals(-p.returncode).name}"
    if p.returncode != 0:
        return f"exit {p.returncode}"
    if "panicked" in p.stderr:
        return "panic printed"
    if p.stdout or p.stderr:
        return "other output"
    return "clean"


def stress(cmd: list[str], n: int, label: str) -> tuple[Counter[str], float]:
    seen: Counter[str] = Counter()
    start = time.monotonic()
    for i in range(1, n + 1):
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
            seen[_classify(p)] += 1
        except subprocess.TimeoutExpired:  # subprocess.run has killed it
            seen["hung (killed after 120 s)"] += 1
        if i % 500 == 0 or i == n:
            print(f"  {label}: {i}/{n}, not clean so far {i - seen['clean']}",
                  file=sys.stderr, flush=True)
    return seen, time.monotonic() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=10_000, help="runs of the CLI (default 10,000)")
    ap.add_argument("--baseline", type=int, default=None,
                    help="runs of the finalizing baseline (default n/10)")
    ap.add_argument("--load", type=int, default=0, help="busy processes beside the runs")
    args = ap.parse_args()
    base_n = args.baseline if args.baseline is not None else max(1, args.n // 10)
    busy = [multiprocessing.Process(target=_busy, args=(time.monotonic() + 24 * 3600,),
                                    daemon=True) for _ in range(args.load)]
    for b in busy:
        b.start()
    try:
        rows = [("memex run -c pass (entry point)", args.n, *stress(CLI, args.n, "cli")),
                ("main() + interpreter finalization", base_n,
                 *stress(FINALIZING, base_n, "baseline"))]
    finally:
        for b in busy:
            b.terminate()
    print(f"\nExit-path stress ({args.load} busy processes beside it)\n")
    print(f"{'what':36s} {'runs':>6s} {'clean':>6s} {'not clean':>9s}  {'s/run':>6s}  kinds")
    for what, n, seen, secs in rows:
        bad = n - seen["clean"]
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(seen.items()) if k != "clean") or "-"
        print(f"{what:36s} {n:6d} {seen['clean']:6d} {bad:9d}  {secs / n:6.3f}  {kinds}")


if __name__ == "__main__":
    main()
