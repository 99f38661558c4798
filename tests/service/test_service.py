"""`memex serve` as a tenant sees it: keys, isolation, quotas and ceilings, typed errors,
the door over the client's WebSocket (a client killed mid-call), oversized and malformed
requests, metrics, the committed OpenAPI document and a graceful stop. Every test talks to a
real server process on 127.0.0.1 (tests/conftest.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import tomllib
from pathlib import Path
from typing import Any

import httpx2
import pytest
from served import client_for_test, start_server
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from memex import (
    BackendBusy,
    ConfigError,
    Door,
    Limits,
    Mount,
    SandboxClosed,
    ServiceError,
    TurnStatus,
)
from memex.backends import RemoteBackend, get_backend
from memex.host_tools import ToolHost
from memex.service import ServiceConfig, create_app, hash_key, load_config

REPO = Path(__file__).resolve().parents[2]


def raw(served: Any, method: str, path: str, key: str | None = "a", **kw: Any
        ) -> httpx2.Response:
    headers = dict(kw.pop("headers", {}))
    if key is not None:
        headers["Authorization"] = f"Bearer {served.keys.get(key, key)}"
    return httpx2.request(method, served.url + path, headers=headers, timeout=60, **kw)


def test_keys_missing_wrong_and_rotated_without_restart(memex_server: Any, tmp_path: Path
                                                        ) -> None:
    for key in (None, "not-a-key-of-anyone-at-all"):
        r = raw(memex_server, "GET", "/v1/sessions", key=key)
        assert r.status_code == 401
        assert r.json()["error"]["code"] == "unauthorized"
    with pytest.raises(ServiceError) as err:
        client_for_test(memex_server.url, "wrong-key-wrong-key").sessions()
    assert err.value.status == 401 and err.value.code == "unauthorized"
    # rotate tenant b's key in the file the server reads: the new one works, the old one not
    old = memex_server.keys["b"]
    new = "rotated-" + old
    text = memex_server.config.read_text()
    memex_server.config.write_text(text.replace(hash_key(old), hash_key(new)))
    try:
        assert client_for_test(memex_server.url, new).sessions() == []
        with pytest.raises(ServiceError):
            client_for_test(memex_server.url, old).sessions()
    finally:
        memex_server.config.write_text(text)
    assert client_for_test(memex_server.url, old).sessions() == []


def test_sighup_reads_the_tenants_again_when_the_stat_cannot_tell(tmp_path: Path) -> None:
    """A rotation written in place with the file's size and modification time kept (an
    editor that restores them, a config tool) is invisible to the stat check; SIGHUP reads
    the tenants again at the next request. The control: before the signal, the old key
    still works."""
    served = start_server(tmp_path, {"a": ""})
    try:
        old = served.keys["a"]
        new = old[::-1]  # the same length: the file keeps its size
        st = served.config.stat()
        text = served.config.read_text()
        with served.config.open("r+") as f:  # in place: the same inode
            f.write(text.replace(hash_key(old), hash_key(new)))
        os.utime(served.config, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert raw(served, "GET", "/v1/sessions", key=old).status_code == 200  # unseen
        served.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while raw(served, "GET", "/v1/sessions", key=old).status_code == 200:
            assert time.monotonic() < deadline, "SIGHUP did not read the tenants again"
            time.sleep(0.05)
        assert raw(served, "GET", "/v1/sessions", key=new).status_code == 200
        assert served.proc.poll() is None  # SIGHUP does not stop the server
    finally:
        served.stop()


def test_a_tenant_cannot_see_or_touch_another_tenants_sessions(memex_server: Any) -> None:
    a = client_for_test(memex_server.url, memex_server.keys["a"])
    b = client_for_test(memex_server.url, memex_server.keys["b"])
    sid = a.create()["id"]
    try:
        a.run(sid, "secret = 42")
        assert sid not in [s["id"] for s in b.sessions()]
        cp = a.checkpoint(sid)
        for method, path, body in [
            ("GET", f"/v1/sessions/{sid}", None),
            ("POST", f"/v1/sessions/{sid}/run", {"code": "secret"}),
            ("POST", f"/v1/sessions/{sid}/fork", None),
            ("POST", f"/v1/sessions/{sid}/forks", {"count": 2}),
            ("POST", f"/v1/sessions/{sid}/checkpoints", None),
            ("GET", f"/v1/sessions/{sid}/files?path=/tmp/x", None),
            ("DELETE", f"/v1/sessions/{sid}", None),
            ("DELETE", f"/v1/checkpoints/{cp}", None),
        ]:
            r = raw(memex_server, method, path, key="b", json=body)
            assert r.status_code == 404, (method, path, r.text)
            assert r.json()["error"]["code"] == "not_found"
        bsid = b.create()["id"]  # b cannot restore a's checkpoint into its own session either
        r = raw(memex_server, "POST", f"/v1/sessions/{bsid}/restore", key="b",
                json={"checkpoint": cp})
        assert r.status_code == 404
        b.close_session(bsid)
        assert a.run(sid, "secret")["result"]["value"] == "42"  # untouched
    finally:
        a.close_session(sid)


def test_quota_and_ceilings(memex_server: Any) -> None:
    small = get_backend("remote", url=memex_server.url, api_key=memex_server.keys["small"])
    try:
        with pytest.raises(ConfigError, match=r"tenant 'small': limits.memory = 1073741824 is "
                                              r"above the ceiling of 536870912"):  # and timeout
            small.open(limits=Limits(memory=1 << 30))
        with pytest.raises(ConfigError, match="timeout") as refused:
            small.open(limits=Limits(memory=256 << 20, timeout=60))
        assert refused.value.retry_after is None  # positive control: a 422 asks for no wait
        with pytest.raises(ConfigError, match="may not mount"):
            small.open(limits=Limits(memory=256 << 20, timeout=10),
                       mounts=[Mount(host_path=str(REPO), guest_path="/data")])
        big_disk = small.open(limits=Limits(memory=256 << 20, timeout=10, disk_bytes=768 << 20))
        with pytest.raises(ServiceError, match="bytes of disk, its bound is 1073741824") as e:
            small.open(limits=Limits(memory=256 << 20, timeout=10))  # 768 + 512 MiB > 1 GiB
        assert e.value.status == 429 and e.value.retry_after == 1.0  # the answer's Retry-After
        big_disk.close()
        ok = Limits(memory=256 << 20, timeout=10)
        one, two = small.open(limits=ok), small.open(limits=ok)
        r = raw(memex_server, "POST", "/v1/sessions", key="small",
                json={"limits": {"memory": 256 << 20, "timeout": 10}})
        assert r.status_code == 429 and r.headers["Retry-After"] == "1"
        assert r.json()["error"]["code"] == "quota"
        with pytest.raises(ServiceError) as err:
            small.open(limits=ok)
        assert err.value.status == 429 and err.value.retry_after == 1.0
        with pytest.raises(ServiceError):
            one.fork()  # a fork counts too
        two.close()
        three = small.open(limits=ok)  # a slot again
        assert three.run("1 + 1").value == "2"
        assert one.run("2 + 2").value == "4"
    finally:
        small.close()
    assert client_for_test(memex_server.url, memex_server.keys["small"]).sessions() == []


def test_forks_in_one_call_are_all_or_none_within_the_quota(memex_server: Any) -> None:
    small = get_backend("remote", url=memex_server.url, api_key=memex_server.keys["small"])
    client = client_for_test(memex_server.url, memex_server.keys["small"])
    try:
        ok = Limits(memory=256 << 20, timeout=10)
        parent = small.open(limits=ok)
        parent.run("x = 1")
        with pytest.raises(ServiceError, match="bound is 2") as err:
            parent.fork_many(2)  # 1 + 2 > max_sessions 2: none is made
        assert err.value.status == 429
        assert [s["id"] for s in client.sessions()] == [parent.id]
        (kid,) = parent.fork_many(1)  # positive control: one fits
        assert kid.run("x + 1").value == "2" and kid.door is parent.door
        assert {s["id"] for s in client.sessions()} == {parent.id, kid.id}
        for body in ({"count": 0}, {"count": 1025}, {"count": "2"}, {"count": 1.5},
                     {"count": True}, {}):
            r = raw(memex_server, "POST", f"/v1/sessions/{parent.id}/forks", key="small",
                    json=body)
            assert r.status_code == 422, (body, r.text)
        kid.close()
        r = raw(memex_server, "POST", f"/v1/sessions/{parent.id}/forks", key="small",
                json={"count": 1})
        assert r.status_code == 201, r.text
        (out,) = r.json()["sessions"]
        assert out["parent"] == parent.id and out["turns"] == 1
    finally:
        small.close()
        for s in client.sessions():
            client.close_session(s["id"])


@pytest.mark.slow
def test_typed_errors_for_bad_requests(memex_server: Any) -> None:
    cases = [
        # a body that does not fit the schema (types taken strictly, bounds included)
        ("POST", "/v1/sessions", {"limits": {"memory": "lots"}}, 422, "invalid_request"),
        ("POST", "/v1/sessions", {"limits": {"no_such_limit": 1}}, 422, "invalid_request"),
        ("POST", "/v1/sessions", {"limits": {"timeout": True}}, 422, "invalid_request"),
        ("POST", "/v1/sessions", {"limits": {"memory": 0}}, 422, "invalid_request"),
        ("POST", "/v1/sessions", {"env": {"A=B": "x"}}, 422, "invalid_request"),
        ("POST", "/v1/sessions", {"env": {"A": "x\u0000y"}}, 422, "invalid_request"),
        ("POST", "/v1/sessions", {"mounts": [{"host": "/tmp", "guest": "/a/../b"}]}, 422,
         "invalid_request"),
        ("POST", "/v1/sessions/s_nope/run", {"code": "1", "timeout": True}, 422,
         "invalid_request"),
        ("POST", "/v1/sessions/s_nope/run", {"code": "1", "timeout": "2"}, 422,
         "invalid_request"),
        ("POST", "/v1/sessions/s_nope/run/stream", {"code": "1", "timeout": "2"}, 422,
         "invalid_request"),
        ("POST", "/v1/sessions", {"unknown": 1}, 422, "invalid_request"),
        # a module name's pattern is in the document: the schema refuses it
        ("POST", "/v1/sessions", {"preload": ["not a module!"]}, 422, "invalid_request"),
        ("POST", "/v1/sessions", {"limits": {"memory": 1 << 20}}, 422, "invalid_request"),
        ("POST", "/v1/sessions", {"limits": {"memory": None}}, 422, "invalid"),
        ("GET", "/v1/sessions/s_nope", None, 404, "not_found"),
        ("POST", "/v1/sessions/s_nope/run", {"code": "1"}, 404, "not_found"),
    ]
    for method, path, body, status, code in cases:
        r = raw(memex_server, method, path, json=body)
        assert (r.status_code, r.json()["error"]["code"]) == (status, code), (path, r.text)
    r = raw(memex_server, "POST", "/v1/sessions", content=b"{not json",
            headers={"Content-Type": "application/json"})
    assert (r.status_code, r.json()["error"]["code"]) == (422, "invalid_request")
    a = client_for_test(memex_server.url, memex_server.keys["a"])
    sid = a.create()["id"]
    try:
        for body in ({"code": 5}, {"code": "1", "timeout": -1}, {}):
            r = raw(memex_server, "POST", f"/v1/sessions/{sid}/run", json=body)
            assert r.status_code == 422, (body, r.text)
        r = raw(memex_server, "GET", f"/v1/sessions/{sid}/files?path=/etc/passwd")
        assert (r.status_code, r.json()["error"]["type"]) == (404, "GuestFileError")
        r = raw(memex_server, "GET", f"/v1/sessions/{sid}/files/list?path=/etc")
        assert (r.status_code, r.json()["error"]["type"]) == (404, "GuestFileError")
        a.write_file(sid, "/tmp/d/x.bin", b"12345")
        assert a.list_files(sid, "/tmp") == [{"name": "d", "path": "/tmp/d", "kind": "dir",
                                              "size": 0}]
        assert a.list_files(sid, "/tmp/d")[0]["size"] == 5
        assert a.run(sid, "1 + 1")["result"]["value"] == "2"  # nothing lost
    finally:
        a.close_session(sid)


@pytest.mark.slow
def test_oversized_bodies_are_refused(tmp_path: Path) -> None:
    served = start_server(tmp_path, {"a": ""}, server="max_body_bytes = 65536")
    try:
        a = client_for_test(served.url, served.keys["a"])
        sid = a.create()["id"]
        big = "x = '" + "y" * 100_000 + "'"
        r = raw(served, "POST", f"/v1/sessions/{sid}/run", json={"code": big})
        assert r.status_code == 413 and r.json()["error"]["code"] == "too_large"

        def chunks() -> Any:  # no Content-Length: counted as it streams
            for _ in range(20):
                yield b"z" * 8192

        r = raw(served, "PUT", f"/v1/sessions/{sid}/files?path=/tmp/big", content=chunks())
        assert r.status_code == 413
        assert a.run(sid, "'still here'")["result"]["value"] == "'still here'"
    finally:
        served.stop()


def test_a_guest_calls_a_tool_in_the_clients_process_with_typed_values(memex_server: Any
                                                                       ) -> None:
    seen: list[int] = []

    def score(rows: list[dict[str, int]], weight: float = 1.0) -> dict[str, float]:
        """Sum the rows' values, weighted."""
        seen.append(os.getpid())
        return {"total": sum(r["v"] for r in rows) * weight}

    with get_backend("remote", url=memex_server.url, api_key=memex_server.keys["a"]) as b:
        sb = b.open()
        with ToolHost([score]).attach(sb):
            r = sb.run("out = score([{'v': 2}, {'v': 3}], weight=1.5)\n"
                       "type(out).__name__, out['total']")
            assert r.value == "('dict', 7.5)", r
            r = sb.run("try:\n    score('nope')\nexcept tools.ToolError as e:\n"
                       "    print(e.kind)")
            assert r.stdout == "invalid_arguments\n", r
    assert seen == [os.getpid()]


