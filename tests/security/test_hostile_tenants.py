"""One tenant against the others on a shared `memex serve` (SECURITY.md, "The shared
server"): a tenant that floods one session, a key rotated out while its sockets are open,
turns sent at once. A real server on 127.0.0.1, then a front of a real Ray cluster on
127.0.0.1 (every attack runs on both); each attack beside a positive control."""

from __future__ import annotations

import concurrent.futures
import contextlib
import importlib.util
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx2
import msgpack
import pytest
from served import Served, client_for_test, cluster_toml, end_namespace, start_server, tenant_table
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

Start = Callable[..., Served]
SMALL = {"memory": 256 << 20}  # the soak's 15 sessions fit the test cluster's one node


@pytest.fixture(params=["one server", pytest.param("cluster", marks=[
    pytest.mark.ray, pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                                        reason="Ray is not installed")])])
def start(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Start]:
    """``start(tenants, server="")``: one server, or a front of the session's Ray cluster in
    a namespace of its own (its control actor and slabs ended with the test)."""
    made: list[Served] = []
    cluster = request.getfixturevalue("ray_cluster") if request.param == "cluster" else None

    def start_(tenants: dict[str, str], server: str = "") -> Served:
        if cluster is not None:
            server += "\n" + cluster_toml(cluster, tmp_path)
        made.append(start_server(tmp_path, tenants, server=server))
        return made[-1]

    yield start_
    for served in made:
        served.stop()
    if cluster is not None:
        end_namespace(cluster, tmp_path.name)


@pytest.fixture
def server(start: Start) -> Served:
    # a's max_running is high on purpose: the session's own queue and the tenant's share of
    # threads are what must keep its flood out of the shared pool
    return start({"a": "max_sessions = 50\nmax_running = 64\nqueued = 80",
                  "b": "max_sessions = 50"}, server="threads = 16\ntenant_threads = 4")


@pytest.mark.slow
def test_one_tenants_flood_leaves_the_others_served(server: Served) -> None:
    """72 turns at once on one session of tenant a (each 0.25 s, 18 s in all, one after
    another): they wait in the event loop, in order, never in the shared thread pool; tenant
    b creates a session and runs turns while a's are still queued (b has 8 s, 32 turns of
    a, before fewer than 40 are left)."""
    a = client_for_test(server.url, server.keys["a"])
    sid = a.create()["id"]
    done: list[float] = []
    lock = threading.Lock()

    def flood(i: int) -> int:
        r = httpx2.post(f"{server.url}/v1/sessions/{sid}/run", json={"code": "import time\n"
                        "time.sleep(0.25)"}, timeout=120,
                        headers={"Authorization": f"Bearer {server.keys['a']}"})
        with lock:
            done.append(time.monotonic())
        return r.status_code

    with concurrent.futures.ThreadPoolExecutor(72) as pool:
        futures = [pool.submit(flood, i) for i in range(72)]
        time.sleep(1.0)  # the flood is in
        b = client_for_test(server.url, server.keys["b"])
        sid_b = b.create()["id"]
        for _ in range(3):
            assert b.run(sid_b, "6 * 7")["result"]["value"] == "42"
        served_b = time.monotonic()
        statuses = [f.result() for f in futures]
    # b was served while most of a's turns were still waiting their turn
    with lock:
        later = sum(1 for t in done if t > served_b)
    assert later >= 40, later
    assert statuses.count(200) == 72, statuses  # queued = 80: every turn of a ran, in turn
    b.close_session(sid_b)
    a.close_session(sid)


@pytest.mark.slow
def test_past_its_queue_a_tenant_gets_429_not_the_server_stuck(start: Start) -> None:
    served = start({"a": "max_running = 1\nqueued = 4"})
    try:
        a = client_for_test(served.url, served.keys["a"])
        sid = a.create()["id"]

        def turn(_: int) -> httpx2.Response:
            return httpx2.post(f"{served.url}/v1/sessions/{sid}/run",
                               json={"code": "import time\ntime.sleep(1)"}, timeout=120,
                               headers={"Authorization": f"Bearer {served.keys['a']}"})

        with concurrent.futures.ThreadPoolExecutor(20) as pool:
            answers = list(pool.map(turn, range(20)))
        refused = [r for r in answers if r.status_code == 429]
        assert len(refused) >= 10 and all("Retry-After" in r.headers for r in refused)
        assert all(r.json()["error"]["code"] == "busy" for r in refused)
        # positive control: once the queue drains, the session takes turns again
        assert a.run(sid, "1 + 1")["result"]["value"] == "2"
    finally:
        served.stop()


