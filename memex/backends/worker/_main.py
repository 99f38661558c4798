"""The worker process of the subprocess and pool backends: it holds sandboxes for one caller
and serves them over a Unix socket (``_wire``). Each sandbox also gets a socket of its
own for its door: every door frame goes back to the caller, whose real
:class:`~memex.runtime_wasm.Door` (and host tools) answers it.

Started by the worker client as ``python -P -m memex.backends.worker FD PARENT_PID`` (the
backends layer imports only the runtime, so a worker loads nothing of the agent). Messages,
caller to worker (``rid`` numbers a request, ``sid`` a sandbox)::

    ["open", rid, sid, spec] (+ door socket, + image fd when resuming)
    ["run", rid, sid, code, timeout, filename, gen, stream]
    ["checkpoint", rid, sid]            ["restore", rid, sid, meta] (+ image fd)
    ["fork", rid, sid, child_sid, resume] (+ the child's door socket)
    ["read_file", rid, sid, path]       ["write_file", rid, sid, path, data]
    ["list_files", rid, sid, path, limit]
    ["close", rid | None, sid]          ["stats", rid]              ["exit"]

and worker to caller: ``["hello", pid]``, ``["started", rid]`` (a turn begins),
``["out", rid, stream, text]`` (what a turn run with ``stream`` writes, as it writes it),
``["ok", rid, value]`` (+ fd for a checkpoint),
``["err", rid, [class, message, reason]]`` and, for sandboxes opened with ``resume``,
``["ckpt", sid, gen, meta]`` + fd after every turn that changed the guest state (the state
the caller resumes from if this process dies). On a door socket the worker sends
``["door", seq, deadline, frame]`` and the caller answers ``["door_reply", seq, "ok", frame]``
or ``["door_reply", seq, "killed", limit, detail]`` (the handler outlived the turn).

Turns, checkpoints and forks of one sandbox run in order on its own thread; file operations
and close run beside them (as on an in-process sandbox, close interrupts a running turn).
The worker exits when the caller's end of the socket closes, when the caller dies
(PR_SET_PDEATHSIG, and a parent-pid watchdog), or on ``exit``; it then removes its scratch
root (``MEMEX_WORKER_ROOT``), where every sandbox's /tmp lives.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import resource
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ...errors import MemexError, SandboxClosed
from ...runtime_wasm import Door, GuestKilled, Sandbox
from ...runtime_wasm.internal import (
    GUEST_NICE_ENV,
    checkpoint_from_fds,
    checkpoint_to_fds,
    open_from_checkpoint,
    remove_tree,
    scratch_dir,
    set_guest_nice,
)
from ._wire import (
    Channel,
    ChannelClosed,
    ProtocolError,
    error_to_wire,
    limits_from_wire,
    mounts_from_wire,
    result_to_wire,
)

__all__ = ["main"]

DOOR_GRACE = 5.0
"""Seconds past a turn's deadline a forwarded door call waits for the caller's answer (the
caller answers by the deadline itself; this only covers a caller that stopped answering)."""

_PR_SET_PDEATHSIG = 1


class _ForwardDoor(Door):
    """The door of a worker's sandbox: every frame goes, over the sandbox's own socket, to
    the caller, whose door answers it (``_client.DoorServer``). One call at a time (a
    guest makes one at a time); replies are matched by sequence number, so the late answer
    to a call abandoned at its deadline is skipped."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self._chan = Channel(sock)
        self._lock = threading.Lock()
        self._seq = 0

    def dispatch(self, frame: bytes, deadline: float = float("inf")) -> bytes:
        finite = deadline != float("inf")
        with self._lock:
            self._seq += 1
            seq = self._seq
            try:
                self._chan.send(["door", seq, deadline if finite else None, bytes(frame)])
                while True:
                    bound = max(0.0, deadline - time.monotonic()) + DOOR_GRACE if finite else None
                    msg, fds = self._chan.recv(timeout=bound)
                    for fd in fds:
                        os.close(fd)
                    if len(msg) >= 3 and msg[1] == seq:
                        break
            except TimeoutError:
                raise GuestKilled("deadline", "the caller did not answer a door call by the "
                                  "turn's deadline") from None
            except (ChannelClosed, ProtocolError):
                raise GuestKilled("cancelled", "the caller's door is gone") from None
        if msg[2] == "ok" and len(msg) >= 4 and isinstance(msg[3], bytes):
            return msg[3]
        if msg[2] == "killed" and len(msg) >= 5:
            raise GuestKilled(str(msg[3]), str(msg[4]))
        raise GuestKilled("trap", f"malformed door reply from the caller: {msg[:3]!r}")

    def close(self) -> None:
        self._chan.close()


