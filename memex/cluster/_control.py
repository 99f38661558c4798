"""The control actor of a ``memex serve`` cluster (docs/scaling.md): one named, detached Ray
actor that every front asks, and the one place where the cluster's shared facts live.

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
  when something of that tenant is first asked (its create, lookup, turn), through the
  storage's per-tenant index (``owners/<tenant>/<sid>``, written before a session opens),
  so that costs the tenant's own sessions, never the cluster's; a background thread reads
  the rest.
* **Fronts' leases.** What a front holds here (the turns it was admitted and has not ended,
  the turns it said run through it) lasts while it speaks: it asks for the config every
  second, which renews its lease. A front silent for :data:`FRONT_LEASE` seconds (killed,
  cut off) loses them: its tenants' running turns come back and its sessions may end by
  their limits, with no word from it. A front that comes back after that ends nothing twice.
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
import json
import logging
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import msgpack

from ..backends.internal import (
    Ledger,
    error_to_wire,
    limits_from_wire,
)
from ..errors import BackendBusy, ConfigError, ImageError, MemexError
from ..runtime_wasm import Limits
from ..runtime_wasm.internal import DecodeCost, unpack_bounded
from ..serving.internal import DoorKit, SlabDoors
from ._direct import Outcome
from ._leases import FRONT_LEASE, FrontLeases
from ._replies import Admitted, Failed, Granted, Refused, Reply, Tokens, Wait
from ._slab import SLAB_LEASE, Slab, session_key
from ._storage import Storage

__all__ = ["CONTROL_NAME", "TOKEN_LEASE", "Control", "ControlRefusal", "checkpoint_key"]

CONTROL_NAME = "memex-control"
LOG = logging.getLogger("memex.serving")


class ControlRefusal(Exception):
    """What the control actor refuses, as data a front turns into its answer: ``code`` is
    ``quota`` (429), ``busy`` (503: no room in the cluster) or ``not_found``."""

    def __init__(self, code: str, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.code, self.message, self.retry_after = code, message, retry_after

    def reply(self) -> Refused:
        return Refused(self.code, self.message, self.retry_after)

    def __reduce__(self) -> tuple[Any, ...]:  # it may cross Ray: rebuilt with its arguments
        return (type(self), (self.code, self.message, self.retry_after))


@dataclass(eq=False)
class _Entry:
    id: str
    tenant: str
    spec: dict[str, Any]
    memory: int
    disk: int
    slab: str | None
    created: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.time)
    parent: str | None = None
    begun: int = 0  # turns begun (what a node's death loses is begun - saved)
    turns: int = 0  # turns its slab last reported
    running: int = 0
    notice: dict[str, Any] | None = None
    gone: str = "its slab was lost (its node died, or it stopped answering)"  # for the notice
    fence: float = 0.0  # not opened elsewhere before (monotonic): its old slab's lease ran out
    running_at: dict[str, int] = field(default_factory=dict)  # front -> turns it said run
    recovering: bool = False
    failed: str | None = None  # why its last recovery failed

    def __post_init__(self) -> None:
        self.limits: Limits = limits_from_wire(self.spec["limits"])  # its lifetime and idle

    def why_ended(self, now: float) -> str | None:
        """Why its own limits ended it (as ``CoreSession.why_ended``); a session with a turn
        running is left to finish."""
        if self.running or any(self.running_at.values()):
            return None
        lifetime, idle_timeout = self.limits.lifetime, self.limits.idle_timeout
        if lifetime is not None and now - self.created >= lifetime:
            return "its lifetime ended"
        if idle_timeout is not None and now - self.last_used >= idle_timeout:
            return "its idle timeout passed"
        return None

    def out(self) -> dict[str, Any]:
        return {"id": self.id, "tenant": self.tenant, "spec": self.spec, "slab": self.slab,
                "failed": self.failed, "moving": self.recovering,
                "created": self.created, "last_used": self.last_used, "parent": self.parent,
                "turns": max(self.turns, 0), "notice": self.notice}


@dataclass(eq=False)
class _SlabInfo:
    name: str
    handle: Any
    node: str
    capacity: int
    endpoint: list[Any]  # its direct path (host, port), and the secret that opens it
    secret: bytes
    last_ok: float = field(default_factory=time.monotonic)  # its lease renewed then
    empty_since: float | None = None  # monotonic: it has held no session since
    used: int = 0
    dead: str | None = None
    sessions: set[str] = field(default_factory=set)


class Control:
    """The cluster's directory, ledger, placement and config (made remote by
    ``memex.service``'s cluster front: ``ray.remote(Control)``, named ``CONTROL_NAME``); what
    each front holds is kept by its leases (``serving._leases``), applied here."""

    def __init__(self, storage: Storage, *, namespace: str, slab_memory: int,
                 slab_cpus: float, save_interval: float, place_timeout: float = 60.0,
                 slab_idle: float = 60.0, checkpoint_ttl: float = 600.0,
                 monitor: float = 1.0, guest_nice: int = 0, backfill: bool = True) -> None:
        import ray
        self._ray = ray
        self.storage, self.namespace = storage, namespace
        self.slab_memory, self.slab_cpus = slab_memory, slab_cpus
        self.save_interval, self.place_timeout = save_interval, place_timeout
        self.slab_idle, self.checkpoint_ttl = slab_idle, checkpoint_ttl
        self.guest_nice = guest_nice  # the slabs' guests' (serve.toml's [server] guest_nice)
        self.lock = threading.RLock()
        self.placing = threading.Lock()
        self.sessions: dict[str, _Entry] = {}
        # each tenant's account in the cluster: sessions being made (reserved*), its held
        # checkpoints (cid -> their meta), running turns, rate bucket; the one Ledger of
        # memex.serving (a server's too), kept under self.lock
        self.ledger = Ledger()
        self.slabs: dict[str, _SlabInfo] = {}
        self.leases = FrontLeases()  # what each front holds, under its lease
        self.fronts = self.leases.fronts  # by the id each front names itself with
        self.config_text: tuple[int, str] | None = None
        self.kits: dict[str, dict[str, Any]] = {}  # tenant -> its DoorKit's wire
        self.draining: set[str] = set()
        self.suspect: dict[str, float] = {}  # node -> when a slab of it was lost (monotonic)
        self.counts = {"lookups": 0, "turns": 0, "creates": 0, "recoveries": 0,
                       "token_batches": 0}
        self._remote_slab = ray.remote(Slab)
        self._recoveries = concurrent.futures.ThreadPoolExecutor(
            RECOVERY_THREADS, thread_name_prefix="memex-control-recover")
        # after a restart: the tenants whose saved sessions and checkpoints are read back
        # (each once, on first use or by the back-fill), the gate each is read under, and
        # whether the storage's per-tenant index is complete (a store written before it
        # existed is indexed once, by the back-fill, before any tenant is read)
        self._read: set[str] = set()
        self._gates: dict[str, threading.Lock] = {}
        self.indexed = threading.Event()
        self.loaded = threading.Event()
        self._load_config()
        if self.config_text is not None:  # a predecessor's (this actor was restarted, or
            # the cluster): its rate buckets are gone, and may have been empty; each fills
            # from now (Ledger.refill_from), never a fresh burst on top of the last
            self.ledger.refill_from = time.monotonic()
        self._adopt_slabs()
        if not backfill:  # the caller's word: a store already indexed, read on demand only
            self.indexed.set()
        else:
            threading.Thread(target=self._backfill, name="memex-control-backfill",
                             daemon=True).start()
        threading.Thread(target=self._monitor, args=(monitor,), name="memex-control-monitor",
                         daemon=True).start()

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
               admitted: list[list[Any]] | None = None
               ) -> tuple[int, str, dict[str, Any]] | None:
        """The held config and its kits when it is newer than ``known``, else None. Asked
        every second by each front: it renews ``front``'s lease. ``admitted``: the turns
        this actor admitted through the front that have not ended, ``[tenant, sid, n]``;
        taken the first time this actor hears the front (after a restart of this actor, or
        the front's lease ran out), so a restart does not forget the running turns of
        ``max_running`` tenants."""
        with self.lock:
            if front is not None:
                self.leases.renew(front)
                took = self.leases.adopt(front, admitted, self._of) if admitted is not None \
                    else iter(())
                for tenant, sid, more in took:
                    self.ledger.account(tenant).running += more
                    self.sessions[sid].running += more
            held, kits = self.config_text, self.kits
        return (held[0], held[1], kits) if held is not None and held[0] > known else None

    # ---- ledger -------------------------------------------------------------------------------
    def _used(self, tenant: str) -> tuple[int, int, int]:
        """(under the lock) The tenant's sessions, memory and disk, from its account: in
        constant time in the cluster's sessions (its checkpoints are bounded by its
        max_checkpoints)."""
        a = self.ledger.account(tenant)
        held = sum(int(c["size"]) for c in a.checkpoints.values())
        return (a.sessions + a.reserved, a.session_memory + held + a.reserved_memory,
                a.session_disk + a.reserved_disk)

    def _put(self, e: _Entry) -> None:
        """(under the lock) A session into the directory, counted in its tenant's account."""
        old = self.sessions.get(e.id)
        if old is not None:
            self._count(old, -1)
        self.sessions[e.id] = e
        self._count(e, 1)

    def _drop(self, sid: str) -> None:
        """(under the lock) A session out of the directory and its tenant's account."""
        e = self.sessions.pop(sid)
        self._count(e, -1)

    def _count(self, e: _Entry, sign: int) -> None:
        a = self.ledger.account(e.tenant)
        a.sessions += sign
        a.session_memory += sign * e.memory
        a.session_disk += sign * e.disk

    def _reserve(self, tenant: str, bounds: dict[str, Any], memory: int, disk: int) -> None:
        count, used_memory, used_disk = self._used(tenant)
        if bounds.get("max_sessions") is not None and count >= bounds["max_sessions"]:
            raise ControlRefusal("quota", f"{tenant!r} holds {count} sessions across the "
                                 f"cluster, its bound is {bounds['max_sessions']}: close one "
                                 "first")
        for what, bound, used, more in (
                ("session memory and checkpoints", bounds.get("max_memory"), used_memory,
                 memory), ("disk", bounds.get("max_disk"), used_disk, disk)):
            if bound is not None and used + more > bound:
                raise ControlRefusal("quota", f"{tenant!r} would hold {used + more} bytes of "
                                     f"{what} across the cluster, its bound is {bound}")
        a = self.ledger.account(tenant)
        a.reserved, a.reserved_memory, a.reserved_disk = \
            a.reserved + 1, a.reserved_memory + memory, a.reserved_disk + disk

    def _unreserve(self, tenant: str, memory: int, disk: int) -> None:
        a = self.ledger.account(tenant)
        a.reserved, a.reserved_memory, a.reserved_disk = \
            a.reserved - 1, a.reserved_memory - memory, a.reserved_disk - disk

    # ---- placement ----------------------------------------------------------------------------
    def _slab_for(self, memory: int, avoid: str | None = None) -> _SlabInfo:
        """A live slab with room for ``memory`` (the fullest that fits: slabs fill before
        new ones are made), else a new one Ray places; its room is taken at once. ``avoid``
        (a lost or draining slab) and the other slabs of its node are passed over."""
        if memory > self.slab_memory:
            raise ControlRefusal("quota", f"a session of {memory} bytes is larger than the "
                                 f"cluster's slab ({self.slab_memory} bytes)")
        def fitting(suspect_too: bool) -> _SlabInfo | None:
            with self.lock:
                shun = self.slabs[avoid].node if avoid in self.slabs else None  # its node
                fits = [s for s in self.slabs.values() if s.dead is None and s.name != avoid
                        and s.node != shun and s.node not in self.draining
                        and (suspect_too or s.node not in self.suspect)
                        and s.capacity - s.used >= memory]
                if not fits:
                    return None
                best = max(fits, key=lambda s: s.used)
                best.used += memory
                return best

        found = fitting(False)
        if found is not None:
            return found
        with self.placing:  # one slab made at a time: racing creates fill it, not make more
            found = fitting(False)
            if found is None and not self._healthy_nodes():  # a slab of a suspect node, then
                found = fitting(True)
            if found is not None:
                return found
            info = self._new_slab()
            with self.lock:
                info.used += memory
            return info

    def _slab_nodes(self) -> set[str]:
        """The live nodes Ray says could hold a slab at all (not the head)."""
        return {n["NodeID"] for n in self._ray.nodes() if n.get("Alive")
                and n.get("Resources", {}).get("CPU", 0) >= self.slab_cpus
                and n.get("Resources", {}).get("memory", 0) >= self.slab_memory}

    def _shunned(self, live: set[str]) -> set[str]:
        """The live nodes no new slab goes to while others can take it: draining ones, and
        those that just lost a slab (Ray notices a dead machine only after missed heartbeats,
        and a slab placed on it would never start, the sessions waiting on it with it)."""
        now = time.monotonic()
        with self.lock:
            self.suspect = {n: t for n, t in self.suspect.items() if now - t < SUSPECT_FOR}
            return (self.draining | self.suspect.keys()) & live

    def _healthy_nodes(self) -> set[str]:
        live = self._slab_nodes()
        return live - self._shunned(live)

    def _new_slab(self) -> _SlabInfo:
        """A new slab where Ray places it; one that dies as it starts (placed on a node
        being lost) is made again, twice at most."""
        for attempt in range(3):
            try:
                return self._place_slab()
            except self._ray.exceptions.RayActorError:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _place_slab(self) -> _SlabInfo:
        ray = self._ray
        name = f"memex-slab-{secrets.token_hex(6)}"
        opts: dict[str, Any] = {
            "name": name, "namespace": self.namespace, "lifetime": "detached",
            "num_cpus": self.slab_cpus, "memory": self.slab_memory, "max_concurrency": 64,
            "max_restarts": 0}
        live = self._slab_nodes()
        shunned = self._shunned(live)
        if shunned and live - shunned:
            opts["label_selector"] = {NODE_LABEL: f"!in({','.join(sorted(shunned))})"}
        opts["scheduling_strategy"] = "SPREAD"
        handle = self._remote_slab.options(**opts).remote(
            name, self.storage, self.save_interval, SlabDoors(), guest_nice=self.guest_nice)
        try:
            info = ray.get(handle.ready.remote(), timeout=self.place_timeout)
        except ray.exceptions.RayActorError:
            raise
        except Exception:
            with contextlib.suppress(Exception):
                ray.kill(handle)
            raise ControlRefusal("busy", "the cluster has no node with room for another "
                                 f"slab of {self.slab_memory} bytes and {self.slab_cpus} "
                                 "CPUs; retry later, or add nodes", retry_after=5) from None
        slab = _SlabInfo(name, handle, str(info["node"]), self.slab_memory,
                         list(info["endpoint"]), bytes(info["secret"]))
        with self.lock:
            self.slabs[name] = slab
        return slab

    def _open(self, slab: _SlabInfo, sid: str, tenant: str, spec: dict[str, Any],
              from_save: bool) -> dict[str, Any]:
        kit = self.kits.get(tenant)  # its operator tools and egress policy, served there
        out: Outcome = self._ray.get(slab.handle.open.remote(sid, tenant, spec, from_save,
                                                             kit), timeout=self.place_timeout)
        result: dict[str, Any] = out.unwrap()
        return result

    def _out(self, e: _Entry) -> dict[str, Any]:
        """The entry as a front gets it: with its slab's direct path (Ray is the boundary
        the secret stays within; the service never sends it to a client)."""
        out = e.out()
        slab = self.slabs.get(e.slab) if e.slab is not None else None
        out["endpoint"] = slab.endpoint if slab is not None else None
        out["secret"] = slab.secret if slab is not None else None
        return out

    # ---- sessions -----------------------------------------------------------------------------
    def create(self, tenant: str, bounds: dict[str, Any], spec: dict[str, Any],
               parent: str | None = None) -> Reply:
        """A new session's entry (:class:`Granted`), within the tenant's cluster-wide
        bounds; else :class:`Refused` or :class:`Failed`."""
        limits = limits_from_wire(spec["limits"])
        memory, disk = limits.memory, limits.disk_bytes
        sid = "s_" + secrets.token_urlsafe(12)
        try:
            self._tenant(tenant)
            with self.lock:
                self._reserve(tenant, bounds, memory, disk)
            try:
                slab = self._slab_for(memory)
                try:
                    self.storage.put(owner_key(tenant, sid), b"")
                    self._open(slab, sid, tenant, spec, False)
                except BaseException:
                    with self.lock:
                        slab.used -= memory
                    with contextlib.suppress(Exception):
                        self.storage.delete(owner_key(tenant, sid))
                    raise
                e = _Entry(sid, tenant, spec, memory, disk, slab.name, parent=parent)
                with self.lock:
                    self._put(e)
                    slab.sessions.add(sid)
                    self.counts["creates"] += 1
            finally:
                with self.lock:
                    self._unreserve(tenant, memory, disk)
        except ControlRefusal as refusal:
            return refusal.reply()
        except Exception as exc:  # a typed answer for the front
            return Failed(_wire(exc))
        return Granted(self._out(e))

    def fork(self, tenant: str, bounds: dict[str, Any], sid: str) -> Reply:
        """A child of ``sid`` holding its state: in the parent's slab when it has room,
        else opened on another from the parent's save (the parent is saved first)."""
        try:
            self._tenant(tenant)
        except Exception as exc:
            return Failed(_wire(exc))
        with self.lock:
            p = self.sessions.get(sid)
        if p is None or p.tenant != tenant or p.slab is None:
            return ControlRefusal("not_found", f"no session {sid!r}").reply()
        child = "s_" + secrets.token_urlsafe(12)
        try:
            with self.lock:
                self._reserve(tenant, bounds, p.memory, p.disk)
            marked = False
            try:
                self.storage.put(owner_key(tenant, child), b"")
                marked = True
                with self.lock:
                    slab = self.slabs[p.slab]
                    here = slab.dead is None and slab.capacity - slab.used >= p.memory
                    if here:
                        slab.used += p.memory
                if here:
                    try:
                        forked: Outcome = self._ray.get(slab.handle.fork.remote(sid, child),
                                                        timeout=self.place_timeout)
                        turns = int(forked.unwrap()["turns"])
                    except BaseException:
                        with self.lock:
                            slab.used -= p.memory
                        raise
                else:
                    saved: Outcome = self._ray.get(slab.handle.save.remote(sid),
                                                   timeout=self.place_timeout)
                    saved.unwrap()
                    self.storage.put(session_key(child, "record"), _child_record(
                        self.storage, sid, child, p.memory))
                    slab = self._slab_for(p.memory)
                    try:
                        turns = int(self._open(slab, child, tenant, p.spec, True)["turns"])
                    except BaseException:
                        with self.lock:
                            slab.used -= p.memory
                        raise
                e = _Entry(child, tenant, p.spec, p.memory, p.disk, slab.name, parent=sid,
                           turns=turns, begun=turns)
                with self.lock:
                    self._put(e)
                    slab.sessions.add(child)
                marked = False
            finally:
                if marked:  # the child did not open: no index entry left for it
                    with contextlib.suppress(Exception):
                        self.storage.delete(owner_key(tenant, child))
                with self.lock:
                    self._unreserve(tenant, p.memory, p.disk)
        except ControlRefusal as refusal:
            return refusal.reply()
        except Exception as exc:
            return Failed(_wire(exc))
        return Granted(self._out(e))

    def lookup(self, tenant: str, sid: str) -> dict[str, Any] | None:
        """The session's entry (None: no such session of this tenant), at once. A session
        with no slab (the cluster restarted, or its slab died) is being opened on one:
        its entry says ``moving`` (ask again shortly), or why that ``failed``."""
        self._tenant(tenant)
        with self.lock:
            self.counts["lookups"] += 1
            e = self.sessions.get(sid)
            if e is None or e.tenant != tenant:
                return None
            if e.slab is not None:
                return self._out(e)
        self._start_recovery(sid, None)
        with self.lock:
            e = self.sessions.get(sid)
            return self._out(e) if e is not None else None

    def of(self, tenant: str) -> list[dict[str, Any]]:
        self._tenant(tenant)
        with self.lock:
            return [self._out(e) for e in self.sessions.values() if e.tenant == tenant]

    def close(self, tenant: str, sid: str, why: str = "closed") -> bool:
        self._tenant(tenant)
        with self.lock:
            e = self.sessions.get(sid)
            if e is None or e.tenant != tenant:
                return False
            self._drop(sid)
            slab = self.slabs.get(e.slab) if e.slab is not None else None
            if slab is not None:
                slab.used -= e.memory
                slab.sessions.discard(sid)
            # its checkpoints stay held checkpoint_ttl more (another session may restore one)
            expires = time.time() + self.checkpoint_ttl
            orphans = [(c, h) for c, h in self.ledger.account(tenant).checkpoints.items()
                       if h["session"] == sid and h.get("expires") is None]
            for _, h in orphans:
                h["expires"] = expires
        for c, h in orphans:  # said in the storage too: a restarted control actor ends them
            with contextlib.suppress(Exception):
                self.storage.put(checkpoint_key(tenant, c, "meta"), json.dumps(
                    {k: h[k] for k in ("size", "turns", "session", "expires")}).encode())
        self._expire_checkpoints()
        if slab is not None and slab.dead is None:
            with contextlib.suppress(Exception):
                self._ray.get(slab.handle.close.remote(sid, True), timeout=30)
        else:
            self.storage.delete(session_key(sid))
        with contextlib.suppress(Exception):  # its record is gone first: a marker left
            self.storage.delete(owner_key(tenant, sid))  # alone is dropped when read
        return True

    def _of(self, tenant: str, sid: str) -> bool:
        """(under the lock) Whether ``sid`` is a session of ``tenant`` in the directory."""
        e = self.sessions.get(sid)
        return e is not None and e.tenant == tenant

    def _expire_fronts(self) -> list[str]:
        """(under the lock) Take back what each front silent for FRONT_LEASE held: its open
        turns from its tenants' accounts and its sessions, and the turns it said were
        running. The fronts dropped."""
        gone = self.leases.expire()
        for front, f in gone:
            for (tenant, sid), n in f.turns.items():
                a = self.ledger.account(tenant)
                a.running = max(0, a.running - n)
                e = self.sessions.get(sid)
                if e is not None:
                    e.running = max(0, e.running - n)
            for sid in f.reported:
                e = self.sessions.get(sid)
                if e is not None:
                    e.running_at.pop(front, None)
        return [front for front, _ in gone]

    def turn_begin(self, tenant: str, sid: str, max_running: int | None,
                   rate: float | None, burst: int, front: str | None = None
                   ) -> Admitted | Wait | Refused:
        """Admit one turn of ``sid``: :class:`Admitted` (where it is now, and what a
        recovery lost, said once), or :class:`Wait` while the tenant runs ``max_running``
        turns across the cluster, or :class:`Refused` past its rate.
        The turn is held under ``front``'s lease until :meth:`turn_end` (or the lease
        runs out)."""
        self._tenant(tenant)
        with self.lock:
            e = self.sessions.get(sid)
            if e is None or e.tenant != tenant:
                return ControlRefusal("not_found", f"no session {sid!r}").reply()
            a = self.ledger.account(tenant)
            if max_running is not None and a.running >= max_running:
                return Wait()
            if rate:
                wait = a.take(rate, 0.0, burst)  # no token now: refused, nothing reserved
                if wait < 0:
                    return _past_rate(tenant, rate, a.tokens)
            a.running += 1
            e.begun = max(e.begun, e.turns) + 1
            e.running += 1
            if front is not None:
                self.leases.hold(front, tenant, sid)
            e.last_used = time.time()
            self.counts["turns"] += 1
            notice, e.notice = e.notice, None
            return Admitted(e.slab, notice)

    def take_tokens(self, tenant: str, rate: float, burst: int, want: int,
                    returned: int = 0) -> Tokens | Refused:
        """Up to ``want`` of the tenant's rate tokens, taken from its bucket now, for a
        front to admit that many turns of a tenant with a rate and no ``max_running`` by
        itself (within :data:`TOKEN_LEASE` seconds, then it gives back what it did not
        spend: ``returned``, put back first, or :meth:`give_back_tokens`): a tenant's turns
        within its rate then ask this actor once a batch per front, not once a turn. Every
        token comes out of the one bucket, so the tenant's turns across the fronts stay
        within its burst plus its rate times the seconds."""
        self._tenant(tenant)
        want = max(1, min(int(want), int(burst), MAX_TOKENS))
        with self.lock:
            a = self.ledger.account(tenant)
            if returned:
                a.give_back(rate, burst, min(max(0, int(returned)), MAX_TOKENS))
            n = a.take_up_to(rate, burst, want)
            if n == 0:
                return _past_rate(tenant, rate, a.tokens)
            self.counts["token_batches"] += 1
            return Tokens(n)

    def give_back_tokens(self, tenant: str, rate: float, burst: int, n: int) -> None:
        """Tokens a front took and did not spend within its lease, back in the bucket."""
        with self.lock:
            self.ledger.account(tenant).give_back(rate, burst, min(max(0, int(n)),
                                                                    MAX_TOKENS))

    def turn_end(self, tenant: str, sid: str, turns: int | None, admitted: bool = True,
                 front: str | None = None) -> None:
        """A turn of ``sid`` ended (``admitted``: one :meth:`turn_begin` let in; else a
        front's report of a turn no bound asked to admit): the session's turns and use.
        A turn ``front`` no longer holds (its lease ran out and gave it back) is not
        given back twice."""
        with self.lock:
            e = self.sessions.get(sid)
            if admitted and front is not None:
                admitted = self.leases.release(front, tenant, sid)
            if admitted:
                a = self.ledger.account(tenant)
                a.running = max(0, a.running - 1)
                if e is not None:
                    e.running = max(0, e.running - 1)
            if e is not None:
                e.last_used = time.time()
                if turns is not None:
                    e.turns = max(e.turns, turns)
                    e.begun = max(e.begun, turns)

    def report(self, uses: list[list[Any]], front: str = "") -> None:
        """A front's batch of ``[sid, turns, running, last_used]``: the turns its sessions'
        slabs answered, the turns still running there, and when they were last used (sent
        about once a second, so a turn costs the control actor nothing). The running ones
        count under ``front``'s lease."""
        with self.lock:
            self.leases.renew(front)
            for sid, turns, running, last_used in uses:
                e = self.sessions.get(sid)
                if e is None:
                    continue
                e.turns = max(e.turns, int(turns))
                e.begun = max(e.begun, e.turns)  # a turn running now may not have reached
                # its slab yet: one lost under it is counted by the front that lost it
                e.last_used = max(e.last_used, float(last_used))
                if int(running):
                    e.running_at[front] = int(running)
                else:
                    e.running_at.pop(front, None)
                self.leases.running(front, sid, bool(int(running)))

    def take_notice(self, sid: str) -> dict[str, Any] | None:
        """What the session's last recovery lost, said once."""
        with self.lock:
            e = self.sessions.get(sid)
            if e is None:
                return None
            notice, e.notice = e.notice, None
            return notice

    # ---- checkpoints --------------------------------------------------------------------------
    def hold(self, tenant: str, bounds: dict[str, Any], cid: str, size: int, turns: int,
             session: str) -> Granted | Refused:
        """Count a checkpoint its slab wrote (``checkpoint_key``) against the tenant; past
        ``max_memory`` it is refused and removed, past ``max_checkpoints`` the oldest goes."""
        gone: list[str] = []
        self._tenant(tenant)
        with self.lock:
            held = self.ledger.account(tenant).checkpoints
            _, used, _ = self._used(tenant)
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

    def _expire_checkpoints(self) -> None:
        """Drop the checkpoints whose session closed ``checkpoint_ttl`` ago (and the room
        they held with them)."""
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

    def checkpoint(self, tenant: str, cid: str) -> dict[str, Any] | None:
        self._tenant(tenant)
        with self.lock:
            a = self.ledger.find(tenant)
            held = a.checkpoints.get(cid) if a is not None else None
            return dict(held) if held is not None else None

    def drop_checkpoint(self, tenant: str, cid: str) -> bool:
        self._tenant(tenant)
        with self.lock:
            a = self.ledger.find(tenant)
            held = a.checkpoints.pop(cid, None) if a is not None else None
        if held is not None:
            self.storage.delete(checkpoint_key(tenant, cid))
        return held is not None

    # ---- recovery -----------------------------------------------------------------------------
    def recover(self, sid: str, dead: str | None, begun: int | None = None,
                tenant: str | None = None) -> dict[str, Any] | None:
        """The front found ``dead`` (the slab it knew for ``sid``) gone, with ``begun``
        turns begun as far as it knows (a turn it lost counts): the session's entry once it
        is open elsewhere (None if it ended). ``tenant``: whose it is (read back first
        after a restart)."""
        if tenant is not None:
            self._tenant(tenant)
        if begun is not None:
            with self.lock:
                e = self.sessions.get(sid)
                if e is not None and (e.slab is None or e.slab == dead):  # not moved yet
                    e.begun = max(e.begun, begun)
                elif e is not None and e.notice is not None:  # moved: its notice counts it
                    e.notice["lost_turns"] = max(int(e.notice["lost_turns"]),
                                                 begun - int(e.notice["from_turn"]))
        if dead is not None:
            self._mark_dead(dead, "a front could not reach it")
        self._start_recovery(sid, dead)
        with self.lock:
            e = self.sessions.get(sid)
            return self._out(e) if e is not None else None

    def _start_recovery(self, sid: str, dead: str | None) -> None:
        """Open ``sid`` elsewhere in the background (once at a time per session; on the
        recovery threads, so lookups never wait on one)."""
        with self.lock:
            e = self.sessions.get(sid)
            if e is None or e.recovering or not self._orphaned(e):
                return
            e.recovering = True
        try:
            self._recoveries.submit(self._recover, sid, dead, True)
        except RuntimeError:  # shutting down
            with self.lock:
                e.recovering = False

    def _orphaned(self, e: _Entry) -> bool:
        """Whether ``e`` has no live slab (under the lock). One whose slab still answers
        stays there: opening it elsewhere from its save would leave two slabs serving it."""
        slab = self.slabs.get(e.slab) if e.slab is not None else None
        return slab is None or slab.dead is not None

    def _mark_dead(self, name: str, why: str) -> None:
        with self.lock:
            slab = self.slabs.get(name)
            if slab is None or slab.dead is not None:
                return
        try:  # a front's word is checked: a slab that answers is not dead
            self._ray.get(slab.handle.ready.remote(), timeout=5)
            slab.last_ok = time.monotonic()
            return
        except Exception:  # dead, or unreachable for 5 s: replaced
            pass
        fence = slab.last_ok + SLAB_LEASE + 0.25
        with self.lock:
            slab.dead = why
            self.suspect[slab.node] = time.monotonic()
            for sid in slab.sessions:
                e = self.sessions.get(sid)
                if e is not None and e.slab == name:
                    e.slab, e.fence = None, fence
            slab.sessions.clear()
            slab.used = 0
        with contextlib.suppress(Exception):
            self._ray.kill(slab.handle)

    def _recover(self, sid: str, dead: str | None, claimed: bool = False) -> None:
        """Open ``sid`` on a live slab from its last save (one recovery at a time per
        session: ``claimed`` when the caller marked it recovering; a session whose save
        cannot be read back is kept, said in ``failed``, and tried again later)."""
        with self.lock:
            e = self.sessions.get(sid)
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
                slab = self._slab_for(e.memory, avoid=dead)
                try:
                    info = self._open(slab, sid, e.tenant, e.spec, True)
                    break
                except Exception as exc:
                    with self.lock:
                        slab.used -= e.memory
                    if attempt == 2 or not isinstance(exc, self._ray.exceptions.RayActorError):
                        raise
                    self._mark_dead(slab.name, "it died while a session was opened on it")
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
        with self.lock:
            slabs = [s for s in self.slabs.values() if s.dead is None]
        refs = [(s, s.handle.ready.remote()) for s in slabs]
        for s, ref in refs:
            try:
                self._ray.get(ref, timeout=max(2.0, every * 2))
                s.last_ok = time.monotonic()
            except Exception:
                self._mark_dead(s.name, "it stopped answering")
        self._retire_empty()
        self._expire_checkpoints()
        with self.lock:
            for front in self._expire_fronts():
                LOG.warning("front %s said nothing for %gs: its running turns are given "
                            "back", front, FRONT_LEASE)
        now = time.time()
        with self.lock:
            ended = [(e.tenant, sid, why) for sid, e in self.sessions.items()
                     if (why := e.why_ended(now)) is not None]
        for tenant, sid, why in ended:  # their quota freed within a second
            try:
                self.close(tenant, sid, why)
            except Exception:
                LOG.exception("ending session %s (%s) failed", sid, why)
        with self.lock:
            orphans = [sid for sid, e in self.sessions.items()
                       if e.slab is None and not e.recovering]
        for sid in orphans:
            self._start_recovery(sid, None)

    def _retire_empty(self) -> None:
        """Give back to Ray the slabs that held no session for ``slab_idle`` seconds (the
        last live one stays, warm for the next create)."""
        now = time.monotonic()
        with self.lock:
            live = [s for s in self.slabs.values() if s.dead is None]
            for s in live:
                s.empty_since = (s.empty_since or now) if not s.sessions and not s.used \
                    else None
            idle = [s for s in live if s.empty_since is not None
                    and now - s.empty_since >= self.slab_idle]
            if len(idle) == len(live) and idle:
                idle.remove(max(idle, key=lambda s: s.empty_since or 0.0))
            for s in idle:
                s.dead = "retired: it held no session"
                del self.slabs[s.name]
        for s in idle:
            with contextlib.suppress(Exception):
                self._ray.kill(s.handle)

    # ---- the cluster's view -------------------------------------------------------------------
    def drain(self, node: str) -> dict[str, Any]:
        """Move every session off ``node`` (saved there, opened elsewhere); it takes no new
        slab until :meth:`undrain`. How many moved, and those that could not."""
        with self.lock:
            self.draining.add(node)
            todo = [(s, sid) for s in self.slabs.values() if s.node == node and s.dead is None
                    for sid in list(s.sessions)]
        moved, failed = 0, []
        for slab, sid in todo:
            try:
                with self.lock:
                    e = self.sessions.get(sid)
                if e is None:
                    continue
                out: Outcome = self._ray.get(slab.handle.save.remote(sid),
                                             timeout=self.place_timeout)
                out.unwrap()
                target = self._slab_for(e.memory, avoid=slab.name)
                try:
                    self._open(target, sid, e.tenant, e.spec, True)
                except BaseException:
                    with self.lock:
                        target.used -= e.memory
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
            self.draining.discard(node)

    def stats(self) -> dict[str, Any]:
        ray = self._ray
        with self.lock:
            nodes = [{"node": n["NodeID"], "alive": bool(n.get("Alive")),
                      "draining": n["NodeID"] in self.draining}
                     for n in (ray.nodes() if ray.is_initialized() else ())]
            slabs = [{"name": s.name, "node": s.node, "sessions": len(s.sessions),
                      "used": s.used, "capacity": s.capacity} for s in self.slabs.values()
                     if s.dead is None]
            per_tenant: dict[str, int] = {}
            for e in self.sessions.values():
                per_tenant[e.tenant] = per_tenant.get(e.tenant, 0) + 1
            return {"nodes": nodes, "slabs": slabs, "sessions": per_tenant,
                    # every tenant with an account, at 0 too (a gauge must come back down)
                    "running": {a.name: a.running for a in self.ledger.accounts()},
                    "counts": dict(self.counts),
                    "checkpoints": {a.name: len(a.checkpoints)
                                    for a in self.ledger.accounts()},
                    "loading": not self.loaded.is_set()}

    def ping(self) -> bool:
        return True

    # ---- after a restart ----------------------------------------------------------------------
    def _load_config(self) -> None:
        """The config last published (unreadable: the fronts publish theirs again)."""
        with contextlib.suppress(Exception):
            raw = self.storage.get(CONFIG_KEY, CONFIG_BYTES)
            if raw is not None:
                version, text, kits = unpack_bounded(raw, DecodeCost.for_bytes(len(raw)))
                self.kits = {str(t): DoorKit.from_wire(k).to_wire() for t, k in kits.items()}
                self.config_text = (int(version), str(text))

    def _adopt_slabs(self) -> None:
        """The slabs still alive (this actor was restarted, not the cluster): the sessions
        they hold stay where they are, their entries rebuilt from what each slab holds (its
        tenant and spec), so they answer before any record is read."""
        from ray.util import list_named_actors
        if not self._ray.is_initialized():  # made outside a cluster (a bench, a test): none,
            return  # and asking would start a Ray instance of its own
        with contextlib.suppress(Exception):
            for name in list_named_actors():
                if not str(name).startswith("memex-slab-"):
                    continue
                try:
                    handle = self._ray.get_actor(name, namespace=self.namespace)
                    info = self._ray.get(handle.ready.remote(), timeout=5)
                    held = self._ray.get(handle.holding.remote(), timeout=5)
                except Exception:
                    continue
                slab = _SlabInfo(name, handle, str(info["node"]), self.slab_memory,
                                 list(info["endpoint"]), bytes(info["secret"]))
                self.slabs[name] = slab
                for sid, turns, tenant, spec in held:
                    try:
                        limits = limits_from_wire(spec["limits"])
                    except Exception:  # a slab of another build: its sessions read back
                        continue
                    with self.lock:
                        if sid in self.sessions:  # on two slabs: the first keeps it
                            continue
                        self._put(_Entry(str(sid), str(tenant), spec, limits.memory,
                                         limits.disk_bytes, name, turns=int(turns),
                                         begun=int(turns)))
                        slab.sessions.add(str(sid))
                        slab.used += limits.memory

    def _tenant(self, tenant: str) -> None:
        """The tenant's saved sessions and held checkpoints in the directory and its
        account: read once after a restart, when something of the tenant is first asked
        (its creates are checked against them), under a gate of its own so the actor's
        lock is never held over the storage. Costs the tenant's own sessions."""
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
                # the caller may ask again (the front answers 503 with Retry-After), and
                # nothing of the tenant was taken as read
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
                if sid in self.sessions:  # held by a live slab (adopted), or made since
                    continue
            rec = _saved(self.storage, sid)
            if rec is None or str(rec.get("tenant")) != tenant:
                # never saved (its create did not get that far) or closed: its marker goes
                with contextlib.suppress(Exception):
                    self.storage.delete(owner_key(tenant, sid))
                continue
            limits = limits_from_wire(rec["spec"]["limits"])
            with self.lock:
                if sid not in self.sessions:
                    self._put(_Entry(sid, tenant, rec["spec"], limits.memory,
                                     limits.disk_bytes, None, turns=int(rec["turns"]),
                                     begun=int(rec["turns"]), gone="the cluster restarted"))
        for cid in self.storage.children(f"checkpoints/{tenant}"):
            try:  # a storage that fails raises (the tenant is read again on its next word)
                raw = self.storage.get(checkpoint_key(tenant, cid, "meta"), 1 << 16)
            except ImageError:
                continue
            if raw is None:
                continue
            with contextlib.suppress(Exception):  # what is there is not a checkpoint's meta
                meta = json.loads(raw)
                expires = meta.get("expires")
                with self.lock:
                    if expires is None and str(meta["session"]) not in self.sessions:
                        expires = time.time() + self.checkpoint_ttl  # its session is gone
                    self.ledger.account(tenant).checkpoints.setdefault(cid, {
                        "size": int(meta["size"]), "turns": int(meta["turns"]),
                        "session": str(meta["session"]), "at": time.time(),
                        "expires": float(expires) if expires is not None else None})

    def _backfill(self) -> None:
        """In the background after a (re)start: index a store written before the index
        (once), then read back every tenant nothing has asked for yet, so the monitor ends
        and reopens their sessions as before."""
        try:
            if self.storage.get(INDEXED_KEY, 64) is None:
                for sid in self.storage.children("sessions"):
                    rec = _saved(self.storage, sid)
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
                self._tenant(tenant)
            except Exception:
                LOG.exception("reading back tenant %s's sessions failed", tenant)
        self.loaded.set()


