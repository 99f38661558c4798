"""Shared formatting, timing, workloads and the `memex serve` launcher for the benchmark
scripts (run as `python bench/X.py`)."""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def fmt(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1.0:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def median_p90(samples: list[float]) -> tuple[float, float]:
    s = sorted(samples)
    return statistics.median(s), s[int(0.9 * (len(s) - 1))]


def sample(fn: Callable[[], Any], n: int, *, warm: int = 0) -> list[float]:
    """Wall times of ``n`` calls of ``fn``, after ``warm`` untimed ones."""
    for _ in range(warm):
        fn()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def ballast(mib: int) -> str:
    """A cell that grows the guest by ``mib`` MiB, every page written (no zero pages)."""
    return f"_ballast = bytearray({mib} << 20)\n_ballast[::4096] = b'x' * len(_ballast[::4096])"


# A turn that writes 256 pages (1 MiB) of the ballast, far apart, different ones each time.
TOUCH_1MIB = ("_k = (_k + 256) % (len(_ballast) >> 12) if '_k' in globals() else 0\n"
              "for _j in range(256):\n"
              "    _ballast[((_k + _j) % (len(_ballast) >> 12)) << 12] = _j & 255")


def launch_serve(cfg: Path, log: Path, env: dict[str, str] | None = None
                 ) -> tuple[subprocess.Popen[bytes], str]:
    """`memex serve --config cfg` (its output in ``log``; ``env``: its environment), once
    it says where it serves. It runs in cfg's folder: ``python -m`` puts its working
    folder first on sys.path, so from the repository's root a ``PYTHONPATH`` naming another
    build of memex (a baseline) would silently lose to this one."""
    where = str(cfg.parent)
    if env is not None and env.get("PYTHONPATH"):
        found = subprocess.run([sys.executable, "-c", "import memex; print(memex.__file__)"],
                               env=env, cwd=where, capture_output=True, text=True).stdout
        if not found.startswith(env["PYTHONPATH"].split(os.pathsep)[0]):
            raise SystemExit(f"the baseline's memex is not the one imported: {found}")
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "memex", "serve", "--config", str(cfg)],
                                stdout=out, stderr=out, env=env, cwd=where)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        m = re.search(r"serving (http://[\d.]+:\d+)", log.read_text())
        if m:
            return proc, m.group(1)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"memex serve did not start:\n{log.read_text()}")
