"""The wire between a caller and a worker process: length-prefixed msgpack frames on a Unix
stream socket, with file descriptors (checkpoint memfds) passed alongside as SCM_RIGHTS.

A frame is ``!IH`` (body length, number of fds) then a msgpack body: an array whose first
item is the message kind (see ``_main`` for the vocabulary). Both ends use one
:class:`Channel`; :class:`FrameDecoder` is the pure parser behind it (tested with arbitrary
bytes). Records cross as plain maps: ``TurnResult.to_dict()``, ``Limits`` fields, ``Mount``
fields, and a MemEx exception as ``[class name, message, reason]``, rebuilt as the same class.
"""

from __future__ import annotations

import array
import contextlib
import dataclasses
import os
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import msgpack

from ... import errors
from ...errors import BackendBusy, MemexError, SandboxClosed, SandboxError, SandboxLost
from ...runtime_wasm import GuestException, Limits, Mount, TurnResult, TurnStatus
from ...runtime_wasm.internal import DecodeCost, unpack_bounded

__all__ = [
    "HEADER",
    "MAX_FDS",
    "MAX_FRAME",
    "Channel",
    "ChannelClosed",
    "FrameDecoder",
    "ProtocolError",
    "encode_frame",
    "error_from_wire",
    "error_to_wire",
    "limits_from_wire",
    "limits_to_wire",
    "mounts_from_wire",
    "mounts_to_wire",
    "result_from_wire",
    "result_to_wire",
]

HEADER = struct.Struct("!IH")
MAX_FRAME = 1 << 30  # larger than any door frame (16 MiB) or file a caller would move
MAX_FDS = 16  # a door socket and an image chain (its root and at most 8 deltas)
_RECV = 1 << 18
_COST_FLOOR = 16 << 20  # a frame's decoding budget is at least that of a 16 MiB one
_ANC = socket.CMSG_SPACE(MAX_FDS * 4)


class ProtocolError(Exception):
    """The peer sent bytes that are not a frame of this protocol (a bug or a corrupt peer)."""


class ChannelClosed(Exception):
    """The peer closed the connection (or the process on the other side died)."""


