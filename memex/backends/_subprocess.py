"""The subprocess backend: sandboxes live in worker processes (``worker``); the caller
keeps a :class:`ProcessSandbox` handle whose door is served in the caller's process, so a
host tool called by a guest in a worker runs the caller's Python function.

Resuming. With ``resume=True`` (the default) a worker sends the caller, after every turn
that changed the guest, the memfd of its state (the same image the sandbox keeps for
rollback; passing the descriptor copies nothing, though the worker's next rollback image is
then a fresh copy rather than an overwrite). When the worker dies (SIGKILL, an abort in the
engine, the OOM killer) the handle rebuilds its sandbox in another worker from that image,
with its /tmp files: a turn running at the time returns ``status=killed, limit="lost",
rolled_back=True`` (exactly as a trap does in-process), and calls between turns simply go
on. When the image does not hold the latest state (the worker died in the moment between
a turn's result and its image) or ``resume=False``, the handle raises
:class:`~memex.errors.SandboxLost`, now and on every later call.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import tempfile
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from ..errors import (
    ConfigError,
    GuestStartError,
    MemexError,
    SandboxClosed,
    SandboxError,
    SandboxLost,
)
from ..runtime_wasm import (
    Door,
    GuestFile,
    Limits,
    Mount,
    OutputListener,
    TurnResult,
    TurnStatus,
    resolve_packages,
    serving_door,
)
from ..runtime_wasm.internal import SandboxHandle, fork_each, remove_tree
from ._contract import Backend
from .worker._client import DoorServer, ProcessCheckpoint, WorkerClient, WorkerDied, door_socketpair
from .worker._wire import limits_to_wire, mounts_to_wire, result_from_wire

__all__ = ["ProcessCheckpoint", "ProcessSandbox", "SubprocessBackend", "check_run_args"]

_BACKENDS: weakref.WeakSet[SubprocessBackend] = weakref.WeakSet()


def check_run_args(code: object, timeout: object) -> None:
    """The argument checks of ``Sandbox.run``, with its messages, before anything is sent."""
    if not isinstance(code, str):
        raise ConfigError(f"code must be a str, got {type(code).__name__}")
    if timeout is not None and not (isinstance(timeout, int | float)
                                    and 0 < timeout < float("inf")):
        raise ConfigError(f"timeout must be a finite number of seconds > 0, got {timeout!r}")


class ProcessSandbox(SandboxHandle):
    """A sandbox in a worker process: the :class:`~memex.runtime_wasm.SandboxAPI` of
    ``memex.Sandbox``, with the same results, errors and limits. ``checkpoint()`` returns a
    :class:`ProcessCheckpoint`."""

    def __init__(self, backend: SubprocessBackend, worker: WorkerClient, sid: int, *,
                 door: Door, limits: Limits, spec: dict[str, Any], tenant: str | None) -> None:
        self._backend = backend
        self._worker = worker
        self.sid = sid
        self.door = door
        self.limits = limits
        self.tenant = tenant
        self.turns = 0
        self._spec = spec
        self._scratch = ""
        self._lock = threading.RLock()  # one operation at a time, as on memex.Sandbox
        self._state = threading.Lock()  # the fields below; the reader thread writes them too
        self._closed_reason: str | None = None
        self._lost_for_good: str | None = None
        self._lost: str | None = None  # the worker died; not resumed yet
        self._gen = 0  # counts changes of the guest state
        self._resume_cp: ProcessCheckpoint | None = None
        self._resume_gen = -1
        self._stash: Path | None = None
        self._resumes = 0
        self._registered = False
        self._admitted: str | None = None  # the tenant a pool admitted this sandbox for
        self._door_server: DoorServer | None = None

    # ---- state ----------------------------------------------------------------------------
    @property
    def resumable(self) -> bool:
        """The caller holds an image of the latest guest state (shipped shortly after each
        turn when the backend resumes): a worker death now would lose nothing."""
        return self._backend.resume and self._resume_cp is not None and \
            self._resume_gen == self._gen

    @property
    def worker_pid(self) -> int:
        """The pid of the worker process holding this sandbox now."""
        return self._worker.pid

    def _check_open(self) -> None:
        if self._lost_for_good is not None:
            raise SandboxLost(self._lost_for_good)
        if self._closed_reason is not None:
            raise SandboxClosed(self._closed_reason)

    # ---- resume bookkeeping (reader thread) -------------------------------------------------
    def _offer_resume(self, gen: int, cp: ProcessCheckpoint) -> None:
        old: ProcessCheckpoint | None = cp
        with self._state:
            if self._closed_reason is None and gen >= self._resume_gen:
                old, self._resume_cp, self._resume_gen = self._resume_cp, cp, gen
        if old is not None:
            old.close()

    def _worker_lost(self, reason: str) -> None:
        with self._state:
            if self._closed_reason is not None or self._lost is not None:
                return
            self._lost = reason
            keep = self._backend.resume and self._resume_cp is not None
        if keep and self._scratch and os.path.isdir(self._scratch):
            stash = self._backend._stash_dir() / str(self.sid)
            with contextlib.suppress(OSError):
                remove_tree(str(stash))
                os.rename(self._scratch, stash)
                self._stash = stash

    def _ensure_live(self) -> None:
        if self._lost is not None:
            self._resume_or_raise(self._lost)

    def _resume_or_raise(self, reason: str) -> None:
        """Rebuild the sandbox in another worker from the resume image, or raise SandboxLost."""
        b = self._backend
        with self._state:
            cp = self._resume_cp
            ok = (b.resume and cp is not None and self._resume_gen == self._gen
                  and self._resumes < b.max_resumes and not b.closed)
        if not ok or cp is None:
            if not b.resume:
                why = " (resume is off)"
            elif cp is None or self._resume_gen != self._gen:
                why = " (no checkpoint of its latest state)"
            elif self._resumes >= b.max_resumes:
                why = f" (lost {self._resumes} times in a row)"
            else:
                why = ""
            self._give_up(reason + why)
        old = self._worker
        try:
            worker = b._pick_worker()
            spec = dict(self._spec, image=cp._meta, resume=True,
                        scratch_from=str(self._stash) if self._stash else None)
            value = self._open_on(worker, spec, cp.fds())
        except (WorkerDied, MemexError) as exc:
            self._give_up(f"{reason}; resuming it failed: {exc}")
        with b._lock:
            old.live.discard(self.sid)
            worker.live.add(self.sid)
        self._worker, self._scratch = worker, str(value["scratch"])
        self._resumes += 1
        with self._state:
            self._lost = None
        if self._stash is not None:
            remove_tree(str(self._stash))
            self._stash = None

    def _open_on(self, worker: WorkerClient, spec: dict[str, Any], fds: Sequence[int] = (),
                 kind: str = "open", *args: Any) -> Any:
        """Ask ``worker`` to open (or fork) this sandbox, with a new door socket."""
        server, theirs = door_socketpair(self.door)
        try:
            if kind == "open":
                value, _ = worker.request("open", self.sid, spec, fds=[theirs.fileno(), *fds],
                                          timeout=self._backend.op_timeout)
            else:
                value, _ = worker.request(kind, *args, fds=[theirs.fileno(), *fds],
                                          timeout=self._backend.op_timeout)
        except BaseException:
            server.close()
            raise
        finally:
            theirs.close()
        old, self._door_server = self._door_server, server
        if old is not None:
            old.close()
        return value

    def _give_up(self, reason: str) -> NoReturn:
        with self._state:
            self._lost_for_good = reason
            self._closed_reason = self._closed_reason or f"lost: {reason}"
        self._release()
        raise SandboxLost(reason)

    def _call(self, kind: str, *args: Any, fds: Sequence[int] = ()) -> tuple[Any, list[int]]:
        """A request about this sandbox; a worker that dies meanwhile is resumed once."""
        for attempt in (0, 1):
            self._ensure_live()
            try:
                return self._worker.request(kind, self.sid, *args, fds=fds,
                                            timeout=self._backend.op_timeout)
            except WorkerDied as died:
                self._worker_lost(died.reason)
                if attempt:
                    self._give_up(died.reason)
            except SandboxClosed as exc:
                self._closed_in_worker(exc)
                raise
        raise AssertionError("unreachable")

    def _closed_in_worker(self, exc: SandboxClosed) -> None:
        """The worker's sandbox closed itself (idle timeout, lifetime, failed rollback)."""
        with self._state:
            if self._closed_reason is not None:
                return
            self._closed_reason = exc.reason
        self._release()

    # ---- turns ----------------------------------------------------------------------------
    def run(self, code: str, *, timeout: float | None = None, filename: str | None = None,
            on_output: OutputListener | None = None) -> TurnResult:
        """Run one cell in the worker. Guest errors, exits and limits come back as data.
        ``on_output(stream, text)`` hears stdout/stderr as the guest writes them, as on
        ``memex.Sandbox.run`` (on this handle's reader thread: keep it quick)."""
        check_run_args(code, timeout)
        if serving_door() is self.door:
            raise SandboxError(
                "a door handler cannot run code in the sandbox whose turn is waiting for it")
        with self._lock:
            self._check_open()
            self._ensure_live()
            self._backend._before_turn(self)
            budget = self.limits.timeout if timeout is None else min(timeout, self.limits.timeout)
            gen_after = self._gen + 1
            self.turns += 1
            start = time.monotonic()
            for attempt in (0, 1):
                try:
                    value, _ = self._worker.request(
                        "run", self.sid, code, timeout, filename, gen_after,
                        on_output is not None, timeout=budget + self._backend.grace,
                        on_output=on_output)
                    break
                except WorkerDied as died:
                    self._worker_lost(died.reason)
                    self._resume_or_raise(died.reason)
                    if died.started or attempt:
                        return TurnResult(
                            status=TurnStatus.KILLED, limit="lost", rolled_back=True,
                            trap=f"the sandbox's worker died during the turn: {died.reason}",
                            duration=time.monotonic() - start)
                    # the turn never began in the dead worker: run it in the new one
                except SandboxClosed as exc:
                    self.turns -= 1
                    self._closed_in_worker(exc)
                    raise
                except BaseException:
                    self.turns -= 1
                    raise
            result = result_from_wire(value[0])
            if result.trap is None or not result.rolled_back:
                self._gen = gen_after
            if result.trap is None:
                self._resumes = 0
            return result

    # ---- checkpoints and forks --------------------------------------------------------------
    def checkpoint(self) -> ProcessCheckpoint:
        """The current guest state, held by the caller (survives the worker)."""
        with self._lock:
            self._check_open()
            meta, fds = self._call("checkpoint")
            cp = ProcessCheckpoint(fds, dict(meta))
            if self._backend.resume:
                self._offer_resume(self._gen, cp.dup())
            return cp

    def restore(self, checkpoint: ProcessCheckpoint) -> None:
        """Put the guest back to ``checkpoint`` (from a sandbox with the same mounts)."""
        if not isinstance(checkpoint, ProcessCheckpoint):
            raise ConfigError("restore takes a checkpoint from checkpoint() of this kind of "
                              "sandbox")
        with self._lock:
            self._check_open()
            self._call("restore", checkpoint._meta, fds=checkpoint.fds())
            self._gen += 1
            if self._backend.resume:
                self._offer_resume(self._gen, checkpoint.dup())

    def fork(self) -> ProcessSandbox:
        """An independent sandbox (same worker) with identical state, limits, door and files."""
        with self._lock:
            self._check_open()
            self._ensure_live()
            b = self._backend
            child = ProcessSandbox(b, self._worker, b._new_sid(), door=self.door,
                                   limits=self.limits, spec=self._spec, tenant=self.tenant)
            b._admit(child)
            b._register(child, self._worker)
            try:
                value = child._open_on(self._worker, {}, (), "fork", self.sid, child.sid,
                                       b.resume)
            except WorkerDied as died:
                child._release()
                self._worker_lost(died.reason)
                raise SandboxError(f"the worker died during the fork: {died.reason}") from None
            except BaseException:
                child._release()
                raise
            if child._worker is not self._worker:  # the parent was resumed elsewhere meanwhile
                with b._lock:
                    child._worker.live.discard(child.sid)
                    self._worker.live.add(child.sid)
                child._worker = self._worker
            child._scratch = str(value["scratch"])
            self._worker.created += 1
            return child

    def fork_many(self, n: int) -> list[ProcessSandbox]:
        """``n`` forks, all or none (each one request to the worker, which keeps one image
        of this sandbox's state for all of them)."""
        return fork_each(self.fork, n, ProcessSandbox.close)

    # ---- files ------------------------------------------------------------------------------
    def read_file(self, guest_path: str, *, max_bytes: int | None = None) -> bytes:
        """Read a file the guest wrote (under /tmp or a mount); ``GuestFileTooLarge`` for
        one over ``max_bytes`` (checked in the worker, before it is read)."""
        self._check_open()
        value, _ = self._call("read_file", guest_path, max_bytes)
        return bytes(value)

    def list_files(self, guest_path: str = "/tmp", *, limit: int = 10_000) -> list[GuestFile]:
        """The entries of a folder under /tmp or a mount, as ``memex.Sandbox.list_files``."""
        self._check_open()
        value, _ = self._call("list_files", guest_path, limit)
        return [GuestFile(name=str(n), path=str(p), kind=str(k), size=int(z))
                for n, p, k, z in value]

    def write_file(self, guest_path: str, data: bytes) -> None:
        """Place a file where the guest can read it (under /tmp or a writable mount)."""
        self._check_open()
        self._call("write_file", guest_path, bytes(memoryview(data)))

    # ---- lifecycle (close, the context manager, __del__: SandboxHandle) ---------------------
    def _shutdown(self, reason: str) -> None:
        """Close the sandbox (its worker tears it down, interrupting a running turn, without
        the caller waiting)."""
        with self._state:
            if self._closed_reason is not None:
                return
            self._closed_reason = reason
        if self._lost is None and self._worker.alive:
            # Not awaited: the worker tears the sandbox down (interrupting a running turn)
            # while the caller goes on; later requests about it find it gone.
            self._worker.send("close", self.sid)
        self._release()

    def _release(self) -> None:
        """Give back everything this handle holds in the caller (once)."""
        with self._state:
            cp, self._resume_cp = self._resume_cp, None
            stash, self._stash = self._stash, None
            server, self._door_server = self._door_server, None
        if cp is not None:
            cp.close()
        if server is not None:
            server.close()
        if stash is not None:
            remove_tree(str(stash))
        self._backend._unregister(self)

    def __repr__(self) -> str:
        state = self._closed_reason or f"open in worker {self._worker.pid}"
        return f"<ProcessSandbox turns={self.turns} {state}>"