NODE_LABEL = "ray.io/node-id"
"""The label Ray gives every node: new slabs are kept off draining and suspect nodes by it."""

SUSPECT_FOR = 60.0
"""Seconds a node that lost a slab takes no new one while other nodes can (Ray marks a dead
machine dead only after missed heartbeats; a slab that died alone clears it this soon)."""

TOKEN_LEASE = 1.0
"""Seconds a front may spend a batch of rate tokens (:meth:`Control.take_tokens`) before it
gives back what it did not spend."""
MAX_TOKENS = 10_000
"""At most this many tokens in one batch or one give-back (a front's word is bounded)."""

RECOVERY_THREADS = 8
"""Sessions opened elsewhere at once after their slab was lost (each waits out the lost
slab's lease first); lookups of a moving session answer at once meanwhile."""
OWNERS = "owners"
"""The storage's index of sessions by tenant: an empty object ``owners/<tenant>/<sid>`` per
session, put before it opens and deleted after it closes."""
INDEXED_KEY = "owners-indexed"
"""Said once the index holds every session of the store (one written before the index is
indexed by the first control actor that finds this missing)."""
CONFIG_KEY = "config/published"
"""Where the storage keeps the config last published (msgpack: version, text, kits)."""
CONFIG_BYTES = 64 << 20