@pytest.mark.slow
def test_turns_sent_at_once_run_in_the_order_they_arrived(server: Served) -> None:
    a = client_for_test(server.url, server.keys["a"])
    sid = a.create()["id"]
    a.run(sid, "seen = []")
    host, port = server.url.rsplit("//", 1)[1].split(":")
    socks = []
    for i in range(20):  # each request whole on the wire before the next is sent
        body = f'{{"code": "seen.append({i})"}}'.encode()
        s = socket.create_connection((host, int(port)), timeout=30)
        s.sendall(f"POST /v1/sessions/{sid}/run HTTP/1.1\r\nHost: x\r\n"
                  f"Authorization: Bearer {server.keys['a']}\r\n"
                  f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                  .encode() + body)
        socks.append(s)
        time.sleep(0.01)
    for s in socks:
        s.settimeout(60)
        assert s.recv(65536).startswith(b"HTTP/1.1 200")
        s.close()
    assert a.run(sid, "seen")["result"]["value"] == str(list(range(20)))
    a.close_session(sid)


@pytest.mark.slow
def test_a_rotated_out_key_loses_its_open_sockets(server: Served) -> None:
    """The door socket of a key rotated out of serve.toml closes within a second, and the
    guest's tool calls are no longer answered by it; a socket of a key still listed stays."""
    a = client_for_test(server.url, server.keys["a"])
    sid = a.create()["id"]
    b = client_for_test(server.url, server.keys["b"])
    sid_b = b.create()["id"]
    base = "ws" + server.url[4:]
    door_a = connect(f"{base}/v1/sessions/{sid}/door", open_timeout=10,
                     additional_headers={"Authorization": f"Bearer {server.keys['a']}"})
    door_b = connect(f"{base}/v1/sessions/{sid_b}/door", open_timeout=10,
                     additional_headers={"Authorization": f"Bearer {server.keys['b']}"})
    turns_a = connect(f"{base}/v1/sessions/{sid}/turns", open_timeout=10,
                      additional_headers={"Authorization": f"Bearer {server.keys['a']}"})
    try:
        assert msgpack.unpackb(door_a.recv(timeout=10)) == ["ready"]
        assert msgpack.unpackb(door_b.recv(timeout=10)) == ["ready"]
        text = server.config.read_text()
        new_key = "rotated-key-for-tenant-a-0123456789"
        start = text.index("[tenants.a]")
        end = text.index("[tenants.b]")
        server.config.write_text(text[:start] + tenant_table(
            "a", new_key, "max_sessions = 50\nmax_running = 64\nqueued = 80") + text[end:])
        rotated = time.monotonic()
        for ws in (door_a, turns_a):
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    ws.recv(timeout=10)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 4401
        assert time.monotonic() - rotated < 5  # (checked twice a second)
        # positive control: b's socket is open, and the new key of a works
        door_b.ping().wait(5)
        assert client_for_test(server.url, new_key).run(sid, "1")["result"]["value"] == "1"
    finally:
        for ws in (door_a, door_b, turns_a):
            ws.close()


def test_a_rotated_out_key_gets_not_one_more_door_call(tmp_path: Any) -> None:
    """The door socket's key is looked up again for every frame, not only by the timer: a
    guest's tool call made right after the key was rotated out of serve.toml never reaches
    the old socket (it is closed, 4401, and the call fails for the guest at once). The
    control: the same call, before the rotation, reaches the socket. (One server: a
    cluster's fronts see a rotation within seconds, through the control actor's copy.)"""
    served = start_server(tmp_path, {"a": "max_sessions = 5", "b": "max_sessions = 5"})
    text = served.config.read_text()
    base = "ws" + served.url[4:]
    try:
        a = client_for_test(served.url, served.keys["a"])
        sid = a.create()["id"]
        call = "from memex_guest import tools\ntools.call('on_the_client', {})"

        def door() -> Any:
            ws = connect(f"{base}/v1/sessions/{sid}/door", open_timeout=10,
                         additional_headers={"Authorization": f"Bearer {served.keys['a']}"})
            assert msgpack.unpackb(ws.recv(timeout=10)) == ["ready"]
            return ws

        def turn(key: str) -> concurrent.futures.Future[Any]:
            pool = concurrent.futures.ThreadPoolExecutor(1)
            fut = pool.submit(lambda: client_for_test(served.url, key).run(sid, call, timeout=20))
            pool.shutdown(wait=False)
            return fut

        ws = door()  # the control: before the rotation the call reaches the client
        pending = turn(served.keys["a"])
        msg = msgpack.unpackb(ws.recv(timeout=30))
        assert msg[0] == "door", msg
        ws.close()  # unanswered: the turn fails for the guest (the client went away)
        pending.result(60)

        ws = door()
        new_key = "rotated-key-for-tenant-a-9876543210"
        start, end = text.index("[tenants.a]"), text.index("[tenants.b]")
        served.config.write_text(text[:start] + tenant_table("a", new_key, "max_sessions = 5")
                                 + text[end:])
        pending = turn(new_key)  # at once: well inside the timer's half second
        got = []
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                got.append(msgpack.unpackb(ws.recv(timeout=30)))
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4401
        assert [m for m in got if m[0] == "door"] == []
        out = pending.result(60)
        assert out["result"]["status"] != "ok", out  # the guest's call failed, promptly
    finally:
        served.config.write_text(text)
        served.stop()


