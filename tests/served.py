"""A real `memex serve` process on 127.0.0.1 for the tests that need one (tests/conftest.py's
``memex_server`` fixture, tests/service). A module of its own, imported as ``served``, because
the name ``conftest`` is taken by every folder's conftest.py."""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memex.client import Client
from memex.service import hash_key

DEFAULT_TIMEOUT = 10.0  # the warm sandboxes' turn deadline, as tests/conftest.py's default

FOR_TEST: list[Client] = []
"""Clients made by :func:`client_for_test`, closed after each test (tests/conftest.py)."""


def client_for_test(url: str, key: str) -> Client:
    """A client for a request or two in one expression (``client_for_test(url, key).sessions()``),
    closed when the test ends: its connection is not left to the collector. Only these are
    closed for the test; a client MemEx itself leaves open still warns. For a test's own use:
    a fixture that outlives one test (module or session scope) makes a ``with Client(...)``."""
    client = Client(url, key)
    FOR_TEST.append(client)
    return client


def close_test_clients() -> None:
    while FOR_TEST:
        FOR_TEST.pop().close()


@dataclass
class Served:
    """A `memex serve` process: its URL, an API key per tenant, its config and its log."""

    url: str
    keys: dict[str, str]
    config: Path
    log: Path
    proc: subprocess.Popen[bytes]

    def wait_for_log(self, text: str, count: int = 1, timeout: float = 10.0) -> str:
        """The log once ``count`` lines hold ``text`` (or ``timeout`` passed): the server writes
        a request's access line after its answer, so a client can read the log before it."""
        deadline = time.monotonic() + timeout
        while (log := self.log.read_text()).count(text) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        return log

    def stop(self, sig: int = signal.SIGTERM) -> int:
        return _end(self.proc, sig)


def loopback_cluster(head: dict[str, Any] | None = None, *nodes: dict[str, Any]) -> Any:
    """A ``ray.cluster_utils.Cluster`` whose head (``head``: its arguments besides the
    defaults below) and worker nodes (one per ``nodes`` entry) are on 127.0.0.1 by name, with
    this process's Ray on loopback too (a driver then joins it there)."""
    from ray.cluster_utils import Cluster

    from memex.backends import LOOPBACK_NODE, ray_on_loopback

    ray_on_loopback()
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "include_dashboard": False, **(head or {}), **LOOPBACK_NODE})
    for args in nodes:
        cluster.add_node(**args, **LOOPBACK_NODE)
    cluster.wait_for_nodes()
    return cluster


DRIVER = ("import sys\nfrom memex.backends import init_ray\n"
          "init_ray(sys.argv[1], namespace=sys.argv[2], log_to_driver=False)\nimport ray\n")
"""The head of a script run as a Ray driver of its own (``python -c DRIVER+code ADDRESS
NAMESPACE``): joins the cluster at ADDRESS as MemEx does (over loopback for a local one)."""


def cluster_toml(cluster: Any, folder: Path) -> str:
    """The ``[cluster]`` table of a front joining ``cluster`` (a ``ray.cluster_utils.Cluster``)
    in a namespace of its own (its control actor and slabs are its alone), its storage in
    ``folder``."""
    return (f'[cluster]\naddress = "{cluster.address}"\nstorage = "{folder / "storage"}"\n'
            f'namespace = "{folder.name}"\nslab_memory = 2147483648\nslab_cpus = 0.5\n')


def end_namespace(cluster: Any, namespace: str) -> None:
    """Kill the control actor and the slabs of a server's namespace on ``cluster`` (they are
    detached: they outlive the fronts, as a cluster's sessions do), from a driver of its own
    (this process may be a driver of another cluster already)."""
    script = (DRIVER + "from ray.util import list_named_actors\n"
              "for name in list_named_actors():\n"
              "    if name == 'memex-control' or name.startswith('memex-slab-'):\n"
              "        ray.kill(ray.get_actor(name))\n")
    subprocess.run([sys.executable, "-c", script, cluster.address, namespace], check=True,
                   capture_output=True, timeout=120)


def tenant_table(name: str, key: str, extra: str = "") -> str:
    return f'[tenants.{name}]\nkeys = ["{hash_key(key)}"]\n{extra}\n'


def start_server(folder: Path, tenants: dict[str, str], server: str = "", port: int = 0
                 ) -> Served:
    """Start `memex serve` with a tenant per ``tenants`` entry (name -> extra TOML lines),
    a fresh key each, on ``port`` (0: a free one); wait until it says where it serves."""
    folder.mkdir(parents=True, exist_ok=True)
    keys = {name: secrets.token_urlsafe(24) for name in tenants}
    config = folder / "serve.toml"
    # the in-process backend has no workers, and refuses the setting
    workers = "" if "inprocess" in server else "workers = 2\n"
    config.write_text(f"[server]\nport = {port}\n{workers}"
                      f"warm_timeout = {DEFAULT_TIMEOUT}\n{server}\n"
                      + "".join(tenant_table(n, keys[n], extra) for n, extra in tenants.items()))
    return launch(config, keys)


LAUNCHED: list[subprocess.Popen[bytes]] = []
"""Every `memex serve` launched in this process: conftest stops those a test's body started
and left running (a test that failed before its own stop left its server and its workers
behind for the rest of the run, found after a run with failures). Fixtures stop their own."""


def _end(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> int:
    """Send ``sig`` to a server still running, SIGKILL it if it has not ended in 60 s."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
    return proc.returncode


def stop_launched_since(count: int) -> None:
    """Stop those of the servers launched after the first ``count`` that still run."""
    for proc in LAUNCHED[count:]:
        _end(proc)


def launch(config: Path, keys: dict[str, str]) -> Served:
    """Run `memex serve --config config` (again, for a restart) and wait for its URL."""
    log = config.with_name(f"serve-{time.monotonic_ns()}.log")
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "memex", "serve", "--config",
                                 str(config)], stdout=out, stderr=out,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    LAUNCHED.append(proc)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = re.search(r"serving (http://127\.0\.0\.1:\d+)", log.read_text())
        if found:
            return Served(url=found.group(1), keys=keys, config=config, log=log, proc=proc)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"memex serve did not start:\n{log.read_text()}")
