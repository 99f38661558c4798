"""What the cluster's storage says of its sessions, and how a restarted control actor reads
it back in constant time in the number of sessions.

A slab saves each session under ``session_key(sid)`` (its record, image and files); the
control actor indexes sessions by tenant (``owners/<tenant>/<sid>``, an empty object put
before a session opens and deleted after it closes). A restarted actor answers at once: a
tenant's saved sessions and held checkpoints are read when something of that tenant is
first asked (:meth:`ReadBack.tenant`), through the index, so that costs the tenant's own
sessions, never the cluster's; a background thread (:meth:`ReadBack.backfill`) reads the
rest, after indexing a store written before the index existed."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from typing import Any

from ..backends.internal import limits_from_wire
from ..errors import BackendBusy, ImageError
from ._checkpoints import Checkpoints
from ._directory import Directory, Entry
from ._replies import ControlRefusal
from ._slab import RECORD_CAP, session_key
from ._storage import Storage

__all__ = ["INDEXED_KEY", "OWNERS", "ReadBack", "child_record", "owner_key", "saved_record"]

LOG = logging.getLogger("memex.serving")

OWNERS = "owners"
"""The storage's index of sessions by tenant: an empty object ``owners/<tenant>/<sid>`` per
session, put before it opens and deleted after it closes."""
INDEXED_KEY = "owners-indexed"
"""Said once the index holds every session of the store (one written before the index is
indexed by the first control actor that finds this missing)."""


def owner_key(tenant: str, sid: str) -> str:
    return f"{OWNERS}/{tenant}/{sid}"


def saved_record(storage: Storage, sid: str) -> dict[str, Any] | None:
    """A session's saved record, its spec's limits checked; None when there is none or what
    is there is not a record. A storage that fails raises: a caller that took that for "no
    record" would drop the session's marker and forget a session that is there."""
    try:
        raw = storage.get(session_key(sid, "record"), RECORD_CAP)
    except ImageError:  # larger than any record
        return None
    if raw is None:
        return None
    try:
        rec = json.loads(raw)
        if not isinstance(rec, dict):
            return None
        limits_from_wire(rec["spec"]["limits"])
        int(rec["turns"])
    except Exception:  # not a record of ours
        return None
    return rec


def child_record(storage: Storage, parent: str, child: str, memory: int) -> bytes:
    """The record of a fork opened from its parent's save: the parent's, renamed (its objects
    copied, each read within what the parent's memory limit lets a save hold)."""
    raw = storage.get(session_key(parent, "record"), RECORD_CAP)
    if raw is None:
        raise ControlRefusal("not_found", f"no save of {parent!r}")
    rec = json.loads(raw)
    image, files = rec.get("image"), rec.get("files")
    for key, name in ((image, "image-1"), (files, "files-1")):
        if key:
            data = storage.get(str(key), memory + (64 << 20))
            if data is not None:
                storage.put(session_key(child, name), data)
    rec.update(id=child, seq=1, image=session_key(child, "image-1") if image else None,
               files=session_key(child, "files-1") if files else None)
    return json.dumps(rec).encode()


class ReadBack:
    """Which tenants a (re)started control actor has read back from the storage, each once,
    under a gate of its own so the actor's lock is never held over the storage."""

    def __init__(self, lock: threading.RLock, directory: Directory, checkpoints: Checkpoints,
                 storage: Storage) -> None:
        self.lock, self.directory = lock, directory
        self.checkpoints, self.storage = checkpoints, storage
        self._read: set[str] = set()
        self._gates: dict[str, threading.Lock] = {}
        self.indexed = threading.Event()  # the index is complete: tenants may be read
        self.loaded = threading.Event()  # every tenant was read (the back-fill ended)

    def tenant(self, tenant: str) -> None:
        """The tenant's saved sessions and held checkpoints in the directory and its
        account, read the first time something of the tenant is asked (its creates are
        checked against them). Costs the tenant's own sessions. A storage that fails is
        ``BackendBusy`` (the front answers 503 with Retry-After), and nothing of the tenant
        is taken as read: its next request reads it again."""
        if tenant in self._read:
            return
        with self.lock:
            gate = self._gates.setdefault(tenant, threading.Lock())
        with gate:
            if tenant in self._read:
                return
            self.indexed.wait()  # a store from before the index: indexed first, once
            try:
                self._read_tenant(tenant)
            except Exception as exc:  # fsspec's are OSErrors; an object store's own may not be
                LOG.warning("reading tenant %r back from the storage failed: %r", tenant, exc)
                raise BackendBusy("unavailable", "the cluster's storage did not give this "
                                  f"tenant's saved sessions ({type(exc).__name__}: {exc}); "
                                  "try again") from exc
            with self.lock:
                self._read.add(tenant)
                self._gates.pop(tenant, None)

    def _read_tenant(self, tenant: str) -> None:
        for sid in self.storage.children(f"{OWNERS}/{tenant}"):
            with self.lock:
                if sid in self.directory:  # held by a live slab (adopted), or made since
                    continue
            rec = saved_record(self.storage, sid)
            if rec is None or str(rec.get("tenant")) != tenant:
                # never saved (its create did not get that far) or closed: its marker goes
                with contextlib.suppress(Exception):
                    self.storage.delete(owner_key(tenant, sid))
                continue
            limits = limits_from_wire(rec["spec"]["limits"])
            with self.lock:
                if sid not in self.directory:
                    self.directory.put(Entry(sid, tenant, rec["spec"], limits.memory,
                                             limits.disk_bytes, None, turns=int(rec["turns"]),
                                             begun=int(rec["turns"]),
                                             gone="the cluster restarted"))
        self.checkpoints.read_back(tenant)

    def backfill(self) -> None:
        """In the background after a (re)start: index a store written before the index
        (once), then read back every tenant nothing has asked for yet, so the monitor ends
        and reopens their sessions as before."""
        try:
            if self.storage.get(INDEXED_KEY, 64) is None:
                for sid in self.storage.children("sessions"):
                    rec = saved_record(self.storage, sid)
                    if rec is not None:
                        with contextlib.suppress(Exception):
                            self.storage.put(owner_key(str(rec["tenant"]), sid), b"")
                self.storage.put(INDEXED_KEY, b"1")
        except Exception:
            LOG.exception("indexing the storage's sessions by tenant failed")
        finally:
            self.indexed.set()
        tenants: set[str] = set()
        for folder in (OWNERS, "checkpoints"):
            with contextlib.suppress(Exception):
                tenants.update(self.storage.children(folder))
        for tenant in sorted(tenants):
            try:
                self.tenant(tenant)
            except Exception:
                LOG.exception("reading back tenant %s's sessions failed", tenant)
        self.loaded.set()
