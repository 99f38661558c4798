"""The cluster figures of ``bench/serve.py`` (``--only cluster``, and after the single-node
figures in a full run): a real Ray cluster on 127.0.0.1 (a head and worker nodes started by
``ray.cluster_utils.Cluster``) with one ``memex serve`` front joined to it, beside a
single-node ``memex serve`` in the same run (the inprocess backend, whose guest runs in the
server's own process, and the default pool backend, whose guest runs in a worker process as a
slab's does).

* a trivial cell through each (RemoteBackend, turns socket): the cluster front's overhead
  is the difference of the p50s (target <= 2 ms);
* a session create through each;
* the control actor's own cost: directory lookups, and running slots taken and given back,
  per second, called back to back from this process (what bounds the cluster size:
  docs/scaling.md);
* a worker node killed under a session: seconds from the kill to the session's next
  successful result on the other node;
* turns/s with 1 and then 2 worker nodes (8 clients, trivial cells): on two cores this shows
  the cost of more processes, not scaling (printed beside it);
* the storage: the bytes one save of a busy session writes, tiny and with 10 MiB, and what
  that is per second at the default ``save_interval`` (``--only storage`` runs it alone).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from _fmt import fmt, launch_serve, sample

from memex import Limits
from memex.backends import LOOPBACK_NODE, get_backend, init_ray, ray_on_loopback
from memex.service import hash_key

GiB = 1 << 30
LIM = Limits(timeout=30.0, memory=256 << 20)


def _serve(cfg: Path) -> tuple[subprocess.Popen[bytes], str]:
    return launch_serve(cfg, cfg.with_suffix(".log"))


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()


def _row(label: str, xs: list[float], target: str = "") -> None:
    xs2 = sorted(xs)
    p99 = xs2[min(len(xs2) - 1, int(0.99 * len(xs2)))]
    print(f"  {label:44s} p50 {fmt(statistics.median(xs)):>9s}  p99 {fmt(p99):>9s}  {target}")


def _turns_per_second(url: str, key: str, clients: int, seconds: float) -> float:
    backend = get_backend("remote", url=url, api_key=key)
    stop = time.monotonic() + seconds
    done = [0]
    lock = threading.Lock()

    def client(_: int) -> None:
        with backend.open(limits=LIM) as sb:
            sb.run("1")
            n = 0
            while time.monotonic() < stop:
                sb.run("1")
                n += 1
            with lock:
                done[0] += n

    t0 = time.monotonic()
    with ThreadPoolExecutor(clients) as ex:
        list(ex.map(client, range(clients)))
    wall = time.monotonic() - t0
    backend.close()
    return done[0] / max(wall, 1e-9)


def cluster_figures(scale: int) -> None:
    import ray
    from ray.cluster_utils import Cluster

    n = 1000 // scale
    key = secrets.token_urlsafe(24)
    tenant = f'[tenants.t]\nkeys = ["{hash_key(key)}"]\nmax_sessions = 100\n'
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        single_cfg = folder / "single.toml"
        single_cfg.write_text("[server]\nport = 0\nbackend = \"inprocess\"\naccess_log = false\n"
                              + tenant)
        pool_cfg = folder / "pool.toml"
        pool_cfg.write_text("[server]\nport = 0\nworkers = 2\naccess_log = false\n" + tenant)
        ray_on_loopback()  # every node below is on 127.0.0.1 by name, and this driver too
        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 0, "include_dashboard": False, **LOOPBACK_NODE})
        workers = [cluster.add_node(num_cpus=4, memory=4 * GiB, **LOOPBACK_NODE)]
        cluster.wait_for_nodes()
        nodes = sorted({cluster.head_node.node_ip_address, *(w.node_ip_address for w in workers)})
        print(f"\nRay cluster at {cluster.address}; its nodes' addresses: {', '.join(nodes)}")
        cfg = folder / "cluster.toml"
        cfg.write_text(
            "[server]\nport = 0\naccess_log = false\n"
            f'[cluster]\naddress = "{cluster.address}"\nstorage = "{folder / "storage"}"\n'
            f"slab_memory = {GiB}\nslab_cpus = 1\nslab_idle = 2\n" + tenant)
        single, single_url = _serve(single_cfg)
        pooled, pool_url = _serve(pool_cfg)
        front, front_url = _serve(cfg)
        try:
            one = get_backend("remote", url=single_url, api_key=key)
            by_pool = get_backend("remote", url=pool_url, api_key=key)
            many = get_backend("remote", url=front_url, api_key=key)
            print(f"\nmemex serve on a Ray cluster (head + worker nodes on 127.0.0.1, one "
                  f"front) vs a single-node memex serve (inprocess backend, and the default "
                  f"pool backend); {os.cpu_count()} cores\n")
            print(f"a trivial cell ('1'), {n} each (RemoteBackend, turns socket):")
            with one.open(limits=LIM) as a, by_pool.open(limits=LIM) as p, \
                    many.open(limits=LIM) as b:
                for sb in (a, p, b):
                    sb.run("1")
                alone = sample(lambda: a.run("1"), n)
                pool_alone = sample(lambda: p.run("1"), n)
                through = sample(lambda: b.run("1"), n)
            _row("single-node memex serve (inprocess)", alone)
            _row("single-node memex serve (pool)", pool_alone)
            _row("cluster front", through)
            for name, base in (("inprocess", alone), ("pool", pool_alone)):
                label = f"cluster overhead (p50 - p50 single, {name})"
                print(f"  {label:44s}     "
                      f"{fmt(statistics.median(through) - statistics.median(base)):>9s}"
                      "                  target <= 2 ms")

            creates: dict[str, list[float]] = {"single": [], "cluster": []}
            for name, b in (("single", one), ("cluster", many)):
                for _ in range(max(20, 100 // scale)):
                    t = time.perf_counter()
                    s = b.open(limits=LIM)
                    creates[name].append(time.perf_counter() - t)
                    s.close()
            print(f"\nsession create (+ close), {len(creates['single'])} each:")
            _row("single-node create", creates["single"])
            _row("cluster create (a slab with room)", creates["cluster"])

            print("\nthe control actor alone, called back to back from this process:")
            init_ray(cluster.address, namespace="memex", log_to_driver=False)
            print(f"  (this driver joined on {ray.util.get_node_ip_address()}; the nodes: "
                  f"{', '.join(sorted({n['NodeManagerAddress'] for n in ray.nodes()}))})")
            from memex.cluster.internal import CONTROL_NAME
            control = ray.get_actor(CONTROL_NAME, namespace="memex")
            with many.open(limits=LIM) as s:
                s.run("1")
                calls = 2000 // scale
                t = time.perf_counter()
                ray.get([control.lookup.remote("t", s.id) for _ in range(calls)])
                lookups = calls / (time.perf_counter() - t)
                t = time.perf_counter()
                for _ in range(calls // 2):  # a bound no take reaches: never a Wait
                    ray.get(control.take_slots.remote("t", 1 << 20, 1, "bench"))
                    control.give_back_slots.remote("t", 1, "bench")
                admits = (calls // 2) / (time.perf_counter() - t)
            print(f"  {'directory lookups (pipelined)':44s}     {lookups:9.0f} /s")
            print(f"  {'running slots (take, then give back)':44s}     {admits:9.0f} /s")

            print("\nmemory: a slab's resident size with idle sessions (each ran '1'):")
            stats0: dict[str, Any] = ray.get(control.stats.remote())
            before = {x["name"]: _slab_rss(x["name"]) for x in stats0["slabs"]}
            held = [many.open(limits=LIM) for _ in range(3)]
            for h in held:
                h.run("x = 1")
            stats1: dict[str, Any] = ray.get(control.stats.remote())
            after = {x["name"]: (_slab_rss(x["name"]), x["sessions"]) for x in stats1["slabs"]}
            grew = [(after[n][0] - before.get(n, after[n][0]), after[n][1])
                    for n in after if n in before]
            per = sum(g for g, _ in grew) / max(1, len(held))
            base = min(before.values()) if before else 0
            print(f"  {'a slab, its sessions closed (base)':44s}     {base / 2**20:9.0f} MiB")
            print(f"  {'each more idle session':44s}     {per / 2**20:9.1f} MiB  "
                  f"(about {2**30 / max(per, 1):.0f} sessions per GiB, the base aside)")
            for h in held:
                h.close()

            storage_figures(many, folder / "storage", 2.0)

            print("\nturns/s, 8 clients with a session each, trivial cells:")
            tps1 = _turns_per_second(front_url, key, 8, 10.0 / scale ** 0.5)
            workers.append(cluster.add_node(num_cpus=4, memory=4 * GiB, **LOOPBACK_NODE))
            cluster.wait_for_nodes()
            tps2 = _turns_per_second(front_url, key, 8, 10.0 / scale ** 0.5)
            print(f"  {'1 worker node':44s}     {tps1:9.0f} turns/s")
            print(f"  {'2 worker nodes':44s}     {tps2:9.0f} turns/s   (2 cores: every node, "
                  "slab and front shares them; this is overhead, not scaling)")

            print("\na worker node killed under a session (its last save: the turn before):")
            with many.open(limits=LIM) as s:
                s.run("kept = 42")
                time.sleep(5.0)  # past save_interval (2 s): the save holds the turn; and
                # past slab_idle (2 s): the slabs the figures above left empty are retired
                stats: dict[str, Any] = ray.get(control.stats.remote())
                slab = next(x for x in stats["slabs"] if _holds(control, x["name"], s.id))
                victim = next(w for w in workers if w.node_id == slab["node"])
                t0 = time.perf_counter()
                cluster.remove_node(victim, allow_graceful=False)
                before_move = 0  # turns the dying node's slab still answered (its lease)
                while True:
                    r = s.run("kept")
                    now = ray.get(control.lookup.remote("t", s.id))
                    if r.ok and now["slab"] != slab["name"]:
                        break
                    before_move += r.ok
                    time.sleep(0.01)
                back = time.perf_counter() - t0
                moved = next((x["node"] for x in ray.get(control.stats.remote())["slabs"]
                              if x["name"] == now["slab"]), "?")
                print(f"  {'kill -> next successful result elsewhere':44s}     {fmt(back):>9s}"
                      f"   (node {slab['node'][:8]} -> {moved[:8]})")
                print(f"    turns its old slab still answered: {before_move} (until its "
                      f"process died or its lease ran out); the answer said: {s.restored}")
            one.close()
            by_pool.close()
            many.close()
        finally:
            ray.shutdown()
            _stop(front)
            _stop(single)
            _stop(pooled)
            cluster.shutdown()


def _slab_rss(name: str) -> int:
    """Resident bytes of a slab's process (this machine runs every node)."""
    import ray
    pid = ray.get(ray.get_actor(name, namespace="memex").ready.remote())["pid"]
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _holds(control: Any, slab: str, sid: str) -> bool:
    import ray
    entry = ray.get(control.lookup.remote("t", sid))
    return bool(entry and entry["slab"] == slab)


