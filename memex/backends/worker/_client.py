"""The caller's side of one worker process: start it, send requests and wait for answers with
a bound, answer its door frames with the caller's doors, and notice its death at once.

A worker's death (SIGKILL, an abort in the engine, the OOM killer) closes its end of the
socket, so the reader thread sees the end of stream immediately; it reaps the process, names
the cause (signal or exit status, and the tail of the worker's output), tells the backend
(``on_death``) and fails every waiting request with :class:`WorkerDied`. A worker that stops
answering is killed when a request's bound passes, which ends the same way: a caller never
waits forever.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ...errors import ConfigError, GuestStartError
from ...runtime_wasm import Door, GuestKilled
from ...runtime_wasm.internal import (
    GUEST_NICE_ENV,
    checkpoint_from_bytes,
    checkpoint_from_fds,
    checkpoint_to_bytes,
    checkpoint_to_fds,
    guest_nice,
    remove_tree,
)
from ._wire import Channel, ChannelClosed, ProtocolError, error_from_wire

__all__ = ["DoorServer", "ProcessCheckpoint", "WorkerClient", "WorkerDied", "door_socketpair"]

T = TypeVar("T")

# -P: the caller's working directory is not put on the worker's sys.path (nothing there can
# shadow memex or what it imports).
_COMMAND = (sys.executable, "-P", "-m", "memex.backends.worker")
_NO_DOOR = Door()


class WorkerDied(Exception):
    """The worker process is gone; ``reason`` says how (signal, exit status, output tail).
    ``started`` tells whether a turn had begun (a worker dying between a turn's arrival and
    its start, or before the request arrived, did nothing: the turn may run elsewhere)."""

    def __init__(self, reason: str, *, started: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.started = started


class ProcessCheckpoint:
    """A checkpoint of a subprocess or pool sandbox, held by the caller as memfds (the image
    chain: its root and the deltas on it): it outlives the worker that took it and restores
    into a sandbox of any worker on this machine (with the same mounts and engine).
    ``close()`` frees it early; otherwise it is freed with the object."""

    __slots__ = ("__weakref__", "_fds", "_meta", "size", "turns")

    def __init__(self, fds: Sequence[int], meta: dict[str, Any]) -> None:
        self._fds = list(fds)
        self._meta = meta
        self.size = int(meta.get("size", 0))
        self.turns = int(meta.get("turns", 0))

    @property
    def closed(self) -> bool:
        return not self._fds

    def fds(self) -> list[int]:
        """The descriptors to send with the image's description (still owned by this)."""
        if not self._fds:
            raise ConfigError("this checkpoint was closed")
        return list(self._fds)

    def dup(self) -> ProcessCheckpoint:
        fds: list[int] = []
        try:
            for fd in self.fds():
                fds.append(os.dup(fd))
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return ProcessCheckpoint(fds, dict(self._meta))

    def close(self) -> None:
        fds, self._fds = self._fds, []
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)

    def to_bytes(self) -> bytes:
        """The guest state as one self-describing blob (``checkpoint_to_bytes``: all-zero
        chunks skipped), to keep on disk or move to another machine."""
        copy = self.dup()  # handed over whole: checkpoint_from_fds owns the copies
        fds, copy._fds = copy._fds, []
        return checkpoint_to_bytes(checkpoint_from_fds(fds, copy._meta))

    @classmethod
    def from_bytes(cls, blob: bytes | bytearray | memoryview, *,
                   max_memory: int | None = None) -> ProcessCheckpoint:
        """A checkpoint from :meth:`to_bytes`; a corrupt blob, or one whose memory would pass
        ``max_memory`` (default: the wasm32 bound), raises ImageError before it inflates."""
        cp = (checkpoint_from_bytes(blob) if max_memory is None
              else checkpoint_from_bytes(blob, max_memory=max_memory))
        fds, meta = checkpoint_to_fds(cp)
        return cls(fds, meta)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def __repr__(self) -> str:
        return f"<ProcessCheckpoint turns={self.turns} size={self.size}>"


