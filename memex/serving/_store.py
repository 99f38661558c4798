"""Where a durable server keeps its sessions: ``state_dir/state.db``, SQLite in WAL mode,
one row per session holding its description, its image, its /tmp files and the turns its
image holds, written by one statement: a save is one atomic step, so a ``kill -9`` at any
instant leaves every session either as its previous save or as its new one, never an image
of one turn beside the description of another. The turns *begun* (updated as each turn
starts) live in the same row, so that after a crash a session says how many turns were lost.

Writes are synchronous (``synchronous=FULL``): a save that returned survives a power loss too.
The folder is 0700 and the database files 0600 whatever the umask: a row holds a session's
environment values and /tmp files in clear. Sessions saved by earlier versions
(``<tenant>/<id>.json`` with ``.image``, ``.files`` and ``.turns`` beside it) are moved in on
start.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..runtime_wasm import private_dir

__all__ = ["SavedSession", "StateStore"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    meta TEXT NOT NULL,
    image BLOB,
    files BLOB,
    turns_begun INTEGER NOT NULL DEFAULT 0
)
"""


class SavedSession:
    """One row as :meth:`StateStore.sessions` lists it (the image and files are read on
    use, with :meth:`StateStore.state`)."""

    __slots__ = ("begun", "has_image", "id", "meta", "tenant")

    def __init__(self, sid: str, tenant: str, meta: dict[str, Any], begun: int,
                 has_image: bool) -> None:
        self.id, self.tenant, self.meta = sid, tenant, meta
        self.begun, self.has_image = begun, has_image


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

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def save(self, sid: str, tenant: str, meta: dict[str, Any], image: bytes | None,
             files: bytes | None) -> None:
        """The session's whole state, in one statement (its turns begun kept)."""
        with self._lock:
            self._db.execute(
                "INSERT INTO sessions (id, tenant, meta, image, files) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT(id) DO UPDATE SET tenant=excluded.tenant, meta=excluded.meta, "
                "image=excluded.image, files=excluded.files",
                (sid, tenant, json.dumps(meta), image, files))

    def begun(self, sid: str, turns: int) -> None:
        """A turn of the session starts: the turns begun, for what a crash would lose."""
        with self._lock:
            self._db.execute("UPDATE sessions SET turns_begun=? WHERE id=?", (turns, sid))

    def forget(self, sid: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM sessions WHERE id=?", (sid,))

    def sessions(self) -> Iterator[SavedSession]:
        with self._lock:
            rows = self._db.execute("SELECT id, tenant, meta, turns_begun, image IS NOT NULL "
                                    "FROM sessions ORDER BY id").fetchall()
        for sid, tenant, meta, begun, has_image in rows:
            try:
                parsed = json.loads(meta)
            except ValueError:
                parsed = None
            yield SavedSession(str(sid), str(tenant), parsed if isinstance(parsed, dict)
                               else {}, int(begun or 0), bool(has_image))

    def state(self, sid: str) -> tuple[bytes | None, bytes | None]:
        """(image, files) of the session's last save."""
        with self._lock:
            row = self._db.execute("SELECT image, files FROM sessions WHERE id=?",
                                   (sid,)).fetchone()
        if row is None:
            return None, None
        return row[0], row[1]
