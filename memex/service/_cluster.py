"""``memex serve`` on a Ray cluster (``[cluster]`` in serve.toml; docs/scaling.md). Every front
is a ``memex serve`` process joined to the cluster as a Ray driver; any front serves any
session. The fronts share nothing but the cluster: the control actor
(``memex.cluster``'s ``Control``) holds the directory, the tenants' ledger and the config, and the
sessions live in slabs (``memex.cluster``'s slabs) that save them to the cluster's storage.

A front keeps a session record per session it has served (:class:`ClusterSandbox` is its
handle to the session's slab, :class:`RelayDoor` its door); the record is a cache: a slab that
no longer holds the session sends the front back to the control actor, which says where it is
now, or that it ended. Each turn is admitted by the control actor (the tenant's running
turns and rate across the cluster) and told there which slab holds the session now, so a
session the monitor moved after its node died is followed without a failed call.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import socket
import threading
import time
import tomllib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import anyio

from ..backends import Backend, init_ray
from ..backends.internal import (
    Channel,
    ChannelClosed,
    ProtocolError,
    error_from_wire,
    limits_from_wire,
    limits_to_wire,
    mounts_from_wire,
    mounts_to_wire,
    result_from_wire,
)
from ..cluster.internal import (
    CONTROL_NAME,
    Answer,
    Call,
    Control,
    Done,
    Granted,
    Heard,
    Hello,
    NotHeld,
    Outcome,
    RateTokens,
    Refused,
    Reply,
    RunningSlots,
    Slots,
    Started,
    Storage,
    Tokens,
    Wait,
    Welcome,
    checkpoint_key,
    from_wire,
    to_wire,
)
from ..errors import BackendBusy, ConfigError, SandboxClosed, SandboxError
from ..runtime_wasm import Door, GuestFile, Limits, TurnResult, TurnStatus
from ..runtime_wasm.internal import SandboxHandle
from ..serving.internal import DoorKit
from ._config import (
    ClusterConfig,
    ServiceConfig,
    TenantConfig,
    adopt_tenants,
    parse_config,
    service_keys,
)
from ._http import ApiError, translate
from ._models import CreateSession, RunIn
from ._service import AUDIT, Service
from ._sessions import Session, new_checkpoint_id

__all__ = ["ClusterService", "check_cluster", "drain_node"]

LOG = logging.getLogger("memex.service")
CONFIG_POLL = 1.0
"""Seconds between two checks of the cluster's config (a key rotated out of serve.toml is
refused on every front within about this, plus the time to notice the file changed)."""
RELAY_WAIT = 2.0
"""Seconds the door relay waits on a slab's answer before it asks where the session is."""
JOIN_WAIT = 30.0
"""Seconds a client's new door connection waits for the session's slab to route calls to it
before it is closed (1013, try again) rather than told ``ready``."""
CONNECT_TIMEOUT = 5.0
"""Seconds to open a socket to a slab (a node gone without a word is found out by this)."""