CLIENT = textwrap.dedent("""
    import sys, time
    from memex.backends import get_backend
    from memex.host_tools import ToolHost
    url, key = sys.argv[1:]
    def block() -> int:
        '''Never answer.'''
        print("calling", flush=True)
        time.sleep(3600)
        return 0
    sb = get_backend("remote", url=url, api_key=key).open()
    sb.run("x = 1")
    print(sb.id, flush=True)
    with ToolHost([block]).attach(sb):
        sb.run("x = 2\\ny = block()")
""")


def test_a_client_killed_mid_tool_call_fails_the_call_cleanly(memex_server: Any) -> None:
    proc = subprocess.Popen([sys.executable, "-c", CLIENT, memex_server.url,
                             memex_server.keys["a"]], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    sid = proc.stdout.readline().strip()
    assert proc.stdout.readline().strip() == "calling"
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    a = client_for_test(memex_server.url, memex_server.keys["a"])
    out = a.run(sid, "x, 'y' in globals()")  # waits for the stranded turn, which was killed
    assert out["result"]["value"] == "(1, False)", out
    runs = [json.loads(x) for x in memex_server.log.read_text().splitlines()
            if x.startswith("{") and f'"session": "{sid}"' in x and '"event": "run"' in x]
    # the stranded turn ended because its client went away, not at its 10 s deadline
    assert [(r["status"], r["limit"]) for r in runs] == [
        ("ok", None), ("ok", None), ("killed", "cancelled"), ("ok", None)], runs
    a.close_session(sid)


def test_close_while_a_turn_runs_and_after(memex_server: Any) -> None:
    with get_backend("remote", url=memex_server.url, api_key=memex_server.keys["a"]) as b:
        sb = b.open(limits=Limits(timeout=10))
        sb.close()
        with pytest.raises(SandboxClosed):
            sb.run("1")
        r = raw(memex_server, "POST", f"/v1/sessions/{sb.id}/run", json={"code": "1"})
        assert r.status_code == 404
    with pytest.raises(SandboxClosed):
        b.open()


def test_an_unreachable_service_is_a_service_error() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    b = get_backend("remote", url=f"http://127.0.0.1:{port}", api_key="k" * 20, timeout=5)
    with pytest.raises(ServiceError, match="cannot reach"):
        b.open()
    b.close()
    with pytest.raises(ConfigError):
        get_backend("remote", url="ftp://x", api_key="k")


@pytest.mark.slow
def test_health_readiness_and_metrics(tmp_path: Path) -> None:
    """Health and readiness answer anyone and say nothing else; /metrics names the tenants,
    so it is closed unless the operator opens it (``metrics_public``) or gives keys. What a
    tenant holds comes from its one ledger account, the pool's sandboxes included (the pool
    is handed the server's ledger): one while its session lives, none after."""
    served = start_server(tmp_path, {"a": "", "b": ""},
                          server="metrics_public = true\nbackend = 'pool'")
    try:
        assert raw(served, "GET", "/healthz", key=None).json() == {"status": "ok"}
        assert raw(served, "GET", "/readyz", key=None).json() == {"status": "ready"}
        a = client_for_test(served.url, served.keys["a"])
        sid = a.create()["id"]
        a.run(sid, "while True: pass", timeout=0.5)
        living = raw(served, "GET", "/metrics", key=None).text
        a.close_session(sid)
        text = raw(served, "GET", "/metrics", key=None).text
    finally:
        served.stop()
    assert 'memex_turns_total{status="killed",tenant="a"}' in text
    assert 'memex_limits_hit_total{limit="deadline",tenant="a"}' in text
    assert "memex_turn_seconds_bucket" in text
    assert 'memex_held{tenant="a",what="pool_sandboxes"} 1.0' in living
    assert 'memex_held{tenant="a",what="pool_sandboxes"} 0.0' in text
    assert 'memex_held{tenant="a",what="running_turns"} 0.0' in text
    assert 'tenant="b"' not in living  # positive control: b used nothing, holds nothing


def test_access_and_audit_logs_name_the_tenant_and_not_the_code(memex_server: Any) -> None:
    a = client_for_test(memex_server.url, memex_server.keys["a"])
    sid = a.create()["id"]
    a.run(sid, "token = 'do-not-log-me'")
    a.close_session(sid)
    log = memex_server.wait_for_log(f'"path": "/v1/sessions/{sid}/run"')
    lines = [json.loads(x) for x in log.splitlines() if x.startswith("{")]
    runs = [x for x in lines if x.get("event") == "run" and x.get("session") == sid]
    assert runs and runs[0]["tenant"] == "a" and runs[0]["status"] == "ok"
    assert "do-not-log-me" not in memex_server.log.read_text()
    assert memex_server.keys["a"] not in memex_server.log.read_text()
    assert any(x.get("path") == f"/v1/sessions/{sid}/run" and x.get("status") == 200
               for x in lines)


def test_the_openapi_document_declares_the_bearer_scheme(memex_server: Any) -> None:
    """Generated clients and the docs page learn that a key is needed: the bearer scheme is
    declared for every route, the public ones (health, readiness, the document itself) say
    they need none, and every other route documents its 401, which the server answers."""
    doc = raw(memex_server, "GET", "/openapi.json", key=None).json()
    scheme = doc["components"]["securitySchemes"]["bearer"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    assert doc["security"] == [{"bearer": []}]
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            if path in ("/healthz", "/readyz"):
                assert op["security"] == [], path
                assert raw(memex_server, method.upper(), path, key=None).status_code != 401
            else:
                assert "security" not in op and "401" in op["responses"], (path, method)
    # positive control: a protected route without a key is the documented 401
    assert raw(memex_server, "GET", "/v1/sessions", key=None).status_code == 401


def test_the_committed_openapi_document_is_current() -> None:
    app = create_app(ServiceConfig())
    doc = json.dumps(app.openapi(), indent=1, sort_keys=True) + "\n"
    path = REPO / "docs" / "service-openapi.json"
    if os.environ.get("MEMEX_WRITE_OPENAPI"):
        path.write_text(doc)
    assert path.read_text() == doc, "regenerate: MEMEX_WRITE_OPENAPI=1 pytest -k openapi"


def test_config_errors_name_the_problem(tmp_path: Path) -> None:
    cases = {
        "[server]\nport = 'x'\n": "[server] port: Input should be a valid integer, got 'x'",
        "[server]\nnope = 1\n": "[server] nope: unknown key (known: access_log, backend",
        "[server]\nbackend = 'ray'\n": "[server] backend: Input should be 'pool', 'subprocess' "
                                       "or 'inprocess'",
        "[server]\nsave_interval = -1\n": "[server] save_interval: expected seconds >= 0",
        "[server]\nmax_body_bytes = '1X'\n": "[server] max_body_bytes: expected a byte count",
        "[tenants.'a/b']\nkeys = []\n": "a tenant name is",
        "[tenants.a]\nkeys = ['plain-key']\n": "not sha256",
        "[tenants.a]\nkeys = []\n[tenants.a.ceiling]\nmemroy = 1\n":
            "[tenants.a.ceiling] memroy: unknown key (known: disk_bytes",
        "[tenants.a]\nmax_sessions = true\n": "[tenants.a] max_sessions: Input should be a "
                                              "valid integer",
        "not toml [": "not valid TOML",
    }
    for i, (text, message) in enumerate(cases.items()):
        f = tmp_path / f"c{i}.toml"
        f.write_text(text)
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_config(f)
    shared = hash_key("x" * 20)
    f = tmp_path / "dup.toml"
    f.write_text(f"[tenants.a]\nkeys = ['{shared}']\n[tenants.b]\nkeys = ['{shared}']\n")
    with pytest.raises(ConfigError, match="one key is listed for tenants"):
        load_config(f)


@pytest.mark.slow
def test_check_command_reads_the_config_and_serves_nothing(tmp_path: Path) -> None:
    cfg = tmp_path / "serve.toml"
    cfg.write_text(f"[tenants.acme]\nkeys = ['{hash_key('k' * 20)}']\nmax_sessions = 3\n"
                   "[tenants.acme.ceiling]\nmemory = 536870912\n")
    out = subprocess.run([sys.executable, "-m", "memex", "serve", "--config", str(cfg),
                          "--check"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "ok, backend pool" in out.stdout
    assert "tenant acme: 1 key(s); sessions 3; ceiling {'memory': '512M'}" in out.stdout
    # what a session asking for nothing gets: the defaults, lowered to the ceiling
    assert "tenant acme: a session asking for no limits gets timeout 30 s, memory 512M " \
        "(lowered to its bounds: ['memory'])" in out.stdout
    # a tenant that may hold the whole pool, or whose memory holds no session: problems
    cfg.write_text(f"[tenants.acme]\nkeys = ['{hash_key('k' * 20)}']\nmax_sessions = 16\n"
                   "max_memory = 1048576\n")
    out = subprocess.run([sys.executable, "-m", "memex", "serve", "--config", str(cfg),
                          "--check"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stdout
    assert "problem: tenant acme: max_sessions 16 lets it hold every sandbox of the pool" \
        in out.stdout
    assert "problem: tenant acme: max_memory 1M holds no session" in out.stdout
    cfg.write_text("[server]\nport = 'x'\n")
    out = subprocess.run([sys.executable, "-m", "memex", "serve", "--config", str(cfg),
                          "--check"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "[server] port: Input should be a valid integer" in out.stderr


def test_a_session_asking_for_nothing_fits_its_tenants_ceiling(memex_server: Any) -> None:
    """Tenant ``small`` caps memory at 512 MiB and the timeout at 20 s; the service's
    defaults are 1 GiB and 10 s: an empty create gets 512 MiB and 10 s (it used to fail)."""
    small = client_for_test(memex_server.url, memex_server.keys["small"])
    s = small.create()
    try:
        assert s["limits"]["memory"] == 512 << 20 and s["limits"]["timeout"] == 10.0
        assert small.run(s["id"], "1 + 1")["result"]["value"] == "2"
    finally:
        small.close_session(s["id"])


@pytest.mark.slow
def test_a_streamed_turn_is_refused_as_run_is(tmp_path: Path) -> None:
    """Past the tenant's running turns, /run/stream answers 429 before it starts, as /run
    does (not 200 with an error event)."""
    served = start_server(tmp_path, {"a": "max_running = 1\nqueued = 0"})
    try:
        a = client_for_test(served.url, served.keys["a"])
        one, two = a.create()["id"], a.create()["id"]
        running = threading.Event()
        busy = threading.Thread(target=a.run_stream, args=(
            one, "print('in', flush=True)\nimport time\ntime.sleep(3)",
            lambda _stream, _text: running.set()))
        busy.start()
        assert running.wait(120)  # its output says it is running
        r = raw(served, "POST", f"/v1/sessions/{two}/run", json={"code": "1"})
        s = raw(served, "POST", f"/v1/sessions/{two}/run/stream", json={"code": "1"})
        busy.join()
        assert (r.status_code, s.status_code) == (429, 429), (r.text, s.text)
        assert r.json()["error"]["code"] == s.json()["error"]["code"] == "busy"
        assert "Retry-After" in s.headers
        # positive control: once the running turn ends, the stream runs
        s = raw(served, "POST", f"/v1/sessions/{two}/run/stream", json={"code": "6 * 7"})
        assert s.status_code == 200 and '"value": "42"' in s.text
    finally:
        served.stop()


def test_hash_key_command() -> None:
    out = subprocess.run([sys.executable, "-m", "memex", "serve", "--hash-key"],
                         input="a-long-enough-api-key\n", capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == hash_key("a-long-enough-api-key")


@pytest.mark.slow
def test_sigterm_closes_every_session_and_exits_cleanly(tmp_path: Path) -> None:
    served = start_server(tmp_path, {"a": ""})
    a = client_for_test(served.url, served.keys["a"])
    for _ in range(3):
        a.run(a.create()["id"], "x = 1")
    # uvicorn re-raises the signal once it has shut down, so the exit status names it
    assert served.stop(signal.SIGTERM) in (0, -signal.SIGTERM)
    log = served.log.read_text()
    assert '"event": "shutdown", "closed": 3' in log


@pytest.mark.slow
def test_output_streams_in_order_while_the_turn_runs(memex_server: Any) -> None:
    with get_backend("remote", url=memex_server.url, api_key=memex_server.keys["a"]) as b:
        sb = b.open()
        heard: list[tuple[float, str, str]] = []
        start = time.monotonic()
        r = sb.run("import sys, time\nfor i in range(4):\n    print('line', i, flush=True)\n"
                   "    sys.stderr.write(f'err {i}\\n')\n    time.sleep(0.5)\n'done'",
                   on_output=lambda stream, text: heard.append(
                       (time.monotonic() - start, stream, text)))
        end = time.monotonic() - start
        assert r.value == "'done'" and r.stdout == "".join(
            t for _, s, t in heard if s == "stdout")
        assert [t for _, s, t in heard if s == "stdout"] == [f"line {i}\n" for i in range(4)]
        assert [t for _, s, t in heard if s == "stderr"] == [f"err {i}\n" for i in range(4)]
        assert heard[0][0] < end - 1.0  # the first line arrived well before the turn ended
        # a guest error and a stopped turn are results on the stream too
        r = sb.run("print('before')\n1/0", on_output=lambda *_: None)
        assert r.exception is not None and r.exception.type == "ZeroDivisionError"
        r = sb.run("while True: pass", timeout=0.5, on_output=lambda *_: None)
        assert r.status is TurnStatus.KILLED and r.limit == "deadline"
        sb.close()
        with pytest.raises(SandboxClosed):
            sb.run("1", on_output=lambda *_: None)
    r2 = raw(memex_server, "POST", "/v1/sessions/s_nope/run/stream", json={"code": "1"})
    assert r2.status_code == 404 and r2.json()["error"]["code"] == "not_found"


@pytest.mark.slow
def test_the_service_example_runs() -> None:
    out = subprocess.run([sys.executable, str(REPO / "examples" / "service.py")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "total on the service: 54.0 (expected 54.0)" in out.stdout
    assert "streamed: A-1 2 x 12.5" in out.stdout
    assert "refused as expected: ConfigError" in out.stdout
    assert "third session: HTTP 429 quota" in out.stdout


@pytest.mark.slow
def test_max_running_bounds_a_tenants_concurrent_turns(tmp_path: Path) -> None:
    served = start_server(tmp_path, {"one": "max_running = 1\nqueued = 0"})
    try:
        entered = threading.Event()
        release = threading.Event()

        def hold() -> str:
            """Wait until the test lets go."""
            entered.set()
            release.wait(30)
            return "held"

        with get_backend("remote", url=served.url, api_key=served.keys["one"]) as b:
            first, second = b.open(), b.open()
            with ToolHost([hold]).attach(first):
                out: list[Any] = []
                t = threading.Thread(target=lambda: out.append(first.run("hold()")))
                t.start()
                assert entered.wait(30)
                with pytest.raises(BackendBusy) as busy:  # its one running turn is taken
                    second.run("1 + 1")
                assert busy.value.reason == "queue_full"
                release.set()
                t.join(30)
                assert out[0].value == "'held'"
                assert second.run("1 + 1").value == "2"  # free again
    finally:
        served.stop()


def test_the_door_websocket_refuses_bad_keys_and_malformed_frames(memex_server: Any) -> None:
    a = client_for_test(memex_server.url, memex_server.keys["a"])
    sid = a.create()["id"]
    ws_url = "ws" + memex_server.url[4:] + f"/v1/sessions/{sid}/door"
    for headers in ({}, {"Authorization": "Bearer wrong-key-wrong-key"},
                    {"Authorization": f"Bearer {memex_server.keys['b']}"}):  # not b's session
        with pytest.raises(InvalidStatus):
            connect(ws_url, additional_headers=headers, proxy=None, open_timeout=10)
    ws = connect(ws_url, additional_headers={"Authorization": f"Bearer {memex_server.keys['a']}"},
                 proxy=None, open_timeout=10)
    assert ws.recv(timeout=10) == b"\x91\xa5ready"
    ws.send(b"\xc1 not msgpack")  # a frame outside the protocol closes the connection
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1003
    assert a.run(sid, "1 + 1")["result"]["value"] == "2"  # the session is unharmed
    a.close_session(sid)


@pytest.mark.slow
def test_metrics_can_ask_for_a_key(tmp_path: Path) -> None:
    """With ``[server] metrics_keys``, /metrics answers only a scraper holding one of them;
    a tenant's key is not one. A key that is not stored hashed is a config error."""
    scraper = "scraper-key-0123456789"
    served = start_server(tmp_path, {"a": ""},
                          server=f'metrics_keys = ["{hash_key(scraper)}"]')
    try:
        for key in (None, served.keys["a"], "wrong-key-wrong-key"):
            r = raw(served, "GET", "/metrics", key=key)
            assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
            assert "tenant" not in r.text
        r = raw(served, "GET", "/metrics", key=scraper)
        assert r.status_code == 200 and "memex_sessions" in r.text
        assert 'memex_connections{state="open"}' in r.text
    finally:
        served.stop()
    bad = tmp_path / "bad.toml"
    bad.write_text(f'[server]\nmetrics_keys = ["{scraper}"]\n')
    with pytest.raises(ConfigError, match=r"metrics_keys.*not sha256"):
        load_config(bad)


def test_the_client_reads_its_url_and_key_from_the_environment(
        memex_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """``RemoteBackend()`` with nothing passed uses $MEMEX_URL and $MEMEX_API_KEY; what is
    passed wins over them; with neither, the error names the variable to set."""
    monkeypatch.setenv("MEMEX_URL", memex_server.url)
    monkeypatch.setenv("MEMEX_API_KEY", memex_server.keys["a"])
    with get_backend("remote") as backend, backend.open() as sb:
        assert sb.run("6 * 7").value == "42"
    monkeypatch.setenv("MEMEX_URL", "http://127.0.0.1:9")  # nothing listens there
    with RemoteBackend(url=memex_server.url) as backend:  # the argument wins
        assert isinstance(backend.client.sessions(), list)
    monkeypatch.delenv("MEMEX_URL")
    with pytest.raises(ConfigError, match=r"\$MEMEX_URL"):
        RemoteBackend()
    monkeypatch.setenv("MEMEX_URL", memex_server.url)
    monkeypatch.delenv("MEMEX_API_KEY")
    with pytest.raises(ConfigError, match=r"\$MEMEX_API_KEY"):
        RemoteBackend()


def test_the_documented_serve_toml_parses_sizes_and_durations_included(tmp_path: Path) -> None:
    """docs/service.md's serve.toml is a file the server reads (its sizes written '32M', '8G',
    its ceiling '1G'), not prose that may drift."""
    from memex.service._config import parse_config

    doc = (REPO / "docs" / "service.md").read_text()
    text = doc.split("```toml\n", 1)[1].split("```", 1)[0]
    data = tomllib.loads(text.replace('"sha256:..."', f'"{hash_key("k" * 20)}"'))
    acme = data["tenants"]["acme"]
    for outside in ("egress", "tools", "mounts"):  # files and folders of another machine
        acme.pop(outside)
    config = parse_config(data, path=tmp_path / "serve.toml")
    assert config.max_body_bytes == 32 << 20 and config.edge.header_timeout == 10
    t = config.tenants["acme"]
    assert (t.max_memory, t.max_disk) == (8 << 30, 16 << 30)
    assert t.ceiling.given() == {"timeout": 60.0, "memory": 1 << 30}


def test_a_new_process_reattaches_to_a_live_session_by_id(memex_server: Any) -> None:
    """One process opens a session, leaves state in it and detaches; another attaches by
    id, finds the state, serves the session's client tools from its own door, and ends it.
    Another tenant's key finds nothing under that id."""
    code = textwrap.dedent(f"""
        from memex import RemoteBackend
        with RemoteBackend(url={memex_server.url!r}, api_key={memex_server.keys['a']!r}) as b:
            sb = b.open()
            sb.run("kept = 6 * 7")
            print(sb.detach())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    sid = out.stdout.strip().splitlines()[-1]
    other = RemoteBackend(url=memex_server.url, api_key=memex_server.keys["b"])
    with pytest.raises(SandboxClosed, match="no session"):
        other.attach(sid)  # not this tenant's
    other.close()
    door = Door()
    door.register("twice", lambda x: 2 * x)
    with RemoteBackend(url=memex_server.url, api_key=memex_server.keys["a"]) as backend:
        sb = backend.attach(sid, door=door)
        assert sb.run("kept").value == "42"  # the first process's state, alive
        r = sb.run("from memex_guest import call\ncall('twice', kept)")
        assert r.value == "84", r
        sb.close()
        with pytest.raises(SandboxClosed, match="no session"):
            backend.attach(sid)  # closed: gone


def test_one_json_log_format_with_the_request_id(memex_server: Any) -> None:
    """Every line the server writes is one JSON object; a request's lines (access and audit)
    carry its id: the client's X-Request-ID when sane, else one made and echoed."""
    sid = raw(memex_server, "POST", "/v1/sessions", json={}).json()["id"]
    r = raw(memex_server, "POST", f"/v1/sessions/{sid}/run", json={"code": "1 + 1"},
            headers={"X-Request-ID": "trace-7f3a"})
    assert r.status_code == 200 and r.headers["x-request-id"] == "trace-7f3a"
    made = raw(memex_server, "GET", f"/v1/sessions/{sid}",
               headers={"X-Request-ID": "not a sane id; {\"x\": 1}"}).headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", made)  # a client's odd text never reaches the log
    raw(memex_server, "DELETE", f"/v1/sessions/{sid}")
    log = memex_server.wait_for_log(made)
    # the log holds stdout too: the command's own banner is the one line that is not JSON
    other = [x for x in log.splitlines() if x.strip() and not x.startswith("{")]
    assert all(x.startswith("memex serve: serving http://") for x in other), other
    lines = [json.loads(x) for x in log.splitlines() if x.startswith("{")]
    assert all(isinstance(x, dict) and "ts" in x and "level" in x for x in lines)
    mine = [x for x in lines if x.get("request_id") == "trace-7f3a"]
    assert {x.get("path") for x in mine} >= {f"/v1/sessions/{sid}/run"}  # the access line
    assert any(x.get("event") == "run" and x.get("session") == sid for x in mine)  # audit
    assert any(x.get("request_id") == made and x.get("path") == f"/v1/sessions/{sid}"
               for x in lines)


def test_a_traceback_is_one_json_line_too() -> None:
    import io
    import logging

    from memex.service._logs import REQUEST_ID, JsonLines

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonLines())
    log = logging.getLogger("memex.test.jsonlines")
    log.addHandler(handler)
    log.propagate = False
    token = REQUEST_ID.set("r-1")
    try:
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("unhandled error")
        log.warning('{"event": "x", "level": "not overwritten"}')
    finally:
        REQUEST_ID.reset(token)
        log.removeHandler(handler)
    other = logging.getLogger("uvicorn.test.jsonlines")  # a library's line: never merged
    other.addHandler(handler)
    other.propagate = False
    other.warning('{"tenant": "forged"}')
    other.removeHandler(handler)
    first, second, third = (json.loads(x) for x in stream.getvalue().splitlines())
    assert first["message"] == "unhandled error" and first["request_id"] == "r-1"
    assert "Traceback" in first["exc"] and "ValueError: boom" in first["exc"]
    assert second["event"] == "x" and second["level"] == "warning"  # ours win
    assert "tenant" not in third and third["message"] == '{"tenant": "forged"}'


@pytest.mark.slow
def test_sessions_end_by_their_ttl_and_free_the_quota(tmp_path: Path) -> None:
    """A session's TTL is its Limits: ``lifetime`` from creation, ``idle_timeout`` from its
    last use, each set by the client and bounded by the tenant's ceiling (a session asking
    for none gets the ceiling). An ended session leaves the list, frees its quota and
    answers 404 saying why; one in use is not cut short by the idle timeout; one without a
    TTL stays (positive control)."""
    served = start_server(tmp_path, {
        "a": "max_sessions = 2",
        "b": "max_sessions = 2\n[tenants.b.ceiling]\nlifetime = 1.5"})
    try:
        a = client_for_test(served.url, served.keys["a"])
        keep = a.create()["id"]
        brief = a.create(limits={"lifetime": 1})["id"]
        with pytest.raises(ServiceError, match="bound is 2"):
            a.create()  # the quota is full while it lives
        time.sleep(1.5)
        assert [s["id"] for s in a.sessions()] == [keep]
        with pytest.raises(ServiceError, match="no session"):
            a.run(brief, "1")
        idle = a.create(limits={"idle_timeout": 1})["id"]  # the freed place
        r = a.run(idle, "import time\ntime.sleep(2)\n'done'")  # in use past its idle time
        assert r["result"]["value"] == "'done'", r
        assert idle in [s["id"] for s in a.sessions()]
        deadline = time.monotonic() + 10
        while idle in [s["id"] for s in a.sessions()] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert [s["id"] for s in a.sessions()] == [keep]  # idle past 1 s after its use
        assert a.run(keep, "6 * 7")["result"]["value"] == "42"
        b = client_for_test(served.url, served.keys["b"])
        capped = b.create()  # asked for no lifetime: the ceiling's
        assert capped["limits"]["lifetime"] == 1.5
        with pytest.raises(ConfigError, match="above the ceiling"):
            b.create(limits={"lifetime": 60})
        deadline = time.monotonic() + 10
        while b.sessions() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert b.sessions() == []
    finally:
        served.stop()
    log = served.log.read_text()
    assert '"why": "its lifetime ended"' in log and '"why": "its idle timeout passed"' in log


@pytest.mark.parametrize("backend", ["inprocess", "subprocess", "pool"])
def test_a_tenant_s_turn_rate_holds_on_every_backend(tmp_path: Path, backend: str) -> None:
    """``turns_per_second`` is admitted by the server's shares, whatever the backend (it
    lived in the pool alone, so on the subprocess and in-process backends a configured rate
    was silently not enforced). A tenant of one turn per 100 s has its burst (one turn), and
    its next turn would wait past the server's wait (30 s): 429 at once, with Retry-After.
    The control: a tenant without a rate runs both turns."""
    served = start_server(tmp_path, {"slow": "turns_per_second = 0.01", "free": ""},
                          server=f"backend = '{backend}'")
    try:
        slow = client_for_test(served.url, served.keys["slow"])
        sid = slow.create()["id"]
        assert slow.run(sid, "1 + 1")["result"]["value"] == "2"
        r = raw(served, "POST", f"/v1/sessions/{sid}/run", key="slow", json={"code": "2"})
        assert r.status_code == 429, r.text
        assert "over its rate of 0.01 turns/s" in r.json()["error"]["message"]
        assert r.headers["Retry-After"]
        free = client_for_test(served.url, served.keys["free"])
        fid = free.create()["id"]
        assert [free.run(fid, c)["result"]["value"] for c in ("1", "2")] == ["1", "2"]
    finally:
        served.stop()


def test_every_405_names_the_methods_its_path_serves(memex_server: Any) -> None:
    """RFC 9110: a 405 carries Allow with the path's methods (a route serves one method, so
    the header gathers every route of the path); read by value, not only present."""
    for method, path, allow in (
            ("PUT", "/v1/sessions", "GET, POST"),
            ("PATCH", "/v1/sessions/s-x", "DELETE, GET"),
            ("DELETE", "/v1/sessions/s-x/files", "GET, PUT"),
            ("POST", "/v1/checkpoints/c-x", "DELETE"),
            ("POST", "/healthz", "GET"),
            ("PUT", "/v1/sessions/s-x/run", "POST")):
        r = raw(memex_server, method, path)
        assert (r.status_code, r.headers.get("allow")) == (405, allow), (method, path, r.text)
        assert r.json()["error"]["code"] == "method_not_allowed"
    r = raw(memex_server, "GET", "/v1/sessions")  # positive control: an allowed method
    assert r.status_code == 200 and "allow" not in r.headers
