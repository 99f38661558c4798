"""The checkpoints a cluster holds for its tenants: each written by the slab of the session
it was taken from (``checkpoint_key``), counted in the tenant's account against its
``max_memory`` (with its sessions) and ``max_checkpoints`` (the oldest goes past it), and
said in the storage (``<key>/meta``) so a restarted control actor holds them again. A
closed session's checkpoints stay held ``ttl`` seconds more (another session may restore
one), then go with the room they held."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from typing import Any

from ..backends.internal import Ledger
from ..errors import ImageError
from ._directory import Directory
from ._replies import ControlRefusal, Granted, Refused
from ._storage import Storage

__all__ = ["Checkpoints", "checkpoint_key"]

META_BYTES = 1 << 16


def checkpoint_key(tenant: str, cid: str, name: str = "image") -> str:
    return f"checkpoints/{tenant}/{cid}/{name}" if name else f"checkpoints/{tenant}/{cid}"


class Checkpoints:
    """The tenants' held checkpoints (in their accounts of ``ledger``, under ``lock``)."""

    def __init__(self, lock: threading.RLock, directory: Directory, storage: Storage,
                 ttl: float) -> None:
        self.lock, self.directory, self.storage, self.ttl = lock, directory, storage, ttl
        self.ledger: Ledger = directory.ledger

    def hold(self, tenant: str, bounds: dict[str, Any], cid: str, size: int, turns: int,
             session: str) -> Granted | Refused:
        """Count a checkpoint its slab wrote against the tenant; past ``max_memory`` it is
        refused and removed, past ``max_checkpoints`` the oldest goes."""
        gone: list[str] = []
        with self.lock:
            held = self.ledger.account(tenant).checkpoints
            _, used, _ = self.directory.used(tenant)
            bound = bounds.get("max_memory")
            if bound is not None and used + size > bound:
                refusal: ControlRefusal | None = ControlRefusal(
                    "quota", f"{tenant!r} would hold {used + size} bytes of session memory "
                    f"and checkpoints across the cluster, its bound is {bound}: release a "
                    "checkpoint or close a session")
            else:
                refusal = None
                held[cid] = {"size": size, "turns": turns, "session": session,
                             "at": time.time()}
                while len(held) > max(1, int(bounds.get("max_checkpoints") or 64)):
                    oldest = min(held, key=lambda c: held[c]["at"])
                    del held[oldest]
                    gone.append(oldest)
        if refusal is not None:
            gone.append(cid)
        for c in gone:
            self.storage.delete(checkpoint_key(tenant, c))
        if refusal is not None:
            return refusal.reply()
        self.storage.put(checkpoint_key(tenant, cid, "meta"), json.dumps(
            {"size": size, "turns": turns, "session": session}).encode())
        return Granted(cid)

    def get(self, tenant: str, cid: str) -> dict[str, Any] | None:
        with self.lock:
            a = self.ledger.find(tenant)
            held = a.checkpoints.get(cid) if a is not None else None
            return dict(held) if held is not None else None

    def drop(self, tenant: str, cid: str) -> bool:
        with self.lock:
            a = self.ledger.find(tenant)
            held = a.checkpoints.pop(cid, None) if a is not None else None
        if held is not None:
            self.storage.delete(checkpoint_key(tenant, cid))
        return held is not None

    def orphan(self, tenant: str, sid: str) -> None:
        """``sid`` closed: its checkpoints expire ``ttl`` seconds from now, said in the
        storage too (a restarted control actor ends them)."""
        expires = time.time() + self.ttl
        with self.lock:
            orphans = [(c, h) for c, h in self.ledger.account(tenant).checkpoints.items()
                       if h["session"] == sid and h.get("expires") is None]
            for _, h in orphans:
                h["expires"] = expires
        for c, h in orphans:
            with contextlib.suppress(Exception):
                self.storage.put(checkpoint_key(tenant, c, "meta"), json.dumps(
                    {k: h[k] for k in ("size", "turns", "session", "expires")}).encode())

    def expire(self) -> None:
        """Drop the checkpoints whose session closed ``ttl`` ago (and the room they held
        with them)."""
        now = time.time()
        with self.lock:
            gone = [(a.name, c) for a in self.ledger.accounts()
                    for c, h in a.checkpoints.items()
                    if h.get("expires") is not None and h["expires"] <= now]
            for t, c in gone:
                del self.ledger.account(t).checkpoints[c]
        for t, c in gone:
            with contextlib.suppress(Exception):
                self.storage.delete(checkpoint_key(t, c))

    def read_back(self, tenant: str) -> None:
        """The tenant's checkpoints as the storage says them (after a restart): each held
        again, one whose session is gone expiring ``ttl`` from now. A storage that fails
        raises (the tenant is read again on its next word)."""
        for cid in self.storage.children(f"checkpoints/{tenant}"):
            try:
                raw = self.storage.get(checkpoint_key(tenant, cid, "meta"), META_BYTES)
            except ImageError:
                continue
            if raw is None:
                continue
            with contextlib.suppress(Exception):  # what is there is not a checkpoint's meta
                meta = json.loads(raw)
                expires = meta.get("expires")
                with self.lock:
                    if expires is None and str(meta["session"]) not in self.directory:
                        expires = time.time() + self.ttl  # its session is gone
                    self.ledger.account(tenant).checkpoints.setdefault(cid, {
                        "size": int(meta["size"]), "turns": int(meta["turns"]),
                        "session": str(meta["session"]), "at": time.time(),
                        "expires": float(expires) if expires is not None else None})