class _Link:
    """One front's connection to the cluster: Ray, the control actor and the slabs' handles
    by name (looked up once)."""

    def __init__(self, cfg: ClusterConfig,
                 config_text: tuple[int, str, dict[str, Any]] | None,
                 checkpoint_ttl: float = 600.0, guest_nice: int = 0) -> None:
        try:
            import ray
        except ImportError as exc:
            raise ConfigError("[cluster] needs Ray: pip install 'memex[cluster]'") from exc
        self.ray, self.cfg = ray, cfg
        joins = {} if cfg.node_temp_dir is None else {"_temp_dir": cfg.node_temp_dir}
        init_ray(cfg.address, namespace=cfg.namespace, log_to_driver=False, **joins)
        self.storage = Storage(cfg.storage, dict(cfg.storage_options))
        self.control = ray.remote(Control).options(
            name=CONTROL_NAME, namespace=cfg.namespace, lifetime="detached",
            get_if_exists=True, num_cpus=0, max_concurrency=64, max_restarts=-1,
            resources={"node:__internal_head__": 0.001},  # lives and dies with the head
        ).remote(self.storage, namespace=cfg.namespace, slab_memory=cfg.slab_memory,
                 slab_cpus=cfg.slab_cpus, save_interval=cfg.save_interval,
                 place_timeout=cfg.place_timeout, slab_idle=cfg.slab_idle,
                 checkpoint_ttl=checkpoint_ttl, guest_nice=guest_nice)
        self.version = 0
        if config_text is not None:
            self.version = self.get(self.control.publish.remote(*config_text))
        self._slabs: dict[str, Any] = {}
        self._idle: dict[str, list[Channel]] = {}
        self._seq = 0
        self._lock = threading.Lock()

    def get(self, ref: Any, timeout: float | None = 60.0) -> Any:
        return self.ray.get(ref, timeout=timeout)

    def slab(self, name: str) -> Any:
        with self._lock:
            h = self._slabs.get(name)
        if h is None:
            h = self.ray.get_actor(name, namespace=self.cfg.namespace)
            with self._lock:
                self._slabs[name] = h
        return h

    def dead(self, exc: BaseException) -> bool:
        """Whether ``exc`` says the actor is gone (its node lost, or killed)."""
        e = self.ray.exceptions
        return isinstance(exc, e.RayActorError | e.ActorUnavailableError | ValueError)

    # the direct path to a slab: a pool of sockets per slab, each opened with its secret
    def call(self, to: _Where, method: str, args: list[Any], timeout: float) -> Outcome:
        """``method(sid, *args)`` on the slab ``to`` over a socket of the pool. Raises
        :class:`_Unreached` when the call did not reach it (it could not have run: a turn
        is acknowledged as it starts), :class:`_Broken` when the connection broke after."""
        ch = self._take(to)
        with self._lock:
            self._seq += 1
            seq = self._seq
        started = method != "run"
        try:
            ch.send(to_wire(Call(seq, method, args)))
            msg = from_wire(ch.recv(timeout)[0])
            if isinstance(msg, Started) and msg.seq == seq:
                started = True
                msg = from_wire(ch.recv(timeout)[0])
        except (ChannelClosed, ProtocolError, OSError) as exc:
            ch.close()
            raise (_Broken if started and method == "run" else _Unreached)(str(exc)) from None
        except TimeoutError:
            ch.close()
            raise _Broken(f"no answer within {timeout:.3g} s") from None
        if not isinstance(msg, Answer) or msg.seq != seq:
            ch.close()
            raise _Broken(f"an answer out of order from slab {to.slab}")
        with self._lock:
            self._idle.setdefault(to.slab, []).append(ch)
        return msg.outcome

    def _take(self, to: _Where) -> Channel:
        with self._lock:
            idle = self._idle.get(to.slab)
            if idle:
                return idle.pop()
        try:
            sock = socket.create_connection(tuple(to.endpoint), timeout=CONNECT_TIMEOUT)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(None)
            ch = Channel(sock)
            ch.send(to_wire(Hello(to.secret)))
            msg = from_wire(ch.recv(CONNECT_TIMEOUT)[0])
        except (ChannelClosed, ProtocolError, OSError) as exc:
            raise _Unreached(f"slab {to.slab}: {exc}") from None
        if not isinstance(msg, Welcome):
            ch.close()
            raise _Unreached(f"slab {to.slab} did not take this front's hello")
        return ch

    def forget(self, slab: str) -> None:
        """Close the pool's sockets to a slab that moved away or died."""
        with self._lock:
            idle = self._idle.pop(slab, [])
        for ch in idle:
            ch.close()

    def close(self) -> None:
        with self._lock:
            pools, self._idle = list(self._idle.values()), {}
        for idle in pools:
            for ch in idle:
                ch.close()
        with contextlib.suppress(Exception):
            self.ray.shutdown()


@dataclass
class _Where:
    """Where a session is: its slab, and that slab's direct path."""

    slab: str
    endpoint: list[Any]
    secret: bytes


class _Unreached(Exception):
    """A direct call did not reach the slab: it did not run."""


class _Broken(Exception):
    """The connection broke after a turn started: it may have run, partly."""


class ClusterBackend(Backend):
    """What ``Service.backend()`` is on a cluster: the front's link (sessions are opened
    through the control actor, never with ``open``)."""

    name = "cluster"

    def __init__(self, link: _Link) -> None:
        self.link = link
        self._closed = False

    def open(self, **kwargs: Any) -> Any:
        raise SandboxError("a cluster's sessions are made through its control actor")

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.link.close()


