"""The Ray backend: sandboxes held by Ray actors, so rollouts spread over a cluster; the same
contract as the other backends. Ray is an optional extra (``pip install 'memex[ray]'``); this
module imports it only when a :class:`RayBackend` is made.

``actors`` host actors (threaded) each hold any number of sandboxes. A guest's door frames
come back to the driver, whose doors (and host tools) answer them: each host actor queues its
sandboxes' frames, and one poller thread per actor in the driver fetches them (a blocking
``door_next`` call), answers each on a thread of its own and sends the reply back. Deadlines
cross as offsets from the turn's start, so they hold between machines with different clocks.

Checkpoints (:class:`RayCheckpoint`) are compressed images in Ray's object store: they restore
into a sandbox of any actor on any node, which is how a session moves between nodes. An actor
that dies (its node lost, its process killed) makes its sandboxes raise
:class:`~memex.errors.SandboxLost`; a checkpoint taken before still restores elsewhere. Mounts
must exist at the same host path on the node that runs the actor.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

from ..errors import ConfigError, SandboxClosed, SandboxError, SandboxLost
from ..runtime_wasm import Door, GuestKilled, Limits, Mount, Sandbox, TurnResult, serving_door
from ..runtime_wasm.internal import (
    SandboxHandle,
    checkpoint_from_bytes,
    checkpoint_to_bytes,
    fork_each,
    guest_nice,
    open_from_checkpoint,
    set_guest_nice,
)
from ._contract import Backend
from ._raynet import init_ray
from ._subprocess import SubprocessBackend, check_run_args
from .worker._wire import (
    answer_of,
    error_from_wire,
    limits_from_wire,
    mounts_from_wire,
    result_from_wire,
    result_to_wire,
)

__all__ = ["RayBackend", "RayCheckpoint", "RaySandbox"]

DOOR_GRACE = 5.0


# ---- the actor side -----------------------------------------------------------------------------
class _ActorDoor(Door):
    """A sandbox's door inside a host actor: frames wait in the actor's queue for the
    driver's poller; the caller's answer (or its deadline) ends the wait."""

    def __init__(self, host: _Host, sid: int) -> None:
        super().__init__()
        self._host, self._sid = host, sid

    def dispatch(self, frame: bytes, deadline: float = float("inf")) -> bytes:
        return self._host.forward(self._sid, bytes(frame), deadline)


class _Host:
    """A Ray actor holding sandboxes (made remote by ``RayBackend``)."""

    def __init__(self, nice: int = 0) -> None:
        set_guest_nice(nice)  # its guests at its creator's priority (engine/_runner.py)
        self.sbs: dict[int, Sandbox] = {}
        self.specs: dict[int, dict[str, Any]] = {}
        self.turn_start: dict[int, float] = {}
        self.requests: queue.SimpleQueue[list[Any]] = queue.SimpleQueue()
        self.waits: dict[int, list[Any]] = {}
        self.seq = itertools.count(1)
        self.lock = threading.Lock()

    def _call(self, fn: Any, *args: Any) -> list[Any]:
        return answer_of(fn, *args)

    def pid(self) -> int:
        return os.getpid()

    # the door
    def forward(self, sid: int, frame: bytes, deadline: float) -> bytes:
        seq = next(self.seq)
        done = threading.Event()
        box: list[Any] = [done]
        with self.lock:
            self.waits[seq] = box
        finite = deadline != float("inf")
        offset = deadline - self.turn_start.get(sid, time.monotonic()) if finite else None
        self.requests.put([sid, seq, offset, frame])
        try:
            bound = max(0.0, deadline - time.monotonic()) + DOOR_GRACE if finite else None
            if not done.wait(bound):
                raise GuestKilled("deadline", "the driver did not answer a door call by the "
                                  "turn's deadline")
        finally:
            with self.lock:
                self.waits.pop(seq, None)
        kind, payload = box[1], box[2]
        if kind == "ok" and isinstance(payload, bytes):
            return payload
        limit, detail = payload if isinstance(payload, list | tuple) else ("trap", str(payload))
        raise GuestKilled(str(limit), str(detail))

    def door_next(self, wait: float) -> list[list[Any]]:
        out: list[list[Any]] = []
        try:
            out.append(self.requests.get(timeout=wait))
            while True:
                out.append(self.requests.get_nowait())
        except queue.Empty:
            pass
        return out

    def door_reply(self, seq: int, kind: str, payload: object) -> None:
        with self.lock:
            box = self.waits.get(seq)
        if box is not None and len(box) == 1:
            box += [kind, payload]
            box[0].set()

    # sandboxes
    def open(self, sid: int, spec: dict[str, Any], blob: bytes | None) -> list[Any]:
        def go() -> dict[str, Any]:
            cp = checkpoint_from_bytes(blob) if blob is not None else None
            sb = open_from_checkpoint(
                cp, limits=limits_from_wire(spec["limits"]),
                mounts=mounts_from_wire(spec["mounts"]), preload=list(spec["preload"]),
                door=_ActorDoor(self, sid), env=spec.get("env"),
                packages=list(spec.get("packages") or ()))
            self.sbs[sid], self.specs[sid] = sb, spec
            return {}
        return self._call(go)

    def _sb(self, sid: int) -> Sandbox:
        sb = self.sbs.get(sid)
        if sb is None:
            raise SandboxClosed("closed")
        return sb

    def run(self, sid: int, code: str, timeout: float | None, filename: str | None
            ) -> list[Any]:
        def go() -> dict[str, Any]:
            sb = self._sb(sid)
            self.turn_start[sid] = time.monotonic()
            return result_to_wire(sb.run(code, timeout=timeout, filename=filename))
        return self._call(go)

    def checkpoint(self, sid: int) -> list[Any]:
        return self._call(lambda: checkpoint_to_bytes(self._sb(sid).checkpoint()))

    def restore(self, sid: int, blob: bytes) -> list[Any]:
        return self._call(lambda: self._sb(sid).restore(checkpoint_from_bytes(blob)))

    def fork(self, sid: int, child: int) -> list[Any]:
        def go() -> dict[str, Any]:
            sb = self._sb(sid)
            spec = self.specs[sid]
            self.sbs[child] = sb.fork(door=_ActorDoor(self, child))
            self.specs[child] = spec
            return {}
        return self._call(go)

    def read_file(self, sid: int, path: str, max_bytes: int | None = None) -> list[Any]:
        return self._call(lambda: self._sb(sid).read_file(path, max_bytes=max_bytes))

    def write_file(self, sid: int, path: str, data: bytes) -> list[Any]:
        return self._call(lambda: self._sb(sid).write_file(path, data))

    def close(self, sid: int) -> list[Any]:
        sb = self.sbs.pop(sid, None)
        self.specs.pop(sid, None)
        if sb is not None:
            sb.close()
        return ["ok", None]


# ---- the driver side ----------------------------------------------------------------------------
class RayCheckpoint:
    """A checkpoint in Ray's object store (compressed image): restores into a sandbox of any
    actor, on any node, with the same mounts and engine."""

    __slots__ = ("ref", "size", "turns")

    def __init__(self, ref: object, size: int, turns: int) -> None:
        self.ref, self.size, self.turns = ref, size, turns

    def __repr__(self) -> str:
        return f"<RayCheckpoint turns={self.turns} bytes={self.size}>"


class _HostRef:
    def __init__(self, backend: RayBackend, actor: Any) -> None:
        self.actor = actor
        self.backend = backend
        self.live: set[int] = set()
        self.dead: str | None = None
        self.pid = int(backend._get(actor.pid.remote(), backend.op_timeout))
        self.poller = threading.Thread(target=self._poll, name="memex-ray-door", daemon=True)
        self.poller.start()

    def _poll(self) -> None:
        ray = self.backend._ray
        while not self.backend.closed and self.dead is None:
            try:
                reqs = ray.get(self.actor.door_next.remote(0.5))
            except Exception as exc:
                self.dead = f"the Ray actor holding the sandbox died: {type(exc).__name__}"
                return
            for req in reqs:
                threading.Thread(target=self._answer, args=(req,), daemon=True).start()

    def _answer(self, req: list[Any]) -> None:
        sid, seq, offset, frame = req
        h = self.backend._handles.get(sid)
        door = h.door if h is not None else Door()
        deadline = float("inf") if offset is None or h is None else h._turn_t0 + offset
        try:
            reply = door.dispatch(frame, deadline)
            args: tuple[Any, ...] = (seq, "ok", reply)
        except GuestKilled as k:
            args = (seq, "killed", [k.limit, k.detail])
        except Exception as exc:
            args = (seq, "killed", ["trap", f"the door failed: {exc}"])
        with contextlib.suppress(Exception):
            self.actor.door_reply.remote(*args)


class RaySandbox(SandboxHandle):
    """A sandbox in a Ray actor: the SandboxAPI of ``memex.Sandbox``; ``checkpoint()``
    returns a :class:`RayCheckpoint`."""

    close_on_collect = False  # the backend holds each handle until it is closed or the
    # backend closes, so no finalizer would run

    def __init__(self, backend: RayBackend, host: _HostRef, sid: int, *, door: Door,
                 limits: Limits, spec: dict[str, Any], tenant: str | None) -> None:
        self._backend, self._host, self.sid = backend, host, sid
        self.door, self.limits, self.tenant, self._spec = door, limits, tenant, spec
        self.turns = 0
        self._turn_t0 = time.monotonic()
        self._lock = threading.RLock()
        self._closed_reason: str | None = None
        self._lost: str | None = None

    def _check_open(self) -> None:
        if self._lost is not None:
            raise SandboxLost(self._lost)
        if self._closed_reason is not None:
            raise SandboxClosed(self._closed_reason)

    def _do(self, method: str, *args: Any, timeout: float | None = None) -> Any:
        b = self._backend
        try:
            out = b._get(getattr(self._host.actor, method).remote(self.sid, *args),
                         timeout or b.op_timeout)
        except _Lost as lost:
            self._lost = lost.reason
            self._closed_reason = f"lost: {lost.reason}"
            self._backend._forget(self)
            raise SandboxLost(lost.reason) from None
        if out[0] == "ok":
            return out[1]
        exc = error_from_wire(out[1])
        if isinstance(exc, SandboxClosed) and self._closed_reason is None:
            self._closed_reason = exc.reason
            self._backend._forget(self)
        raise exc

    def run(self, code: str, *, timeout: float | None = None, filename: str | None = None
            ) -> TurnResult:
        check_run_args(code, timeout)
        if serving_door() is self.door:
            raise SandboxError(
                "a door handler cannot run code in the sandbox whose turn is waiting for it")
        with self._lock:
            self._check_open()
            budget = self.limits.timeout if timeout is None else min(timeout, self.limits.timeout)
            self.turns += 1
            self._turn_t0 = time.monotonic()
            try:
                wire = self._do("run", code, timeout, filename,
                                timeout=budget + self._backend.grace)
            except SandboxLost:
                raise
            except BaseException:
                self.turns -= 1
                raise
            return result_from_wire(wire)

    def checkpoint(self) -> RayCheckpoint:
        with self._lock:
            self._check_open()
            blob = self._do("checkpoint")
            return RayCheckpoint(self._backend._ray.put(blob), len(blob), self.turns)

    def restore(self, checkpoint: RayCheckpoint) -> None:
        if not isinstance(checkpoint, RayCheckpoint):
            raise ConfigError("restore takes a checkpoint from checkpoint() of this kind of "
                              "sandbox")
        with self._lock:
            self._check_open()
            self._do("restore", checkpoint.ref)

    def fork(self) -> RaySandbox:
        with self._lock:
            self._check_open()
            child = RaySandbox(self._backend, self._host, self._backend._new_sid(),
                               door=self.door, limits=self.limits, spec=self._spec,
                               tenant=self.tenant)
            self._do("fork", child.sid)
            self._backend._adopt(child)
            return child

    def fork_many(self, n: int) -> list[RaySandbox]:
        """``n`` forks, all or none (each one call to the actor, which keeps one image of
        this sandbox's state for all of them)."""
        return fork_each(self.fork, n, RaySandbox.close)

    def read_file(self, guest_path: str, *, max_bytes: int | None = None) -> bytes:
        self._check_open()
        return bytes(self._do("read_file", guest_path, max_bytes))

    def write_file(self, guest_path: str, data: bytes) -> None:
        self._check_open()
        self._do("write_file", guest_path, bytes(memoryview(data)))

    def _shutdown(self, reason: str) -> None:
        if self._closed_reason is not None:
            return
        self._closed_reason = reason
        if self._host.dead is None:
            with contextlib.suppress(Exception):
                self._host.actor.close.remote(self.sid)  # not awaited, as in the pool
        self._backend._forget(self)

    def __repr__(self) -> str:
        return f"<RaySandbox turns={self.turns} {self._closed_reason or 'open'}>"


class _Lost(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class RayBackend(Backend):
    """Sandboxes in ``actors`` Ray actors (placed on the least loaded).

    Args:
        actors: host actors to start (each a process somewhere in the cluster).
        address: the cluster to join; None starts a local one on 127.0.0.1 (``init_ray``)
            unless Ray is initialised already. A cluster this backend started is shut down
            by ``close``.
        init_options: more keyword arguments for ``ray.init``.
        actor_options: options for the host actors (``num_cpus``, ``resources``, ...).
        max_concurrency: threads per host actor (turns, door polls and file calls at once).
        grace, op_timeout: as for :class:`SubprocessBackend`.
    """

    name = "ray"

    def __init__(self, *, actors: int = 2, address: str | None = None,
                 init_options: dict[str, Any] | None = None,
                 actor_options: dict[str, Any] | None = None, max_concurrency: int = 64,
                 grace: float = 10.0, op_timeout: float = 300.0) -> None:
        try:
            import ray
        except ImportError as exc:
            raise ConfigError("the Ray backend needs Ray: pip install 'memex[ray]'") from exc
        if actors < 1 or max_concurrency < 4:
            raise ConfigError("actors must be >= 1 and max_concurrency >= 4")
        self._ray = ray
        self.grace, self.op_timeout = grace, op_timeout
        self._owns_ray = False
        opts = {"include_dashboard": False, "log_to_driver": False, **(init_options or {})}
        self._owns_ray = init_ray(address, **opts)
        self._closed = False
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._handles: dict[int, RaySandbox] = {}
        cls = ray.remote(max_concurrency=max_concurrency, **(actor_options or {}))(_Host)
        self._hosts = [_HostRef(self, cls.remote(guest_nice())) for _ in range(actors)]

    def _get(self, ref: object, timeout: float) -> Any:
        ray = self._ray
        try:
            return ray.get(ref, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise _Lost(f"the Ray actor did not answer within {timeout:.3g}s") from None
        except ray.exceptions.RayActorError as exc:
            raise _Lost(f"the Ray actor holding the sandbox died: {str(exc)[:300]}") from None

    def _new_sid(self) -> int:
        return next(self._ids)

    def _adopt(self, h: RaySandbox) -> None:
        with self._lock:
            self._handles[h.sid] = h
            h._host.live.add(h.sid)

    def _forget(self, h: RaySandbox) -> None:
        with self._lock:
            self._handles.pop(h.sid, None)
            h._host.live.discard(h.sid)

    def open(self, *, limits: Limits | None = None, mounts: Sequence[Mount] = (),
             preload: Iterable[str] = (), door: Door | None = None,
             env: dict[str, str] | None = None, tenant: str | None = None,
             packages: Sequence[str] = ()) -> RaySandbox:
        if self._closed:
            raise SandboxClosed("the backend was closed")
        limits, spec = SubprocessBackend._spec(limits, mounts, preload, env, packages)
        with self._lock:
            hosts = [h for h in self._hosts if h.dead is None]
            if not hosts:
                raise SandboxError("every Ray host actor of this backend died")
            host = min(hosts, key=lambda h: len(h.live))
        h = RaySandbox(self, host, self._new_sid(), door=door or Door(), limits=limits,
                       spec=spec, tenant=tenant)
        self._adopt(h)
        try:
            h._do("open", spec, None)
        except BaseException:
            self._forget(h)
            raise
        return h

    @property
    def closed(self) -> bool:
        return self._closed

    def actor_pids(self) -> list[int]:
        """Pids of the host actors' processes (on their nodes)."""
        return [h.pid for h in self._hosts if h.dead is None]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._lock:
            handles = list(self._handles.values())
        for h in handles:
            h._closed_reason = h._closed_reason or "the backend was closed"
        self._handles.clear()
        for host in self._hosts:
            with contextlib.suppress(Exception):
                self._ray.kill(host.actor)
        for host in self._hosts:
            host.poller.join(5)
        if self._owns_ray:
            self._ray.shutdown()