def test_a_tenant_s_open_sockets_are_bounded_by_its_share(tmp_path: Any) -> None:
    """One tenant's idle WebSockets cannot take the connections every other tenant needs:
    past ``tenant_sockets`` (default: a quarter of the server's connections) its next door
    or turns socket is refused before it is accepted, while another tenant still opens
    one; closing one of its own gives the place back (the control)."""
    from websockets.exceptions import InvalidStatus

    served = start_server(tmp_path, {"a": "max_sessions = 5", "b": "max_sessions = 5"},
                          server="tenant_sockets = 3")
    base = "ws" + served.url[4:]
    held: list[Any] = []
    try:
        sid = client_for_test(served.url, served.keys["a"]).create()["id"]
        sid_b = client_for_test(served.url, served.keys["b"]).create()["id"]

        def sock(tenant: str, session: str, kind: str) -> Any:
            return connect(f"{base}/v1/sessions/{session}/{kind}", open_timeout=10,
                           additional_headers={"Authorization":
                                               f"Bearer {served.keys[tenant]}"})

        for kind in ("door", "turns", "door"):
            held.append(sock("a", sid, kind))
        for kind in ("door", "turns"):
            with pytest.raises(InvalidStatus):
                sock("a", sid, kind)
        held.append(sock("b", sid_b, "door"))  # another tenant is still served
        assert msgpack.unpackb(held[-1].recv(timeout=10)) == ["ready"]
        held.pop(0).close()  # one of a's closes: its place is a's again
        deadline = time.monotonic() + 10
        while True:
            try:
                held.append(sock("a", sid, "door"))
                break
            except InvalidStatus:  # the server has not seen the close yet
                assert time.monotonic() < deadline
                time.sleep(0.05)
        assert msgpack.unpackb(held[-1].recv(timeout=10)) == ["ready"]
    finally:
        for ws in held:
            ws.close()
        served.stop()


