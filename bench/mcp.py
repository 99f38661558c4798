"""MCP both ways, side by side in one run on this machine:

* ``run_python('pass')`` through ``memex mcp`` (the real MCP client over stdio, and over
  streamable HTTP on 127.0.0.1) beside the same cell run by ``Sandbox.run`` directly;
* a bridged MCP tool (``add(1, 2)`` of tests/host_tools/mcp/mcp_test_server.py) called from
  guest code through ``ToolSet.from_mcp``, beside the same call made by a plain host MCP client
  to its own copy of that server.

Medians (and p90) of per-call wall times as the caller sees them, calls made back to back.
The direct sandbox rows show both its settings: ``memex mcp`` keeps the default rollback
record (the pages the last good cell wrote, copied at the start of the next cell), which every
call waits for. The host client's call to a plain MCP server over stdio is the protocol's
floor. Asserts nothing.

    python bench/mcp.py            # 300 calls per row
    python bench/mcp.py --quick    # 60
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HERE = ROOT / "bench"
# This file is named mcp.py: the SDK is imported before bench/ goes on the path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

import anyio  # noqa: E402
import anyio.from_thread  # noqa: E402
import httpx2  # noqa: E402
from mcp import Client, StdioServerParameters  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

for p in (ROOT, HERE):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from _fmt import fmt, median_p90, sample  # noqa: E402

from memex import Sandbox, ToolHost, ToolSet  # noqa: E402

MEMEX = shutil.which("memex", path=str(Path(sys.executable).parent)) or "memex"
SERVER = str(ROOT / "tests" / "host_tools" / "mcp" / "mcp_test_server.py")
TOKEN = "bench-token"


async def timed(n: int, fn: Callable[[], Awaitable[Any]], gap: float = 0.0) -> list[float]:
    await fn()  # warm
    out = []
    for _ in range(n):
        if gap:
            await anyio.sleep(gap)
        t = time.perf_counter()
        await fn()
        out.append(time.perf_counter() - t)
    return out


async def over_stdio(n: int, *flags: str, gap: float = 0.0) -> list[float]:
    async with Client(StdioServerParameters(command=MEMEX, args=["mcp", *flags])) as c:
        return await timed(n, lambda: c.call_tool("run_python", {"code": "pass"}), gap)


async def over_http(n: int, url: str, mode: Any) -> list[float]:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as h, \
            Client(streamable_http_client(url, http_client=h), mode=mode) as c:
        r = await c.call_tool("run_python", {"code": "pass"})
        sid = (r.structured_content or {})["session"]
        return await timed(n, lambda: c.call_tool("run_python", {"code": "pass",
                                                                 "session": sid}))


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def bridged_vs_host(n: int, rounds: int = 10, cpu: dict[str, float] | None = None
                    ) -> tuple[list[float], list[float]]:
    """The same add(1, 2) from a plain host client (timed in its event loop) and from guest
    code through ToolSet.from_mcp (timed in the guest), in alternating rounds so that load
    from other work falls on both alike. Each side has its own server process. ``cpu`` gets
    each side's CPU time per call in this process (all its threads; the servers' not)."""
    host: list[float] = []
    guest: list[float] = []
    spent = {"host": 0.0, "guest": 0.0}
    k = max(1, n // rounds)
    with anyio.from_thread.start_blocking_portal() as portal, \
            ToolSet.from_mcp(sys.executable, args=[SERVER]) as ts, \
            Sandbox(rollback=False) as sb, ToolHost(ts).attach(sb):
        client = portal.wrap_async_context_manager(
            Client(StdioServerParameters(command=sys.executable, args=[SERVER])))
        with client as c:
            async def batch() -> list[float]:
                return await timed(k, lambda: c.call_tool("add", {"a": 1, "b": 2}))

            sb.run("import time\nadd(1, 2)")
            code = (f"_t = []\nfor _ in range({k}):\n    _s = time.perf_counter()\n"
                    "    add(1, 2)\n    _t.append(time.perf_counter() - _s)\n_t")
            for _ in range(rounds):
                c0 = _cpu()
                host += portal.call(batch)
                c1 = _cpu()
                r = sb.run(code, timeout=600)
                spent["host"] += c1 - c0
                spent["guest"] += _cpu() - c1
                guest += [float(x) for x in (r.value or "[]").strip("[]").split(",")
                          if x.strip()]
    if cpu is not None:
        cpu["host"] = spent["host"] / max(len(host), 1)
        cpu["guest"] = spent["guest"] / max(len(guest), 1)
    return host, guest


def start_http() -> tuple[subprocess.Popen[str], str]:
    env = dict(os.environ, MEMEX_BENCH_TOKEN=TOKEN)
    p = subprocess.Popen([MEMEX, "mcp", "--http", "--port", "0", "--token-env",
                          "MEMEX_BENCH_TOKEN"], stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True, env=env)
    assert p.stderr is not None
    line = p.stderr.readline()
    m = re.search(r"serving (\S+)", line)
    if m is None:
        raise SystemExit(f"memex mcp --http did not start: {line}")
    return p, m.group(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    n = 60 if ap.parse_args().quick else 300
    rows: list[tuple[str, list[float], str]] = []
    t0 = time.monotonic()
    for rollback in (False, True):
        with Sandbox(rollback=rollback) as sb:
            rows.append((f"Sandbox.run('pass') direct, rollback={rollback}",
                         sample(lambda sb=sb: sb.run("pass"), n, warm=1), "in-process floor"))
    rows.append(("memex mcp stdio: run_python('pass')", anyio.run(over_stdio, n),
                 "real mcp Client, protocol 2026-07-28"))
    rows.append(("memex mcp stdio: run_python('pass'), 25 ms apart",
                 anyio.run(lambda: over_stdio(n, gap=0.025)),
                 "a host's think time (the rollback record is taken as the next call starts)"))
    rows.append(("memex mcp stdio --no-rollback: run_python('pass')",
                 anyio.run(over_stdio, n, "--no-rollback"), "the protocol's own cost"))
    proc, url = start_http()
    try:
        rows.append(("memex mcp HTTP: run_python('pass')", anyio.run(over_http, n, url, "auto"),
                     "stateless protocol, session handle, bearer token"))
        rows.append(("memex mcp HTTP legacy: run_python('pass')",
                     anyio.run(over_http, n, url, "legacy"), "2025-11-25, Mcp-Session-Id"))
    finally:
        proc.terminate()
        proc.wait(30)
    cpu: dict[str, float] = {}
    host, guest = bridged_vs_host(n, cpu=cpu)
    rows.append(("host mcp Client -> server: add(1, 2)", host,
                 "the bridged server's own round trip over stdio: the protocol's floor"))
    rows.append(("guest -> ToolSet.from_mcp -> server: add(1, 2)", guest,
                 "timed in the guest: door + host checks + the same client path"))
    print(f"MemEx MCP benchmark ({'quick; ' if n == 60 else ''}medians of {n} calls; "
          f"{os.cpu_count()} CPUs; {time.monotonic() - t0:.0f} s)\n")
    print(f"{'what':58} {'median':>10} {'p90':>10}  notes")
    for label, samples, note in rows:
        med, p90 = median_p90(samples)
        print(f"{label:58} {fmt(med):>10} {fmt(p90):>10}  {note}")
    host = median_p90(rows[-2][1])[0]
    guest_med = median_p90(rows[-1][1])[0]
    print(f"\nbridged call overhead over the host client's own call: {fmt(guest_med - host)} "
          "(target <= 0.5 ms)")
    print(f"CPU per call in this process (all threads; the servers' not): host client "
          f"{fmt(cpu['host'])}, bridged {fmt(cpu['guest'])} (+{fmt(cpu['guest'] - cpu['host'])})")
    stdio = median_p90(rows[2][1])[0]
    turn = median_p90(rows[1][1])[0]
    print(f"stdio run_python('pass') median: {fmt(stdio)} back to back, "
          f"{fmt(median_p90(rows[3][1])[0])} 25 ms apart; target: the in-process turn + 1 ms "
          f"= {fmt(turn + 1e-3)}")
    print(f"the protocol's floor (a plain MCP server's tool over stdio, the host client row) + "
          f"the in-process turn: {fmt(host + turn)}; memex mcp's own part: "
          f"{fmt(stdio - host - turn)}")


if __name__ == "__main__":
    main()
