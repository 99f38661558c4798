"""Two `memex serve` nodes on 127.0.0.1 sharing one parking folder: a session pinned to node A
is parked, taken by node B with its state, and is then B's alone; only one node can take a
parked session, another tenant cannot, and a node without a shared folder says so."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from served import launch, start_server

from memex import ImageError, SandboxClosed, ServiceError
from memex.backends import Client, RemoteCheckpoint, get_backend
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
        assert Client(a_node.url, a_node.keys["t"]).sessions() == []  # gone from A
        u = Client(b_node.url, a_node.keys["u"])
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
        a = Client(a_node.url, key)
        sid = a.create()["id"]
        a.run(sid, "x = 1")
        a.park(sid)
        wins: list[str] = []
        errors: list[int | None] = []

        def take(url: str) -> None:
            try:
                Client(url, key).unpark(sid)
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
        assert Client(wins[0], key).run(sid, "x")["result"]["value"] == "1"
    finally:
        a_node.stop()
        b_node.stop()


def test_a_node_without_a_shared_folder_says_so(memex_server: object) -> None:
    served = memex_server
    a = Client(served.url, served.keys["a"])  # type: ignore[attr-defined]
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
        Client(a_node.url, a_node.keys["t"]).drop_checkpoint(cp.id)
        assert not (shared / "t" / "checkpoints" / cp.id).exists()
        with pytest.raises(ServiceError) as err:  # only a checkpoint held here is shared
            Client(a_node.url, a_node.keys["t"]).share_checkpoint("c_nothing")
        assert err.value.status == 404
        for h in (sa, sb, su):
            h.close()
        for b in (on_a, on_b, u):
            b.close()
    finally:
        a_node.stop()
        b_node.stop()