class FrameDecoder:
    """Incremental parser: ``feed`` bytes and received fds, ``next`` gives whole frames."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._fds: deque[int] = deque()

    def feed(self, data: bytes | memoryview, fds: Sequence[int] = ()) -> None:
        self._buf += data
        self._fds.extend(fds)

    def next(self) -> tuple[list[Any], list[int]] | None:
        """The next frame as (message, fds), or None until more bytes arrive."""
        if len(self._buf) < HEADER.size:
            return None
        size, nfds = HEADER.unpack_from(self._buf)
        if size > MAX_FRAME or nfds > MAX_FDS:
            raise ProtocolError(f"frame header out of bounds ({size} bytes, {nfds} fds)")
        end = HEADER.size + size
        if len(self._buf) < end:
            return None
        if len(self._fds) < nfds:
            raise ProtocolError(f"frame announces {nfds} fds, {len(self._fds)} arrived")
        with memoryview(self._buf) as view:  # one copy of the body, not two
            body = bytes(view[HEADER.size:end])
        del self._buf[:end]
        fds = [self._fds.popleft() for _ in range(nfds)]
        try:
            # bounded as every frame from outside the process: a frame's values cost what a
            # real message of its size holds (a guest's door frame travels inside as bytes)
            msg = unpack_bounded(body, DecodeCost.for_bytes(max(size, _COST_FLOOR)))
        except ValueError as exc:
            for fd in fds:
                os.close(fd)
            raise ProtocolError(f"frame body is not msgpack: {exc}") from None
        if not isinstance(msg, list) or not msg or not isinstance(msg[0], str):
            for fd in fds:
                os.close(fd)
            raise ProtocolError("a message must be an array starting with its kind")
        return msg, fds

    def close(self) -> None:
        """Close fds that arrived but belong to no complete frame."""
        while self._fds:
            os.close(self._fds.popleft())


def encode_frame(msg: Sequence[Any], nfds: int = 0) -> bytes:
    body: bytes = msgpack.packb(list(msg), use_bin_type=True)
    return HEADER.pack(len(body), nfds) + body


class Channel:
    """One end of the socket: thread-safe ``send``; ``recv`` from a single reader thread."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._wlock = threading.Lock()
        self._dec = FrameDecoder()
        self._closed = False
        self._rbuf = bytearray(_RECV)  # reused: no large allocation per message
        self._rview = memoryview(self._rbuf)

    def send(self, msg: Sequence[Any], fds: Sequence[int] = ()) -> None:
        """Send one message (fds are duplicated by the kernel; the caller keeps its own)."""
        if len(fds) > MAX_FDS:
            raise ValueError(f"at most {MAX_FDS} fds per frame")
        data = memoryview(encode_frame(msg, len(fds)))
        with self._wlock:
            if self._closed:
                raise ChannelClosed("channel closed")
            try:
                if fds:
                    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
                    sent = self.sock.sendmsg([data], anc)
                    if sent < len(data):
                        self.sock.sendall(data[sent:])
                else:
                    self.sock.sendall(data)
            except OSError as exc:
                raise ChannelClosed(f"send failed: {exc}") from None

    def recv(self, timeout: float | None = None) -> tuple[list[Any], list[int]]:
        """The next message and the fds that came with it; ChannelClosed at end of stream,
        TimeoutError when ``timeout`` seconds pass first (a partial frame is kept)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            frame = self._dec.next()
            if frame is not None:
                return frame
            try:
                if deadline is not None:
                    self.sock.settimeout(max(deadline - time.monotonic(), 1e-6))
                n, anc, flags, _ = self.sock.recvmsg_into([self._rbuf], _ANC)
            except TimeoutError:
                raise
            except OSError as exc:
                raise ChannelClosed(f"receive failed: {exc}") from None
            finally:
                if deadline is not None:
                    with contextlib.suppress(OSError):
                        self.sock.settimeout(None)
            fds: list[int] = []
            for level, kind, cdata in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    arr = array.array("i")
                    arr.frombytes(cdata[: len(cdata) - len(cdata) % arr.itemsize])
                    fds.extend(arr)
            if flags & socket.MSG_CTRUNC:
                for fd in fds:
                    os.close(fd)
                raise ProtocolError("file descriptors were truncated in transit")
            if not n:
                for fd in fds:
                    os.close(fd)
                raise ChannelClosed("end of stream")
            self._dec.feed(self._rview[:n], fds)

    def close(self) -> None:
        with self._wlock:
            self._closed = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self._dec.close()


# ---- records ----------------------------------------------------------------------------------
def result_to_wire(r: TurnResult) -> dict[str, Any]:
    return r.to_dict()


def result_from_wire(d: object) -> TurnResult:
    if not isinstance(d, dict):
        raise ProtocolError("a turn result must be a map")
    try:
        exc = d.get("exception")
        return TurnResult(
            status=TurnStatus(d["status"]), stdout=str(d.get("stdout", "")),
            stderr=str(d.get("stderr", "")), value=d.get("value"),
            exception=None if exc is None else GuestException(
                type=str(exc["type"]), message=str(exc["message"]),
                traceback=str(exc["traceback"])),
            exit_code=d.get("exit_code"), limit=d.get("limit"), trap=d.get("trap"),
            rolled_back=bool(d.get("rolled_back", False)), duration=float(d.get("duration", 0)),
            fuel_used=d.get("fuel_used"), memory_bytes=int(d.get("memory_bytes", 0)),
            truncated=tuple(d.get("truncated", ())),
            disk_bytes=int(d.get("disk_bytes", 0)), disk_files=int(d.get("disk_files", 0)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"malformed turn result: {exc}") from None


def limits_to_wire(limits: Limits) -> dict[str, Any]:
    return dataclasses.asdict(limits)


def limits_from_wire(d: object) -> Limits:
    if not isinstance(d, dict):
        raise ProtocolError("limits must be a map")
    try:
        return Limits(**d)
    except TypeError as exc:
        raise ProtocolError(f"malformed limits: {exc}") from None


def mounts_to_wire(mounts: Sequence[Mount]) -> list[list[Any]]:
    return [[os.fspath(m.host_path), m.guest_path, m.writable, m.links] for m in mounts]


def mounts_from_wire(items: object) -> list[Mount]:
    if not isinstance(items, list):
        raise ProtocolError("mounts must be an array")
    try:
        return [Mount(host_path=m[0], guest_path=m[1], writable=bool(m[2]),
                      links=bool(m[3]) if len(m) > 3 else False) for m in items]
    except (TypeError, ValueError, IndexError, KeyError) as exc:
        if isinstance(exc, MemexError):
            raise
        raise ProtocolError(f"malformed mounts: {exc}") from None


def error_to_wire(exc: BaseException) -> list[Any]:
    reason = getattr(exc, "reason", None)
    return [type(exc).__name__, str(exc), reason if isinstance(reason, str) else None]


def error_from_wire(item: Any) -> MemexError:
    """The same MemEx exception class the peer raised; anything else as a SandboxError."""
    try:
        name, message, reason = item
        name, message = str(name), str(message)
    except (TypeError, ValueError):
        return SandboxError(f"worker error: {item!r}")
    cls = getattr(errors, name, None) if name in errors.__all__ else None
    if not (isinstance(cls, type) and issubclass(cls, MemexError)):
        return SandboxError(f"worker error: {name}: {message}")
    try:
        if issubclass(cls, SandboxClosed | SandboxLost):
            return cls(str(reason))
        if issubclass(cls, BackendBusy):
            return cls(str(reason or "busy"), message)
        made: MemexError = cls(message)
    except TypeError:
        made = SandboxError(f"{name}: {message}")
    return made


def answer_of(fn: Any, *args: Any) -> list[Any]:
    """``["ok", fn(*args)]``, or ``["err", <error wire>]`` for what it raised: how an actor
    (the Ray backend's host, a cluster's slab) answers a call from another process."""
    try:
        return ["ok", fn(*args)]
    except MemexError as exc:
        return ["err", error_to_wire(exc)]
    except Exception as exc:
        return ["err", ["SandboxError", f"{type(exc).__name__}: {exc}", None]]