TEN_MIB = "import random\nbig = bytearray(random.Random(7).randbytes(10 << 20))"
"""10 MiB that neither the image's zero-chunk skipping nor its compression makes smaller."""


def _next_save(storage: Path, sid: str, after: int, timeout: float = 30.0
               ) -> tuple[int, int, float]:
    """Wait for the session's save after ``after`` (its record's ``seq``, the commit); its
    seq, the bytes it wrote (image, /tmp files, record) and when it was seen."""
    from memex.cluster.internal import session_key

    record = storage / session_key(sid, "record")
    deadline = time.monotonic() + timeout
    while True:
        try:
            rec = json.loads(record.read_bytes())
        except (OSError, ValueError):
            rec = None
        if rec is not None and int(rec["seq"]) > after:
            size = len(json.dumps(rec).encode())
            for part in ("image", "files"):
                if rec.get(part):
                    size += (storage / rec[part]).stat().st_size
            return int(rec["seq"]), size, time.monotonic()
        if time.monotonic() > deadline:
            raise TimeoutError(f"no save of {sid} after seq {after}")
        time.sleep(0.02)


def storage_figures(backend: Any, storage: Path, interval: float, saves: int = 4) -> None:
    """What one save writes to the cluster's storage, for a session that changes every
    turn: a tiny one and one holding 10 MiB of random bytes (one byte changed a turn), each
    saved whole (a checkpoint image) every ``interval`` seconds while it changes."""
    print(f"\nstorage: what a busy session's save writes (local folder storage; "
          f"save_interval {interval:g} s; {saves} saves each):")
    for label, setup, turn in (("a tiny session ('x += 1' a turn)", "x = 0", "x += 1"),
                               ("10 MiB of random bytes (one changed a turn)", TEN_MIB,
                                "big[0] ^= 1")):
        with backend.open(limits=LIM) as s:
            s.run(setup)
            seq, _, _ = _next_save(storage, s.id, 0)
            sizes: list[int] = []
            for _ in range(saves):
                s.run(turn)
                seq, size, _ = _next_save(storage, s.id, seq)
                sizes.append(size)
        per = statistics.mean(sizes)
        print(f"  {label:44s}     {per / 2**20:9.2f} MiB a save   "
              f"{per / interval / 2**20:6.2f} MiB/s while it changes")


def storage_only(scale: int) -> None:
    """``bench/serve.py --only storage``: a head, one worker node and one front."""
    from ray.cluster_utils import Cluster

    del scale  # a few saves each: quick as it is
    key = secrets.token_urlsafe(24)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        ray_on_loopback()
        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 0, "include_dashboard": False, **LOOPBACK_NODE})
        cluster.add_node(num_cpus=2, memory=2 * GiB, **LOOPBACK_NODE)
        cluster.wait_for_nodes()
        cfg = folder / "cluster.toml"
        cfg.write_text(
            "[server]\nport = 0\naccess_log = false\n"
            f'[cluster]\naddress = "{cluster.address}"\nstorage = "{folder / "storage"}"\n'
            f"slab_memory = {GiB}\nslab_cpus = 1\n"
            f'[tenants.t]\nkeys = ["{hash_key(key)}"]\n')
        front, url = _serve(cfg)
        try:
            with get_backend("remote", url=url, api_key=key) as b:
                storage_figures(b, folder / "storage", 2.0)
        finally:
            _stop(front)
            cluster.shutdown()
