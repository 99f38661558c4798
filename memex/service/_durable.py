"""Sessions that outlive the server process: saved to ``state_dir``, evicted when idle, and
brought back after a restart or a ``kill -9`` with what was lost said, never silently.

A session's save is one row of ``state_dir/state.db`` (``_store``: SQLite, WAL, one
statement per save): how to open it again (limits, mounts, preload, env), its parent and the
turns its image holds; the guest state (``ProcessCheckpoint.to_bytes``: zero chunks skipped);
its /tmp files (msgpack: guest path -> bytes, when they fit FILES_CAP); and the turns *begun*
(updated as each turn starts). A new session gets its row at once (without an image): a
crash before its first save brings it back empty, saying that every turn was lost.

A keeper thread saves every session whose state changed, at most once per ``save_interval``
seconds after its creation or its last save (0: after every turn), and evicts a session idle
for ``idle_evict`` seconds (saved, then its sandbox closed). A stopping server saves every
live session first (the log says how many it saved then, and how many hold their latest
state). After a restart
each saved session is listed again and opened on its first use; that answer carries
``restored``: the turn its image holds, how many turns begun after it were lost, and whether
its /tmp files came back (``files_kept``: false when they were over FILES_CAP, or the backend
cannot list them; links and empty folders are not kept). A session whose save cannot be read
back answers 410 ``session_lost`` with the reason.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack

from ..backends import Backend, ProcessCheckpoint, ProcessSandbox
from ..backends.worker import limits_from_wire, limits_to_wire, mounts_from_wire, mounts_to_wire
from ..errors import GuestFileTooLarge, ImageError, MemexError, SandboxError, SandboxLost
from ..runtime_wasm import (
    DecodeCost,
    Sandbox,
    SandboxAPI,
    checkpoint_from_bytes,
    checkpoint_to_bytes,
    unpack_bounded,
)
from ._config import TenantConfig
from ._door import ClientDoor
from ._sessions import QuotaExceeded, Session, SessionTable
from ._store import StateStore

__all__ = ["Keeper"]

LOG = logging.getLogger("memex.service.audit")
FILES_CAP = 64 << 20
"""Bytes of /tmp files a save keeps; past it only the interpreter state is kept."""
FILES_ENTRIES = 10_000
"""Files a save keeps at most (past it, as past FILES_CAP, only the interpreter state)."""
_SAFE = re.compile(r"^[A-Za-z0-9_.-]+$")


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _files_of(sb: SandboxAPI[Any]) -> dict[str, bytes] | None:
    """The session's /tmp files by guest path, or None when they cannot all be kept."""
    if not isinstance(sb, Sandbox | ProcessSandbox):
        return None
    out: dict[str, bytes] = {}
    total = entries = 0
    todo = ["/tmp"]
    while todo:  # iterative, bounded in bytes and in entries
        for f in sb.list_files(todo.pop()):
            entries += 1
            if entries > FILES_ENTRIES:
                return None
            if f.kind == "dir":
                todo.append(f.path)
            elif f.kind == "file":
                total += f.size
                if total > FILES_CAP:
                    return None
                try:
                    data = sb.read_file(f.path, max_bytes=FILES_CAP - total + f.size)
                except GuestFileTooLarge:
                    return None
                total += len(data) - f.size
                out[f.path] = data
    return out


def _to_bytes(cp: Any) -> bytes:
    if isinstance(cp, ProcessCheckpoint):
        return cp.to_bytes()
    return checkpoint_to_bytes(cp)  # an in-process sandbox's Checkpoint


def _meta(s: Session, turns: int, *, files_kept: bool) -> dict[str, Any]:
    """How to open the session again, and what its save holds."""
    return {"id": s.id, "tenant": s.tenant, "limits": limits_to_wire(s.limits),
            "mounts": mounts_to_wire(s.mounts), "preload": list(s.preload), "env": s.env,
            "created": s.created, "parent": s.parent, "turns": turns, "saved_at": time.time(),
            "files_kept": files_kept}


def _files_from(packed: bytes | None) -> dict[str, bytes]:
    """The /tmp files of a save (msgpack: guest path -> bytes), decoded under a cost cap."""
    if not packed:
        return {}
    files = unpack_bounded(packed, DecodeCost(containers=4, items=2 * FILES_ENTRIES,
                                              ext_bytes=0))
    if not isinstance(files, dict) or not all(
            isinstance(k, str) and isinstance(v, bytes) for k, v in files.items()):
        raise ValueError("the saved files are not a map of paths to bytes")
    return files


