"""The sessions of a ``memex serve`` cluster (docs/scaling.md): each lives in a *slab*, a Ray
actor that declares a slab of memory and CPU to Ray's scheduler and holds sessions until
their memory limits fill it, so a node is never promised more than it has. A slab saves each
session to the cluster's storage (``_storage``) as it changes, so that any slab on any node
can open it again: after its node died, after a drain, or after the whole cluster restarted.

A session's door lives in its slab (a :class:`ClientDoor`): the guest's tool calls for the
client wait there, and whichever front holds the client's door WebSocket pulls them
(``door_pull``) and answers them (``door_answer``), so the client's tools answer whatever
front its turns go through.

A save is ``sessions/<sid>/image-<n>`` and ``files-<n>`` written first, then the record
``sessions/<sid>/record`` (JSON: how to open the session again, its owner, the turns its
image holds and the names of its objects); the record is the commit, so a reader never
follows a record to half a save.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hmac
import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from ..backends.internal import (
    FILES_CAP,
    HEADER,
    Channel,
    ChannelClosed,
    ClientDoor,
    ProtocolError,
    limits_from_wire,
    mounts_from_wire,
    result_to_wire,
    tmp_files,
    tmp_files_from,
)
from ..errors import ImageError, SandboxClosed
from ..runtime_wasm import Sandbox
from ..runtime_wasm.internal import (
    DecodeCost,
    checkpoint_from_bytes,
    checkpoint_to_bytes,
    open_from_checkpoint,
    set_guest_nice,
    unpack_bounded,
)
from ._direct import (
    DIRECT,
    Answer,
    Call,
    Done,
    Hello,
    NotHeld,
    NotHeldHere,
    Outcome,
    Raised,
    Started,
    Welcome,
    from_wire,
    outcome_of,
    to_wire,
)
from ._storage import Storage

__all__ = ["DIRECT", "RECORD_CAP", "SLAB_LEASE", "DoorServer", "Slab", "session_key"]

DoorServer = Callable[[Any, str, Sandbox, ClientDoor, bool, Callable[[dict[str, Any]], None]],
                      Callable[[], None]]
"""What a slab serves on a session's door for the server (given by whoever makes the slab:
``serving.SlabDoors``): ``doors(kit, sid, sandbox, door, fresh, audit)`` starts serving the
tenant's kit, ``fresh`` when the guest is new, each audit event of its calls to ``audit``;
it returns what stops it."""
AUDIT_KEEP = 1000
"""Audit events of a door's operator tools and egress kept for the front between two turns
(each turn's answer carries those of its calls to the front's audit log; past this many,
the oldest are counted as dropped)."""

SLAB_LEASE = 4.0
"""Seconds a slab serves after the control actor last reached it. The control actor pings
every slab each second (renewing it), and opens a lost slab's sessions elsewhere only once
its lease has run out: a slab cut off from the control actor (a partition, a node whose
processes outlive it for a moment) has stopped serving and saving by then, so a session is
never live in two places."""
HELLO_TIMEOUT = 10.0
HELLO_BYTES = 256
"""What a connection may send before it has said the slab's secret."""
MAX_UNPROVEN = 64
"""Connections at once that have not said the secret yet (more are closed at once)."""
DOOR_STALE = 10.0
"""Seconds a front's door connection may go without pulling before it is let go (a front
pulls at least every second while it holds one)."""
DOOR_REJOIN = 30.0
"""Seconds (within the turn's deadline) a tool call of a session opened again elsewhere
waits for its client's door connection to follow it (the front holding it reconnects within
a few seconds: its waits on the lost slab are bounded)."""
RECORD_CAP = 1 << 20
"""Bytes a session's record may have (it is read before anything else of a save)."""


def session_key(sid: str, name: str = "") -> str:
    return f"sessions/{sid}/{name}" if name else f"sessions/{sid}"


class _Mailbox:
    """The frames waiting for one front's door connection to pull them."""

    def __init__(self) -> None:
        self.frames: collections.deque[bytes] = collections.deque()
        self.cond = threading.Condition()
        self.closed = False
        self.pulled = time.monotonic()  # a connection that stops pulling is let go

    def take(self, wait: float) -> list[bytes] | None:
        self.pulled = time.monotonic()
        with self.cond:
            self.cond.wait_for(lambda: self.frames or self.closed, wait)
            if self.closed and not self.frames:
                return None
            out = list(self.frames)
            self.frames.clear()
            return out


