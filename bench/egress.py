"""Network egress through the host, side by side with the host's own HTTP client (same local
server on 127.0.0.1, same process, same run), and policy decision time for a 1,000-rule
policy beside a 1-rule one.

    python bench/egress.py            # full run (under a minute)
    python bench/egress.py --quick    # fewer repetitions

Request rows are medians of per-request wall times; guest rows are timed inside the guest (a
call's whole round trip as the code that makes it sees it: door, policy, connect, request,
response back). Host and guest are measured in alternating rounds so that load from other
work on the machine falls on both alike; a note gives the spread of the round medians. Both
sides open one connection per request (the egress client never reuses connections).
It asserts nothing.
"""

from __future__ import annotations

import argparse
import ast
import http.client
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "bench"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from _fmt import fmt, sample  # noqa: E402  (bench/ is on sys.path when a script runs)

from memex import Limits, Sandbox  # noqa: E402
from memex.host_tools import Egress, EgressPolicy  # noqa: E402
from memex.host_tools.egress import Fetcher, FetchRequest  # noqa: E402

BIG = b"x" * (1 << 20)
SMALL = json.dumps({"hello": "world", "n": list(range(8))}).encode()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        body = BIG if self.path.startswith("/big") else SMALL
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


TIMER = (
    "import time, json, urllib.request, http.client\n"
    "from memex_guest import net\n"
    "def _times(fn, n):\n"
    "    out = []\n"
    "    for _ in range(n):\n"
    "        t = time.perf_counter()\n"
    "        fn()\n"
    "        out.append(time.perf_counter() - t)\n"
    "    return out\n"
)


def _guest_times(sb: Sandbox, expr: str, n: int) -> list[float]:
    r = sb.run(f"_times(lambda: {expr}, {n})")
    if r.value is None:
        raise RuntimeError(f"guest timing failed: {r.exception or r}")
    return list(ast.literal_eval(r.value))


def _rounds(pairs: list[tuple[str, Callable[[int], list[float]]]], rounds: int, n: int
            ) -> dict[str, tuple[float, float, float]]:
    """Alternate the measurements; per name: (median of all, min and max round median)."""
    samples: dict[str, list[float]] = {name: [] for name, _ in pairs}
    medians: dict[str, list[float]] = {name: [] for name, _ in pairs}
    for _ in range(rounds):
        for name, run in pairs:
            times = run(n)
            samples[name].extend(times)
            medians[name].append(statistics.median(times))
    return {k: (statistics.median(v), min(medians[k]), max(medians[k]))
            for k, v in samples.items()}


