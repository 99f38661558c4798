"""Where a durable server keeps its sessions: ``state_dir/state.db``, SQLite in WAL mode,
one row per session holding its description and the turns its image holds, and naming the
files that hold its image and its /tmp files (``state_dir/blobs/``). A save writes the two
files under new names (each fsynced, then the folder), then points the row at them in one
statement, then removes the files of the save before: a ``kill -9`` at any instant leaves
every session either as its previous save or as its new one, never an image of one turn
beside the description of another (files no row names are removed on the next start).
The turns *begun* (updated as each turn starts) live in the same row, so that after a crash
a session says how many turns were lost.

Only small statements run under the database's lock: writing a 100 MiB image holds nothing
another session's create, turn start or save needs (one principal's saves used to stall
every other principal's creates and turns behind one lock, p99 7-14x). Writes are
synchronous (``synchronous=FULL``): a save that returned survives a power loss too. The
folders are 0700 and the files 0600 whatever the umask: a session's environment values and
/tmp files are in them in clear. Rows of earlier versions that hold their image and files
in the row itself are still read; sessions saved by versions before that
(``<tenant>/<id>.json`` with ``.image``, ``.files`` and ``.turns`` beside it) are moved in on
start.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..runtime_wasm.internal import atomic_write, private_dir

__all__ = ["SavedSession", "StateStore"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    meta TEXT NOT NULL,
    image BLOB,
    files BLOB,
    turns_begun INTEGER NOT NULL DEFAULT 0,
    image_file TEXT,
    files_file TEXT
)
"""
_COLUMNS = ("image_file", "files_file")  # added after the first schema: ALTER on open


class SavedSession:
    """One row as :meth:`StateStore.sessions` lists it (the image and files are read on
    use, with :meth:`StateStore.state`)."""

    __slots__ = ("begun", "has_image", "id", "meta", "tenant")

    def __init__(self, sid: str, tenant: str, meta: dict[str, Any], begun: int,
                 has_image: bool) -> None:
        self.id, self.tenant, self.meta = sid, tenant, meta
        self.begun, self.has_image = begun, has_image


def _saved(sid: Any, tenant: Any, meta: Any, begun: Any, has_image: Any) -> SavedSession:
    try:
        parsed = json.loads(meta)
    except (TypeError, ValueError):
        parsed = None
    return SavedSession(str(sid), str(tenant), parsed if isinstance(parsed, dict) else {},
                        int(begun or 0), bool(has_image))


class StateStore:
    """The sessions of one durable server (thread-safe: one connection behind a lock)."""

    def __init__(self, root: Path) -> None:
        private_dir(root)
        self.path = root / "state.db"
        # 0600 before SQLite opens it (its -wal and -shm files take the database's mode),
        # and tightened if an earlier version made it under the umask
        os.close(os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
        for p in (self.path, root / "state.db-wal", root / "state.db-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.chmod(p, 0o600)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None,
                                   timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute(_SCHEMA)
        have = {r[1] for r in self._db.execute("PRAGMA table_info(sessions)")}
        for col in _COLUMNS:
            if col not in have:
                self._db.execute(f"ALTER TABLE sessions ADD COLUMN {col} TEXT")
        self.blobs = private_dir(root / "blobs")
        self._sweep()

    def _sweep(self) -> None:
        """Remove the files no row names: a save's files written before a crash (or a
        restart) that kept the row on its save before, and the save before's files left
        when a crash came between the row and their removal."""
        with self._lock:
            named = {n for row in self._db.execute(
                "SELECT image_file, files_file FROM sessions") for n in row if n}
        with contextlib.suppress(OSError), os.scandir(self.blobs) as it:
            for e in it:
                if e.name not in named:
                    with contextlib.suppress(OSError):
                        os.unlink(e.path)

    def _write(self, name: str, data: bytes) -> None:
        atomic_write(self.blobs / name, data, private=True)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def save(self, sid: str, tenant: str, meta: dict[str, Any], image: bytes | None,
             files: bytes | None) -> None:
        """The session's whole state (its turns begun kept): its image and files written
        to new files outside the lock, then the row pointed at them in one statement."""
        names: tuple[str | None, str | None] = (None, None)
        if image is not None or files is not None:
            stem = f"{sid}.{secrets.token_hex(8)}"
            names = (f"{stem}.image" if image is not None else None,
                     f"{stem}.files" if files is not None else None)
            for name, data in zip(names, (image, files), strict=True):
                if name is not None and data is not None:
                    self._write(name, data)
            fd = os.open(self.blobs, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:  # the renames durable before the row names them
                os.fsync(fd)
            finally:
                os.close(fd)
        with self._lock:
            old = self._db.execute("SELECT image_file, files_file FROM sessions WHERE id=?",
                                   (sid,)).fetchone()
            self._db.execute(
                "INSERT INTO sessions (id, tenant, meta, image, files, image_file, files_file)"
                " VALUES (?, ?, ?, NULL, NULL, ?, ?) "
                "ON CONFLICT(id) DO UPDATE SET tenant=excluded.tenant, meta=excluded.meta, "
                "image=NULL, files=NULL, image_file=excluded.image_file, "
                "files_file=excluded.files_file",
                (sid, tenant, json.dumps(meta), names[0], names[1]))
        self._unlink(old)

    def _unlink(self, names: tuple[str | None, ...] | None) -> None:
        for name in names or ():
            if name:
                with contextlib.suppress(FileNotFoundError):
                    (self.blobs / name).unlink()

    def begun(self, sid: str, turns: int) -> None:
        """A turn of the session starts: the turns begun, for what a crash would lose."""
        with self._lock:
            self._db.execute("UPDATE sessions SET turns_begun=? WHERE id=?", (turns, sid))

    def forget(self, sid: str) -> None:
        with self._lock:
            old = self._db.execute("SELECT image_file, files_file FROM sessions WHERE id=?",
                                   (sid,)).fetchone()
            self._db.execute("DELETE FROM sessions WHERE id=?", (sid,))
        self._unlink(old)

    def sessions(self) -> Iterator[SavedSession]:
        with self._lock:
            rows = self._db.execute("SELECT id, tenant, meta, turns_begun, image IS NOT NULL "
                                    "OR image_file IS NOT NULL FROM sessions ORDER BY id"
                                    ).fetchall()
        for found in rows:
            yield _saved(*found)

    def row(self, sid: str) -> SavedSession | None:
        """One session's row as :meth:`sessions` lists it (None when it has none)."""
        with self._lock:
            found = self._db.execute("SELECT id, tenant, meta, turns_begun, image IS NOT NULL "
                                     "OR image_file IS NOT NULL FROM sessions WHERE id=?",
                                     (sid,)).fetchone()
        return _saved(*found) if found is not None else None

    def state(self, sid: str) -> tuple[bytes | None, bytes | None]:
        """(image, files) of the session's last save (OSError when a file it names cannot
        be read)."""
        with self._lock:
            row = self._db.execute("SELECT image, files, image_file, files_file FROM sessions "
                                   "WHERE id=?", (sid,)).fetchone()
        if row is None:
            return None, None
        image, files, image_file, files_file = row
        if image_file:
            image = (self.blobs / image_file).read_bytes()
        if files_file:
            files = (self.blobs / files_file).read_bytes()
        return image, files