class _Audit:
    """A door's audit events waiting for the front (at most AUDIT_KEEP, then counted)."""

    def __init__(self) -> None:
        self.events: collections.deque[dict[str, Any]] = collections.deque()
        self.dropped = 0
        self.lock = threading.Lock()

    def add(self, event: dict[str, Any]) -> None:
        with self.lock:
            if len(self.events) >= AUDIT_KEEP:
                self.events.popleft()
                self.dropped += 1
            self.events.append(event)

    def take(self) -> list[dict[str, Any]]:
        with self.lock:
            out = list(self.events)
            if self.dropped:
                out.append({"event": "audit_dropped", "count": self.dropped})
            self.events.clear()
            self.dropped = 0
        return out


@dataclass(eq=False)
class _Held:
    sb: Sandbox
    door: ClientDoor
    tenant: str
    spec: dict[str, Any]
    turns: int = 0
    gen: int = 0  # changes of the guest state
    saved_gen: int = -1
    saved_turns: int = 0
    seq: int = 0  # the number of its last save's objects
    lock: threading.RLock = field(default_factory=threading.RLock)
    boxes: dict[int, _Mailbox] = field(default_factory=dict)
    unserve: Callable[[], None] | None = None  # stops what the server serves on its door
    audit: _Audit = field(default_factory=lambda: _Audit())  # its door's (a fork shares it)


