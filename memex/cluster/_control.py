"""The control actor of a ``memex serve`` cluster (docs/scaling.md): one named, detached Ray
actor that every front asks, and the one place where the cluster's shared facts live. Each
concern has a module of its own, and this class holds them under one lock and answers the
fronts: the directory (``_directory``), placement (``_placement``), turns and the fronts'
leases (``_turns``, ``_leases``), checkpoints (``_checkpoints``), the storage's records and
their read-back (``_records``); the sessions' life, recovery and the config are here.

* **Directory.** Which slab (``_slab.Slab``) holds each session, so any front serves any
  session: a front caches the answer and asks again when the slab says the session is not
  there (it moved, or it closed).
* **Ledger.** Each tenant's sessions, memory, disk and held checkpoints, its running turns
  and its turn rate, counted across the whole cluster: a create reserves its place under
  one lock, so racing creates through different fronts cannot both take the last one.
* **Placement.** Slabs are made on demand with their memory and CPU declared to Ray, which
  places them (``SPREAD``); a session goes to a slab with room, so a node is never promised
  more memory than its slabs declared. A slab that Ray cannot place within
  ``place_timeout`` is given up: the create is refused (busy), nothing over-commits.
* **Recovery.** A monitor pings every slab each second; a dead slab's sessions are opened
  again on other slabs from their last save, each flagged with the turns it lost.
* **Restart in constant time.** A restarted actor reads the config and asks the live slabs
  what they hold (each slab keeps its sessions' tenant and spec), and answers at once: it
  reads no session record first. A tenant's saved sessions and held checkpoints are read
  when something of that tenant is first asked (its create, lookup, slots), through the
  storage's per-tenant index (``owners/<tenant>/<sid>``, written before a session opens),
  so that costs the tenant's own sessions, never the cluster's; a background thread reads
  the rest.
* **Turns never wait on it.** A ``max_running`` tenant's running slots and a rated tenant's
  tokens are handed to the fronts, which spend them themselves (``_turns``): a turn on a
  healthy slab asks this actor nothing.
* **Fronts' leases.** What a front holds here (running slots, the turns it said run through
  it) lasts while it speaks: it asks for the config every second, which renews its lease.
  A front silent for :data:`FRONT_LEASE` seconds (killed, cut off) loses them: its
  tenants' slots come back and its sessions may end by their limits, with no word from it.
  A front that comes back after that gives nothing back twice.
* **Rates across a restart.** A tenant's rate bucket lives here, in memory: a restarted
  actor (one that finds a published config) fills each bucket from its own start, empty
  then, so the turns a tenant is admitted stay within its burst plus its rate times the
  seconds, across the restart (a fresh bucket would hand it a second burst).
* **Config.** The serve.toml every front serves (keys rotate through it): the newest text a
  front published, pulled by every front each second, with its tenants' operator tools and
  egress policies as data (``DoorKit``), handed to the slab that opens a session; kept in
  the storage, so a restarted control actor still has them.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import secrets
import threading
import time
from typing import Any

import msgpack

from ..backends.internal import Ledger, limits_from_wire
from ..errors import ConfigError
from ..runtime_wasm.internal import DecodeCost, unpack_bounded
from ..serving.internal import DoorKit
from ._checkpoints import Checkpoints, checkpoint_key
from ._direct import Outcome, raised
from ._directory import Directory, Entry
from ._leases import FRONT_LEASE
from ._placement import Placement, SlabInfo, SlabSettings
from ._records import ReadBack, child_record, owner_key
from ._replies import (
    ControlRefusal,
    Failed,
    Granted,
    Heard,
    Refused,
    Reply,
    Slots,
    Tokens,
    Wait,
)
from ._slab import session_key
from ._storage import Storage
from ._turns import TOKEN_LEASE, Turns

__all__ = ["CONTROL_NAME", "TOKEN_LEASE", "Control", "ControlRefusal", "checkpoint_key"]

CONTROL_NAME = "memex-control"
LOG = logging.getLogger("memex.serving")

RECOVERY_THREADS = 8
"""Sessions opened elsewhere at once after their slab was lost (each waits out the lost
slab's lease first); lookups of a moving session answer at once meanwhile."""
CONFIG_KEY = "config/published"
"""Where the storage keeps the config last published (msgpack: version, text, kits)."""
CONFIG_BYTES = 64 << 20


class Control:
    """The cluster's directory, ledger, placement and config (made remote by
    ``memex.service``'s cluster front: ``ray.remote(Control)``, named ``CONTROL_NAME``).
    Its public methods are what the fronts call; each concern's state is its part's."""

    def __init__(self, storage: Storage, *, namespace: str, slab_memory: int,
                 slab_cpus: float, save_interval: float, place_timeout: float = 60.0,
                 slab_idle: float = 60.0, checkpoint_ttl: float = 600.0,
                 monitor: float = 1.0, guest_nice: int = 0, backfill: bool = True) -> None:
        import ray
        self._ray = ray
        self.storage, self.namespace = storage, namespace
        self.place_timeout = place_timeout
        self.lock = threading.RLock()
        # each tenant's account in the cluster (sessions, those being made, held
        # checkpoints, running turns, rate bucket): the one Ledger of memex.backends (a
        # server's too), kept under self.lock by the parts below
        self.ledger = Ledger()
        self.counts = {"lookups": 0, "creates": 0, "recoveries": 0, "slot_batches": 0,
                       "token_batches": 0}
        self.directory = Directory(self.ledger)
        self.placement = Placement(ray, self.lock, self.directory, storage, SlabSettings(
            namespace=namespace, memory=slab_memory, cpus=slab_cpus,
            save_interval=save_interval, place_timeout=place_timeout, idle=slab_idle,
            guest_nice=guest_nice))
        self.turns = Turns(self.lock, self.directory, self.counts)
        self.checkpoints = Checkpoints(self.lock, self.directory, storage, checkpoint_ttl)
        self.read_back = ReadBack(self.lock, self.directory, self.checkpoints, storage)
        self.config_text: tuple[int, str] | None = None
        self.kits: dict[str, dict[str, Any]] = {}  # tenant -> its DoorKit's wire
        self._recoveries = concurrent.futures.ThreadPoolExecutor(
            RECOVERY_THREADS, thread_name_prefix="memex-control-recover")
        self._load_config()
        if self.config_text is not None:  # a predecessor's (this actor was restarted, or
            # the cluster): its rate buckets are gone, and may have been empty; each fills
            # from now (Ledger.refill_from), never a fresh burst on top of the last
            self.ledger.refill_from = time.monotonic()
        self._adopt_slabs()
        if not backfill:  # the caller's word: a store already indexed, read on demand only
            self.read_back.indexed.set()
        else:
            threading.Thread(target=self.read_back.backfill, name="memex-control-backfill",
                             daemon=True).start()
        threading.Thread(target=self._monitor, args=(monitor,), name="memex-control-monitor",
                         daemon=True).start()

    @property
    def sessions(self) -> dict[str, Entry]:
        """The directory's entries by session id (read under ``lock``)."""
        return self.directory.sessions

    @property
    def fronts(self) -> dict[str, Any]:
        """The fronts' leases by the id each names itself with."""
        return self.turns.leases.fronts

    # ---- config -------------------------------------------------------------------------------
    def publish(self, version: int, text: str, kits: dict[str, Any] | None = None) -> int:
        """Keep ``text`` and its tenants' ``kits`` (tenant -> ``DoorKit.to_wire()``) if it
        is newer than what is held, in the storage too; the version now held."""
        checked = {str(t): DoorKit.from_wire(k).to_wire() for t, k in (kits or {}).items()}
        with self.lock:
            if self.config_text is not None and version <= self.config_text[0]:
                return self.config_text[0]
            packed = msgpack.packb([version, text, checked], use_bin_type=True)
            if len(packed) > CONFIG_BYTES:
                raise ConfigError(f"a config of {len(packed)} bytes with its tools and "
                                  f"policies (a cluster holds at most {CONFIG_BYTES})")
            self.storage.put(CONFIG_KEY, packed)
            self.config_text, self.kits = (version, text), checked
            return version

    def config(self, known: int, front: str | None = None,
               held: list[list[Any]] | None = None) -> Heard:
        """The held config and its kits when it is newer than ``known`` (else None in its
        place), and the tenants a front waits for a running slot of. Asked every second by
        each front: it renews ``front``'s lease (``held``: the slots it holds,
        :meth:`Turns.heard`)."""
        wanted = self.turns.heard(front, held) if front is not None else self.turns.wanted()
        with self.lock:
            config, kits = self.config_text, self.kits
        newer = (config[0], config[1], kits) if config is not None and config[0] > known \
            else None
        return Heard(newer, wanted)

    def _load_config(self) -> None:
        """The config last published (unreadable: the fronts publish theirs again)."""
        with contextlib.suppress(Exception):
            raw = self.storage.get(CONFIG_KEY, CONFIG_BYTES)
            if raw is not None:
                version, text, kits = unpack_bounded(raw, DecodeCost.for_bytes(len(raw)))
                self.kits = {str(t): DoorKit.from_wire(k).to_wire() for t, k in kits.items()}
                self.config_text = (int(version), str(text))

    # ---- sessions -----------------------------------------------------------------------------
    def _open(self, slab: SlabInfo, sid: str, tenant: str, spec: dict[str, Any],
              from_save: bool) -> dict[str, Any]:
        """Open ``sid`` on ``slab``, with its tenant's operator tools and egress policy
        served there."""
        return self.placement.open(slab, sid, tenant, spec, from_save, self.kits.get(tenant))

    def _out(self, e: Entry) -> dict[str, Any]:
        """The entry as a front gets it: with its slab's direct path (Ray is the boundary
        the secret stays within; the service never sends it to a client)."""
        out = e.out()
        slab = self.placement.get(e.slab)
        out["endpoint"] = slab.endpoint if slab is not None else None
        out["secret"] = slab.secret if slab is not None else None
        return out

    def create(self, tenant: str, bounds: dict[str, Any], spec: dict[str, Any],
               parent: str | None = None) -> Reply:
        """A new session's entry (:class:`Granted`), within the tenant's cluster-wide
        bounds; else :class:`Refused` or :class:`Failed`."""
        limits = limits_from_wire(spec["limits"])
        memory, disk = limits.memory, limits.disk_bytes
        sid = "s_" + secrets.token_urlsafe(12)
        try:
            self.read_back.tenant(tenant)
            with self.lock:
                self.directory.reserve(tenant, bounds, memory, disk)
            try:
                slab = self.placement.slab_for(memory)
                try:
                    self.storage.put(owner_key(tenant, sid), b"")
                    self._open(slab, sid, tenant, spec, False)
                except BaseException:
                    self.placement.give_back(slab, memory)
                    with contextlib.suppress(Exception):
                        self.storage.delete(owner_key(tenant, sid))
                    raise
                e = Entry(sid, tenant, spec, memory, disk, slab.name, parent=parent)
                with self.lock:
                    self.directory.put(e)
                    slab.sessions.add(sid)
                    self.counts["creates"] += 1
            finally:
                with self.lock:
                    self.directory.unreserve(tenant, memory, disk)
        except ControlRefusal as refusal:
            return refusal.reply()
        except Exception as exc:  # a typed answer for the front
            return Failed(raised(exc).error)
        return Granted(self._out(e))

    def fork(self, tenant: str, bounds: dict[str, Any], sid: str) -> Reply:
        """A child of ``sid`` holding its state: in the parent's slab when it has room,
        else opened on another from the parent's save (the parent is saved first)."""
        try:
            self.read_back.tenant(tenant)
        except Exception as exc:
            return Failed(raised(exc).error)
        with self.lock:
            p = self.directory.of(tenant, sid)
        if p is None or p.slab is None:
            return ControlRefusal("not_found", f"no session {sid!r}").reply()
        child = "s_" + secrets.token_urlsafe(12)
        try:
            with self.lock:
                self.directory.reserve(tenant, bounds, p.memory, p.disk)
            marked = False
            try:
                self.storage.put(owner_key(tenant, child), b"")
                marked = True
                with self.lock:
                    slab = self.placement.slabs[p.slab]
                    here = slab.dead is None and slab.capacity - slab.used >= p.memory
                    if here:
                        slab.used += p.memory
                if here:
                    try:
                        forked: Outcome = self._ray.get(slab.handle.fork.remote(sid, child),
                                                        timeout=self.place_timeout)
                        turns = int(forked.unwrap()["turns"])
                    except BaseException:
                        self.placement.give_back(slab, p.memory)
                        raise
                else:
                    saved: Outcome = self._ray.get(slab.handle.save.remote(sid),
                                                   timeout=self.place_timeout)
                    saved.unwrap()
                    self.storage.put(session_key(child, "record"), child_record(
                        self.storage, sid, child, p.memory))
                    slab = self.placement.slab_for(p.memory)
                    try:
                        turns = int(self._open(slab, child, tenant, p.spec, True)["turns"])
                    except BaseException:
                        self.placement.give_back(slab, p.memory)
                        raise
                e = Entry(child, tenant, p.spec, p.memory, p.disk, slab.name, parent=sid,
                          turns=turns, begun=turns)
                with self.lock:
                    self.directory.put(e)
                    slab.sessions.add(child)
                marked = False
            finally:
                if marked:  # the child did not open: no index entry left for it
                    with contextlib.suppress(Exception):
                        self.storage.delete(owner_key(tenant, child))
                with self.lock:
                    self.directory.unreserve(tenant, p.memory, p.disk)
        except ControlRefusal as refusal:
            return refusal.reply()
        except Exception as exc:
            return Failed(raised(exc).error)
        return Granted(self._out(e))

    def lookup(self, tenant: str, sid: str) -> dict[str, Any] | None:
        """The session's entry (None: no such session of this tenant), at once. A session
        with no slab (the cluster restarted, or its slab died) is being opened on one:
        its entry says ``moving`` (ask again shortly), or why that ``failed``."""
        self.read_back.tenant(tenant)
        with self.lock:
            self.counts["lookups"] += 1
            e = self.directory.of(tenant, sid)
            if e is None:
                return None
            if e.slab is not None:
                return self._out(e)
        self._start_recovery(sid, None)
        with self.lock:
            e = self.directory.get(sid)
            return self._out(e) if e is not None else None

    def of(self, tenant: str) -> list[dict[str, Any]]:
        self.read_back.tenant(tenant)
        with self.lock:
            return [self._out(e) for e in self.directory if e.tenant == tenant]

    def close(self, tenant: str, sid: str, why: str = "closed") -> bool:
        self.read_back.tenant(tenant)
        with self.lock:
            e = self.directory.of(tenant, sid)
            if e is None:
                return False
            self.directory.drop(sid)
            slab = self.placement.get(e.slab)
            if slab is not None:
                slab.used -= e.memory
                slab.sessions.discard(sid)
        # its checkpoints stay held checkpoint_ttl more (another session may restore one)
        self.checkpoints.orphan(tenant, sid)
        self.checkpoints.expire()
        if slab is not None and slab.dead is None:
            with contextlib.suppress(Exception):
                self._ray.get(slab.handle.close.remote(sid, True), timeout=30)
        else:
            self.storage.delete(session_key(sid))
        with contextlib.suppress(Exception):  # its record is gone first: a marker left
            self.storage.delete(owner_key(tenant, sid))  # alone is dropped when read
        return True

    def take_notice(self, sid: str) -> dict[str, Any] | None:
        """What the session's last recovery lost, said once."""
        with self.lock:
            e = self.directory.get(sid)
            if e is None:
                return None
            notice, e.notice = e.notice, None
            return notice

    # ---- turns (``_turns``) -------------------------------------------------------------------
    def take_slots(self, tenant: str, max_running: int, want: int, front: str
                   ) -> Slots | Wait:
        """Running slots of a ``max_running`` tenant for ``front`` (:meth:`Turns.take_slots`)."""
        self.read_back.tenant(tenant)
        return self.turns.take_slots(tenant, max_running, want, front)

    def give_back_slots(self, tenant: str, n: int, front: str) -> None:
        self.turns.give_back_slots(tenant, n, front)

    def take_tokens(self, tenant: str, rate: float, burst: int, want: int,
                    returned: int = 0) -> Tokens | Refused:
        """A batch of the tenant's rate tokens for a front (:meth:`Turns.take_tokens`)."""
        self.read_back.tenant(tenant)
        return self.turns.take_tokens(tenant, rate, burst, want, returned)

    def give_back_tokens(self, tenant: str, rate: float, burst: int, n: int) -> None:
        self.turns.give_back_tokens(tenant, rate, burst, n)

    def report(self, uses: list[list[Any]], front: str = "") -> None:
        self.turns.report(uses, front)

    # ---- checkpoints (``_checkpoints``) -------------------------------------------------------
    def hold(self, tenant: str, bounds: dict[str, Any], cid: str, size: int, turns: int,
             session: str) -> Granted | Refused:
        """Count a checkpoint its slab wrote against the tenant (:meth:`Checkpoints.hold`)."""
        self.read_back.tenant(tenant)
        return self.checkpoints.hold(tenant, bounds, cid, size, turns, session)

    def checkpoint(self, tenant: str, cid: str) -> dict[str, Any] | None:
        self.read_back.tenant(tenant)
        return self.checkpoints.get(tenant, cid)

    def drop_checkpoint(self, tenant: str, cid: str) -> bool:
        self.read_back.tenant(tenant)
        return self.checkpoints.drop(tenant, cid)

    # ---- recovery -----------------------------------------------------------------------------
    def recover(self, sid: str, dead: str | None, begun: int | None = None,
                tenant: str | None = None) -> dict[str, Any] | None:
        """The front found ``dead`` (the slab it knew for ``sid``) gone, with ``begun``
        turns begun as far as it knows (a turn it lost counts): the session's entry once it
        is open elsewhere (None if it ended). ``tenant``: whose it is (read back first
        after a restart)."""
        if tenant is not None:
            self.read_back.tenant(tenant)
        if begun is not None:
            with self.lock:
                e = self.directory.get(sid)
                if e is not None and (e.slab is None or e.slab == dead):  # not moved yet
                    e.begun = max(e.begun, begun)
                elif e is not None and e.notice is not None:  # moved: its notice counts it
                    e.notice["lost_turns"] = max(int(e.notice["lost_turns"]),
                                                 begun - int(e.notice["from_turn"]))
        if dead is not None:
            self.placement.mark_dead(dead, "a front could not reach it")
        self._start_recovery(sid, dead)
        with self.lock:
            e = self.directory.get(sid)
            return self._out(e) if e is not None else None

    def _start_recovery(self, sid: str, dead: str | None) -> None:
        """Open ``sid`` elsewhere in the background (once at a time per session; on the
        recovery threads, so lookups never wait on one)."""
        with self.lock:
            e = self.directory.get(sid)
            if e is None or e.recovering or not self._orphaned(e):
                return
            e.recovering = True
        try:
            self._recoveries.submit(self._recover, sid, dead, True)
        except RuntimeError:  # shutting down
            with self.lock:
                e.recovering = False

    def _orphaned(self, e: Entry) -> bool:
        """Whether ``e`` has no live slab (under the lock). One whose slab still answers
        stays there: opening it elsewhere from its save would leave two slabs serving it."""
        slab = self.placement.get(e.slab)
        return slab is None or slab.dead is not None

    def _recover(self, sid: str, dead: str | None, claimed: bool = False) -> None:
        """Open ``sid`` on a live slab from its last save (one recovery at a time per
        session: ``claimed`` when the caller marked it recovering; a session whose save
        cannot be read back is kept, said in ``failed``, and tried again later)."""
        with self.lock:
            e = self.directory.get(sid)
            if e is None or not self._orphaned(e) or (e.recovering and not claimed):
                if e is not None and claimed:
                    e.recovering = False
                return
            e.recovering = True
        try:
            fenced = e.fence - time.monotonic()
            if fenced > 0:  # its old slab may still serve until its lease runs out
                time.sleep(fenced)
            for attempt in range(3):  # a target that dies under it: the next one
                slab = self.placement.slab_for(e.memory, avoid=dead)
                try:
                    info = self._open(slab, sid, e.tenant, e.spec, True)
                    break
                except Exception as exc:
                    self.placement.give_back(slab, e.memory)
                    if attempt == 2 or not isinstance(exc, self._ray.exceptions.RayActorError):
                        raise
                    self.placement.mark_dead(slab.name,
                                             "it died while a session was opened on it")
            with self.lock:
                e.slab = slab.name
                slab.sessions.add(sid)
                saved = int(info["turns"])
                e.notice = {"from_turn": saved, "lost_turns": max(0, e.begun - saved),
                            "files_kept": bool(info.get("files_kept")),
                            "saved_at": info.get("saved_at"),
                            "reason": f"{e.gone}; it was opened again from its last "
                                      f"save on node {slab.node}"}
                e.turns = e.begun = saved
                self.counts["recoveries"] += 1
        except Exception as exc:  # said to the front; tried again on its next use
            e.failed = f"{type(exc).__name__}: {exc}"[:500]
        else:
            e.failed = None
        finally:
            with self.lock:
                e.recovering = False

    def _monitor(self, every: float) -> None:
        """Every ``every`` seconds: :meth:`_watch`. A round that fails is logged and the next
        one runs (a monitor that died would leave every lost slab's sessions unmoved)."""
        while True:
            time.sleep(every)
            try:
                self._watch(every)
            except Exception:
                LOG.exception("the control actor's monitor round failed")

    def _watch(self, every: float) -> None:
        """Ping the live slabs (a silent one is marked dead), retire empty ones, end the
        sessions past their limits and start moving those without a slab."""
        self.placement.ping(every)
        self.placement.retire_empty()
        self.checkpoints.expire()
        for front in self.turns.expire_fronts():
            LOG.warning("front %s said nothing for %gs: its running turns are given back",
                        front, FRONT_LEASE)
        now = time.time()
        with self.lock:
            ended = [(e.tenant, e.id, why) for e in self.directory
                     if (why := e.why_ended(now)) is not None]
        for tenant, sid, why in ended:  # their quota freed within a second
            try:
                self.close(tenant, sid, why)
            except Exception:
                LOG.exception("ending session %s (%s) failed", sid, why)
        with self.lock:
            orphans = [e.id for e in self.directory if e.slab is None and not e.recovering]
        for sid in orphans:
            self._start_recovery(sid, None)

    def _adopt_slabs(self) -> None:
        """The slabs still alive (this actor was restarted, not the cluster): the sessions
        they hold stay where they are, their entries rebuilt from what each slab holds (its
        tenant and spec), so they answer before any record is read."""
        for slab, held in self.placement.adopt():
            for sid, turns, tenant, spec in held:
                try:
                    limits = limits_from_wire(spec["limits"])
                except Exception:  # a slab of another build: its sessions read back
                    continue
                with self.lock:
                    if sid in self.directory:  # on two slabs: the first keeps it
                        continue
                    self.directory.put(Entry(str(sid), str(tenant), spec, limits.memory,
                                             limits.disk_bytes, slab.name, turns=int(turns),
                                             begun=int(turns)))
                    slab.sessions.add(str(sid))
                    slab.used += limits.memory

    # ---- the cluster's view -------------------------------------------------------------------
    def drain(self, node: str) -> dict[str, Any]:
        """Move every session off ``node`` (saved there, opened elsewhere); it takes no new
        slab until :meth:`undrain`. How many moved, and those that could not."""
        with self.lock:
            self.placement.draining.add(node)
            todo = [(s, sid) for s in self.placement.slabs.values()
                    if s.node == node and s.dead is None for sid in list(s.sessions)]
        moved, failed = 0, []
        for slab, sid in todo:
            try:
                with self.lock:
                    e = self.directory.get(sid)
                if e is None:
                    continue
                out: Outcome = self._ray.get(slab.handle.save.remote(sid),
                                             timeout=self.place_timeout)
                out.unwrap()
                target = self.placement.slab_for(e.memory, avoid=slab.name)
                try:
                    self._open(target, sid, e.tenant, e.spec, True)
                except BaseException:
                    self.placement.give_back(target, e.memory)
                    raise
                with self.lock:
                    e.slab = target.name
                    target.sessions.add(sid)
                    slab.sessions.discard(sid)
                    slab.used -= e.memory
                self._ray.get(slab.handle.close.remote(sid, False), timeout=30)
                moved += 1
            except Exception as exc:  # reported, left where it is
                failed.append({"session": sid, "error": f"{type(exc).__name__}: {exc}"})
        return {"node": node, "moved": moved, "failed": failed}

    def undrain(self, node: str) -> None:
        with self.lock:
            self.placement.draining.discard(node)

    def stats(self) -> dict[str, Any]:
        nodes, slabs = self.placement.stats()
        with self.lock:
            return {"nodes": nodes, "slabs": slabs, "sessions": self.directory.per_tenant(),
                    "running": self.turns.running(),
                    "counts": dict(self.counts),
                    "checkpoints": {a.name: len(a.checkpoints)
                                    for a in self.ledger.accounts()},
                    "loading": not self.read_back.loaded.is_set(),
                    "pid": os.getpid()}  # the actor's process, for an operator's tools

    def ping(self) -> bool:
        return True
