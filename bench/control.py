"""The cluster control actor's admission of a create against the tenant's quota (sessions,
memory, disk), with N sessions in the directory: this build beside BASELINE, in one run.

The control actor is made in this process (no Ray cluster: only its directory and ledger are
exercised) and filled with N sessions of many tenants; each sample is one create's check and
reservation and its release, under the actor's lock, as ``Control.create`` does before it
asks a slab. At BASELINE the check walked every session in the cluster under that one lock,
so it grew with the cluster (issue 47: 8.7 ms at 100,000 sessions, ~115 creates/s for the
whole cluster); now it reads the tenant's account.

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
SIZES = (1_000, 10_000, 100_000)
TENANTS = 100


def child(n: int, samples: int) -> dict[str, float]:
    from memex import Limits
    from memex.backends import Storage
    from memex.backends.worker import limits_to_wire
    from memex.serving import Control
    from memex.serving._control import _Entry

    with tempfile.TemporaryDirectory() as tmp:
        c = Control(Storage(str(Path(tmp) / "storage")), namespace="bench", slab_memory=1 << 30,
                    slab_cpus=1, save_interval=0, monitor=3600)
        spec = {"limits": limits_to_wire(Limits())}
        put = getattr(c, "_put", None)
        for i in range(n):
            e = _Entry(id=f"s-{i}", tenant=f"t-{i % TENANTS}", memory=1 << 20, disk=0,
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
                c._reserve(tenant, bounds, 1 << 20, 0)
                c._unreserve(tenant, 1 << 20, 0)
            times.append(time.perf_counter() - t)
    times.sort()
    return {"p50": times[len(times) // 2], "p99": times[int(0.99 * (len(times) - 1))]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--samples", type=int, default=300, help="creates timed per row")
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args.samples)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        blob = subprocess.run(["git", "-C", str(ROOT), "archive", BASELINE, "memex"],
                              check=True, capture_output=True).stdout
        with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
            tar.extractall(tmp, filter="data")
        print(f"a create's quota check and reservation in the control actor, "
              f"{args.samples} each, {TENANTS} tenants:")
        print(f"  {'sessions':>9}  {'as built p50':>13} {'p99':>9}   "
              f"{'landed ' + BASELINE + ' p50':>19} {'p99':>9}")
        for n in SIZES:
            row = []
            for path in (str(ROOT), tmp):
                out = subprocess.run([sys.executable, __file__, "--child", str(n),
                                      "--samples", str(args.samples)],
                                     env={**os.environ, "PYTHONPATH": path}, check=True,
                                     capture_output=True, text=True).stdout
                row.append(json.loads(out.strip().splitlines()[-1]))
            print(f"  {n:>9,}  {row[0]['p50'] * 1e6:>10.1f} us {row[0]['p99'] * 1e6:>6.1f} us"
                  f"   {row[1]['p50'] * 1e6:>16.1f} us {row[1]['p99'] * 1e6:>6.1f} us")


if __name__ == "__main__":
    main()
