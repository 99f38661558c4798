"""Sessions that outlive the server process (the session core's durability, for ``memex
serve`` and ``memex mcp --state-dir``): saved to ``state_dir``, evicted when idle, and brought
back after a restart or a ``kill -9`` with what was lost said, never silently.

A session's save is one row of ``state_dir/state.db`` (``_store``: SQLite, WAL, one
statement per save): how to open it again (limits, mounts, preload, env), its owner, its
parent and the turns its image holds; the guest state (zero chunks skipped); its /tmp files
(msgpack: guest path -> bytes, when they fit FILES_CAP); and the turns *begun* (updated as
each turn starts). A new session gets its row at once (without an image): a crash before its
first save brings it back empty, saying that every turn was lost.

A keeper thread saves every session whose state changed, at most once per ``save_interval``
seconds after its creation or its last save (0: after every turn), and evicts a session idle
for ``idle_evict`` seconds (saved, then its sandbox closed). A stopping server saves every
live session first (the log says how many it saved then, and how many hold their latest
state). After a restart each saved session is listed again and opened on its first use; the
session's ``notice`` then says the turn its image holds, how many turns begun after it were
lost, and whether its /tmp files came back (``files_kept``: false when they were over
FILES_CAP, or the backend cannot list them; links and empty folders are not kept). A session
whose save cannot be read back is ``lost``, with the reason.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import msgpack

from ..backends import Backend
from ..backends.internal import (
    ProcessCheckpoint,
    limits_from_wire,
    limits_to_wire,
    mounts_from_wire,
    mounts_to_wire,
    tmp_files,
    tmp_files_from,
)
from ..errors import ImageError, MemexError, SandboxLost
from ..runtime_wasm import Door, Mount, SandboxAPI
from ..runtime_wasm.internal import checkpoint_from_bytes, checkpoint_to_bytes, private_dir
from ._store import StateStore
from ._table import ID_PATTERN, CoreSession, SessionTable

__all__ = ["DurableSession", "Keeper", "session_fields"]
_SAFE = re.compile(ID_PATTERN)


@dataclass(kw_only=True, eq=False)
class DurableSession(CoreSession):
    """A session the keeper can save and open again: its door (the same across reopenings),
    what it was opened with, and the bookkeeping of its saves."""

    door: Door
    mounts: tuple[Mount, ...] = ()
    preload: tuple[str, ...] = ()
    env: dict[str, str] | None = None
    packages: tuple[str, ...] = ()  # pins of its guest packages
    parent: str | None = None
    turn_base: int = 0  # turns run before the current sandbox was opened (a restore)
    gen: int = 0  # changes of the guest state (turns, restores)
    saved_gen: int = -1
    saved_turns: int | None = None
    saved_at: float | None = None
    files_kept: bool = False  # its last save holds its /tmp files too
    notice: dict[str, Any] | None = None  # how much a restore lost, for the next answer
    lost: str | None = None  # why the session cannot be brought back
    fresh: bool = False  # its next opening starts an empty guest (new, or reset)

    @property
    def turns(self) -> int:
        return self.turn_base + (self.sandbox.turns if self.sandbox is not None else 0)


S = TypeVar("S", bound=DurableSession)


def _to_bytes(cp: Any) -> bytes:
    if isinstance(cp, ProcessCheckpoint):
        return cp.to_bytes()
    return checkpoint_to_bytes(cp)  # an in-process sandbox's Checkpoint


def _meta(s: DurableSession, turns: int, *, files_kept: bool) -> dict[str, Any]:
    """How to open the session again, and what its save holds."""
    return {"id": s.id, "tenant": s.owner, "limits": limits_to_wire(s.limits),
            "mounts": mounts_to_wire(s.mounts), "preload": list(s.preload), "env": s.env,
            "packages": list(s.packages), "created": s.created, "parent": s.parent,
            "turns": turns, "saved_at": time.time(), "files_kept": files_kept}


def session_fields(meta: dict[str, Any]) -> dict[str, Any]:
    """The fields of a :class:`DurableSession` its saved description gives (a front end
    adds its own, the door first)."""
    saved = int(meta["turns"])
    return {"id": meta["id"], "owner": meta["tenant"],
            "limits": limits_from_wire(meta["limits"]),
            "mounts": tuple(mounts_from_wire(meta["mounts"])),
            "preload": tuple(meta["preload"]), "env": meta["env"],
            "packages": tuple(str(p) for p in meta.get("packages") or ()),
            "created": float(meta["created"]), "parent": meta["parent"], "turn_base": saved,
            "saved_turns": saved, "saved_at": float(meta["saved_at"]),
            "files_kept": bool(meta.get("files_kept", False))}


class Keeper(Generic[S]):
    """Saves, evicts and revives the sessions of one server. Without ``state_dir`` it only
    hands out sandboxes (``using``: a ``fresh`` session's opened empty) and nothing is kept.

    ``make(meta)`` is a front end's session from its saved description; ``opener(s)`` opens
    a sandbox for a session (default: the backend's ``open`` with the session's settings);
    ``on_open(s, sb)`` prepares each sandbox opened (the front end's tools on its door)."""

    def __init__(self, table: SessionTable[S], backend: Callable[[], Backend], *,
                 make: Callable[[dict[str, Any]], S],
                 state_dir: Path | None, save_interval: float, idle_evict: float | None,
                 on_open: Callable[[S, SandboxAPI[Any]], None] | None = None,
                 opener: Callable[[S], SandboxAPI[Any]] | None = None,
                 log: logging.Logger | None = None) -> None:
        self.table, self.backend, self.on_open = table, backend, on_open
        self.make, self.opener = make, opener
        self.log = log or logging.getLogger("memex.serving")
        self.root, self.save_interval, self.idle_evict = state_dir, save_interval, idle_evict
        self._store: StateStore | None = None
        self._store_lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def durable(self) -> bool:
        return self.root is not None

    def store(self) -> StateStore:
        assert self.root is not None
        with self._store_lock:
            if self._store is None:
                self._store = StateStore(self.root)
            return self._store

    @staticmethod
    def safe_id(name: str) -> bool:
        """Whether ``name`` may name a saved session or checkpoint (a file name, no path)."""
        return bool(_SAFE.match(name))

    @staticmethod
    def image_bytes(checkpoint: object) -> bytes:
        """A checkpoint of any backend as the bytes a save holds."""
        return _to_bytes(checkpoint)

    @staticmethod
    def describe(s: DurableSession, turns: int, *, files_kept: bool) -> dict[str, Any]:
        """A session's saved description (how to open it again, what its save holds)."""
        return _meta(s, turns, files_kept=files_kept)

    # ---- handing out the sandbox ----------------------------------------------------------
    @contextlib.contextmanager
    def using(self, s: S) -> Iterator[SandboxAPI[Any]]:
        """The session's sandbox (the core's ``CoreSession.use``), opened again first if it
        was evicted or the server restarted; never evicted or saved while in use."""
        def reopen() -> SandboxAPI[Any]:
            self._revive(s)
            assert s.sandbox is not None
            return s.sandbox

        with s.use(reopen) as sb:
            try:
                yield sb
            except SandboxLost as exc:  # its worker died: back from the last save, if any
                turn = self._fall_back(s, sb, str(exc))
                if turn is None:
                    raise
                raise SandboxLost(f"{exc}; the next request opens its last save (turn "
                                  f"{turn})") from exc

    def _fall_back(self, s: S, sb: SandboxAPI[Any], why: str) -> int | None:
        """The sandbox is gone for good; the next use opens the last save (saying what was
        lost): the turn it holds. With no save the session stays lost (None)."""
        with s.lock:
            if s.sandbox is not sb:
                return s.saved_turns if s.sandbox is None and s.lost is None else None
            s.sandbox = None
            if self.root is None or s.saved_turns is None:
                s.lost = why
                return None
            lost = max(0, s.turn_base + sb.turns - s.saved_turns)
            s.turn_base, s.saved_gen = s.saved_turns, s.gen
            s.notice = {"from_turn": s.saved_turns, "lost_turns": lost,
                        "files_kept": s.files_kept, "saved_at": s.saved_at,
                        "reason": f"its sandbox was lost ({why})"}
        self.log.info(json.dumps({"event": "fall_back", "tenant": s.owner, "session": s.id,
                             "from_turn": s.saved_turns, "why": why}))
        return s.saved_turns

    def turn_begins(self, s: S) -> None:
        if self.root is not None:
            with contextlib.suppress(sqlite3.Error):
                self.store().begun(s.id, s.turns + 1)

    def added(self, s: S) -> None:
        """A new session: its row at once, without an image (a crash before its first save
        brings it back empty, saying so)."""
        self.changed(s)
        if self.root is not None:
            with contextlib.suppress(sqlite3.Error):
                self.store().save(s.id, s.owner, _meta(s, 0, files_kept=False), None, None)

    def changed(self, s: S) -> None:
        s.gen += 1
        if self.save_interval == 0:
            self._wake.set()

    # ---- saves ----------------------------------------------------------------------------
    def save(self, s: S, wait: float = 0.0) -> bool:
        """Save the session's state if it changed since its last save, once no use of it is
        running (waiting up to ``wait`` seconds); True if saved."""
        if self.root is None:
            return False
        with s.alone(wait) as alone:
            sb, gen = s.sandbox, s.gen
            if not alone or sb is None or gen == s.saved_gen:
                return False
            try:
                turns, blob, files = self._state(s, sb)
                self.store().save(s.id, s.owner, _meta(s, turns, files_kept=files is not None),
                                  blob, msgpack.packb(files or {}, use_bin_type=True))
            except (MemexError, OSError, sqlite3.Error) as exc:
                self.log.info(json.dumps({"event": "save_failed", "tenant": s.owner,
                                     "session": s.id, "error": f"{type(exc).__name__}: {exc}"}))
                return False
        s.files_kept = files is not None
        s.saved_gen, s.saved_turns, s.saved_at = gen, turns, time.time()
        return True

    @staticmethod
    def _state(s: S, sb: SandboxAPI[Any]) -> tuple[int, bytes, dict[str, bytes] | None]:
        """(the turns it holds, the image, the /tmp files or None when they do not fit)."""
        turns = s.turns
        return turns, _to_bytes(sb.checkpoint()), tmp_files(sb)

    def forget(self, s: S) -> None:
        if self.root is not None:
            with contextlib.suppress(sqlite3.Error):
                self.store().forget(s.id)

    def _revive(self, s: S, folder: Path | None = None) -> None:
        """Open the session again from its image and files in ``folder`` (default: this
        node's own for its tenant); called with ``s.lock`` held."""
        if s.lost is not None:
            raise SandboxLost(s.lost)
        if self.root is None and folder is None and not s.fresh:
            raise SandboxLost("the session has no sandbox and the server keeps no state")
        try:
            if s.fresh and folder is None:  # nothing to read back: an empty guest
                blob, packed = None, None
            elif folder is None:
                blob, packed = self.store().state(s.id)
            else:
                blob = (folder / f"{s.id}.image").read_bytes()
                files_path = folder / f"{s.id}.files"
                packed = files_path.read_bytes() if files_path.exists() else None
            files = tmp_files_from(packed)
            cp = self._from_bytes(blob, s.limits.memory) if blob is not None else None
        except (OSError, ImageError, ValueError, sqlite3.Error) as exc:
            s.lost = f"its saved state cannot be read back: {exc}"
            raise SandboxLost(s.lost) from exc
        sb = self.opener(s) if self.opener is not None else self.backend().open(
            limits=s.limits, mounts=s.mounts, preload=s.preload, door=s.door, env=s.env,
            tenant=s.owner, packages=s.packages)
        try:
            if cp is not None:  # a session that crashed before its first save starts empty
                sb.restore(cp)
            for path, data in files.items():
                sb.write_file(path, data)
        except MemexError as exc:
            sb.close()
            s.lost = f"its saved state does not fit a new sandbox: {exc}"
            raise SandboxLost(s.lost) from exc
        if self.on_open is not None:
            try:
                self.on_open(s, sb)
            except BaseException:
                sb.close()
                raise
        s.sandbox, s.saved_gen, s.fresh = sb, s.gen, False
        self.log.info(json.dumps({"event": "revive", "tenant": s.owner, "session": s.id,
                                  "turns": s.turns}))

    def _before_load(self) -> None:
        """What a front end does to its state_dir before the sessions are listed."""

    def load(self) -> int:
        """List every saved session again (opened on first use); how many."""
        if self.root is None or not self.root.is_dir():
            return 0
        self._before_load()
        n = 0
        for row in self.store().sessions():
            s = self._listed(row, "the server restarted")
            if s is not None:
                self.table.add(s)
                n += 1
        return n

    def saved(self, owner: str, sid: str) -> S | None:
        """The owner's session ``sid`` as it was last saved, made again from its row
        (opened on first use; the caller adds it to the table within its bounds), or None
        when the server keeps no row of the owner's by that id."""
        if self.root is None or not self.safe_id(sid):
            return None
        try:
            row = self.store().row(sid)
        except sqlite3.Error:
            return None
        if row is None or row.tenant != owner:
            return None
        return self._listed(row, "it was put away to make room for another session")

    def _listed(self, row: Any, reason: str) -> S | None:
        """A session from its row, saying what its save holds (None: a row that does not
        describe itself, logged)."""
        try:
            meta = row.meta
            if not (_SAFE.match(row.id) and meta.get("id") == row.id
                    and meta.get("tenant") == row.tenant):
                raise ValueError("the row's description names another session")
            s = self.make(meta)
        except (ValueError, KeyError, TypeError, MemexError) as exc:
            self.log.info(json.dumps({"event": "load_failed", "session": row.id,
                                 "error": f"{type(exc).__name__}: {exc}"}))
            return None
        saved = s.turn_base
        if not row.has_image:
            s.saved_turns = None  # never saved: it comes back empty
        s.notice = {"from_turn": saved if row.has_image else 0,
                    "lost_turns": max(0, row.begun - (saved if row.has_image else 0)),
                    "files_kept": s.files_kept, "saved_at": s.saved_at, "reason": reason}
        if not row.has_image:
            s.turn_base = 0
        return s

    def _from_bytes(self, blob: bytes, max_memory: int) -> Any:
        """A checkpoint of this server's backend from its saved bytes (``_to_bytes``),
        refused before it inflates when its memory would pass the session's own limit (a
        state file is outside input: it is decoded at the depth the session may hold)."""
        if self.opener is not None or self.backend().name == "inprocess":
            return checkpoint_from_bytes(blob, max_memory=max_memory)
        return ProcessCheckpoint.from_bytes(blob, max_memory=max_memory)

    # ---- the keeper thread ----------------------------------------------------------------
    def start(self) -> None:
        if self.root is None:
            return
        private_dir(self.root)
        self._thread = threading.Thread(target=self._loop, name="memex-serve-keeper",
                                        daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        tick = 1.0 if self.save_interval == 0 else min(1.0, self.save_interval)
        while not self._stop.is_set():
            self._wake.wait(tick)
            self._wake.clear()
            now = time.time()
            for s in self.table.all():
                if self._stop.is_set():
                    break
                if s.sandbox is None or s.running:
                    continue
                # due save_interval after its last save, or after its creation: a server
                # told to save hourly does not save a new session at its first tick
                since = s.saved_at if s.saved_at is not None else s.created
                if s.gen != s.saved_gen and now - since >= self.save_interval:
                    self.save(s)
            if self.idle_evict is not None:  # the core's idle sessions (none in use)
                for s in self.table.idle(self.idle_evict, now):
                    if self._stop.is_set():
                        break
                    if s.sandbox is not None:
                        self._evict(s)

    def _evict(self, s: S) -> None:
        if s.gen != s.saved_gen and not self.save(s):
            return  # keep it live rather than lose it
        with s.lock:
            if s.running or s.sandbox is None or s.gen != s.saved_gen:
                return
            s.turn_base = s.saved_turns or 0
            # in the same step as the sandbox goes: whoever sees the session not live sees
            # why (the close below may take a while)
            s.notice = {"from_turn": s.turn_base, "lost_turns": 0,
                        "files_kept": s.files_kept, "saved_at": s.saved_at,
                        "reason": f"evicted after {self.idle_evict:g} s idle"}
            sb, s.sandbox = s.sandbox, None
        with contextlib.suppress(MemexError):
            sb.close()
        self.log.info(json.dumps({"event": "evict", "tenant": s.owner, "session": s.id,
                             "turns": s.turn_base}))

    def stop(self, sessions: list[S]) -> tuple[int, int]:
        """Stop the thread, save every live session that changed, close them all: (how many
        were saved now, how many hold their latest state: saved now or before, unchanged
        since; without state_dir none)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(30)
        saved = sum(1 for s in sessions if self.save(s, wait=30.0))
        current = sum(1 for s in sessions if self.root is not None and (
            s.gen == s.saved_gen or s.sandbox is None) and s.lost is None)
        for s in sessions:
            if s.sandbox is not None:
                with contextlib.suppress(MemexError):
                    s.sandbox.close()
        if self._store is not None:
            self._store.close()
        return saved, current
