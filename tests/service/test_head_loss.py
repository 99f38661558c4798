"""Head loss under GCS fault tolerance (docs/scaling.md): the cluster's head keeps its state
in a real Redis (Debian's ``redis-server``, started here on 127.0.0.1; ``./build.sh test``
installs it), every process of the head is killed at once, as when its machine dies, and a
new head is started on the same address. The sessions on the worker nodes live on, the
front (on a Ray node of its own, as docs/scaling.md deploys it: here on the same host as the
head, so it names its node by ``[cluster] node_temp_dir``) stays joined, and the cluster
takes new work again."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from served import launch, loopback_cluster, tenant_table

from memex import Limits, RemoteBackend
from memex.backends import LOOPBACK_NODE
from memex.backends.internal import Client
from memex.cluster.internal import SLAB_LEASE
from memex.errors import ServiceError

pytestmark = [pytest.mark.ray, pytest.mark.slow]
pytest.importorskip("ray")
pytest.importorskip("fsspec")

GiB = 1 << 30
HEAD = {"num_cpus": 0, "include_dashboard": False}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[str]:
    """A real Redis on 127.0.0.1 (no persistence of its own: the test loses the head, not
    Redis); its address, ``host:port``."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server is not installed (./build.sh test installs Debian's)")
    port = free_port()
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:  # until it accepts a connection and answers PING
            with contextlib.suppress(OSError), \
                    socket.create_connection(("127.0.0.1", port), timeout=1) as c:
                c.sendall(b"PING\r\n")
                if c.recv(16).startswith(b"+PONG"):
                    break
            assert proc.poll() is None and time.monotonic() < deadline, "redis did not start"
            time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait(30)


def kill_head(cluster: Any) -> None:
    """Every process of the head (its GCS, raylet, workers and the actors on it) killed at
    once, not shut down: the head's machine is gone. Its state in Redis stays."""
    cluster.head_node.kill_all_processes(check_alive=False, allow_graceful=False, wait=True)
    cluster.head_node = None


def test_sessions_live_on_through_a_head_loss_with_gcs_fault_tolerance(
        tmp_path: Path, redis_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A session open on a worker node keeps its state through a head loss: its turns are
    answered while its slab's lease holds, then answered 503 (never a 500, never a dropped
    socket) until the restarted control actor renews the lease; once a new head is up on the
    same address, the tenant's sessions are listed, the same session answers on, unmoved (no
    ``restored``) with every turn's effect, and a new session opens. Positive controls: the
    head really was lost (its GCS port refused connections), and past the lease a turn is
    refused (the lease is what stops a slab that may be moved)."""
    monkeypatch.setenv("RAY_REDIS_ADDRESS", redis_server)  # GCS fault tolerance
    monkeypatch.setenv("RAY_external_storage_namespace", f"memex-{tmp_path.name}")
    gcs_port = free_port()
    cluster = loopback_cluster({"gcs_server_port": gcs_port},
                               {"num_cpus": 2, "memory": 2 * GiB})
    # the front's node: short, for the sockets Ray makes under it (at most 107 bytes)
    front_dir = tempfile.mkdtemp(prefix="mxf", dir="/tmp")
    cluster.add_node(num_cpus=0, temp_dir=front_dir, **LOOPBACK_NODE)
    key = "key-a-" + "h" * 24
    config = tmp_path / "serve.toml"
    config.write_text(
        "[server]\nport = 0\nwarm_timeout = 20\n"
        f'[cluster]\naddress = "{cluster.address}"\nstorage = "{tmp_path / "storage"}"\n'
        f'namespace = "{tmp_path.name}"\nslab_memory = {GiB}\nslab_cpus = 1\n'
        f'save_interval = 0\nplace_timeout = 30\nnode_temp_dir = "{front_dir}"\n'
        + tenant_table("a", key, "[tenants.a.ceiling]\nmemory = 268435456\n"))
    front = launch(config, {"a": key})
    try:
        with RemoteBackend(url=front.url, api_key=key) as b:
            sb = b.open(limits=Limits(memory=128 << 20, timeout=20))
            assert sb.run("kept = 7").ok

            kill_head(cluster)
            with pytest.raises(OSError):  # the positive control: nothing at the GCS address
                socket.create_connection(("127.0.0.1", gcs_port), timeout=2).close()
            # the front stays in its balancer: live sessions' turns never ask the head
            with urllib.request.urlopen(f"{front.url}/readyz", timeout=30) as ready:
                assert json.loads(ready.read()) == {"status": "ready"}
            answered = 0

            def turn() -> bool:
                """A turn while the head is away: answered, or a 503 (never a 500, never a
                socket dropped); whether it was answered."""
                nonlocal answered
                try:
                    r = sb.run("kept += 1; kept")
                except ServiceError as e:
                    assert e.status == 503, e
                    return False
                assert r.ok, r
                answered += 1
                return True

            at_once = turn()  # answered while the slab's lease holds (the last ping < 1 s ago)
            # past the lease nothing renewed (the control actor is gone with the head): the
            # slab serves no longer (it cannot tell a dead control actor from one that cannot
            # reach it and is moving its sessions), and the turn is a 503, not a dropped socket
            time.sleep(SLAB_LEASE + 1.0)
            assert not turn()
            began = time.monotonic()
            cluster.add_node(**HEAD, gcs_server_port=gcs_port, **LOOPBACK_NODE)
            print(f"head away: a turn at once answered: {at_once}; past the slab's lease: 503; "
                  f"new head up in {time.monotonic() - began:.1f}s")

            deadline = time.monotonic() + 120
            while True:  # until the cluster lists the tenant's session again
                with Client(front.url, key) as client:
                    try:
                        listed = [s["id"] for s in client.sessions()]
                        break
                    except ServiceError as e:
                        assert e.status == 503, e  # the control actor away: never a 500
                assert time.monotonic() < deadline, "the cluster did not come back"
                time.sleep(0.5)
            print(f"sessions listed again {time.monotonic() - began:.1f}s after the new head")
            assert listed == [sb.id]
            while not turn():  # until the restarted control actor has renewed the slab's lease
                assert time.monotonic() < deadline, "the slab did not serve again"
                time.sleep(0.5)
            print(f"the session answered again {time.monotonic() - began:.1f}s after the new head")
            r = sb.run("kept")
            assert r.ok and r.value == str(7 + answered), r
            assert sb.restored is None, sb.restored  # it lived on where it was
            other = b.open(limits=Limits(memory=128 << 20, timeout=20))
            assert other.run("1 + 1").value == "2"
            other.close()
            sb.close()
    finally:
        front.stop()
        if cluster.head_node is not None:
            cluster.shutdown()
        else:  # the head is already gone: the worker nodes go the same way
            for node in list(cluster.worker_nodes):
                node.kill_all_processes(check_alive=False, allow_graceful=False, wait=True)
        shutil.rmtree(front_dir, ignore_errors=True)