class Slab:
    """A Ray actor holding sessions (made remote, named and detached, by the cluster's
    control actor). Every method answers an ``Outcome`` (``_direct``): ``Done``, ``Raised``
    or ``NotHeld``."""

    def __init__(self, name: str, storage: Storage, save_interval: float,
                 doors: DoorServer | None = None, *, guest_nice: int = 0) -> None:
        set_guest_nice(guest_nice)  # its guests below its own threads (engine/_runner.py)
        self.name, self.storage, self.save_interval = name, storage, save_interval
        self.doors = doors
        self.held: dict[str, _Held] = {}
        self.lock = threading.Lock()
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="memex-slab-door",
                         daemon=True).start()
        self._stop = threading.Event()
        if save_interval > 0:
            threading.Thread(target=self._saver, name="memex-slab-saver", daemon=True).start()
        threading.Thread(target=self._janitor, name="memex-slab-janitor", daemon=True).start()
        # the data path: fronts call turns and files over a socket of their own (a Ray call
        # costs more than a turn); the secret that opens it is given out only through Ray
        import ray
        self._lease_until = time.monotonic() + SLAB_LEASE
        self._secret = secrets.token_bytes(32)
        self._listener = socket.create_server((ray.util.get_node_ip_address(), 0))
        self.endpoint = list(self._listener.getsockname()[:2])
        threading.Thread(target=self._accept, name="memex-slab-listen", daemon=True).start()

    # ---- the direct path ----------------------------------------------------------------------
    def _accept(self) -> None:
        strangers = threading.BoundedSemaphore(MAX_UNPROVEN)
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            if not strangers.acquire(blocking=False):
                conn.close()  # too many connections that have not said the secret yet
                continue
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._serve, args=(conn, strangers),
                             name="memex-slab-conn", daemon=True).start()

    def _proven(self, conn: socket.socket) -> bool:
        """Whether the connection opens with a ``Hello`` holding the secret: read whole
        within HELLO_TIMEOUT and at most HELLO_BYTES, before anything else is read or kept."""
        conn.settimeout(HELLO_TIMEOUT)
        try:
            head = _read_exactly(conn, HEADER.size)
            size, nfds = HEADER.unpack(head)
            if size > HELLO_BYTES or nfds:
                return False
            hello = from_wire(unpack_bounded(_read_exactly(conn, size),
                                             DecodeCost.for_bytes(size)))
        except (OSError, ValueError, EOFError, ProtocolError):
            return False
        finally:
            with contextlib.suppress(OSError):
                conn.settimeout(None)
        return isinstance(hello, Hello) and hmac.compare_digest(hello.secret, self._secret)

    def _serve(self, conn: socket.socket, strangers: threading.BoundedSemaphore) -> None:
        """One front's connection: its ``Hello`` first (else it is closed unheard), then
        each ``Call`` answered by an ``Answer``; a turn is acknowledged by ``Started`` as it
        begins, so a front that loses the connection knows whether the turn could have run.
        Anything that is not a ``Call`` closes the connection."""
        try:
            proven = self._proven(conn)
        finally:
            strangers.release()
        if not proven:
            with contextlib.suppress(OSError):
                conn.close()
            return
        ch = Channel(conn)
        try:
            ch.send(to_wire(Welcome()))
            while True:
                raw, _ = ch.recv()
                call = from_wire(raw)
                if not isinstance(call, Call):
                    return
                seq, method, args = call.seq, call.method, call.args
                if not self._leased():
                    ch.send(to_wire(Answer(seq, NotHeld(args[0], lease=True))))
                    continue
                if method == "run":
                    ch.send(to_wire(Started(seq)))
                try:
                    out = getattr(self, method)(*args)
                except TypeError as exc:  # wrong arguments: a bug of the caller
                    out = Raised(["SandboxError", f"{method}: {exc}", None])
                ch.send(to_wire(Answer(seq, out)))
        except (ChannelClosed, ProtocolError, TimeoutError, OSError):
            pass
        finally:
            ch.close()

    # ---- plumbing ---------------------------------------------------------------------------
    def _call(self, fn: Any, *args: Any) -> Outcome:
        return outcome_of(fn, *args)

    def _h(self, sid: str) -> _Held:
        h = self.held.get(sid)
        if h is None:
            raise NotHeldHere(sid)
        return h

    def _leased(self) -> bool:
        return time.monotonic() < self._lease_until

    def renew(self) -> None:
        """The control actor reached this slab: it serves SLAB_LEASE seconds more."""
        self._lease_until = time.monotonic() + SLAB_LEASE

    def ready(self) -> dict[str, Any]:
        """Where it runs, and how a front reaches its direct path (asked through Ray, by the
        control actor only: each answer renews the slab's lease)."""
        import ray
        self.renew()
        return {"node": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
                "name": self.name, "endpoint": self.endpoint, "secret": self._secret}

    def holding(self) -> list[list[Any]]:
        """``[sid, turns, tenant, spec]`` of each session held here: what a restarted
        control actor rebuilds their directory entries from, reading no storage."""
        with self.lock:
            return [[sid, h.turns, h.tenant, h.spec] for sid, h in self.held.items()]

    def stats(self) -> dict[str, Any]:
        with self.lock:
            held = list(self.held.values())
        return {"sessions": len(held), "memory": sum(h.sb.limits.memory for h in held)}

    # ---- sessions ---------------------------------------------------------------------------
    def open(self, sid: str, tenant: str, spec: dict[str, Any], from_save: bool,
             kit: Any = None) -> Outcome:
        """Open the session here: empty, or from its last save (what it holds is said:
        ``turns``, ``files_kept``; ``saved: False`` when it had none yet); ``kit``: what
        the server serves on its door (the tenant's operator tools and egress policy,
        built by ``doors``)."""
        def go() -> dict[str, Any]:
            limits = limits_from_wire(spec["limits"])
            rec = self._record(sid) if from_save else None
            cp, files = None, {}
            if rec is not None and rec.get("image"):
                blob = self.storage.get(str(rec["image"]), limits.memory + (64 << 20))
                if blob is None:
                    raise ImageError("the image its record names is missing")
                cp = checkpoint_from_bytes(blob, max_memory=limits.memory)
                if rec.get("files"):
                    files = _files_from_save(self.storage.get(str(rec["files"]), FILES_CAP * 2))
            door = ClientDoor()
            if rec is not None and rec.get("door"):
                door.expect_client(DOOR_REJOIN)  # its client's connection moves here too
            sb = open_from_checkpoint(cp, limits=limits, mounts=mounts_from_wire(spec["mounts"]),
                                      preload=list(spec["preload"]), door=door,
                                      env=spec.get("env"),
                                      packages=list(spec.get("packages") or ()))
            unserve, audit = None, _Audit()
            try:
                for path, data in files.items():
                    sb.write_file(path, data)
                if kit is not None and self.doors is not None:
                    unserve = self.doors(kit, sid, sb, door, cp is None, audit.add)
            except BaseException:
                sb.close()
                raise
            turns = int(rec["turns"]) if rec is not None else 0
            h = _Held(sb, door, tenant, spec, turns=turns, saved_turns=turns,
                      seq=int(rec.get("seq", 0)) if rec is not None else 0, unserve=unserve,
                      audit=audit)
            with self.lock:
                old = self.held.pop(sid, None)
                self.held[sid] = h
            if old is not None:
                self._closed(old)
            if rec is None:
                self._save(sid, h)  # its record at once: a node lost before its first turn
            else:  # brings it back empty, not unknown
                h.saved_gen = h.gen
            return {"turns": turns, "saved": rec is not None and bool(rec.get("image")),
                    "saved_at": rec.get("saved_at") if rec is not None else None,
                    "files_kept": bool(rec.get("files_kept")) if rec is not None else True}
        return self._call(go)

    def _record(self, sid: str) -> dict[str, Any] | None:
        raw = self.storage.get(session_key(sid, "record"), RECORD_CAP)
        if raw is None:
            return None
        try:
            rec = json.loads(raw)
        except ValueError as exc:
            raise ImageError(f"the record of {sid} is not JSON: {exc}") from None
        if not isinstance(rec, dict):
            raise ImageError(f"the record of {sid} is not an object")
        return rec

    def run(self, sid: str, code: str, timeout: float | None, filename: str | None
            ) -> Outcome:
        def go() -> dict[str, Any]:
            h = self._h(sid)
            with h.lock:
                r = h.sb.run(code, timeout=timeout, filename=filename)
                h.turns += 1
                h.gen += 1
                if self.save_interval <= 0 and sid in self.held:  # not when it was closed
                    self._save(sid, h)
                return {"result": result_to_wire(r), "turns": h.turns,
                        "audit": h.audit.take()}
        return self._call(go)

    def checkpoint(self, sid: str, key: str) -> Outcome:
        """The session's state written to ``key`` of the storage; its memory's size (what
        it counts against the tenant) and the turns it holds."""
        def go() -> dict[str, Any]:
            h = self._h(sid)
            with h.lock:
                cp = h.sb.checkpoint()
                blob = checkpoint_to_bytes(cp)
            self.storage.put(key, blob)
            return {"size": cp.size, "bytes": len(blob), "turns": h.turns}
        return self._call(go)

    def restore(self, sid: str, key: str) -> Outcome:
        def go() -> None:
            h = self._h(sid)
            blob = self.storage.get(key, h.sb.limits.memory + (64 << 20))
            if blob is None:
                raise SandboxClosed(f"no checkpoint at {key}")
            cp = checkpoint_from_bytes(blob, max_memory=h.sb.limits.memory)
            with h.lock:
                h.sb.restore(cp)
                h.gen += 1
                if self.save_interval <= 0:
                    self._save(sid, h)
        return self._call(go)

    def fork(self, sid: str, child: str) -> Outcome:
        def go() -> dict[str, Any]:
            h = self._h(sid)
            with h.lock:
                sb = h.sb.fork()  # shares the parent's door, as on every backend
                c = _Held(sb, h.door, h.tenant, h.spec, turns=h.turns,  # its door: h's
                          audit=h.audit)
            with self.lock:
                self.held[child] = c
            self._save(child, c)
            return {"turns": c.turns}
        return self._call(go)

    def read_file(self, sid: str, path: str, max_bytes: int | None) -> Outcome:
        return self._call(lambda: self._h(sid).sb.read_file(path, max_bytes=max_bytes))

    def write_file(self, sid: str, path: str, data: bytes) -> Outcome:
        def go() -> None:
            h = self._h(sid)
            with h.lock:
                h.sb.write_file(path, data)
                h.gen += 1
        return self._call(go)

    def list_files(self, sid: str, path: str, limit: int) -> Outcome:
        return self._call(lambda: [[f.name, f.path, f.kind, f.size] for f in
                                   self._h(sid).sb.list_files(path, limit=limit)])

    def close(self, sid: str, forget: bool) -> Outcome:
        """Close the session here; ``forget``: its saves go too (the client closed it)."""
        def go() -> None:
            with self.lock:
                h = self.held.pop(sid, None)
            if h is not None:
                self._closed(h)
            if forget:
                self.storage.delete(session_key(sid))
        return self._call(go)

    def _closed(self, h: _Held) -> None:
        """Close a session let go of: its door's connections, its guest (not under its
        lock: a running turn is interrupted), and what the server served on its door once
        no session held here shares that door (a fork shares its parent's)."""
        for box in list(h.boxes.values()):
            with box.cond:
                box.closed = True
                box.cond.notify_all()
        h.sb.close()
        with self.lock:
            heir = next((o for o in self.held.values() if o.door is h.door), None)
            if heir is not None and heir.unserve is None:
                heir.unserve, h.unserve = h.unserve, None
        if h.unserve is not None:
            h.unserve()

    def save(self, sid: str) -> Outcome:
        """Save the session now (if it changed since its last save); the turns it holds."""
        def go() -> int:
            h = self._h(sid)
            with h.lock:
                if h.gen != h.saved_gen:
                    self._save(sid, h)
                return h.saved_turns
        return self._call(go)

    # ---- saves ------------------------------------------------------------------------------
    def _save(self, sid: str, h: _Held) -> None:
        """Its image and files, then its record (the commit); the previous objects after."""
        with h.lock:
            gen, turns = h.gen, h.turns
            blob = checkpoint_to_bytes(h.sb.checkpoint()) if h.turns or h.gen else None
            files = tmp_files(h.sb)
        seq = h.seq + 1
        rec: dict[str, Any] = {"id": sid, "tenant": h.tenant, "spec": h.spec, "turns": turns,
                               "seq": seq, "saved_at": time.time(), "image": None,
                               "files": None, "files_kept": files is not None,
                               "door": h.door.ever_attached}
        if blob is not None:
            rec["image"] = session_key(sid, f"image-{seq}")
            self.storage.put(rec["image"], blob)
        if files:
            rec["files"] = session_key(sid, f"files-{seq}")
            self.storage.put(rec["files"], msgpack.packb(files, use_bin_type=True))
        if sid not in self.held or not self._leased():
            return  # closed meanwhile (its objects go with its folder), or fenced off
        self.storage.put(session_key(sid, "record"), json.dumps(rec).encode())
        for name in (f"image-{h.seq}", f"files-{h.seq}"):
            if h.seq:
                self.storage.delete(session_key(sid, name))
        h.seq, h.saved_gen, h.saved_turns = seq, gen, turns

    def _janitor(self) -> None:
        while not self._stop.wait(1.0):
            with self.lock:
                held = list(self.held.items())
            for sid, h in held:
                self._let_go_of_stale(sid, h)

    def _saver(self) -> None:
        while not self._stop.wait(self.save_interval):
            with self.lock:
                todo = [(sid, h) for sid, h in self.held.items() if h.gen != h.saved_gen]
            for sid, h in todo:
                with contextlib.suppress(Exception):  # the next round tries again
                    self._save(sid, h)

    # ---- the door ---------------------------------------------------------------------------
    def _let_go_of_stale(self, sid: str, h: _Held) -> None:
        """Detach the connections no front has pulled from for DOOR_STALE seconds (a front
        that died, or lost its way): a call routed to one would wait for its deadline."""
        now = time.monotonic()
        for token, box in list(h.boxes.items()):
            if now - box.pulled > DOOR_STALE:
                self.door_detach(sid, token)

    def door_attach(self, sid: str) -> Outcome:
        """A front's door connection for the session: its token to pull frames with."""
        def go() -> int:
            h = self._h(sid)
            self._let_go_of_stale(sid, h)
            box = _Mailbox()

            async def send(frame: bytes) -> None:
                with box.cond:
                    box.frames.append(frame)
                    box.cond.notify_all()

            token = h.door.attach(send, self.loop)
            h.boxes[token] = box
            return token
        return self._call(go)

    def door_pull(self, sid: str, token: int, wait: float) -> Outcome:
        """The frames waiting for the connection (within ``wait`` seconds); None once the
        session or the connection is gone."""
        h = self.held.get(sid)
        box = h.boxes.get(token) if h is not None else None
        if box is None or not self._leased():
            return Done(None)
        return Done(box.take(min(wait, 5.0)))

    def door_answer(self, sid: str, data: bytes) -> Outcome:
        h = self.held.get(sid)
        return Done(h is not None and h.door.answer(bytes(data)))

    def door_detach(self, sid: str, token: int) -> Outcome:
        h = self.held.get(sid)
        if h is not None:
            h.door.detach(token)
            box = h.boxes.pop(token, None)
            if box is not None:
                with box.cond:
                    box.closed = True
                    box.cond.notify_all()
        return Done(None)


def _read_exactly(conn: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise EOFError("closed")
        buf += chunk
    return bytes(buf)


def _files_from_save(packed: bytes | None) -> dict[str, bytes]:
    try:
        return tmp_files_from(packed)
    except ValueError as exc:
        raise ImageError(str(exc)) from None
