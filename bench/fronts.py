"""How a cluster's fronts join it: the options of issue 47 measured side by side (docs/scaling.md
"Choosing the fronts"), on a Ray cluster on 127.0.0.1 (``ray.cluster_utils``).

* **A Ray node of its own** (what MemEx does): ``memex serve`` joins as a Ray driver beside a
  node on its machine.
* **Ray Client**: ``memex serve`` with ``[cluster] address = "ray://HEAD:10001"``, no node
  beside it (Ray's client server on the head holds its driver). Needs ``ray[client]``.
* **Ray Serve**: the front as a Serve deployment behind Serve's HTTP proxy. Not ported (its
  proxy would replace the front's own edge: the connection guard, per-tenant connection
  bounds, the turns and door sockets); measured instead is the hop Serve adds to a trivial
  FastAPI route, beside the same route under uvicorn alone. Needs ``ray[serve]``.

Rows: a trivial turn and a session create through a node front and a Ray Client front
(alternated, three rounds); Serve's hop; ``--head-loss`` also kills the head (GCS fault
tolerance, a real ``redis-server`` on 127.0.0.1) under a Ray Client front and says whether it
answers again (a node front does: tests/service/test_head_loss.py).

The extras are not MemEx's dependencies: give them on ``PYTHONPATH`` (a folder holding what
``pip install --target DIR 'ray[serve,client]==2.60.0'`` adds beyond the venv), or run from a
venv that has them. A part whose extra is missing says so and is skipped."""

from __future__ import annotations

import argparse
import http.client
import importlib.util
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _fmt import fmt, launch_serve, sample

from memex import Limits
from memex.backends import LOOPBACK_NODE, get_backend, init_ray, ray_on_loopback
from memex.service import hash_key

GiB = 1 << 30
LIM = Limits(timeout=30.0, memory=256 << 20)


def _free() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _row(label: str, xs: list[float]) -> None:
    s = sorted(xs)
    print(f"  {label:46s} p50 {fmt(statistics.median(s)):>9s}  p99 "
          f"{fmt(s[int(0.99 * (len(s) - 1))]):>9s}")


def _config(folder: Path, name: str, address: str, key: str, extra: str = "") -> Path:
    path = folder / f"{name}.toml"
    path.write_text(
        "[server]\nport = 0\naccess_log = false\nwarm_timeout = 20\n"
        f'[cluster]\naddress = "{address}"\nstorage = "{folder / "storage"}"\n'
        f"slab_memory = {GiB}\nslab_cpus = 1\n{extra}"
        f'[tenants.t]\nkeys = ["{hash_key(key)}"]\n')
    return path


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()


