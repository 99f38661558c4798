"""A restarted control actor answers before it reads the cluster's saved sessions (issue 47:
killed with 1,000 records in S3 it came back after 21-34 s, re-reading every record first).
It reads the config, and a tenant's saved sessions and checkpoints when something of that
tenant is first asked, through the storage's per-tenant index; the rest in the background.
The control actor is made here in this process (no Ray cluster, so no slab is adopted:
tests/service/test_cluster.py restarts a real one beside live slabs); the storage counts
which keys it is asked for."""

from __future__ import annotations

import json
import pickle
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("fsspec")

from memex import Limits
from memex.backends.internal import limits_to_wire
from memex.cluster._records import INDEXED_KEY, owner_key
from memex.cluster.internal import Control, Granted, Refused, Storage, checkpoint_key, session_key
from memex.errors import BackendBusy

MiB = 1 << 20


class Counted(Storage):
    """The storage, with the records each get asked for kept (in this process only)."""

    def __init__(self, uri: str) -> None:
        super().__init__(uri)
        self.got: list[str] = []

    def get(self, key: str, max_bytes: int) -> bytes | None:
        self.got.append(key)
        return super().get(key, max_bytes)

    def records(self) -> list[str]:
        return [k.split("/")[1] for k in self.got if k.endswith("/record")]


def _save(storage: Storage, sid: str, tenant: str, memory: int = 64 * MiB, *,
          indexed: bool = True) -> None:
    """A session's record as a slab saves it (no image: it ran nothing yet)."""
    spec = {"limits": limits_to_wire(Limits(memory=memory)), "mounts": [], "preload": []}
    storage.put(session_key(sid, "record"), json.dumps(
        {"id": sid, "tenant": tenant, "spec": spec, "turns": 2, "seq": 1, "image": None,
         "files": None, "files_kept": True, "door": False}).encode())
    if indexed:
        storage.put(owner_key(tenant, sid), b"")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Counted]:
    s = Counted(str(tmp_path / "storage"))
    for i in range(3):
        _save(s, f"s-a{i}", "a")
    for i in range(40):
        _save(s, f"s-b{i}", "b")
    s.put(checkpoint_key("a", "c-1", "meta"),
          json.dumps({"size": 8 * MiB, "turns": 1, "session": "s-a0"}).encode())
    s.put(INDEXED_KEY, b"1")
    s.got.clear()
    yield s


def _control(storage: Storage, backfill: bool) -> Control:
    return Control(storage, namespace="t", slab_memory=1 << 30, slab_cpus=1, save_interval=0,
                   monitor=3600, backfill=backfill)


def test_a_restart_reads_no_session_before_it_answers(store: Counted) -> None:
    c = _control(store, backfill=False)
    assert store.records() == []  # the config only, whatever the store holds
    assert c.sessions == {}
    assert c.stats()["loading"] is True
    listed = sorted(e["id"] for e in c.of("a"))  # a's first word: a's records, b's none
    assert listed == ["s-a0", "s-a1", "s-a2"]
    assert sorted(store.records()) == listed
    assert all(e["slab"] is None for e in c.of("a"))  # saved, opened on first use
    assert sorted(store.records()) == listed  # read once
    assert c.checkpoint("a", "c-1") is not None


def test_a_tenants_quota_counts_its_saved_sessions_from_its_first_request(
        store: Counted) -> None:
    """A tenant holding 3 x 64 MiB saved sessions and an 8 MiB checkpoint, bound to
    200 MiB: the first thing it asks after the restart is checked against all of them."""
    c = _control(store, backfill=False)
    bounds = {"max_memory": 200 * MiB, "max_checkpoints": 8}
    out = c.hold("a", bounds, "c-2", 1 * MiB, 1, "s-a0")  # 192 + 8 + 1 > 200
    assert isinstance(out, Refused) and out.code == "quota", out
    assert c.ledger.held("a")["sessions"] == 3
    out = c.hold("b", {"max_memory": 200 * MiB}, "c-3", 1 * MiB, 1, "s-b0")  # the control
    assert isinstance(out, Refused), out  # b holds 40 x 64 MiB
    assert c.hold("b", {"max_memory": 4000 * MiB}, "c-3", 1 * MiB, 1, "s-b0") == Granted("c-3")


