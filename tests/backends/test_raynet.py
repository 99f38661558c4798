"""Every Ray node that MemEx, its tests and its benchmarks start for local use is on 127.0.0.1,
by name rather than by an environment variable read when Ray is imported: the session's
cluster, a RayBackend started without an address, and the sockets its fronts and slabs
listen on. The positive control is Ray's own choice in a fresh process: the machine's
interface address, wherever the machine has one."""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import sys
from typing import Any

import pytest
from served import DRIVER, Served

from memex import Limits, RemoteBackend
from memex.backends._raynet import is_loopback_address

pytestmark = pytest.mark.ray
psutil = pytest.importorskip("psutil")
pytest.importorskip("ray")

SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def fresh_env() -> dict[str, str]:
    """This environment less anything that would steer Ray to loopback or to a cluster."""
    return {k: v for k, v in os.environ.items() if k not in (SWITCH, "RAY_ADDRESS")}


def interface_addresses() -> list[str]:
    """This machine's IPv4 addresses beyond loopback (where Ray would go on its own)."""
    return [a.address for addrs in psutil.net_if_addrs().values() for a in addrs
            if a.family == socket.AF_INET and not ipaddress.ip_address(a.address).is_loopback]


def listening(pids: set[int]) -> list[tuple[int, str, int]]:
    """(pid, address, port) of every TCP socket the processes ``pids`` listen on."""
    return [(k.pid, k.laddr.ip, k.laddr.port) for k in psutil.net_connections("tcp")
            if k.status == psutil.CONN_LISTEN and k.pid in pids]


def loopback(ip: str) -> bool:
    a = ipaddress.ip_address(ip)
    mapped = getattr(a, "ipv4_mapped", None)
    return (mapped or a).is_loopback


def tree(pid: int) -> set[int]:
    try:
        p = psutil.Process(pid)
        return {pid, *(c.pid for c in p.children(recursive=True))}
    except psutil.NoSuchProcess:
        return set()


@pytest.mark.parametrize("address, local", [
    ("127.0.0.1:6379", True), ("localhost:6379", True), ("[::1]:6379", True),
    ("ray://127.0.0.2:10001", True), ("10.0.0.5:6379", False), ("head:6379", False),
    ("auto", False), (None, False), ("", False),
])
def test_which_addresses_are_loopback(address: str | None, local: bool) -> None:
    assert is_loopback_address(address) is local


def test_a_ray_backend_started_without_an_address_is_on_loopback() -> None:
    """In a fresh process with nothing in its environment about Ray: Ray on its own picks the
    interface address (the control), RayBackend() starts a cluster whose every node says
    127.0.0.1 and whose every process listens on loopback only."""
    script = """
import json, os, sys
import psutil, ray
own = ray.util.get_node_ip_address()          # Ray's own choice, before anything of MemEx
from memex.backends import RayBackend
from memex import Limits
b = RayBackend(actors=1, init_options={"num_cpus": 1})
with b.open(limits=Limits(timeout=60)) as sb:
    assert sb.run("1").ok
    nodes = [n["NodeManagerAddress"] for n in ray.nodes()]
    me = psutil.Process()
    pids = {me.pid, *(c.pid for c in me.children(recursive=True))}
    socks = [(k.laddr.ip, k.laddr.port) for k in psutil.net_connections("tcp")
             if k.status == psutil.CONN_LISTEN and k.pid in pids]
    driver = ray.util.get_node_ip_address()
b.close()
print(json.dumps({"own": own, "nodes": nodes, "socks": socks, "driver": driver,
                  "owned": b._owns_ray}))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300, env=fresh_env())
    assert out.returncode == 0, out.stderr[-3000:]
    got: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    if interface_addresses():  # the control: without MemEx's choice Ray goes beyond loopback
        assert got["own"] in interface_addresses(), got
    assert got["owned"] is True
    assert got["nodes"] and set(got["nodes"]) == {"127.0.0.1"}, got
    assert got["driver"] == "127.0.0.1"
    assert got["socks"] and all(loopback(ip) for ip, _ in got["socks"]), got["socks"]


def test_the_session_cluster_its_fronts_and_slabs_are_on_loopback(
        ray_cluster: Any, cluster_server: Served) -> None:
    """The test session's cluster: each node reports 127.0.0.1 to a driver that joins it as
    MemEx does; a front's and a slab's sockets (the HTTP port, the slab's direct path) and
    every Ray process of the session listen on loopback only."""
    with RemoteBackend(url=cluster_server.url, api_key=cluster_server.keys["a"]) as b, \
            b.open(limits=Limits(timeout=30)) as sb:
        assert sb.run("1").ok  # a slab holds this session now
        namespace = cluster_server.config.parent.name
        code = ("import json\nfrom ray.util import list_named_actors\n"
                "slabs = [ray.get(ray.get_actor(n).ready.remote()) for n in "
                "list_named_actors() if n.startswith('memex-slab-')]\n"
                "print(json.dumps({'nodes': [n['NodeManagerAddress'] for n in ray.nodes()],"
                " 'slabs': [[s['pid'], s['endpoint']] for s in slabs]}))\n")
        out = subprocess.run([sys.executable, "-c", DRIVER + code, ray_cluster.address,
                              namespace], capture_output=True, text=True, timeout=120,
                             env=fresh_env())
        assert out.returncode == 0, out.stderr[-3000:]
        got = json.loads(out.stdout.strip().splitlines()[-1])
    assert ray_cluster.address.startswith("127.0.0.1:")
    assert got["nodes"] and set(got["nodes"]) == {"127.0.0.1"}, got
    assert got["slabs"], got
    for pid, (host, port) in got["slabs"]:
        assert host == "127.0.0.1", got
        assert any(p == port and loopback(ip) for _, ip, p in listening({pid})), pid
    front = listening(tree(cluster_server.proc.pid))
    assert front and all(loopback(ip) for _, ip, _ in front), front
    everything = listening(tree(os.getpid()))  # the nodes, the fronts, every other server
    assert everything and all(loopback(ip) for _, ip, _ in everything), [
        s for s in everything if not loopback(s[1])]