class ClusterSandbox(SandboxHandle):
    """A front's handle to a session in a slab (the SandboxAPI of the routes): turns and
    files over the slab's direct path, anything else through the control actor. ``turns``
    is the session's count as its slab last said it."""

    close_on_collect = False

    def __init__(self, link: _Link, entry: dict[str, Any], limits: Limits) -> None:
        self.link, self.sid, self.tenant = link, str(entry["id"]), str(entry["tenant"])
        self.where = _where(entry)
        self.limits, self.turns = limits, int(entry["turns"])
        self.door: Door = Door()
        self.notice: dict[str, Any] | None = None  # what a move of its slab lost, said once
        self.notice_pending = False  # the door relay found it moved: a notice may wait

    @property
    def slab(self) -> str:
        return self.where.slab if self.where is not None else ""

    def _refresh(self, dead: bool, begun: int | None = None, take: bool = True) -> None:
        """Ask the control actor where the session is now (after its slab said it does not
        hold it, or could not be reached); SandboxClosed when it ended. ``take``: a move's
        notice is taken for this front's next answer (the door relay leaves it for the
        next turn, through whichever front: :meth:`take_pending_notice`)."""
        link = self.link
        if self.where is not None:
            link.forget(self.where.slab)
        ref = link.control.recover.remote(self.sid, self.slab or None, begun,
                                          self.tenant) if dead else \
            link.control.lookup.remote(self.tenant, self.sid)
        entry = link.get(ref)
        deadline = time.monotonic() + link.cfg.place_timeout + 30
        pause = 0.05
        while entry is not None and entry["slab"] is None and entry.get("moving") and \
                time.monotonic() < deadline:  # being opened elsewhere: here, not there, waits
            time.sleep(pause)
            pause = min(pause * 2, 0.5)
            entry = link.get(link.control.lookup.remote(self.tenant, self.sid))
        if entry is None:
            self._closed_reason = "closed"
            raise SandboxClosed("the session ended")
        if entry["slab"] is None:  # kept: the next use (and the monitor) tries again
            raise BackendBusy("no_room", "the session's slab was lost and it could not be "
                              "opened again yet: "
                              f"{entry.get('failed') or 'no room in the cluster'}")
        known, self.where = self.turns, _where(entry)
        if entry.get("notice") and not take:
            self.notice_pending = True
            return
        notice = link.get(link.control.take_notice.remote(self.sid)) if entry.get("notice") \
            else None
        if notice is not None:
            self._moved(notice, known)
        else:
            self.turns = max(self.turns, int(entry["turns"]))

    def take_pending_notice(self) -> None:
        """Before a turn: the notice of a move the door relay found, unless a turn through
        another front said it already."""
        if not self.notice_pending:
            return
        self.notice_pending = False
        notice = self.link.get(self.link.control.take_notice.remote(self.sid))
        if notice is not None:
            self._moved(notice, self.turns)

    def _moved(self, notice: dict[str, Any], known: int) -> None:
        """It moved: its count is its save's, and the turns this front saw (``known``)
        after that save are lost too."""
        notice["lost_turns"] = max(int(notice["lost_turns"]), known - int(notice["from_turn"]))
        self.turns = int(notice["from_turn"])
        self.notice = notice

    def _do(self, method: str, *args: Any, timeout: float = 300.0) -> Any:
        """``method`` on the session's slab, following the session when it moved. A call
        that did not reach the slab is sent again where the session is now; a turn whose
        connection broke after it started is not (:class:`_Moved`)."""
        if self._closed_reason is not None:
            raise SandboxClosed(self._closed_reason)
        for attempt in range(3):
            if self.where is None:
                self._refresh(dead=False)
            assert self.where is not None
            try:
                out = self.link.call(self.where, method, [self.sid, *args], timeout)
            except _Unreached:
                self._refresh(dead=True)
                continue
            except _Broken:
                self._refresh(dead=True, begun=self.turns + 1)
                raise _Moved() from None
            match out:
                case Done(value):
                    return value
                case NotHeld(lease=lease) if attempt < 2:  # moved (a drain, a recovery)
                    self._refresh(dead=lease)  # or ended; its slab's lease ran out: being
                    continue  # recovered now
            out.unwrap()  # raises what the slab raised, or that it does not hold it
        raise SandboxError("the session kept moving while this call followed it")

    # the SandboxAPI the routes use
    def run(self, code: str, *, timeout: float | None = None, filename: str | None = None
            ) -> TurnResult:
        budget = self.limits.timeout if timeout is None else min(timeout, self.limits.timeout)
        try:
            out = self._do("run", code, timeout, filename, timeout=budget + 30.0)
        except _Moved:
            return _lost_turn(self.notice)
        self.turns = int(out["turns"])
        for event in out.get("audit") or ():  # its operator tools' and egress's, in the slab
            AUDIT.info(json.dumps({k: event.get(k) for k in AUDIT_FIELDS if k in event}))
        return result_from_wire(out["result"])

    def checkpoint(self) -> Any:
        raise SandboxError("a cluster's checkpoints are taken through its control actor")

    def restore(self, checkpoint: Any) -> None:
        raise SandboxError("a cluster's checkpoints are restored through its control actor")

    def fork(self) -> Any:
        raise SandboxError("a cluster's sessions fork through its control actor")

    def fork_many(self, n: int) -> Any:
        raise SandboxError("a cluster's sessions fork through its control actor")

    def read_file(self, guest_path: str, *, max_bytes: int | None = None) -> bytes:
        return bytes(self._do("read_file", guest_path, max_bytes))

    def write_file(self, guest_path: str, data: bytes) -> None:
        self._do("write_file", guest_path, bytes(memoryview(data)))

    def list_files(self, path: str = "/tmp", *, limit: int = 10_000) -> list[GuestFile]:
        return [GuestFile(name=n, path=p, kind=k, size=int(z))
                for n, p, k, z in self._do("list_files", path, limit)]

    def _shutdown(self, reason: str) -> None:
        self._closed_reason = reason  # the session ends through the control actor