def test_the_back_fill_reads_every_tenant_and_drops_markers_without_a_record(
        store: Counted) -> None:
    store.put(owner_key("a", "s-gone"), b"")  # its create never got as far as a save
    c = _control(store, backfill=True)
    assert c.read_back.loaded.wait(60)
    assert c.stats()["loading"] is False
    assert c.stats()["sessions"] == {"a": 3, "b": 40}
    assert "s-gone" not in c.sessions
    assert "s-gone" not in set(store.children("owners/a"))
    assert "s-a0" in set(store.children("owners/a"))


def test_a_store_from_before_the_index_is_indexed_once(tmp_path: Path) -> None:
    s = Counted(str(tmp_path / "storage"))
    for i in range(5):
        _save(s, f"s-old{i}", "old", indexed=False)
    c = _control(s, backfill=True)
    assert c.read_back.loaded.wait(60)
    assert sorted(e["id"] for e in c.of("old")) == [f"s-old{i}" for i in range(5)]
    assert s.get(INDEXED_KEY, 64) == b"1"
    assert sorted(s.children("owners/old")) == [f"s-old{i}" for i in range(5)]
    s.got.clear()
    c2 = _control(s, backfill=False)  # the next restart reads nothing of it up front
    assert s.records() == [] and c2.sessions == {}


def test_a_record_naming_another_tenant_is_not_taken_for_the_marker_s(
        store: Counted) -> None:
    """The index is a hint: the record says whose a session is (a marker put under the
    wrong tenant does not hand it over)."""
    store.put(owner_key("a", "s-b0"), b"")
    c = _control(store, backfill=False)
    assert "s-b0" not in {e["id"] for e in c.of("a")}
    assert c.ledger.held("a")["sessions"] == 3



class Failing(Counted):
    """The storage, failing every read of a session record or checkpoint meta while
    ``down`` (an object store that does not answer)."""

    down = True

    def get(self, key: str, max_bytes: int) -> bytes | None:
        if self.down and (key.endswith("/record") or key.endswith("/meta")):
            raise OSError("the storage did not answer")
        return super().get(key, max_bytes)


def test_a_storage_failure_while_a_tenant_is_read_back_forgets_nothing(
        tmp_path: Path) -> None:
    """A record the storage fails to give is not a record that is not there: the tenant's
    first request fails (BackendBusy ``unavailable``, which says why and which the front
    answers 503), its markers stay, nothing of it is taken as read,
    and its next request once the storage answers finds every session and checkpoint. The
    control: a marker with no record behind it is still dropped."""
    s = Failing(str(tmp_path / "storage"))
    for i in range(3):
        _save(s, f"s-a{i}", "a")
    s.put(owner_key("a", "s-gone"), b"")
    s.put(checkpoint_key("a", "c-1", "meta"),
          json.dumps({"size": 8 * MiB, "turns": 1, "session": "s-a0"}).encode())
    s.put(INDEXED_KEY, b"1")
    c = _control(s, backfill=False)
    with pytest.raises(BackendBusy, match="did not answer") as away:
        c.of("a")
    assert away.value.reason == "unavailable"  # the front's 503 with Retry-After
    assert pickle.loads(pickle.dumps(away.value)).reason == "unavailable"  # it crosses Ray
    assert sorted(s.children("owners/a")) == ["s-a0", "s-a1", "s-a2", "s-gone"]
    s.down = False
    assert sorted(e["id"] for e in c.of("a")) == ["s-a0", "s-a1", "s-a2"]
    assert c.ledger.held("a")["sessions"] == 3
    assert c.checkpoint("a", "c-1") is not None
    assert sorted(s.children("owners/a")) == ["s-a0", "s-a1", "s-a2"]