class _Session:
    """One sandbox and the thread that runs its turns, checkpoints and forks in order."""

    def __init__(self, worker: Worker, sid: int) -> None:
        self.worker = worker
        self.sid = sid
        self.sb: Sandbox | None = None
        self.door: _ForwardDoor | None = None
        self.spec: dict[str, Any] = {}
        self.resume = False
        self.closing = False
        self.q: queue.SimpleQueue[tuple[list[Any], list[int]] | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name=f"memex-session-{sid}",
                                       daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            item = self.q.get()
            if item is None:
                return
            msg, fds = item
            self.worker.handle(self, msg, fds)

    def close(self) -> None:
        self.closing = True
        sb = self.sb
        if sb is not None:
            sb.close()
        if self.door is not None:
            self.door.close()
        self.q.put(None)


class Worker:
    def __init__(self, chan: Channel) -> None:
        self.chan = chan
        self.sessions: dict[int, _Session] = {}
        self._lock = threading.Lock()
        self._side = ThreadPoolExecutor(max_workers=8, thread_name_prefix="memex-worker-side")

    # ---- replies ----------------------------------------------------------------------------
    def _streamer(self, rid: object) -> Callable[[str, str], None]:
        """Output as the guest writes it, to the caller (on the sandbox's thread)."""
        def out(stream: str, text: str) -> None:
            with contextlib.suppress(ChannelClosed):
                self.chan.send(["out", rid, stream, text])
        return out

    def _ok(self, rid: object, value: object = None, fds: tuple[int, ...] = ()) -> None:
        if rid is not None:
            with contextlib.suppress(ChannelClosed):
                self.chan.send(["ok", rid, value], fds)

    def _err(self, rid: object, exc: BaseException) -> None:
        if not isinstance(exc, MemexError):
            traceback.print_exception(exc, file=sys.stderr)
        if rid is not None:
            with contextlib.suppress(ChannelClosed):
                self.chan.send(["err", rid, error_to_wire(exc)])

    def _ship(self, sid: int, gen: int, sb: Sandbox) -> None:
        """Send the caller the guest state it would resume from (memfds: no copy)."""
        try:
            fds, meta = checkpoint_to_fds(sb.checkpoint())
        except MemexError:
            return  # closed meanwhile: nothing to resume
        try:
            self.chan.send(["ckpt", sid, gen, meta], tuple(fds))
        except ChannelClosed:
            pass
        finally:
            for fd in fds:
                os.close(fd)

    # ---- session work (on the session's thread) ---------------------------------------------
    def handle(self, s: _Session, msg: list[Any], fds: list[int]) -> None:
        kind, rid = msg[0], msg[1]
        try:
            if kind == "open":
                self._open(s, rid, msg[3], fds)
                return
            sb = s.sb
            if sb is None or s.closing:
                raise SandboxClosed("closed")
            if kind == "run":
                code, timeout, filename, gen = msg[3:7]
                with contextlib.suppress(ChannelClosed):
                    self.chan.send(["started", rid])  # past this, the turn may have effects
                listener = self._streamer(rid) if len(msg) > 7 and msg[7] else None
                r = sb.run(code, timeout=timeout, filename=filename, on_output=listener)
                self._ok(rid, [result_to_wire(r), sb.turns])
                if s.resume and (r.trap is None or not r.rolled_back) and not sb.closed:
                    self._ship(s.sid, gen, sb)
            elif kind == "checkpoint":
                out, meta = checkpoint_to_fds(sb.checkpoint())
                try:
                    self._ok(rid, meta, tuple(out))
                finally:
                    for fd in out:
                        os.close(fd)
            elif kind == "restore":
                if not fds:
                    raise ProtocolError("restore needs the image's fds")
                image, fds[:] = list(fds), []
                sb.restore(checkpoint_from_fds(image, msg[3]))
                self._ok(rid)
            elif kind == "fork":
                child_sid, resume = int(msg[3]), bool(msg[4])
                if len(fds) != 1:
                    raise ProtocolError("fork needs the child's door socket")
                cs = _Session(self, child_sid)
                cs.door = _ForwardDoor(socket.socket(fileno=fds.pop()))
                cs.spec, cs.resume = s.spec, resume
                try:
                    child = sb.fork(door=cs.door)  # /tmp shared copy-on-write, one quota
                except BaseException:
                    cs.close()
                    raise
                cs.sb = child
                with self._lock:
                    self.sessions[child_sid] = cs
                self._ok(rid, {"scratch": str(scratch_dir(child))})
                if resume:
                    self._ship(child_sid, 0, child)
            else:
                raise ProtocolError(f"unknown request {kind!r}")
        except BaseException as exc:
            self._err(rid, exc)
        finally:
            for fd in fds:
                os.close(fd)

    def _open(self, s: _Session, rid: object, spec: dict[str, Any], fds: list[int]) -> None:
        resumed = bool(spec.get("image"))
        if len(fds) < 1 + resumed or (len(fds) > 1 and not resumed):
            raise ProtocolError("open needs the door socket (and the image when resuming)")
        s.door = _ForwardDoor(socket.socket(fileno=fds.pop(0)))
        image, fds[:] = list(fds), []
        cp = checkpoint_from_fds(image, spec["image"]) if resumed else None
        scratch = spec.get("scratch_from")
        sb = open_from_checkpoint(
            cp, limits=limits_from_wire(spec["limits"]), mounts=mounts_from_wire(spec["mounts"]),
            preload=list(spec.get("preload") or ()), door=s.door, env=spec.get("env"),
            scratch_from=Path(scratch) if scratch else None,
            packages=list(spec.get("packages") or ()))
        del cp
        s.sb, s.spec, s.resume = sb, spec, bool(spec.get("resume"))
        if s.closing:
            sb.close()
            raise SandboxClosed("closed")
        self._ok(rid, {"scratch": str(scratch_dir(sb))})
        if s.resume and not resumed:
            self._ship(s.sid, int(spec.get("gen", 0)), sb)

    # ---- side work (beside a running turn) --------------------------------------------------
    def _side_op(self, msg: list[Any]) -> None:
        kind, rid = msg[0], msg[1]
        try:
            if kind == "stats":
                self._ok(rid, {"rss": _rss(), "sandboxes": len(self.sessions)})
                return
            sid = msg[2]
            with self._lock:
                s = self.sessions.get(sid)
                if kind == "close" and s is not None:
                    del self.sessions[sid]
            if kind == "close":
                if s is not None:
                    s.close()
                self._ok(rid)
                return
            if s is None or s.sb is None or s.closing:
                raise SandboxClosed("closed")
            if kind == "read_file":
                most = msg[4] if len(msg) > 4 and isinstance(msg[4], int) else None
                self._ok(rid, s.sb.read_file(msg[3], max_bytes=most))
            elif kind == "write_file":
                s.sb.write_file(msg[3], msg[4])
                self._ok(rid)
            elif kind == "list_files":
                found = s.sb.list_files(msg[3], limit=int(msg[4]))
                self._ok(rid, [[f.name, f.path, f.kind, f.size] for f in found])
            else:
                raise ProtocolError(f"unknown request {kind!r}")
        except BaseException as exc:
            self._err(rid, exc)

    # ---- the reader -------------------------------------------------------------------------
    def route(self, msg: list[Any], fds: list[int]) -> bool:
        """Hand one message to whoever handles it; False for ``exit``."""
        kind = msg[0]
        if kind == "open":
            s = _Session(self, int(msg[2]))
            with self._lock:
                self.sessions[s.sid] = s
            s.q.put((msg, fds))
            return True
        elif kind in ("run", "checkpoint", "restore", "fork"):
            with self._lock:
                found = self.sessions.get(msg[2])
            if found is None:
                for fd in fds:
                    os.close(fd)
                self._err(msg[1], SandboxClosed("closed"))
            else:
                found.q.put((msg, fds))
            return True
        elif kind in ("read_file", "write_file", "list_files", "close", "stats"):
            self._side.submit(self._side_op, msg)
        elif kind == "exit":
            return False
        else:
            self._err(msg[1] if len(msg) > 1 else None,
                      ProtocolError(f"unknown message {kind!r}"))
        for fd in fds:
            os.close(fd)
        return True

    def serve(self) -> None:
        try:
            self.chan.send(["hello", os.getpid()])
            while True:
                msg, fds = self.chan.recv()
                if not self.route(msg, fds):
                    break
        except (ChannelClosed, ProtocolError):
            pass
        with self._lock:
            sessions = list(self.sessions.values())
            self.sessions.clear()
        for s in sessions:
            with contextlib.suppress(Exception):
                s.close()


def _rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def _cleanup_and_exit(code: int = 0) -> None:
    root = os.environ.get("MEMEX_WORKER_ROOT")
    if root:
        remove_tree(str(root))
    os._exit(code)


def _die_with_parent(parent: int) -> None:
    """No orphans: SIGTERM when the parent dies (PR_SET_PDEATHSIG), and a watchdog thread for
    the case the signal cannot be delivered to a busy main thread."""
    signal.signal(signal.SIGTERM, lambda *_: _cleanup_and_exit(0))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the caller's to handle
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:
        _cleanup_and_exit(0)

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                _cleanup_and_exit(0)

    threading.Thread(target=watch, name="memex-parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    fd, parent = int(args[0]), int(args[1])
    _die_with_parent(parent)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # an abort leaves no core file
    set_guest_nice(int(os.environ.get(GUEST_NICE_ENV) or 0))  # its caller's (_client)
    sock = socket.socket(fileno=fd)
    Worker(Channel(sock)).serve()
    _cleanup_and_exit(0)