class SubprocessBackend(Backend):
    """Sandboxes in ``workers`` worker processes (placed on the least loaded), host tools in
    this process.

    Args:
        workers: worker processes to spread sandboxes over (started on demand).
        resume: ship each turn's state to the caller so that a dead worker's sessions resume
            in another worker (see the module docstring); False raises SandboxLost instead.
        max_resumes: resumes in a row (without a good turn between) before giving up.
        grace: seconds past a turn's deadline before a silent worker is presumed stuck and
            killed (its sandboxes are then resumed or lost).
        op_timeout: the same bound for everything else (open, checkpoint, files).
        worker_env: extra environment variables for the worker processes.
    """

    name = "subprocess"

    def __init__(self, *, workers: int = 1, resume: bool = True, max_resumes: int = 3,
                 grace: float = 10.0, op_timeout: float = 120.0,
                 worker_env: Mapping[str, str] | None = None) -> None:
        if not isinstance(workers, int) or workers < 1:
            raise ConfigError(f"workers must be an int >= 1, got {workers!r}")
        if max_resumes < 0 or not grace > 0 or not op_timeout > 0:
            raise ConfigError("max_resumes must be >= 0, grace and op_timeout > 0")
        self.workers = workers
        self.resume = resume
        self.max_resumes = max_resumes
        self.grace = grace
        self.op_timeout = op_timeout
        self._worker_env = dict(worker_env or {})
        self._lock = threading.RLock()
        self._spawn_lock = threading.Lock()
        self._workers: list[WorkerClient] = []
        self._handles: weakref.WeakValueDictionary[int, ProcessSandbox] = (
            weakref.WeakValueDictionary())
        self._ids = itertools.count(1)
        self._closed = False
        self._stash_root: Path | None = None
        _sweep_stale_dirs()
        _BACKENDS.add(self)

    def _stash_dir(self) -> Path:
        """Where a dead worker's sandboxes keep their /tmp files until they resume."""
        with self._lock:
            if self._stash_root is None:
                self._stash_root = Path(tempfile.mkdtemp(prefix=f"memex-stash-{os.getpid()}-"))
            return self._stash_root

    # ---- workers ----------------------------------------------------------------------------
    def _spawn(self) -> WorkerClient:
        return WorkerClient(on_checkpoint=self._on_checkpoint, on_death=self._on_death,
                            env=self._worker_env)

    def _usable(self, w: WorkerClient) -> bool:
        return w.alive and not w.closing and not w.retiring

    def _pick_worker(self) -> WorkerClient:
        """The least loaded usable worker, starting one while fewer than ``workers`` run."""
        with self._spawn_lock:
            if self._closed:
                raise SandboxClosed("the backend was closed")
            with self._lock:
                usable = [w for w in self._workers if self._usable(w)]
            if len(usable) < self.workers:
                w = self._spawn()
                with self._lock:
                    self._workers.append(w)
                    if self._closed:
                        w.closing = True
                if w.closing:
                    w.close()
                    raise SandboxClosed("the backend was closed")
                return w
        with self._lock:
            return min(usable, key=lambda w: len(w.live))

    def _on_checkpoint(self, sid: int, gen: int, cp: ProcessCheckpoint) -> None:
        h = self._handles.get(sid)
        if h is None:
            cp.close()
        else:
            h._offer_resume(gen, cp)

    def _on_death(self, worker: WorkerClient) -> None:
        with self._lock:
            if worker in self._workers:
                self._workers.remove(worker)
            sids = list(worker.live)
        if worker.closing:
            return
        for sid in sids:
            h = self._handles.get(sid)
            if h is not None and worker.death is not None:
                h._worker_lost(worker.death)

    # ---- handles --------------------------------------------------------------------
    def _new_sid(self) -> int:
        return next(self._ids)

    def _register(self, h: ProcessSandbox, worker: WorkerClient) -> None:
        with self._lock:
            self._handles[h.sid] = h
            worker.live.add(h.sid)
            h._registered = True

    def _unregister(self, h: ProcessSandbox) -> None:
        with self._lock:
            if not h._registered:
                return
            h._registered = False
            if self._handles.get(h.sid) is h:
                del self._handles[h.sid]
            h._worker.live.discard(h.sid)
        self._released(h)

    # ---- hooks for the pool -------------------------------------------------------------------
    def _before_turn(self, h: ProcessSandbox) -> None:
        """Called before each turn (the pool's turns-per-second quota)."""

    def _admit(self, h: ProcessSandbox) -> None:
        """Called before a fork is made (the pool counts it against the tenant's quotas)."""

    def _released(self, h: ProcessSandbox) -> None:
        """Called once when a handle is closed or lost (the pool frees its slot)."""

    # ---- the contract ---------------------------------------------------------------------------
    def open(self, *, limits: Limits | None = None, mounts: Sequence[Mount] = (),
             preload: Iterable[str] = (), door: Door | None = None,
             env: dict[str, str] | None = None, tenant: str | None = None,
             packages: Sequence[str] = ()) -> ProcessSandbox:
        limits, spec = self._spec(limits, mounts, preload, env, packages)
        return self._open_in(self._pick_worker(), limits, spec, door or Door(), tenant)

    @staticmethod
    def _spec(limits: Limits | None, mounts: Sequence[Mount], preload: Iterable[str],
              env: dict[str, str] | None, packages: Sequence[str] = ()
              ) -> tuple[Limits, dict[str, Any]]:
        limits = limits if limits is not None else Limits()
        if not isinstance(limits, Limits):
            raise ConfigError(f"limits takes a Limits, got {type(limits).__name__}")
        for m in mounts:
            if not isinstance(m, Mount):
                raise ConfigError(f"mounts takes Mount objects, got {type(m).__name__}")
        pre = list(preload)
        for name in pre:
            if not isinstance(name, str) or not all(p.isidentifier() for p in name.split(".")):
                raise ConfigError(f"preload entries are module names, got {name!r}")
        # resolved here (a PackageError in the caller's process), pinned for the worker
        pins = list(resolve_packages(list(packages), max_bytes=limits.disk_bytes).locked) \
            if packages else []
        return limits, {"limits": limits_to_wire(limits), "mounts": mounts_to_wire(mounts),
                        "preload": pre, "env": dict(env) if env is not None else None,
                        "packages": pins}

    def _open_in(self, worker: WorkerClient, limits: Limits, spec: dict[str, Any], door: Door,
                 tenant: str | None) -> ProcessSandbox:
        for attempt in (0, 1):
            h = ProcessSandbox(self, worker, self._new_sid(), door=door, limits=limits,
                               spec=spec, tenant=tenant)
            self._register(h, worker)
            try:
                value = h._open_on(worker, dict(h._spec, resume=self.resume))
            except WorkerDied as died:
                h._closed_reason = "never opened"
                h._release()
                if attempt:
                    raise GuestStartError(f"the worker died while opening a sandbox: "
                                          f"{died.reason}") from None
                worker = self._pick_worker()
                continue
            except BaseException:
                h._closed_reason = "never opened"
                h._release()
                raise
            h._scratch = str(value["scratch"])
            worker.created += 1
            return h
        raise AssertionError("unreachable")

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        with self._spawn_lock, self._lock:
            if self._closed:
                return
            self._closed = True
            handles = list(self._handles.values())
            workers = list(self._workers)
            for w in workers:
                w.closing = True
        for h in handles:
            with h._state:
                h._closed_reason = h._closed_reason or "the backend was closed"
            h._release()
        for w in workers:
            w.close()
        if self._stash_root is not None:
            remove_tree(str(self._stash_root))

    def worker_pids(self) -> list[int]:
        """Pids of the live worker processes."""
        with self._lock:
            return [w.pid for w in self._workers if w.alive]

    def __repr__(self) -> str:
        return (f"<{type(self).__name__} workers={len(self._workers)} "
                f"live={len(self._handles)}{' closed' if self._closed else ''}>")


def _sweep_stale_dirs() -> None:
    """Remove scratch roots left by callers that were killed (their pid is gone)."""
    base = Path(tempfile.gettempdir())
    for prefix in ("memex-worker-", "memex-stash-"):
        for d in base.glob(prefix + "*"):
            pid = d.name[len(prefix):].split("-", 1)[0]
            if not pid.isdigit() or int(pid) == os.getpid():
                continue
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                remove_tree(str(d))
            except OSError:
                pass


@atexit.register
def _close_all() -> None:
    for b in list(_BACKENDS):
        with contextlib.suppress(Exception):
            b.close()
