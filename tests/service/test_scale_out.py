"""Two `memex serve` nodes on 127.0.0.1 sharing one parking folder: a session pinned to node A
is parked, taken by node B with its state, and is then B's alone; only one node can take a
parked session, another tenant cannot, and a node without a shared folder says so. What the
nodes keep at rest is their owner's alone, and ids in paths are names, never paths."""

from __future__ import annotations

import http.client
import json
import os
import stat
import threading
from pathlib import Path

import pytest
from served import client_for_test, launch, start_server

from memex import ImageError, SandboxClosed, ServiceError
from memex.backends import get_backend
from memex.backends.internal import RemoteCheckpoint
from memex.host_tools import ToolHost


@pytest.mark.slow
def test_a_session_moves_between_nodes_through_the_shared_folder(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    a_node = start_server(tmp_path / "a", {"t": "", "u": ""},
                          server=f"shared_dir = '{shared}'\nstate_dir = 'state'")
    (tmp_path / "b").mkdir()
    b_config = tmp_path / "b" / "serve.toml"
    b_config.write_text(a_node.config.read_text())  # same tenants and keys, its own state
    b_node = launch(b_config, a_node.keys)
    try:
        on_a = get_backend("remote", url=a_node.url, api_key=a_node.keys["t"])
        on_b = get_backend("remote", url=b_node.url, api_key=a_node.keys["t"])
        sb = on_a.open()

        def where() -> str:
            """Which node's client answers."""
            return "client"

        with ToolHost([where]).attach(sb):
            sb.run("import numpy as np\nx = np.arange(4)\nnote = where()")
        sb.write_file("/tmp/data/in.csv", b"a,b\n1,2\n")
        sid = sb.park()
        assert sb.closed
        with pytest.raises(SandboxClosed):
            sb.run("1")
        assert client_for_test(a_node.url, a_node.keys["t"]).sessions() == []  # gone from A
        u = client_for_test(b_node.url, a_node.keys["u"])
        with pytest.raises(ServiceError) as err:
            u.unpark(sid)  # another tenant's parked session is not there for it
        assert err.value.status == 404
        moved = on_b.unpark(sid)
        assert moved.run("int(x.sum()), note").value == "(6, 'client')"
        assert moved.turns == 3  # the install cell, the block, and this one
        assert moved.read_file("/tmp/data/in.csv") == b"a,b\n1,2\n"  # its files moved too
        assert [f.name for f in moved.list_files("/tmp/data")] == ["in.csv"]
        with pytest.raises(ServiceError) as err:
            on_a.unpark(sid)  # taken once
        assert err.value.status == 404
        moved.close()
        on_a.close()
        on_b.close()
    finally:
        a_node.stop()
        b_node.stop()


@pytest.mark.slow
def test_only_one_node_takes_a_parked_session(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    a_node = start_server(tmp_path / "a", {"t": ""}, server=f"shared_dir = '{shared}'")
    b_config = tmp_path / "b.toml"
    b_config.write_text(a_node.config.read_text())
    b_node = launch(b_config, a_node.keys)
    try:
        key = a_node.keys["t"]
        a = client_for_test(a_node.url, key)
        sid = a.create()["id"]
        a.run(sid, "x = 1")
        a.park(sid)
        wins: list[str] = []
        errors: list[int | None] = []

        def take(url: str) -> None:
            try:
                client_for_test(url, key).unpark(sid)
                wins.append(url)
            except ServiceError as exc:
                errors.append(exc.status)

        racers = [threading.Thread(target=take, args=(u,)) for u in
                  (a_node.url, b_node.url, a_node.url, b_node.url)]
        for r in racers:
            r.start()
        for r in racers:
            r.join(60)
        assert len(wins) == 1 and errors == [404, 404, 404]
        assert client_for_test(wins[0], key).run(sid, "x")["result"]["value"] == "1"
    finally:
        a_node.stop()
        b_node.stop()


def test_a_node_without_a_shared_folder_says_so(memex_server: object) -> None:
    served = memex_server
    a = client_for_test(served.url, served.keys["a"])  # type: ignore[attr-defined]
    sid = a.create()["id"]
    with pytest.raises(ServiceError) as err:
        a.park(sid)
    assert err.value.status == 409 and err.value.code == "not_configured"
    assert a.run(sid, "1 + 1")["result"]["value"] == "2"  # still here, untouched
    a.close_session(sid)


@pytest.mark.slow
def test_a_checkpoint_shared_on_one_node_restores_on_another(tmp_path: Path) -> None:
    """A held checkpoint lives in its node's memory until shared: then any node's restore of
    its id reads it from the shared folder. Another tenant cannot restore it, a corrupt
    copy is a typed error, and dropping it removes the shared copy too."""
    shared = tmp_path / "shared"
    a_node = start_server(tmp_path / "a", {"t": "", "u": ""}, server=f"shared_dir = '{shared}'")
    (tmp_path / "b").mkdir()
    b_config = tmp_path / "b" / "serve.toml"
    b_config.write_text(a_node.config.read_text())
    b_node = launch(b_config, a_node.keys)
    try:
        on_a = get_backend("remote", url=a_node.url, api_key=a_node.keys["t"])
        on_b = get_backend("remote", url=b_node.url, api_key=a_node.keys["t"])
        sa, sb = on_a.open(), on_b.open()
        sa.run("import numpy as np\nx = np.arange(6)\nkept = 'from a'")
        cp = sa.checkpoint()
        with pytest.raises(ServiceError) as err:  # not shared yet: B does not know it
            sb.restore(RemoteCheckpoint(cp.id, cp.turns))
        assert err.value.status == 404
        assert on_a.share(cp) is cp
        sb.restore(RemoteCheckpoint(cp.id, cp.turns))
        assert sb.run("int(x.sum()), kept").value == "(15, 'from a')"
        sb.run("kept = 'changed on b'")
        sb.restore(RemoteCheckpoint(cp.id, cp.turns))  # now held on B too
        assert sb.run("kept").value == "'from a'"
        u = get_backend("remote", url=b_node.url, api_key=a_node.keys["u"])
        su = u.open()
        with pytest.raises(ServiceError) as err:  # another tenant's id is not its own
            su.restore(RemoteCheckpoint(cp.id, cp.turns))
        assert err.value.status == 404
        # a corrupt shared copy is answered with a typed error, and nothing breaks
        other = sa.checkpoint()
        on_a.share(other)
        (shared / "t" / "checkpoints" / other.id).write_bytes(b"not an image")
        with pytest.raises(ImageError, match="cannot be read back"):  # the server's class
            sb.restore(RemoteCheckpoint(other.id, other.turns))
        assert sb.run("kept").value == "'from a'"
        client_for_test(a_node.url, a_node.keys["t"]).drop_checkpoint(cp.id)
        assert not (shared / "t" / "checkpoints" / cp.id).exists()
        with pytest.raises(ServiceError) as err:  # only a checkpoint held here is shared
            client_for_test(a_node.url, a_node.keys["t"]).share_checkpoint("c_nothing")
        assert err.value.status == 404
        for h in (sa, sb, su):
            h.close()
        for b in (on_a, on_b, u):
            b.close()
    finally:
        a_node.stop()
        b_node.stop()


def _modes(root: Path) -> dict[str, str]:
    """Each folder and file under ``root`` (itself included) and its mode, in octal."""
    found = {".": oct(stat.S_IMODE(root.stat().st_mode))}
    for p in root.rglob("*"):
        found[str(p.relative_to(root))] = oct(stat.S_IMODE(p.lstat().st_mode))
    return found


def _raw(url: str, method: str, path: str, key: str, body: bytes | None = None) -> int:
    """The status of a request sent as written (an HTTP client would fold ``..`` away)."""
    host, port = url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request(method, path, body=body, headers={
            "Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        return conn.getresponse().status
    finally:
        conn.close()


def test_state_at_rest_is_its_owner_s_and_ids_in_paths_are_names(tmp_path: Path) -> None:
    """Under the usual umask (022), the state folder, the shared folder and everything the
    server writes in them are 0700 folders and 0600 files: they hold every tenant's saved
    environment values and files. And an id in a path is a name: ``.``, ``..`` and their
    %-encodings are refused (422) on every route that takes one, without touching the shared
    folder (``.`` used to reach it as a path and answer 500)."""
    shared = tmp_path / "shared"
    old = os.umask(0o022)
    try:
        (tmp_path / "control").mkdir()  # the control: this umask leaves a folder open
        node = start_server(tmp_path / "a", {"t": ""},
                            server=f"shared_dir = '{shared}'\nstate_dir = 'state'")
    finally:
        os.umask(old)
    assert oct(stat.S_IMODE((tmp_path / "control").stat().st_mode)) == "0o755"
    key = node.keys["t"]
    try:
        c = client_for_test(node.url, key)
        sid = c.create(env={"API_TOKEN": "s3cret"})["id"]
        c.run(sid, "open('/tmp/notes.txt', 'w').write('private')")
        cid = c.checkpoint(sid)
        c.share_checkpoint(cid)
        parked = c.create()["id"]
        c.park(parked)
        state = tmp_path / "a" / "state"
        for root in (state, shared):
            modes = _modes(root)
            assert len(modes) > 1, root
            assert {p: m for p, m in modes.items()
                    if m != ("0o700" if (root / p).is_dir() else "0o600")} == {}, root
        assert (state / "state.db").is_file()
        assert (shared / "t" / "checkpoints" / cid).is_file()
        assert (shared / "t" / f"{parked}.image").is_file()

        # a separator makes another path, which no route serves
        assert _raw(node.url, "DELETE", "/v1/checkpoints/a%2fb", key) == 404
        for bad in ("..", ".", "%2e%2e", "%2E", "a.b", "%2e%2e%5c"):
            assert _raw(node.url, "DELETE", f"/v1/checkpoints/{bad}", key) == 422, bad
            assert _raw(node.url, "POST", f"/v1/checkpoints/{bad}/share", key) == 422, bad
            assert _raw(node.url, "POST", f"/v1/sessions/{bad}/unpark", key) == 422, bad
            assert _raw(node.url, "GET", f"/v1/sessions/{bad}", key) == 422, bad
        for bad in ("..", ".", "../t"):
            body = json.dumps({"checkpoint": bad}).encode()
            assert _raw(node.url, "POST", f"/v1/sessions/{sid}/restore", key, body) == 422
        assert (shared / "t" / "checkpoints" / cid).is_file()  # nothing was touched
        assert c.run(sid, "open('/tmp/notes.txt').read()")["result"]["value"] == "'private'"
        # the control: the checkpoint's own id is dropped, its shared copy with it
        assert _raw(node.url, "DELETE", f"/v1/checkpoints/{cid}", key) == 204
        assert not (shared / "t" / "checkpoints" / cid).exists()
        c.close_session(sid)
    finally:
        node.stop()