class DoorServer:
    """Serves one sandbox's door socket in the caller: a thread that answers each forwarded
    frame with ``door.dispatch`` (so handlers run here, marked as serving this door for the
    re-entrancy guard) until the socket closes. A handler still running at the turn's deadline
    answers ``killed``, which traps the turn in the worker, as in-process."""

    def __init__(self, sock: socket.socket, door: Door | None) -> None:
        self._chan = Channel(sock)
        self.door = door  # None answers unknown_op (a pooled sandbox not handed out yet)
        self._thread = threading.Thread(target=self._serve, name="memex-door-serve",
                                        daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                msg, fds = self._chan.recv()
            except (ChannelClosed, ProtocolError):
                break
            for fd in fds:
                os.close(fd)
            if len(msg) < 4 or msg[0] != "door" or not isinstance(msg[3], bytes):
                break  # not our protocol: stop serving (the worker's call then fails)
            _, seq, deadline, frame = msg[:4]
            try:
                reply = (self.door or _NO_DOOR).dispatch(
                    frame, float("inf") if deadline is None else float(deadline))
                out: list[Any] = ["door_reply", seq, "ok", reply]
            except GuestKilled as k:
                out = ["door_reply", seq, "killed", k.limit, k.detail]
            except Exception as exc:
                out = ["door_reply", seq, "killed", "trap", f"the door failed: {exc}"]
            try:
                self._chan.send(out)
            except ChannelClosed:
                break
        self._chan.close()

    def close(self) -> None:
        """Stop serving (the worker's pending call, if any, fails). Idempotent."""
        self._chan.close()


class _Spawner:
    """Forks every worker from one long-lived thread: PR_SET_PDEATHSIG fires when the *thread*
    that forked a child ends, so a worker started from a short-lived thread would die with
    it."""

    def __init__(self) -> None:
        self._q: queue.SimpleQueue[tuple[Callable[[], Any], list[Any], threading.Event]] = (
            queue.SimpleQueue())
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def call(self, fn: Callable[[], T]) -> T:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="memex-spawner",
                                                daemon=True)
                self._thread.start()
        box: list[Any] = []
        done = threading.Event()
        self._q.put((fn, box, done))
        done.wait()
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]  # type: ignore[no-any-return]

    def _loop(self) -> None:
        while True:
            fn, box, done = self._q.get()
            try:
                box.append(fn())
            except BaseException as exc:
                box.append(exc)
            done.set()
            del fn, box, done


_SPAWNER = _Spawner()


class _Slot:
    """A one-shot hand-off from the reader thread to a waiting thread, through a lock (one
    wake-up, cheaper than an Event's condition variable)."""

    __slots__ = ("_lock", "started", "value")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self.value: tuple[list[Any], list[int]] | None = None
        self.started = False

    def set(self, value: tuple[list[Any], list[int]]) -> None:
        if self.value is None:
            self.value = value
            with contextlib.suppress(RuntimeError):  # a second answer (reply vs death)
                self._lock.release()

    def wait(self, timeout: float | None = None) -> bool:
        if self.value is not None:
            return True
        return self._lock.acquire(timeout=-1 if timeout is None else max(timeout, 0.0))


