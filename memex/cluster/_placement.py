"""The control actor's placement of slabs: slabs are made on demand with their memory and
CPU declared to Ray, which places them (``SPREAD``); a session goes to a slab with room (the
fullest that fits, so slabs fill before new ones are made), so a node is never promised more
memory than its slabs declared. A slab Ray cannot place within ``place_timeout`` is given
up: the create is refused (busy), nothing over-commits. Lost slabs are marked dead (their
sessions left without a slab, fenced until the slab's lease ran out), empty ones retired,
and the slabs of a restarted actor's predecessor adopted."""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..serving.internal import SlabDoors
from ._direct import Outcome
from ._directory import Directory
from ._replies import ControlRefusal
from ._slab import SLAB_LEASE, Slab
from ._storage import Storage

__all__ = ["CONFIRM_WAIT", "NODE_LABEL", "SUSPECT_FOR", "Placement", "SlabInfo"]

NODE_LABEL = "ray.io/node-id"
"""The label Ray gives every node: new slabs are kept off draining and suspect nodes by it."""

CONFIRM_WAIT = 5.0
"""Seconds a slab said lost has to answer before it is taken as dead (a slab that answers
is not dead, whoever said so)."""
SUSPECT_FOR = 60.0
"""Seconds a node that lost a slab takes no new one while other nodes can (Ray marks a dead
machine dead only after missed heartbeats; a slab that died alone clears it this soon)."""


@dataclass(eq=False)
class SlabInfo:
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


@dataclass(frozen=True, slots=True)
class SlabSettings:
    """What every slab of the cluster is made with (serve.toml's ``[cluster]``)."""

    namespace: str
    memory: int
    cpus: float
    save_interval: float
    place_timeout: float
    idle: float
    guest_nice: int


