"""A whole-cluster restart with its storage on a real S3-compatible server on 127.0.0.1: every
saved session and held checkpoint comes back on the new cluster, flagged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from served import launch, loopback_cluster, tenant_table

from memex import Limits, RemoteBackend
from memex.backends.internal import Client, RemoteCheckpoint

pytestmark = [pytest.mark.ray, pytest.mark.slow]
pytest.importorskip("ray")
pytest.importorskip("s3fs")

GiB = 1 << 30


def start(folder: Path, s3: dict[str, Any], key: str) -> tuple[Any, Any]:
    cluster = loopback_cluster({}, {"num_cpus": 2, "memory": 2 * GiB})
    folder.mkdir(parents=True, exist_ok=True)
    endpoint = s3["endpoint"]
    config = folder / "serve.toml"
    config.write_text(
        "[server]\nport = 0\nwarm_timeout = 20\n"
        f'[cluster]\naddress = "{cluster.address}"\nstorage = "{s3["uri"]}/restart"\n'
        f"slab_memory = {GiB}\nsave_interval = 0\nplace_timeout = 30\n"
        '[cluster.storage_options]\nkey = "testing"\nsecret = "testing"\n'
        f'client_kwargs = {{endpoint_url = "{endpoint}", region_name = "us-east-1"}}\n'
        + tenant_table("a", key, "[tenants.a.ceiling]\nmemory = 268435456\n"))
    return cluster, launch(config, {"a": key})


def test_every_saved_session_comes_back_after_a_whole_cluster_restart(
        tmp_path: Path, s3_server: dict[str, Any]) -> None:
    key = "key-a-" + "r" * 24
    cluster, front = start(tmp_path / "one", s3_server, key)
    try:
        with RemoteBackend(url=front.url, api_key=key) as b:
            sb = b.open(limits=Limits(memory=128 << 20, timeout=20))
            sb.run("kept = 42\nopen('/tmp/note.txt', 'w').write('still here')")
            cp = sb.checkpoint()
            sb.run("kept = 43")
            sid = sb.detach()
    finally:
        front.stop()
        cluster.shutdown()
    cluster, front = start(tmp_path / "two", s3_server, key)  # nothing of the first but S3
    try:
        with Client(front.url, key) as client:  # listed at once, opened or not yet
            assert [x["id"] for x in client.sessions()] == [sid]
        with RemoteBackend(url=front.url, api_key=key) as b:
            sb = b.attach(sid)
            r = sb.run("kept, open('/tmp/note.txt').read()")
            assert r.value == "(43, 'still here')", r
            assert sb.restored is not None and sb.restored["from_turn"] == 2, sb.restored
            assert "restarted" in sb.restored["reason"]
            sb.restore(RemoteCheckpoint(cp.id, cp.turns))  # held checkpoints came back too
            assert sb.run("kept").value == "42"
            sb.close()
    finally:
        front.stop()
        cluster.shutdown()