def _hwm(served: Served) -> int:
    with open(f"/proc/{served.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.mark.slow
def test_held_checkpoints_count_against_memory_and_expire_with_their_session(
        start: Start) -> None:
    served = start({"a": "max_memory = 419430400"}, server="checkpoint_ttl = 1")  # 400 MiB
    try:
        auth = {"Authorization": f"Bearer {served.keys['a']}"}
        a = client_for_test(served.url, served.keys["a"])
        sid = a.create(limits={"memory": 128 << 20, "timeout": 10})["id"]
        taken, refused = [], None
        for _ in range(20):
            r = httpx2.post(f"{served.url}/v1/sessions/{sid}/checkpoints", headers=auth,
                            timeout=30)
            if r.status_code != 201:
                refused = r
                break
            taken.append(r.json()["checkpoint"])
        # each counts its guest's memory (~40 MiB) beside the session's 128 MiB
        assert refused is not None and refused.status_code == 429, refused
        assert refused.json()["error"]["code"] == "quota" and 3 <= len(taken) <= 8, taken
        # positive control: releasing one makes room for one
        assert httpx2.delete(f"{served.url}/v1/checkpoints/{taken[0]}", headers=auth,
                             timeout=30).status_code == 204
        assert httpx2.post(f"{served.url}/v1/sessions/{sid}/checkpoints", headers=auth,
                           timeout=30).status_code == 201
        # the session closes: its checkpoints go after checkpoint_ttl, and the room with them
        a.close_session(sid)
        deadline = time.monotonic() + 30
        while True:
            sid2 = None
            try:
                sid2 = a.create(limits={"memory": 384 << 20, "timeout": 10})["id"]
                break
            except Exception:
                assert time.monotonic() < deadline, "the closed session's checkpoints stayed"
                time.sleep(0.5)
        a.close_session(sid2)
        r = httpx2.post(f"{served.url}/v1/sessions/{sid}/restore", headers=auth, timeout=30,
                        json={"checkpoint": taken[1]})
        assert r.status_code == 404
    finally:
        served.stop()


@pytest.mark.slow
def test_a_file_is_refused_before_it_is_read_and_a_stream_costs_its_output(
        start: Start) -> None:
    served = start({"a": ""}, server="max_body_bytes = 8388608")
    try:
        a = client_for_test(served.url, served.keys["a"])
        sid = a.create()["id"]
        a.run(sid, "open('/tmp/big', 'wb').write(b'x' * (48 << 20))")
        auth = {"Authorization": f"Bearer {served.keys['a']}"}
        before = _hwm(served)  # the 48 MiB file, read into the server, would pass the bound
        r = httpx2.get(f"{served.url}/v1/sessions/{sid}/files", params={"path": "/tmp/big"},
                       headers=auth, timeout=30)
        assert r.status_code == 413 and r.json()["error"]["code"] == "too_large", r.text
        a.run(sid, "open('/tmp/small', 'wb').write(b'y' * 1000)")  # positive control
        assert a.read_file(sid, "/tmp/small") == b"y" * 1000
        # a streaming client that never reads: 300,000 writes of one byte each
        host, port = served.url.rsplit("//", 1)[1].split(":")
        body = json.dumps({"code": "import sys\nfor _ in range(300000):\n"
                           "    sys.stdout.write('x'); sys.stdout.flush()\n'done'"}).encode()
        turns = a.session(sid)["turns"]
        with socket.create_connection((host, int(port)), timeout=60) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(f"POST /v1/sessions/{sid}/run/stream HTTP/1.1\r\nHost: x\r\n"
                      f"Authorization: Bearer {served.keys['a']}\r\n"
                      f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                      .encode() + body)
            # the turn runs to its end while nothing is read (the server keeps what it wrote)
            deadline = time.monotonic() + 120
            while a.session(sid)["turns"] == turns:
                assert time.monotonic() < deadline, "the unread streamed turn never ended"
                time.sleep(0.05)
            grew = _hwm(served) - before
        assert grew < 40 << 20, grew
        # positive control: a reader gets all of it, and the session goes on
        assert a.run(sid, "6 * 7")["result"]["value"] == "42"
    finally:
        served.stop()


@pytest.mark.slow
@pytest.mark.soak
def test_a_soak_of_two_noisy_tenants_and_a_quiet_one(start: Start) -> None:
    """Two noisy tenants flood turns (over their queues: 429s) and an unauthenticated client
    sends bodies for 60 s (``MEMEX_SOAK_SECONDS`` for a longer soak); the quiet tenant's
    every turn is answered, and the server's memory stays within 100 MiB of where it started
    (its p99 beside them: bench/serve.py)."""
    served = start({
        "quiet": "", "n1": "max_running = 1\nqueued = 4", "n2": "max_running = 1\nqueued = 4"})
    stop = threading.Event()
    refused = {"n1": 0, "n2": 0}

    def noisy(name: str) -> None:
        c = client_for_test(served.url, served.keys[name])
        sid = c.create(limits=SMALL)["id"]
        while not stop.is_set():
            r = httpx2.post(f"{served.url}/v1/sessions/{sid}/run", timeout=60,
                            json={"code": "sum(i * i for i in range(100_000))"},
                            headers={"Authorization": f"Bearer {served.keys[name]}"})
            if r.status_code == 429:
                refused[name] += 1

    def stranger() -> None:
        body = b"[" * (4 << 20) + b"]" * (4 << 20)
        while not stop.is_set():
            with contextlib.suppress(httpx2.HTTPError):
                httpx2.post(f"{served.url}/v1/sessions", content=body, timeout=10,
                            headers={"Content-Type": "application/json"})

    try:
        q = client_for_test(served.url, served.keys["quiet"])
        sid = q.create(limits=SMALL)["id"]
        q.run(sid, "n = 0")
        before = _hwm(served)
        load = [threading.Thread(target=noisy, args=(n,)) for n in ("n1", "n2") for _ in
                range(7)] + [threading.Thread(target=stranger)]  # 7 each: past their queue
        # (5 of each are in at once: max_running 1, queued 4), and 15 sessions in all: a
        # pool's 16 sandboxes hold them
        for t in load:
            t.start()
        deadline = time.monotonic() + float(os.environ.get("MEMEX_SOAK_SECONDS", "60"))
        turns = 0
        while time.monotonic() < deadline:
            assert q.run(sid, "n += 1\nn")["result"]["value"] == str(turns + 1)
            turns += 1
        stop.set()
        for t in load:
            t.join(60)
        assert turns > 100 and refused["n1"] > 0 and refused["n2"] > 0, (turns, refused)
        assert _hwm(served) - before < 100 << 20
    finally:
        stop.set()
        served.stop()