def _from_meta(meta: dict[str, Any]) -> Session:
    saved = int(meta["turns"])
    return Session(id=meta["id"], owner=meta["tenant"], door=ClientDoor(),
                   limits=limits_from_wire(meta["limits"]),
                   mounts=tuple(mounts_from_wire(meta["mounts"])),
                   preload=tuple(meta["preload"]), env=meta["env"],
                   created=float(meta["created"]), parent=meta["parent"], turn_base=saved,
                   saved_turns=saved, saved_at=float(meta["saved_at"]),
                   files_kept=bool(meta.get("files_kept", False)))


class Keeper:
    """Saves, evicts and revives the sessions of one server. Without ``state_dir`` it only
    hands out sandboxes (``using``) and nothing is kept."""

    def __init__(self, table: SessionTable[Session], backend: Callable[[], Backend], *,
                 state_dir: Path | None, save_interval: float, idle_evict: float | None,
                 on_open: Callable[[Session, SandboxAPI[Any]], None] | None = None) -> None:
        self.table, self.backend, self.on_open = table, backend, on_open
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

    # ---- handing out the sandbox ----------------------------------------------------------
    @contextlib.contextmanager
    def using(self, s: Session) -> Iterator[SandboxAPI[Any]]:
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

    def _fall_back(self, s: Session, sb: SandboxAPI[Any], why: str) -> int | None:
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
        LOG.info(json.dumps({"event": "fall_back", "tenant": s.tenant, "session": s.id,
                             "from_turn": s.saved_turns, "why": why}))
        return s.saved_turns

    def turn_begins(self, s: Session) -> None:
        if self.root is not None:
            with contextlib.suppress(sqlite3.Error):
                self.store().begun(s.id, s.turns + 1)

    def added(self, s: Session) -> None:
        """A new session: its row at once, without an image (a crash before its first save
        brings it back empty, saying so)."""
        self.changed(s)
        if self.root is not None:
            with contextlib.suppress(sqlite3.Error):
                self.store().save(s.id, s.tenant, _meta(s, 0, files_kept=False), None, None)

    def changed(self, s: Session) -> None:
        s.gen += 1
        if self.save_interval == 0:
            self._wake.set()

    # ---- saves ----------------------------------------------------------------------------
    def _path(self, s: Session, suffix: str) -> Path:
        assert self.root is not None
        return self.root / s.tenant / f"{s.id}{suffix}"

    def save(self, s: Session, wait: float = 0.0) -> bool:
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
                self.store().save(s.id, s.tenant, _meta(s, turns, files_kept=files is not None),
                                  blob, msgpack.packb(files or {}, use_bin_type=True))
            except (MemexError, OSError, sqlite3.Error) as exc:
                LOG.info(json.dumps({"event": "save_failed", "tenant": s.tenant,
                                     "session": s.id, "error": f"{type(exc).__name__}: {exc}"}))
                return False
        s.files_kept = files is not None
        s.saved_gen, s.saved_turns, s.saved_at = gen, turns, time.time()
        return True

    @staticmethod
    def _state(s: Session, sb: SandboxAPI[Any]) -> tuple[int, bytes, dict[str, bytes] | None]:
        """(the turns it holds, the image, the /tmp files or None when they do not fit)."""
        turns = s.turns
        return turns, _to_bytes(sb.checkpoint()), _files_of(sb)

    @classmethod
    def _write(cls, s: Session, sb: SandboxAPI[Any], folder: Path) -> int:
        """Write the session's image, files and description into ``folder`` (a shared folder
        another node takes it from); the turns the image holds."""
        turns, blob, files = cls._state(s, sb)
        folder.mkdir(parents=True, exist_ok=True)
        _atomic_write(folder / f"{s.id}.image", blob)
        _atomic_write(folder / f"{s.id}.files", msgpack.packb(files or {}, use_bin_type=True))
        _atomic_write(folder / f"{s.id}.json",
                      json.dumps(_meta(s, turns, files_kept=files is not None)).encode())
        s.files_kept = files is not None
        return turns

    def forget(self, s: Session) -> None:
        if self.root is not None:
            with contextlib.suppress(sqlite3.Error):
                self.store().forget(s.id)

    def _revive(self, s: Session, folder: Path | None = None) -> None:
        """Open the session again from its image and files in ``folder`` (default: this
        node's own for its tenant); called with ``s.lock`` held."""
        if s.lost is not None:
            raise SandboxLost(s.lost)
        if self.root is None and folder is None:
            raise SandboxLost("the session has no sandbox and the server keeps no state")
        try:
            if folder is None:
                blob, packed = self.store().state(s.id)
            else:
                blob = (folder / f"{s.id}.image").read_bytes()
                files_path = folder / f"{s.id}.files"
                packed = files_path.read_bytes() if files_path.exists() else None
            files = _files_from(packed)
            cp = self._from_bytes(blob) if blob is not None else None
        except (OSError, ImageError, ValueError, sqlite3.Error) as exc:
            s.lost = f"its saved state cannot be read back: {exc}"
            raise SandboxLost(s.lost) from exc
        sb = self.backend().open(limits=s.limits, mounts=s.mounts, preload=s.preload,
                                 door=s.door, env=s.env, tenant=s.tenant)
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
            except MemexError:
                sb.close()
                raise
        s.sandbox, s.saved_gen = sb, s.gen
        LOG.info(json.dumps({"event": "revive", "tenant": s.tenant, "session": s.id,
                             "turns": s.turns}))

    def load(self) -> int:
        """List every saved session again (opened on first use); how many."""
        if self.root is None or not self.root.is_dir():
            return 0
        self._move_in_legacy()
        n = 0
        for row in self.store().sessions():
            try:
                meta = row.meta
                if not (_SAFE.match(row.id) and meta.get("id") == row.id
                        and meta.get("tenant") == row.tenant):
                    raise ValueError("the row's description names another session")
                s = _from_meta(meta)
            except (ValueError, KeyError, TypeError, MemexError) as exc:
                LOG.info(json.dumps({"event": "load_failed", "session": row.id,
                                     "error": f"{type(exc).__name__}: {exc}"}))
                continue
            saved = s.turn_base
            if not row.has_image:
                s.saved_turns = None  # never saved: it comes back empty
            s.notice = {"from_turn": saved if row.has_image else 0,
                        "lost_turns": max(0, row.begun - (saved if row.has_image else 0)),
                        "files_kept": s.files_kept, "saved_at": s.saved_at,
                        "reason": "the server restarted"}
            if not row.has_image:
                s.turn_base = 0
            self.table.add(s)
            n += 1
        return n

    def _move_in_legacy(self) -> None:
        """Sessions saved by an earlier version as files, moved into the store."""
        assert self.root is not None
        for meta_path in sorted(self.root.glob("*/*.json")):
            try:
                meta = json.loads(meta_path.read_text())
                sid, tenant = meta["id"], meta["tenant"]
                if not (_SAFE.match(sid) and tenant == meta_path.parent.name):
                    continue
                image = meta_path.with_suffix(".image").read_bytes()
                files_path = meta_path.with_suffix(".files")
                files = files_path.read_bytes() if files_path.exists() else None
                begun_path = meta_path.with_suffix(".turns")
                store = self.store()
                store.save(sid, tenant, meta, image, files)
                if begun_path.exists():
                    store.begun(sid, int(begun_path.read_text()))
            except (OSError, ValueError, KeyError, TypeError, sqlite3.Error) as exc:
                LOG.info(json.dumps({"event": "load_failed", "file": str(meta_path),
                                     "error": f"{type(exc).__name__}: {exc}"}))
                continue
            for suffix in (".image", ".files", ".turns", ".json"):
                with contextlib.suppress(OSError):
                    meta_path.with_suffix(suffix).unlink()

    # ---- moving a session to another node -------------------------------------------------
    def park(self, s: Session, shared: Path) -> int:
        """Hand the session over: out of this node's table first (no new use can start), its
        state written to ``shared/<tenant>/``, its sandbox closed; the turns it holds. On a
        failure it stays here, live."""
        if self.table.pop(s.tenant, s.id) is None:
            raise SandboxLost("the session is no longer on this node")
        try:
            with s.lock:
                if s.sandbox is None:
                    self._revive(s)
            with s.alone(s.limits.timeout + 30) as alone:  # a turn in flight ends
                if not alone:
                    raise SandboxError("the session stayed in use; it was not parked")
                assert s.sandbox is not None
                turns = self._write(s, s.sandbox, shared / s.tenant)
        except BaseException:
            self.table.add(s)
            raise
        s.lost = "it was parked for another node (POST .../unpark there)"
        with contextlib.suppress(MemexError):
            s.sandbox.close()
        self.forget(s)
        LOG.info(json.dumps({"event": "park", "tenant": s.tenant, "session": s.id,
                             "turns": turns}))
        return turns

    def _from_bytes(self, blob: bytes) -> Any:
        """A checkpoint of this server's backend from its saved bytes (``_to_bytes``)."""
        if self.backend().name == "inprocess":
            return checkpoint_from_bytes(blob)
        return ProcessCheckpoint.from_bytes(blob)

    def share_checkpoint(self, tenant: str, cid: str, checkpoint: Any, shared: Path) -> None:
        """Write a held checkpoint to ``shared/<tenant>/checkpoints/<cid>``, where any node's
        restore of that id finds it (:meth:`shared_checkpoint`)."""
        folder = shared / tenant / "checkpoints"
        folder.mkdir(parents=True, exist_ok=True)
        _atomic_write(folder / cid, _to_bytes(checkpoint))
        LOG.info(json.dumps({"event": "share_checkpoint", "tenant": tenant,
                             "checkpoint": cid}))

    def shared_checkpoint(self, tenant: str, cid: str, shared: Path | None) -> Any | None:
        """A checkpoint another node shared under this id for the tenant, read back (None if
        there is none); one that cannot be read is an ImageError."""
        if shared is None or not _SAFE.match(cid):
            return None
        try:
            blob = (shared / tenant / "checkpoints" / cid).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ImageError(f"the shared checkpoint {cid!r} cannot be read: {exc}") from exc
        try:
            return self._from_bytes(blob)
        except (ImageError, ValueError) as exc:
            raise ImageError(f"the shared checkpoint {cid!r} cannot be read back: {exc}"
                             ) from exc

    @staticmethod
    def unshare_checkpoint(tenant: str, cid: str, shared: Path | None) -> bool:
        """Remove a shared checkpoint; whether there was one."""
        if shared is None or not _SAFE.match(cid):
            return False
        try:
            (shared / tenant / "checkpoints" / cid).unlink()
        except FileNotFoundError:
            return False
        return True

    def unpark(self, tenant: TenantConfig, sid: str, shared: Path) -> Session | None:
        """Take a parked session from ``shared/<tenant>/`` (None if there is none: another
        node may have taken it first; the claim is an atomic rename, so only one does),
        counted against the tenant's bounds here (QuotaExceeded leaves it parked)."""
        if not _SAFE.match(sid):
            return None
        folder = shared / tenant.name
        claim = folder / f"{sid}.json.claimed-{os.getpid()}-{time.monotonic_ns()}"
        try:
            os.rename(folder / f"{sid}.json", claim)
        except FileNotFoundError:
            return None
        reserved: Session | None = None
        try:
            meta = json.loads(claim.read_text())
            if meta.get("id") != sid or meta.get("tenant") != tenant.name:
                raise ImageError("the parked description names another session")
            s = _from_meta(meta)
            self.table.reserve(tenant.name, tenant.bounds(), s.limits)
            reserved = s
            with s.lock:
                self._revive(s, folder)
        except (OSError, ValueError, KeyError, TypeError, MemexError, QuotaExceeded) as exc:
            if reserved is not None:
                self.table.release(tenant.name, reserved.limits)
            with contextlib.suppress(OSError):
                os.rename(claim, folder / f"{sid}.json")  # left for another try
            if isinstance(exc, MemexError | QuotaExceeded):
                raise
            raise SandboxLost(f"the parked session cannot be read back: {exc}") from exc
        self.table.add(s)
        self.table.release(tenant.name, s.limits)
        self.added(s)  # kept in this node's state_dir from now on (when durable)
        for leftover in (claim, folder / f"{sid}.image", folder / f"{sid}.files"):
            with contextlib.suppress(OSError):
                leftover.unlink()
        LOG.info(json.dumps({"event": "unpark", "tenant": tenant.name, "session": sid,
                             "turns": s.turns}))
        return s

    # ---- the keeper thread ----------------------------------------------------------------
    def start(self) -> None:
        if self.root is None:
            return
        self.root.mkdir(parents=True, exist_ok=True)
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

    def _evict(self, s: Session) -> None:
        if s.gen != s.saved_gen and not self.save(s):
            return  # keep it live rather than lose it
        with s.lock:
            if s.running or s.sandbox is None or s.gen != s.saved_gen:
                return
            sb, s.sandbox = s.sandbox, None
            s.turn_base = s.saved_turns or 0
        with contextlib.suppress(MemexError):
            sb.close()
        s.notice = {"from_turn": s.turn_base, "lost_turns": 0, "files_kept": s.files_kept,
                    "saved_at": s.saved_at,
                    "reason": f"evicted after {self.idle_evict:g} s idle"}
        LOG.info(json.dumps({"event": "evict", "tenant": s.tenant, "session": s.id,
                             "turns": s.turn_base}))

    def stop(self, sessions: list[Session]) -> tuple[int, int]:
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