class Placement:
    """The cluster's slabs: where sessions go, which slabs are lost, which retire. Its
    state is kept under the control actor's ``lock``; a slab is made under ``placing``
    (one at a time: racing creates fill it, not make more)."""

    def __init__(self, ray: Any, lock: threading.RLock, directory: Directory,
                 storage: Storage, settings: SlabSettings) -> None:
        self._ray, self.lock, self.directory = ray, lock, directory
        self.storage, self.settings = storage, settings
        self.placing = threading.Lock()
        self.slabs: dict[str, SlabInfo] = {}
        self.draining: set[str] = set()
        self.suspect: dict[str, float] = {}  # node -> when a slab of it was lost (monotonic)
        self._remote_slab = ray.remote(Slab)

    def get(self, name: str | None) -> SlabInfo | None:
        """(under the lock) The slab ``name``, if it is known."""
        return self.slabs.get(name) if name is not None else None

    def live(self) -> list[SlabInfo]:
        with self.lock:
            return [s for s in self.slabs.values() if s.dead is None]

    def slab_for(self, memory: int, avoid: str | None = None) -> SlabInfo:
        """A live slab with room for ``memory`` (the fullest that fits), else a new one Ray
        places; its room is taken at once. ``avoid`` (a lost or draining slab) and the other
        slabs of its node are passed over."""
        if memory > self.settings.memory:
            raise ControlRefusal("quota", f"a session of {memory} bytes is larger than the "
                                 f"cluster's slab ({self.settings.memory} bytes)")

        def fitting(suspect_too: bool) -> SlabInfo | None:
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
        with self.placing:
            found = fitting(False)
            if found is None and not self.healthy_nodes():  # a slab of a suspect node, then
                found = fitting(True)
            if found is not None:
                return found
            info = self._new_slab()
            with self.lock:
                info.used += memory
            return info

    def give_back(self, slab: SlabInfo, memory: int) -> None:
        """The room :meth:`slab_for` took for a session that did not open there."""
        with self.lock:
            slab.used -= memory

    def open(self, slab: SlabInfo, sid: str, tenant: str, spec: dict[str, Any],
             from_save: bool, kit: Any) -> dict[str, Any]:
        """Open ``sid`` on ``slab`` (empty, or from its last save), with the tenant's
        ``kit`` served on its door; what the slab says it holds."""
        out: Outcome = self._ray.get(slab.handle.open.remote(sid, tenant, spec, from_save,
                                                             kit),
                                     timeout=self.settings.place_timeout)
        result: dict[str, Any] = out.unwrap()
        return result

    def nodes(self) -> set[str]:
        """The live nodes Ray says could hold a slab at all (not the head)."""
        s = self.settings
        return {n["NodeID"] for n in self._ray.nodes() if n.get("Alive")
                and n.get("Resources", {}).get("CPU", 0) >= s.cpus
                and n.get("Resources", {}).get("memory", 0) >= s.memory}

    def shunned(self, live: set[str]) -> set[str]:
        """The live nodes no new slab goes to while others can take it: draining ones, and
        those that just lost a slab (Ray notices a dead machine only after missed heartbeats,
        and a slab placed on it would never start, the sessions waiting on it with it)."""
        now = time.monotonic()
        with self.lock:
            self.suspect = {n: t for n, t in self.suspect.items() if now - t < SUSPECT_FOR}
            return (self.draining | self.suspect.keys()) & live

    def healthy_nodes(self) -> set[str]:
        live = self.nodes()
        return live - self.shunned(live)

    def _new_slab(self) -> SlabInfo:
        """A new slab where Ray places it; one that dies as it starts (placed on a node
        being lost) is made again, twice at most."""
        for attempt in range(3):
            try:
                return self._place_slab()
            except self._ray.exceptions.RayActorError:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _place_slab(self) -> SlabInfo:
        ray, s = self._ray, self.settings
        name = f"memex-slab-{secrets.token_hex(6)}"
        opts: dict[str, Any] = {
            "name": name, "namespace": s.namespace, "lifetime": "detached",
            "num_cpus": s.cpus, "memory": s.memory, "max_concurrency": 64,
            "max_restarts": 0}
        live = self.nodes()
        shunned = self.shunned(live)
        if shunned and live - shunned:
            opts["label_selector"] = {NODE_LABEL: f"!in({','.join(sorted(shunned))})"}
        opts["scheduling_strategy"] = "SPREAD"
        handle = self._remote_slab.options(**opts).remote(
            name, self.storage, s.save_interval, SlabDoors(), guest_nice=s.guest_nice)
        try:
            info = ray.get(handle.ready.remote(), timeout=s.place_timeout)
        except ray.exceptions.RayActorError:
            raise
        except Exception:
            with contextlib.suppress(Exception):
                ray.kill(handle)
            raise ControlRefusal("busy", "the cluster has no node with room for another "
                                 f"slab of {s.memory} bytes and {s.cpus} "
                                 "CPUs; retry later, or add nodes", retry_after=5) from None
        return self._known(name, handle, info)

    def _known(self, name: str, handle: Any, info: dict[str, Any]) -> SlabInfo:
        """A slab that answered ``ready`` (``info``), in the placement's slabs."""
        slab = SlabInfo(name, handle, str(info["node"]), self.settings.memory,
                        list(info["endpoint"]), bytes(info["secret"]))
        with self.lock:
            self.slabs[name] = slab
        return slab

    def _answering(self, slabs: list[SlabInfo], timeout: float) -> set[str]:
        """The names of ``slabs`` that answer within ``timeout`` seconds, asked all at once
        (each answer renews that slab's lease; its time is kept as its ``last_ok``)."""
        refs = {s.handle.ready.remote(): s for s in slabs}
        done, _ = self._ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
        answering = set()
        for ref in done:
            try:
                self._ray.get(ref, timeout=0)
            except Exception:  # it died: its answer is its error
                continue
            s = refs[ref]
            s.last_ok = time.monotonic()
            answering.add(s.name)
        return answering

    def mark_dead(self, name: str, why: str) -> None:
        """A slab said lost (by a front), checked first: one that answers within 5 s is not
        dead. The other live slabs of its node are checked with it, at once (a lost machine
        takes them all: each found then, not one monitor round after another). A dead one's
        sessions are left without a slab, fenced until its lease has run out (it may serve
        until then), and its node is suspect for a while."""
        with self.lock:
            slab = self.slabs.get(name)
            if slab is None or slab.dead is not None:
                return
            mates = [s for s in self.slabs.values()
                     if s.node == slab.node and s.dead is None and s is not slab]
        answering = self._answering([slab, *mates], CONFIRM_WAIT)
        for s in (slab, *mates):
            if s.name not in answering:
                self._dead(s, why if s is slab else
                           "a slab of its node was lost and it did not answer either")

    def _dead(self, slab: SlabInfo, why: str) -> None:
        fence = slab.last_ok + SLAB_LEASE + 0.25
        with self.lock:
            if slab.dead is not None:
                return
            slab.dead = why
            self.suspect[slab.node] = time.monotonic()
            for sid in slab.sessions:
                e = self.directory.get(sid)
                if e is not None and e.slab == slab.name:
                    e.slab, e.fence = None, fence
            slab.sessions.clear()
            slab.used = 0
        with contextlib.suppress(Exception):
            self._ray.kill(slab.handle)

    def ping(self, every: float) -> None:
        """Ask every live slab whether it is there, all at once (each answer renews its
        lease); those silent for ``every`` * 2 seconds (at least 2) are asked again, together,
        and those silent for :data:`CONFIRM_WAIT` more are dead."""
        live = self.live()
        if not live:
            return
        answering = self._answering(live, max(2.0, every * 2))
        silent = [s for s in live if s.name not in answering]
        if silent:
            confirmed = self._answering(silent, CONFIRM_WAIT)
            for s in silent:
                if s.name not in confirmed:
                    self._dead(s, "it stopped answering")

    def retire_empty(self) -> None:
        """Give back to Ray the slabs that held no session for ``idle`` seconds (the last
        live one stays, warm for the next create)."""
        now = time.monotonic()
        with self.lock:
            live = [s for s in self.slabs.values() if s.dead is None]
            for s in live:
                s.empty_since = (s.empty_since or now) if not s.sessions and not s.used \
                    else None
            idle = [s for s in live if s.empty_since is not None
                    and now - s.empty_since >= self.settings.idle]
            if len(idle) == len(live) and idle:
                idle.remove(max(idle, key=lambda s: s.empty_since or 0.0))
            for s in idle:
                s.dead = "retired: it held no session"
                del self.slabs[s.name]
        for s in idle:
            with contextlib.suppress(Exception):
                self._ray.kill(s.handle)

    def adopt(self) -> Iterator[tuple[SlabInfo, list[list[Any]]]]:
        """The slabs still alive (this actor was restarted, not the cluster), each taken
        back with what it holds (``Slab.holding``); none outside a Ray cluster."""
        from ray.util import list_named_actors
        if not self._ray.is_initialized():  # made outside a cluster (a bench, a test): none,
            return  # and asking would start a Ray instance of its own
        try:
            names = list_named_actors()
        except Exception:
            return
        for name in names:
            if not str(name).startswith("memex-slab-"):
                continue
            try:
                handle = self._ray.get_actor(name, namespace=self.settings.namespace)
                info = self._ray.get(handle.ready.remote(), timeout=5)
                held = self._ray.get(handle.holding.remote(), timeout=5)
            except Exception:
                continue
            yield self._known(name, handle, info), held

    def stats(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(nodes, slabs) as the cluster's view shows them."""
        ray = self._ray
        nodes = [{"node": n["NodeID"], "alive": bool(n.get("Alive")),
                  "draining": n["NodeID"] in self.draining}
                 for n in (ray.nodes() if ray.is_initialized() else ())]
        with self.lock:
            slabs = [{"name": s.name, "node": s.node, "sessions": len(s.sessions),
                      "used": s.used, "capacity": s.capacity} for s in self.slabs.values()
                     if s.dead is None]
        return nodes, slabs