AUDIT_FIELDS = ("event", "tenant", "session", "tool", "outcome", "seconds", "method", "url",
                "decision", "rule", "reason", "status", "request_bytes", "response_bytes",
                "count")
"""What a slab's audit event may say (the front logs these fields and no other)."""


def _where(entry: dict[str, Any]) -> _Where | None:
    if entry.get("slab") is None or entry.get("endpoint") is None:
        return None
    return _Where(str(entry["slab"]), list(entry["endpoint"]), bytes(entry["secret"]))


class _Moved(Exception):
    """The slab died during the call; the session is open elsewhere now."""


def _lost_turn(notice: dict[str, Any] | None) -> TurnResult:
    """The answer of a turn whose node died under it: data, as every guest outcome."""
    turn = notice.get("from_turn") if notice else None
    return TurnResult(
        status=TurnStatus.KILLED, limit="lost", rolled_back=True,
        stderr="the node holding this session was lost during this cell; the session was "
               f"opened again on another node from its save at turn {turn} (the restored "
               "notice says what was lost); this cell's effects are gone: run it again\n")


class RelayDoor(Door):
    """A front's end of a session's door: the client's door WebSocket, relayed to the door
    in the session's slab (frames pulled from there, replies sent there). It follows the
    session when it moves."""

    def __init__(self, sandbox: ClusterSandbox) -> None:
        super().__init__()
        self.sb = sandbox
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._joined: dict[int, asyncio.Event] = {}
        self._next = 0

    @property
    def attached(self) -> bool:
        return bool(self._tasks)

    def attach(self, send: Callable[[bytes], Any], loop: asyncio.AbstractEventLoop) -> int:
        self._next += 1
        token = self._next
        self._joined[token] = joined = asyncio.Event()
        self._tasks[token] = loop.create_task(self._relay(send, joined))
        return token

    async def joined(self, token: int) -> bool:
        """True once the session's slab routes calls to this connection (its relay attached
        there): the guest's calls go through the slab's door, which answers a call as an
        empty door while no connection was ever attached there, so a client told ``ready``
        before that had its first tool call answered ``unknown tool`` (the turns reach the
        slab by another path than the relay's attach, and could overtake it). False if the
        relay ended first (the session did) or did not attach within ``JOIN_WAIT``."""
        event, task = self._joined.get(token), self._tasks.get(token)
        if event is None or task is None:
            return False
        waiter = asyncio.ensure_future(event.wait())
        try:
            await asyncio.wait({waiter, task}, timeout=JOIN_WAIT,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        return event.is_set()

    async def _relay(self, send: Callable[[bytes], Any], joined: asyncio.Event) -> None:
        """Pull the session's door frames from its slab and send them to the client, for as
        long as the connection lasts; when the slab stops answering (the session moved, its
        node was lost), find where the session is now and go on there. Every wait on the
        slab is bounded, so a slab that died without a word holds the relay up for seconds,
        never for good; the relay ends when the session does."""
        link, sb = self.sb.link, self.sb
        while True:
            slab, slab_token = sb.slab, None
            try:
                if slab:
                    out: Outcome = await asyncio.wait_for(
                        link.slab(slab).door_attach.remote(sb.sid), RELAY_WAIT)
                    if isinstance(out, Done):
                        slab_token = out.value
                        joined.set()
                    while slab_token is not None:
                        got: Outcome = await asyncio.wait_for(
                            link.slab(slab).door_pull.remote(sb.sid, slab_token, 1.0),
                            1.0 + RELAY_WAIT)
                        frames = got.unwrap()
                        if frames is None:
                            break  # the session left this slab, or its lease ran out
                        for frame in frames:
                            await send(frame)
                        if sb.slab != slab:
                            break  # a turn found it moved: follow it now
            except asyncio.CancelledError:
                if slab_token is not None:
                    with contextlib.suppress(Exception):
                        link.slab(slab).door_detach.remote(sb.sid, slab_token)
                raise
            except Exception as exc:
                if not (link.dead(exc) or isinstance(exc, TimeoutError)):
                    LOG.warning("door relay of %s: %s", sb.sid, exc)
            if slab_token is not None:  # let go of this connection there: a call routed to
                with contextlib.suppress(Exception):  # it fails now, not at its deadline
                    link.slab(slab).door_detach.remote(sb.sid, slab_token)
            try:  # where is it now? (a move's notice is left for the next turn's answer)
                await anyio.to_thread.run_sync(sb._refresh, False, None, False)
            except SandboxClosed:
                return
            except Exception:
                await asyncio.sleep(0.5)
            if sb.slab == slab:  # not moved (yet): ask again shortly, not in a tight loop
                await asyncio.sleep(0.25)

    def answer(self, data: bytes) -> bool:
        if self.sb.slab:
            with contextlib.suppress(Exception):
                self.sb.link.slab(self.sb.slab).door_answer.remote(self.sb.sid, bytes(data))
        return True

    def detach(self, token: int) -> None:
        self._joined.pop(token, None)
        task = self._tasks.pop(token, None)
        if task is not None:
            task.cancel()


class ClusterService(Service):
    """The service of one front of a cluster (see the module's docstring)."""

    RATE_HERE = False  # a rate's tokens come from the control actor's one bucket

    def __init__(self, config: ServiceConfig) -> None:
        if config.cluster is None:
            raise ConfigError("ClusterService needs [cluster] in serve.toml")
        super().__init__(config)
        self.keys = service_keys(config, watch=False)
        self.cluster = config.cluster
        self._link: _Link | None = None
        self._stamp: tuple[int, int] | None = None
        self._heard: float | None = None  # when the control actor last answered
        self._running: dict[str, int] = {}  # turns running through this front, by session
        # its max_running tenants' running slots held here (cluster._slots): said with
        # every config poll, so a restarted control actor counts them again
        self.slots = RunningSlots()
        self.tokens = RateTokens()  # its tenants' rate tokens held here (cluster._tokens)
        self._used: dict[str, float] = {}  # sessions used since the last report
        self._active: dict[str, Session] = {}  # those sessions
        # how the control actor knows this front's holds (running slots, turns running):
        # they last while this front asks for the config each second (FRONT_LEASE)
        self.front_id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"

    @property
    def link(self) -> _Link:
        if self._link is None:
            raise ApiError(503, "not_ready", "the front has not joined the cluster")
        return self._link

    def backend(self) -> Backend:
        if self._backend is None:
            self._link = _Link(self.cluster, self._config_text(), self.config.checkpoint_ttl,
                               self.config.guest_nice)
            self._backend = ClusterBackend(self._link)
        return self._backend

    def _config_text(self) -> tuple[int, str, dict[str, Any]] | None:
        """This front's serve.toml to publish: its version (mtime), its text and its
        tenants' kits (None when it cannot be read, or does not parse: not published)."""
        path = self.config.path
        if path is None:
            return None
        try:
            st = path.stat()
            text = path.read_text()
        except OSError:
            return None
        self._stamp = (st.st_mtime_ns, st.st_size)
        try:
            tenants = parse_config(tomllib.loads(text), path=path).tenants
        except (ConfigError, tomllib.TOMLDecodeError) as exc:
            LOG.warning("cluster config: not published: %s", exc)
            return None
        kits = {n: t.kit.to_wire() for n, t in tenants.items() if t.kit is not None}
        return (st.st_mtime_ns, text, kits)

    # ---- life -----------------------------------------------------------------------------
    async def start(self) -> None:
        await anyio.to_thread.run_sync(self.backend)
        self._sweeper = asyncio.ensure_future(self._follow_config())

    async def _follow_config(self) -> None:
        """Publish this front's serve.toml when it changes; serve the cluster's newest."""
        while True:
            try:
                link = self.link
                path = self.config.path
                if path is not None:
                    with contextlib.suppress(OSError):
                        st = path.stat()
                        if (st.st_mtime_ns, st.st_size) != self._stamp:
                            text = self._config_text()
                            if text is not None:
                                await link.control.publish.remote(*text)
                heard: Heard = await link.control.config.remote(
                    link.version, self.front_id, self.slots.held())
                newer = heard.config
                self._heard = asyncio.get_running_loop().time()
                self._report()
                self._give_back_expired()
                self._give_back_slots(heard.wanted)
                if newer is not None:
                    link.version = newer[0]
                    kits = {n: DoorKit.from_wire(k) for n, k in newer[2].items()}
                    await anyio.to_thread.run_sync(adopt_tenants, self.keys, newer[1],
                                                   self.config.path, kits)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                LOG.warning("cluster config: %s", exc)
            await asyncio.sleep(CONFIG_POLL)

    def _report(self) -> None:
        """Tell the control actor, in one call, which sessions this front used since its
        last report: their turns, the turns still running, and when (their idle timeouts
        and the turns a lost node cost count by it)."""
        now = time.time()
        used, self._used = self._used, {}
        busy = [sid for sid, n in self._running.items() if n > 0]
        batch = []
        for sid in set(used) | set(busy):
            s = self._active.get(sid)
            if s is None or not isinstance(s.sandbox, ClusterSandbox):
                continue
            running = self._running.get(sid, 0)
            batch.append([sid, s.sandbox.turns, running, now if running else used[sid]])
        self._running = {sid: n for sid, n in self._running.items() if n > 0}
        self._active = {sid: s for sid, s in self._active.items() if sid in self._running}
        if batch:
            self.link.control.report.remote(batch, self.front_id)

    async def stop(self) -> None:
        sweeper = getattr(self, "_sweeper", None)
        if sweeper is not None:
            sweeper.cancel()
        self.table.drain()  # the sessions live on in the cluster; only the cache goes
        AUDIT.info(json.dumps({"event": "shutdown", "front": True}))
        if self._backend is not None:
            await anyio.to_thread.run_sync(self._backend.close)

    @property
    def ready(self) -> bool:
        """Joined, and the control actor has answered since this front started (the front
        holds the tenants' config). Still ready while the control actor is away (restarting,
        or the head lost): every front shares it, so they would all leave the balancer at
        once, and with them the turns of live sessions, which never ask it; what needs it
        answers 503 with Retry-After itself."""
        return self._link is not None and not self.backend().closed and self._heard is not None

    async def reap(self, owner: str | None = None) -> None:
        """Sessions their limits ended are ended by the control actor."""

    # ---- sessions -------------------------------------------------------------------------
    def _bounds(self, tenant: TenantConfig) -> dict[str, Any]:
        b = tenant.bounds()
        return {"max_sessions": b.max_sessions, "max_memory": b.max_memory,
                "max_disk": b.max_disk, "max_checkpoints": b.max_checkpoints}

    def _record(self, entry: dict[str, Any]) -> Session:
        spec = entry["spec"]
        limits = limits_from_wire(spec["limits"])
        sb = ClusterSandbox(self.link, entry, limits)
        door = RelayDoor(sb)
        sb.door = door
        s = Session(id=entry["id"], owner=entry["tenant"], limits=limits, sandbox=sb,
                    door=door,  # type: ignore[arg-type]
                    mounts=tuple(mounts_from_wire(spec["mounts"])),
                    preload=tuple(spec["preload"]), env=spec.get("env"),
                    packages=tuple(spec.get("packages") or ()),
                    parent=entry.get("parent"), created=float(entry["created"]),
                    last_used=float(entry["last_used"]))
        return s

    async def find(self, tenant: TenantConfig, sid: str) -> Session | None:
        """The session as the control actor knows it now (another front may have closed
        it); this front's record of it is kept, and brought up to date."""
        entry = await self.link.control.lookup.remote(tenant.name, sid)
        s = self.table.get(tenant.name, sid)
        if entry is None:
            if s is not None:
                self.table.pop(tenant.name, sid)
            return None
        if s is None or s.sandbox is None or s.sandbox.closed:
            s = self._record(entry)
            self.table.add(s)
        else:
            sb = s.sandbox
            assert isinstance(sb, ClusterSandbox)
            sb.where = _where(entry) or sb.where
            sb.turns = max(sb.turns, int(entry["turns"]))
        if entry.get("notice"):  # a move no front has said yet: said from here on
            s.notice = await self.link.control.take_notice.remote(sid) or s.notice
        return s

    async def run_turn(self, tenant: TenantConfig, sid: str, body: RunIn) -> dict[str, Any]:
        """As on one node, with this front's record when it has one: the turn's admission
        by the control actor checks the session is still there (404 otherwise)."""
        s = self.table.get(tenant.name, sid)
        if s is None or s.sandbox is None or s.sandbox.closed:
            s = await self.session_of(tenant, sid)
        try:
            r: TurnResult = await self.ordered(s, tenant, self.turn_of(s, tenant, body),
                                               turn=True)
        except ApiError as exc:
            if exc.status == 404:
                self.table.pop(tenant.name, sid)
            raise
        return self.answer_of(s, tenant, body, r)

    async def session_of(self, tenant: TenantConfig, sid: str) -> Session:
        s = await self.find(tenant, sid)
        if s is None:
            raise ApiError(404, "not_found", f"no session {sid!r}")
        return s

    async def listed(self, tenant: TenantConfig) -> list[Session]:
        """Every session of the tenant, those being opened elsewhere too (a turn on one
        waits for it)."""
        return [self._record(e) for e in await self.link.control.of.remote(tenant.name)]

    async def observe(self) -> None:
        self.metrics.cluster(await self.cluster_stats())

    async def session_counts(self) -> dict[str, int]:
        return dict((await self.cluster_stats())["sessions"])

    def make_session(self, tenant: TenantConfig, body: CreateSession) -> Session:
        limits, mounts = self.granted(tenant, body)
        pins = self.packages.pins(tenant.name, tenant.packages, body.packages,
                                  max_bytes=limits.disk_bytes)
        spec = {"limits": limits_to_wire(limits), "mounts": mounts_to_wire(mounts),
                "preload": list(body.preload), "env": body.env, "packages": list(pins)}
        link = self.link
        out = link.get(link.control.create.remote(tenant.name, self._bounds(tenant), spec),
                       timeout=link.cfg.place_timeout + 60)
        s = self._record(_answer(out))
        self.table.add(s)
        AUDIT.info(json.dumps({"event": "create", "tenant": tenant.name, "session": s.id,
                               "memory": limits.memory, "timeout": limits.timeout,
                               "slab": _slab_of(s)}))
        return s

    def fork_of(self, s: Session, tenant: TenantConfig) -> Callable[[Any], Session]:
        def fork(sb: Any) -> Session:
            link = self.link
            out = link.get(link.control.fork.remote(tenant.name, self._bounds(tenant), s.id),
                           timeout=link.cfg.place_timeout + 60)
            c = self._record(_answer(out))
            self.table.add(c)
            return c
        return fork

    def forks_of(self, s: Session, tenant: TenantConfig, n: int
                 ) -> Callable[[Any], list[Session]]:
        """``n`` forks through the control actor (which checks the tenant's bounds across
        every front for each), all or none: when one is refused, those made are closed."""
        one = self.fork_of(s, tenant)

        def forks(sb: Any) -> list[Session]:
            made: list[Session] = []
            try:
                for _ in range(n):
                    made.append(one(sb))
            except BaseException:
                link = self.link
                for c in made:
                    self.table.pop(c.tenant, c.id)
                    with contextlib.suppress(Exception):
                        link.get(link.control.close.remote(c.tenant, c.id,
                                                           "its fork batch failed"),
                                 timeout=60)
                raise
            return made
        return forks

    async def end(self, s: Session, why: str) -> None:
        self.table.pop(s.tenant, s.id)
        await self.link.control.close.remote(s.tenant, s.id, why)
        if s.sandbox is not None:
            s.sandbox.close()
        AUDIT.info(json.dumps({"event": "close", "tenant": s.tenant, "session": s.id,
                               "why": why}))

    # ---- turns ----------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def admitted(self, s: Session, tenant: TenantConfig, *, turn: bool
                       ) -> AsyncIterator[None]:
        """This front's order and shares, then (for a turn of a tenant with a running or
        rate bound) the cluster's: a running slot and a rate token of the tenant's across
        every front, held by this front (taken from the control actor when it holds none).
        The turn then goes straight to the slab, and is reported after."""
        async with super().admitted(s, tenant, turn=turn):
            if not turn:
                yield
                return
            sb = s.sandbox
            assert isinstance(sb, ClusterSandbox)
            bounded = tenant.max_running is not None
            if bounded:  # its slot first: a turn that waits for one and is refused has
                await self._slot(tenant, sb)  # spent none of its rate
            try:
                if tenant.turns_per_second:
                    await self._token(tenant)
                if sb.notice_pending:
                    await anyio.to_thread.run_sync(sb.take_pending_notice)
                self._running[s.id] = self._running.get(s.id, 0) + 1
                self._active[s.id] = s
                try:
                    yield
                finally:
                    self._running[s.id] -= 1
                    self._used[s.id] = time.time()
                    if sb.notice is not None:
                        s.notice, sb.notice = sb.notice, None
            finally:
                if bounded:
                    self._release_slot(tenant.name)

    async def _slot(self, tenant: TenantConfig, sb: ClusterSandbox) -> None:
        """One of the tenant's running slots for this turn: one this front holds, else one
        taken from the control actor; while every slot is held by turns elsewhere, the
        turn waits (asking again, 2 to 50 ms apart) up to its timeout, then 429."""
        control, bound = self.link.control, int(tenant.max_running or 1)

        async def ask(want: int) -> Slots | Wait:
            out: Slots | Wait = await control.take_slots.remote(tenant.name, bound, want,
                                                                self.front_id)
            return out

        if not await self.slots.take(tenant.name, bound, ask, sb.limits.timeout):
            raise ApiError(429, "busy", f"{tenant.name!r} runs its max_running "
                           f"({tenant.max_running}) turns across the cluster",
                           headers={"Retry-After": "1"})

    def _release_slot(self, tenant: str) -> None:
        """A turn ended: its slot stays here for the next, or goes back at once when another
        front waits for one (said by the last poll)."""
        n = self.slots.release(tenant)
        if n:
            with contextlib.suppress(Exception):
                self.link.control.give_back_slots.remote(tenant, n, self.front_id)

    def _give_back_slots(self, wanted: tuple[str, ...]) -> None:
        """(each config poll) The slots no turn used since the last poll, and the idle ones
        of tenants another front waits for, given back."""
        for tenant, n in self.slots.poll(wanted):
            with contextlib.suppress(Exception):
                self.link.control.give_back_slots.remote(tenant, n, self.front_id)

    async def _token(self, tenant: TenantConfig) -> None:
        """One of the tenant's rate tokens, from this front's batch or a new one (429 with
        Retry-After when the cluster's bucket is empty)."""
        rate = float(tenant.turns_per_second or 0)
        burst = _burst(tenant)
        control = self.link.control

        async def ask(want: int, returned: int) -> Tokens | Refused:
            out: Tokens | Refused = await control.take_tokens.remote(
                tenant.name, rate, burst, want, returned)
            return out

        refused = await self.tokens.take(tenant.name, rate, burst, ask)
        if refused is not None:
            raise _refusal(refused)

    def _give_back_expired(self) -> None:
        """(each config poll) The tokens of batches past their lease, given back."""
        for tenant, rate, burst, n in self.tokens.expired():
            with contextlib.suppress(Exception):
                self.link.control.give_back_tokens.remote(tenant, rate, burst, n)

    # ---- checkpoints ----------------------------------------------------------------------
    async def take_checkpoint(self, s: Session, tenant: TenantConfig) -> str:
        cid = new_checkpoint_id()
        key = checkpoint_key(tenant.name, cid)
        sb = s.sandbox
        assert isinstance(sb, ClusterSandbox)
        info = await self.ordered(s, tenant, lambda _: sb._do("checkpoint", key))
        out = await self.link.control.hold.remote(tenant.name, self._bounds(tenant), cid,
                                                  int(info["size"]), int(info["turns"]), s.id)
        return str(_answer(out))

    async def restore_checkpoint(self, s: Session, tenant: TenantConfig, cid: str) -> None:
        held = await self.link.control.checkpoint.remote(tenant.name, cid)
        if held is None:
            raise ApiError(404, "not_found", f"no checkpoint {cid!r} (unknown, released, or "
                           "past the tenant's max_checkpoints)")
        sb = s.sandbox
        assert isinstance(sb, ClusterSandbox)
        key = checkpoint_key(tenant.name, cid)
        await self.ordered(s, tenant, lambda _: sb._do("restore", key))

    async def drop_checkpoint(self, tenant: TenantConfig, cid: str) -> bool:
        return bool(await self.link.control.drop_checkpoint.remote(tenant.name, cid))

    async def cluster_stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = await self.link.control.stats.remote()
        return stats

    def drain(self, node: str) -> dict[str, Any]:
        link = self.link
        out: dict[str, Any] = link.get(link.control.drain.remote(node), timeout=None)
        return out