def _policy_rules(n: int) -> list[dict[str, Any]]:
    """n rules of the kinds a real policy has: exact hosts with methods and paths, wildcard
    suffixes, ports, a few deny rules and IP rules."""
    rules: list[dict[str, Any]] = []
    for i in range(n):
        k = i % 10
        if k < 6:
            rules.append({"name": f"api-{i}", "action": "allow", "scheme": "https",
                          "host": f"api{i}.service{i % 37}.example.com", "method": ["GET"],
                          "path": f"/v{i % 3}"})
        elif k < 8:
            rules.append({"name": f"cdn-{i}", "action": "allow", "host": f"*.cdn{i}.example.net",
                          "port": [443, "8000-8100"]})
        elif k == 8:
            rules.append({"name": f"block-{i}", "action": "deny", "host": f"*.bad{i}.example.org"})
        else:
            rules.append({"name": f"net-{i}", "action": "allow",
                          "ip": f"93.{i % 250}.{i // 250}.0/24"})
    return rules


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    rounds, n = (3, 30) if args.quick else (7, 60)
    start = time.monotonic()

    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    port = srv.server_address[1]
    url, big = f"http://127.0.0.1:{port}/small", f"http://127.0.0.1:{port}/big"
    policy = EgressPolicy.from_dict({"rules": [{"name": "local", "action": "allow",
                                                "ip": "127.0.0.1"}],
                                     "limits": {"max_response_bytes": "4M"}})
    rows: list[tuple[str, str, str, str]] = []

    def raw_http(path: str) -> bytes:
        c = http.client.HTTPConnection("127.0.0.1", port)
        c.request("GET", path)
        data = c.getresponse().read()
        c.close()
        return data

    fetcher = Fetcher(policy)

    def host_egress(u: str) -> bytes:
        resp = fetcher.fetch(FetchRequest(url=u), deadline=time.monotonic() + 10,
                             admit=lambda: None, on_hop=lambda hop: None)
        return resp.body

    with Sandbox(limits=Limits(timeout=120)) as sb:
        Egress(policy).attach(sb)
        r = sb.run(TIMER)
        assert r.ok, r
        _guest_times(sb, f"urllib.request.urlopen({url!r}).read()", 3)  # warm: imports
        res = _rounds([
            ("host urlopen", lambda k: sample(
                lambda: urllib.request.urlopen(url).read(), k)),
            ("host http.client", lambda k: sample(lambda: raw_http("/small"), k)),
            ("host egress client", lambda k: sample(lambda: host_egress(url), k)),
            ("guest urlopen", lambda k: _guest_times(
                sb, f"urllib.request.urlopen({url!r}).read()", k)),
            ("guest fetch", lambda k: _guest_times(sb, f"net.fetch({url!r}).body", k)),
            ("guest http.client", lambda k: _guest_times(
                sb, f"(lambda c: (c.request('GET', '/small'), c.getresponse().read()))("
                    f"http.client.HTTPConnection('127.0.0.1', {port}))", k)),
        ], rounds, n)
        base = res["host urlopen"][0]
        for name, (med, lo, hi) in res.items():
            note = f"rounds {fmt(lo)}..{fmt(hi)}, n={rounds * n}"
            if name.startswith("guest") or name == "host egress client":
                note += f"; +{fmt(med - base)} over host urlopen ({med / base:.1f}x)"
            rows.append(("request", f"{name}, {len(SMALL)} B response", fmt(med), note))
        big_res = _rounds([
            ("host urlopen", lambda k: sample(
                lambda: urllib.request.urlopen(big).read(), k)),
            ("guest urlopen", lambda k: _guest_times(
                sb, f"urllib.request.urlopen({big!r}).read()", k)),
            ("guest fetch", lambda k: _guest_times(sb, f"net.fetch({big!r}).body", k)),
        ], rounds, max(5, n // 6))
        base = big_res["host urlopen"][0]
        for name, (med, lo, hi) in big_res.items():
            note = f"rounds {fmt(lo)}..{fmt(hi)}"
            if name != "host urlopen":
                note += f"; {med / base:.1f}x host urlopen"
            rows.append(("request", f"{name}, 1 MiB response", fmt(med), note))
    srv.shutdown()

    # ---- decisions ------------------------------------------------------------------------
    small_policy = EgressPolicy.from_dict({"rules": _policy_rules(1)})
    rules = _policy_rules(1000)
    big_policy = EgressPolicy.from_dict({"rules": rules})
    cases = [
        ("exact host, last such rule", f"https://api990.service{990 % 37}.example.com/v0/x",
         "GET", None),
        ("wildcard host", "https://img.a.cdn997.example.net:8080/p.png", "GET", None),
        ("no rule matches (default deny)", "https://unknown.example/", "GET", None),
        ("IP literal", "http://93.249.3.7/", "GET", None),
        ("name with its addresses", "https://api0.service0.example.com/v0/",
         "GET", ["93.184.216.34"]),
    ]
    reps = 500 if args.quick else 2000
    for label, u, m, addrs in cases:
        per: dict[str, list[float]] = {"1 rule": [], "1,000 rules": []}
        for _ in range(rounds):
            for pname, pol in (("1 rule", small_policy), ("1,000 rules", big_policy)):
                t = time.perf_counter()
                for _ in range(reps):
                    pol.check(u, m, addresses=addrs)
                per[pname].append((time.perf_counter() - t) / reps)
        d = big_policy.check(u, m, addresses=addrs)
        big_t, small_t = statistics.median(per["1,000 rules"]), statistics.median(per["1 rule"])
        rows.append(("decide", f"{label}: 1,000-rule policy", fmt(big_t),
                     f"1-rule policy {fmt(small_t)}; {'allow' if d.allowed else 'deny'} "
                     f"({d.rule or d.code}); {rounds} rounds x {reps}"))
    t = time.perf_counter()
    for _ in range(reps):
        urllib.parse.urlsplit(f"https://api{_}.example.com/v0/x")
    rows.append(("decide", "baseline: urllib.parse.urlsplit of a URL", fmt(
        (time.perf_counter() - t) / reps), "what a bare URL parse costs on this machine"))
    with tempfile.TemporaryDirectory() as tmp:
        import tomllib  # noqa: F401  (the loader uses it)

        path = os.path.join(tmp, "policy.toml")
        with open(path, "w") as f:
            for r in rules:
                f.write("[[rules]]\n")
                for k, v in r.items():
                    f.write(f"{k} = {json.dumps(v)}\n")
                f.write("\n")
        t = time.perf_counter()
        EgressPolicy.load(path)
        rows.append(("load", "1,000-rule TOML file to a policy", fmt(time.perf_counter() - t),
                     f"{os.path.getsize(path) // 1024} KiB; parse, validate, index"))

    print(f"MemEx egress benchmark ({'quick; ' if args.quick else ''}medians; "
          f"{os.cpu_count()} CPUs; {time.monotonic() - start:.0f} s)\n")
    w = max(len(r[1]) for r in rows)
    print(f"{'section':<9} {'what':<{w}} {'median':>10}  notes")
    print(f"{'-' * 9} {'-' * w} {'-' * 10}  -----")
    for sec, what, val, note in rows:
        print(f"{sec:<9} {what:<{w}} {val:>10}  {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
