"""memex serve's keeper: the session core's (``memex.serving.Keeper``: saves, eviction,
revival after a restart) with what only serve does: sessions and checkpoints handed between
nodes through a shared folder (park, unpark), and sessions saved as files by earlier versions
moved into ``state.db``."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import msgpack

from ..backends.internal import ClientDoor
from ..errors import ImageError, MemexError, SandboxError, SandboxLost
from ..runtime_wasm import SandboxAPI
from ..runtime_wasm.internal import atomic_write
from ..serving import Keeper, QuotaExceeded, session_fields
from ._config import TenantConfig
from ._sessions import Session

__all__ = ["ServeKeeper", "session_of_meta"]


def session_of_meta(meta: dict[str, Any]) -> Session:
    """A serve session from its saved description (its door to the client made anew)."""
    return Session(**session_fields(meta), door=ClientDoor())


class ServeKeeper(Keeper[Session]):
    """The core's keeper, and the moves between nodes."""

    def _path(self, s: Session, suffix: str) -> Path:
        assert self.root is not None
        return self.root / s.tenant / f"{s.id}{suffix}"

    @classmethod
    def _write(cls, s: Session, sb: SandboxAPI[Any], folder: Path) -> int:
        """Write the session's image, files and description into ``folder`` (a shared folder
        another node takes it from); the turns the image holds."""
        turns, blob, files = cls._state(s, sb)
        # 0600 files in 0700 folders: a tenant's saved values and files
        atomic_write(folder / f"{s.id}.image", blob, private=True)
        atomic_write(folder / f"{s.id}.files", msgpack.packb(files or {}, use_bin_type=True),
                     private=True)
        atomic_write(folder / f"{s.id}.json", json.dumps(
            cls.describe(s, turns, files_kept=files is not None)).encode(), private=True)
        s.files_kept = files is not None
        return turns

    def _before_load(self) -> None:
        """Sessions saved by an earlier version as files, moved into the store."""
        assert self.root is not None
        for meta_path in sorted(self.root.glob("*/*.json")):
            try:
                meta = json.loads(meta_path.read_text())
                sid, tenant = meta["id"], meta["tenant"]
                if not (self.safe_id(sid) and tenant == meta_path.parent.name):
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
                self.log.info(json.dumps({"event": "load_failed", "file": str(meta_path),
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
        self.log.info(json.dumps({"event": "park", "tenant": s.tenant, "session": s.id,
                             "turns": turns}))
        return turns

    def share_checkpoint(self, tenant: str, cid: str, checkpoint: object, shared: Path) -> None:
        """Write a held checkpoint to ``shared/<tenant>/checkpoints/<cid>``, where any node's
        restore of that id finds it (:meth:`shared_checkpoint`)."""
        atomic_write(shared / tenant / "checkpoints" / cid, self.image_bytes(checkpoint),
                     private=True)
        self.log.info(json.dumps({"event": "share_checkpoint", "tenant": tenant,
                             "checkpoint": cid}))

    def shared_checkpoint(self, tenant: str, cid: str, shared: Path | None, *,
                          max_memory: int) -> Any | None:
        """A checkpoint another node shared under this id for the tenant, read back (None if
        there is none); one that cannot be read, or whose memory would pass ``max_memory``
        (the session it is restored into), is an ImageError before it inflates."""
        if shared is None or not self.safe_id(cid):
            return None
        try:
            blob = (shared / tenant / "checkpoints" / cid).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ImageError(f"the shared checkpoint {cid!r} cannot be read: {exc}") from exc
        try:
            return self._from_bytes(blob, max_memory)
        except (ImageError, ValueError) as exc:
            raise ImageError(f"the shared checkpoint {cid!r} cannot be read back: {exc}"
                             ) from exc

    @staticmethod
    def unshare_checkpoint(tenant: str, cid: str, shared: Path | None) -> bool:
        """Remove a shared checkpoint; whether there was one."""
        if shared is None or not Keeper.safe_id(cid):
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
        if not self.safe_id(sid):
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
            s = self.make(meta)
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
        self.log.info(json.dumps({"event": "unpark", "tenant": tenant.name, "session": sid,
                             "turns": s.turns}))
        return s