def door_socketpair(door: Door) -> tuple[DoorServer, socket.socket]:
    """A door server for ``door`` and the socket end to pass to the worker (close it after
    sending)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    return DoorServer(ours, door), theirs


class WorkerClient:
    """One worker process. ``on_checkpoint(sid, gen, checkpoint)`` receives resume images;
    ``on_death(client)`` runs on the reader thread once the process is gone, before waiting
    requests fail."""

    def __init__(self, *, on_checkpoint: Callable[[int, int, ProcessCheckpoint], None],
                 on_death: Callable[[WorkerClient], None], start_timeout: float = 120.0,
                 env: Mapping[str, str] | None = None) -> None:
        self._on_checkpoint = on_checkpoint
        self._on_death = on_death
        self.root = Path(tempfile.mkdtemp(prefix=f"memex-worker-{os.getpid()}-"))
        self.closing = False
        self.retiring = False  # the pool places nothing new here; closed once empty
        self.created = 0  # sandboxes made in this worker (the pool recycles on it)
        self.live: set[int] = set()  # sids of sandboxes placed here (kept by the backend)
        self._dead: str | None = None
        self._kill_reason: str | None = None
        self._lock = threading.Lock()
        self._pending: dict[int, _Slot] = {}
        self._listeners: dict[int, Callable[[str, str], None]] = {}
        self._ids = itertools.count(1)
        self._hello = threading.Event()
        self._gone = threading.Event()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        penv = dict(os.environ)
        penv.update(env or {})
        penv.update(MEMEX_WORKER_ROOT=str(self.root), TMPDIR=str(self.root))
        penv[GUEST_NICE_ENV] = str(guest_nice())  # its guests at this process's priority
        try:
            with open(self.root / "worker.log", "wb") as log:
                self.proc = _SPAWNER.call(lambda: subprocess.Popen(
                    [*_COMMAND, str(theirs.fileno()), str(os.getpid())],
                    pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=log,
                    stderr=log, env=penv, close_fds=True))
        except BaseException:
            ours.close()
            remove_tree(str(self.root))
            raise
        finally:
            theirs.close()
        self.pid = self.proc.pid
        self.chan = Channel(ours)
        self._reader = threading.Thread(target=self._read, name=f"memex-worker-{self.pid}",
                                        daemon=True)
        self._reader.start()
        if not self._hello.wait(start_timeout) or self._dead is not None:
            self.kill("did not start in time")
            self._gone.wait(5)
            raise GuestStartError(f"a worker process could not start: {self._dead}")

    # ---- state ----------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self._dead is None

    @property
    def death(self) -> str | None:
        return self._dead

    def rss(self) -> int:
        """Resident memory of the worker process (bytes; 0 once it is gone)."""
        try:
            with open(f"/proc/{self.pid}/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            return 0

    # ---- requests -------------------------------------------------------------------------
    def request(self, kind: str, *args: Any, fds: Sequence[int] = (),
                timeout: float | None = None,
                on_output: Callable[[str, str], None] | None = None) -> tuple[Any, list[int]]:
        """Send one request and wait for its answer: the value (and fds), the worker's MemEx
        exception re-raised, or WorkerDied. Past ``timeout`` the worker is presumed stuck
        and killed. ``on_output(stream, text)`` hears the ``out`` messages of this request
        (on the reader thread: keep it quick)."""
        rid = next(self._ids)
        slot = _Slot()
        with self._lock:
            if self._dead is not None:
                raise WorkerDied(self._dead)
            self._pending[rid] = slot
            if on_output is not None:
                self._listeners[rid] = on_output
        try:
            try:
                self.chan.send([kind, rid, *args], fds)
            except ChannelClosed:
                self._gone.wait(5)
                raise WorkerDied(self._dead or "the worker's socket closed") from None
            if not slot.wait(timeout):
                self.kill(f"no answer to {kind!r} within {timeout:.3g}s")
                slot.wait(10)
                if slot.value is None:
                    raise WorkerDied(self._dead or "the worker stopped answering",
                                     started=slot.started)
        finally:
            with self._lock:
                self._pending.pop(rid, None)
                self._listeners.pop(rid, None)
        assert slot.value is not None
        msg, rfds = slot.value
        if msg[0] == "ok":
            return msg[2], rfds
        for fd in rfds:
            os.close(fd)
        if msg[0] == "err":
            raise error_from_wire(msg[2])
        raise WorkerDied(str(msg[2]), started=slot.started)

    def send(self, kind: str, *args: Any) -> None:
        """Fire and forget (no answer is awaited); a dead worker is ignored."""
        with contextlib.suppress(ChannelClosed):
            self.chan.send([kind, None, *args])

    # ---- the reader -----------------------------------------------------------------------
    def _read(self) -> None:
        try:
            while True:
                msg, fds = self.chan.recv()
                kind = msg[0]
                if kind in ("ok", "err"):
                    with self._lock:
                        slot = self._pending.get(msg[1])
                    if slot is None:
                        for fd in fds:
                            os.close(fd)
                    else:
                        slot.set((msg, fds))
                elif kind == "ckpt" and fds:
                    self._on_checkpoint(int(msg[1]), int(msg[2]),
                                        ProcessCheckpoint(fds, dict(msg[3])))
                elif kind == "out":
                    with self._lock:
                        listener = self._listeners.get(msg[1])
                    if listener is not None:
                        with contextlib.suppress(Exception):  # a listener's bug is its own
                            listener(str(msg[2]), str(msg[3]))
                elif kind == "started":
                    with self._lock:
                        slot = self._pending.get(msg[1])
                    if slot is not None:
                        slot.started = True
                elif kind == "hello":
                    self._hello.set()
                else:
                    for fd in fds:
                        os.close(fd)
        except (ChannelClosed, ProtocolError) as exc:
            cause = exc
        except Exception as exc:  # a bug on this side: still never leave callers waiting
            cause = ProtocolError(f"{type(exc).__name__}: {exc}")
        self._died(cause)

    def _died(self, cause: BaseException) -> None:
        reason = self._reap(cause)
        with self._lock:
            self._dead = reason
            pending = list(self._pending.values())
        try:
            self._on_death(self)
        finally:
            for slot in pending:
                slot.set((["died", None, reason], []))
            self._hello.set()
            self.chan.close()
            remove_tree(str(self.root))
            self._gone.set()

    def _reap(self, cause: BaseException) -> str:
        try:
            code = self.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:  # socket gone but process alive: end it
            with contextlib.suppress(OSError):
                self.proc.kill()
            code = self.proc.wait()
        if code < 0:
            try:
                how = f"killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"killed by signal {-code}"
        else:
            how = f"exited with status {code}"
        if self._kill_reason is not None:
            how = f"{how} ({self._kill_reason})"
        elif isinstance(cause, ProtocolError):
            how = f"{how} (protocol error: {cause})"
        tail = ""
        with contextlib.suppress(OSError), open(self.root / "worker.log", "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 600))
            tail = f.read().decode("utf-8", "replace").strip()
        return f"worker process {self.pid} {how}" + (f"; its last output: {tail}" if tail
                                                    else "")

    # ---- ending ---------------------------------------------------------------------------
    def kill(self, reason: str) -> None:
        if self._kill_reason is None:
            self._kill_reason = reason
        with contextlib.suppress(OSError):
            self.proc.kill()

    def close(self, timeout: float = 5.0) -> None:
        """Ask the worker to exit (its sandboxes close with it); kill it past ``timeout``.
        Idempotent."""
        self.closing = True
        if self._dead is None:
            with contextlib.suppress(ChannelClosed):
                self.chan.send(["exit"])
            if not self._gone.wait(timeout):
                self.kill("did not exit when asked")
        self._gone.wait(timeout + 5)
        remove_tree(str(self.root))
