"""The durable servers' store (``memex.serving._store.StateStore``): a save writes its image
and files outside the database's lock, so one session's large save never holds what
another session's create, turn start or save needs; a save is still whole or absent; files
no row names are removed on the next start; everything is its owner's alone."""

from __future__ import annotations

import os
import sqlite3
import stat
import threading
from pathlib import Path

import pytest

from memex.serving._store import StateStore


def test_a_save_in_progress_holds_nothing_another_session_needs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A save whose image is still being written (held at the write, as a 100 MiB one
    would be) does not stop another session's row, turn start or save; the control: the
    same calls run as usual once the save is done, and the save is then read back."""
    store = StateStore(tmp_path / "state")
    store.save("s_big", "a", {"id": "s_big"}, None, None)
    real_write = StateStore._write
    writing, done = threading.Event(), threading.Event()

    def slow_write(self: StateStore, name: str, data: bytes) -> None:
        if name.startswith("s_big."):
            writing.set()
            assert done.wait(60)
        real_write(self, name, data)

    monkeypatch.setattr(StateStore, "_write", slow_write)
    saver = threading.Thread(target=store.save,
                             args=("s_big", "a", {"id": "s_big"}, b"I" * 4096, b"F"))
    saver.start()
    try:
        assert writing.wait(60)
        # while the big save is mid-write: another tenant's create, turn start and save
        store.save("s_other", "b", {"id": "s_other"}, None, None)
        store.begun("s_other", 1)
        store.save("s_other", "b", {"id": "s_other"}, b"small", b"f")
        assert store.state("s_other") == (b"small", b"f")
        assert store.state("s_big") == (None, None)  # its save is not there yet: whole
    finally:
        done.set()
        saver.join(60)
    assert store.state("s_big") == (b"I" * 4096, b"F")
    assert {r.id: r.has_image for r in store.sessions()} == {"s_big": True, "s_other": True}
    store.close()


def test_a_save_replaces_its_files_and_a_restart_sweeps_the_rest(tmp_path: Path) -> None:
    root = tmp_path / "state"
    store = StateStore(root)
    store.save("s_1", "a", {"id": "s_1"}, b"one", b"f1")
    first = sorted(os.listdir(root / "blobs"))
    store.save("s_1", "a", {"id": "s_1"}, b"two", b"f2")
    second = sorted(os.listdir(root / "blobs"))
    assert len(first) == len(second) == 2 and not set(first) & set(second)
    store.save("s_2", "a", {"id": "s_2"}, b"x", None)
    store.forget("s_2")  # its files go with its row
    assert sorted(os.listdir(root / "blobs")) == second
    store.close()
    # a crash left a save's files that no row names (written, row not updated yet)
    (root / "blobs" / "s_1.deadbeefdeadbeef.image").write_bytes(b"three")
    again = StateStore(root)
    assert sorted(os.listdir(root / "blobs")) == second
    assert again.state("s_1") == (b"two", b"f2")
    again.close()


def test_rows_of_the_earlier_layout_are_read(tmp_path: Path) -> None:
    """A row that holds its image and files itself (the layout before) reads as it did."""
    root = tmp_path / "state"
    root.mkdir()
    with sqlite3.connect(root / "state.db") as db:
        db.execute("CREATE TABLE sessions (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, meta "
                   "TEXT NOT NULL, image BLOB, files BLOB, turns_begun INTEGER NOT NULL "
                   "DEFAULT 0)")
        db.execute("INSERT INTO sessions VALUES ('s_old', 'a', '{}', x'01', x'02', 3)")
    store = StateStore(root)
    assert store.state("s_old") == (b"\x01", b"\x02")
    assert [(r.id, r.begun, r.has_image) for r in store.sessions()] == [("s_old", 3, True)]
    store.save("s_old", "a", {}, b"new", None)  # saved again: in the new layout
    assert store.state("s_old") == (b"new", None)
    store.close()


def test_the_store_is_its_owner_s_alone(tmp_path: Path) -> None:
    """0700 folders and 0600 files under the usual umask (the control: a folder made
    without care under it is 0755)."""
    old = os.umask(0o022)
    try:
        store = StateStore(tmp_path / "state")
        store.save("s_1", "a", {"env": {"TOKEN": "x"}}, b"img", b"files")
        (tmp_path / "control").mkdir()
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "control").stat().st_mode) == 0o755
    root = tmp_path / "state"
    modes = {str(p.relative_to(root)): oct(stat.S_IMODE(p.stat().st_mode))
             for p in [root, *root.rglob("*")]}
    assert {p: m for p, m in modes.items()
            if m != ("0o700" if (root / p).is_dir() else "0o600")} == {}, modes
    store.close()