def _burst(tenant: TenantConfig) -> int:
    """The bucket of a tenant's rate: a second's worth of turns, at least one."""
    return max(1, int(tenant.turns_per_second or 1))


def _slab_of(s: Session) -> str | None:
    return s.sandbox.slab if isinstance(s.sandbox, ClusterSandbox) else None


def _refusal(out: Refused) -> ApiError:
    if out.code == "not_found":
        return ApiError(404, "not_found", out.message)
    status = 429 if out.code == "quota" else 503
    return ApiError(status, out.code, out.message,
                    headers={"Retry-After": str(out.retry_after)})


def _answer(out: Reply) -> Any:
    """The value of a control actor's answer; its refusal or error as the API's."""
    if isinstance(out, Granted):
        return out.value
    if isinstance(out, Refused):
        raise _refusal(out)
    exc = error_from_wire(out.error)
    raise translate(exc) from exc


def check_cluster(cfg: ClusterConfig) -> tuple[list[str], list[str]]:
    """(notes, problems) of a ``[cluster]`` table, without joining the cluster: its storage
    is opened and listed (a front that cannot reach it cannot save a session)."""
    saves = f"every {cfg.save_interval:g} s" if cfg.save_interval else "after every turn"
    notes = [f"cluster at {cfg.address} (namespace {cfg.namespace}); slabs of "
             f"{cfg.slab_memory} bytes and {cfg.slab_cpus:g} CPU(s); sessions saved {saves}"]
    problems: list[str] = []
    try:
        storage = Storage(cfg.storage, dict(cfg.storage_options))
        saved = sum(1 for _ in storage.children("sessions"))
        notes.append(f"storage {cfg.storage}: reachable, {saved} saved session(s)")
    except Exception as exc:
        problems.append(f"storage {cfg.storage}: cannot be read ({type(exc).__name__}: "
                        f"{exc})")
    try:
        import ray  # noqa: F401
    except ImportError:
        problems.append("Ray is not installed: pip install 'memex[cluster]'")
    return notes, problems


def drain_node(cfg: ClusterConfig, node: str, *, undo: bool = False) -> dict[str, Any]:
    """Move every session off the Ray node ``node`` (each saved there and opened on another
    node; its client sees a slower turn, nothing else) and place no new slab on it; with
    ``undo``, place slabs on it again."""
    import ray

    init_ray(cfg.address, namespace=cfg.namespace, log_to_driver=False)
    try:
        control = ray.get_actor(CONTROL_NAME, namespace=cfg.namespace)
        if undo:
            ray.get(control.undrain.remote(node))
            return {"node": node, "moved": 0, "failed": []}
        out: dict[str, Any] = ray.get(control.drain.remote(node))
        return out
    finally:
        ray.shutdown()