def node_and_client(n: int) -> None:
    from ray.cluster_utils import Cluster

    key = secrets.token_urlsafe(24)
    client_port = _free()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        ray_on_loopback()
        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 0, "include_dashboard": False, "ray_client_server_port": client_port,
            **LOOPBACK_NODE})
        cluster.add_node(num_cpus=2, memory=2 * GiB, **LOOPBACK_NODE)
        cluster.wait_for_nodes()
        fronts = {"a node front": cluster.address,
                  "a Ray Client front": f"ray://127.0.0.1:{client_port}"}
        served = {}
        try:
            for label, address in fronts.items():
                t = time.perf_counter()
                name = label.split()[1].lower()  # node, ray
                served[label] = launch_serve(_config(folder, name, address, key),
                                             folder / f"{name}.log")
                print(f"{label}: serving {time.perf_counter() - t:.1f} s after it started")
            turns: dict[str, list[float]] = {k: [] for k in fronts}
            creates: dict[str, list[float]] = {k: [] for k in fronts}
            for _ in range(3):  # rounds, alternated
                for label, (_, url) in served.items():
                    with get_backend("remote", url=url, api_key=key) as b:
                        for _ in range(max(5, n // 50)):
                            t = time.perf_counter()
                            s = b.open(limits=LIM)
                            creates[label].append(time.perf_counter() - t)
                            s.close()
                        with b.open(limits=LIM) as s:
                            s.run("1")
                            turns[label] += sample(lambda s=s: s.run("1"), n // 3)
            print(f"\na trivial turn ('1'), {n} each, and a session create (+ close), "
                  f"{len(creates['a node front'])} each, three rounds alternated:")
            for label in fronts:
                _row(f"{label}: turn", turns[label])
            for label in fronts:
                _row(f"{label}: create", creates[label])
        finally:
            for proc, _ in served.values():
                _stop(proc)
            cluster.shutdown()


def head_loss() -> None:
    """The head killed under a Ray Client front (GCS fault tolerance on a real Redis)."""
    import shutil

    from ray.cluster_utils import Cluster

    from memex.backends.internal import Client

    exe = shutil.which("redis-server")
    if exe is None:
        print("\nhead loss: skipped (no redis-server)")
        return
    rport, client_port, gcs_port = _free(), _free(), _free()
    redis = subprocess.Popen([exe, "--port", str(rport), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    os.environ["RAY_REDIS_ADDRESS"] = f"127.0.0.1:{rport}"
    os.environ["RAY_external_storage_namespace"] = f"fronts-{os.getpid()}"  # noqa: SIM112
    key = secrets.token_urlsafe(24)
    head = {"num_cpus": 0, "include_dashboard": False, "ray_client_server_port": client_port,
            "gcs_server_port": gcs_port, **LOOPBACK_NODE}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        time.sleep(0.5)
        cluster = Cluster(initialize_head=True, head_node_args=head)
        cluster.add_node(num_cpus=2, memory=2 * GiB, **LOOPBACK_NODE)
        cluster.wait_for_nodes()
        proc, url = launch_serve(_config(folder, "client", f"ray://127.0.0.1:{client_port}",
                                         key, "save_interval = 0\n"), folder / "client.log")
        try:
            with get_backend("remote", url=url, api_key=key) as b:
                sb = b.open(limits=LIM)
                sb.run("kept = 7")
                cluster.head_node.kill_all_processes(check_alive=False, allow_graceful=False,
                                                     wait=True)
                cluster.head_node = None
                cluster.add_node(**head)
                began, listed = time.monotonic(), None
                while listed is None and time.monotonic() - began < 90:
                    try:
                        with Client(url, key) as c:
                            listed = time.monotonic() - began
                            c.sessions()
                    except Exception as exc:
                        listed, last = None, f"{type(exc).__name__}: {exc}"[:160]
                        time.sleep(1.0)
                print("\nthe head killed -9 and started again (GCS fault tolerance), under a "
                      "Ray Client front:")
                if listed is None:
                    print(f"  sessions never listed again in 90 s; the last answer: {last}")
                else:
                    print(f"  sessions listed again {listed:.1f} s after the new head")
        finally:
            _stop(proc)
            for node in list(cluster.worker_nodes):
                node.kill_all_processes(check_alive=False, allow_graceful=False, wait=True)
            if cluster.head_node is not None:
                cluster.head_node.kill_all_processes(check_alive=False, allow_graceful=False,
                                                     wait=True)
            redis.kill()
            os.environ.pop("RAY_REDIS_ADDRESS", None)  # a Ray started after is not FT's
            os.environ.pop("RAY_external_storage_namespace", None)


def serve_hop(n: int) -> None:
    import uvicorn
    from fastapi import FastAPI

    app = FastAPI()

    @app.post("/run")
    def run() -> dict[str, int]:
        return {"ok": 1}

    def rows(port: int) -> list[float]:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        xs = sample(lambda: (c.request("POST", "/run", body=b"{}", headers={
            "Content-Type": "application/json"}), c.getresponse().read()), n // 3, warm=50)
        c.close()
        return xs

    port = _free()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    import ray
    from ray import serve

    init_ray("local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    serve_port = _free()
    serve.start(http_options={"host": "127.0.0.1", "port": serve_port})

    @serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 0})
    @serve.ingress(app)
    class Front:
        pass

    serve.run(Front.bind(), route_prefix="/")
    alone: list[float] = []
    served: list[float] = []
    for _ in range(3):
        alone += rows(port)
        served += rows(serve_port)
    print(f"\na trivial FastAPI POST, {n} each, three rounds alternated:")
    _row("uvicorn alone", alone)
    _row("Ray Serve (its proxy, then the replica)", served)
    print(f"  {'the hop Serve adds (p50 less p50)':46s}     "
          f"{fmt(statistics.median(served) - statistics.median(alone)):>9s}")
    serve.shutdown()
    ray.shutdown()
    server.should_exit = True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--head-loss", action="store_true")
    args = ap.parse_args()
    n = 300 if args.quick else 900
    print(f"the fronts' options; {os.cpu_count()} cores")
    if importlib.util.find_spec("grpc") is None:
        print("Ray Client and Ray Serve need grpcio (ray[client], ray[serve]): skipped")
        return
    node_and_client(n)
    if args.head_loss:
        head_loss()
    if importlib.util.find_spec("ray.serve") is None or \
            importlib.util.find_spec("opencensus") is None:
        print("\nRay Serve: skipped (ray[serve]'s packages are not here)")
    else:
        serve_hop(n)


if __name__ == "__main__":
    sys.exit(main())