def _past_rate(tenant: str, rate: float, tokens: float) -> Refused:
    """A tenant's turn past its rate across the cluster: 429, and the seconds until its
    bucket holds a token again."""
    return ControlRefusal("quota", f"{tenant!r} runs at most {rate:g} turns per second "
                          "across the cluster",
                          retry_after=max(1, int((1 - tokens) / rate + 1))).reply()


def owner_key(tenant: str, sid: str) -> str:
    return f"{OWNERS}/{tenant}/{sid}"


def _saved(storage: Storage, sid: str) -> dict[str, Any] | None:
    """A session's saved record, its spec's limits checked; None when there is none or what
    is there is not a record. A storage that fails raises: a caller that took that for "no
    record" would drop the session's marker and forget a session that is there."""
    try:
        raw = storage.get(session_key(sid, "record"), 1 << 20)
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


def checkpoint_key(tenant: str, cid: str, name: str = "image") -> str:
    return f"checkpoints/{tenant}/{cid}/{name}" if name else f"checkpoints/{tenant}/{cid}"


def _child_record(storage: Storage, parent: str, child: str, memory: int) -> bytes:
    """The record of a fork opened from its parent's save: the parent's, renamed (its objects
    copied, each read within what the parent's memory limit lets a save hold)."""
    raw = storage.get(session_key(parent, "record"), 1 << 20)
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


def _wire(exc: BaseException) -> list[Any]:
    if isinstance(exc, MemexError):
        return list(error_to_wire(exc))
    return ["SandboxError", f"{type(exc).__name__}: {exc}", None]
