"""The host end of the door: framed msgpack requests from the guest, dispatched to handlers
registered by operation name, with size caps and a per-call time bound.

Every request gets a reply frame; nothing a guest sends can raise in the host. A handler that
raises :class:`DoorError` answers with an error of its own kind (``{"ok": false, "error":
{"kind", "message", ...extra}}``); any other exception yields ``handler_error``; one that
outlives the turn's deadline traps the turn (it is rolled back), one that outlives its own
call bound yields a ``timeout`` error. Handlers run on a shared thread pool so that a slow
handler can be abandoned at its bound (Python threads cannot be killed: the call record says
it may still be running). Dispatch takes and returns bytes, so a guest living in another
process can reach the same handlers by forwarding frames.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ._bounded import DecodeCost, DecodeLimit, unpack_bounded
from ._instance import GuestKilled
from ._workers import Workers

__all__ = ["Door", "DoorCall", "DoorContext", "DoorError", "ErrorKind", "serving_door"]

ErrorKind = str  # protocol | too_large | unknown_op | handler_error | timeout | unencodable

MAX_MESSAGE_CHARS = 4096  # an error message longer than this is cut
MAX_EXTRA_BYTES = 64 << 10  # encoded extras of one DoorError beyond this are dropped
_MAX_KIND_CHARS = 64


def _text(value: str, limit: int) -> str:
    """``value`` cut to ``limit`` characters and made encodable (lone surrogates escaped)."""
    if len(value) > limit:
        value = value[: limit - 40] + f"... [{len(value) - limit + 40} characters cut]"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        value = value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


def _describe(exc: BaseException) -> str:
    """``Type: message`` of an exception, even one whose ``__str__`` raises."""
    try:
        text = str(exc)
    except Exception:
        text = "<unprintable>"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _msgpack() -> Any:
    """msgpack, imported with the first frame that needs it: a sandbox whose guest calls no
    tool (``memex run``) does not pay its import (~3 ms, with the datetime module it pulls
    in)."""
    import msgpack

    return msgpack


class DoorError(Exception):
    """Raised by a door handler to answer the guest with a typed error: the reply becomes
    ``{"ok": false, "error": {"kind": kind, "message": message, **extra}}``.

    A signal from a handler to :meth:`Door.dispatch`, which always catches it: it never
    reaches a MemEx caller, so it is not part of the ``MemexError`` tree (memex/errors.py).
    ``kind`` is a non-empty str of at most 64 characters (a handler constructing a bad one
    gets ``handler_error`` instead); the message is cut at 4096 characters. Each extra is kept
    when msgpack can encode it and the extras stay within 64 KiB (in the order given); any
    other extra is dropped, so the kind and the message always reach the guest.
    """

    def __init__(self, kind: str, message: str = "", **extra: Any) -> None:
        if not isinstance(kind, str) or not kind or len(kind) > _MAX_KIND_CHARS:
            raise ValueError(f"a DoorError kind is a str of 1 to {_MAX_KIND_CHARS} "
                             f"characters, got {kind!r}")
        if not isinstance(message, str):
            message = str(message)
        super().__init__(f"{kind}: {message}" if message else kind)
        self.kind = kind
        self.message = message
        self.extra = extra

    def error_map(self) -> dict[str, Any]:
        """The error map the guest receives (bounded, encodable)."""
        err: dict[str, Any] = {"kind": _text(self.kind, _MAX_KIND_CHARS),
                               "message": _text(self.message, MAX_MESSAGE_CHARS)}
        used = 0
        for key, value in self.extra.items():
            if key in err:
                continue
            try:
                size = len(_msgpack().packb(key, use_bin_type=True)) + len(
                    _msgpack().packb(value, use_bin_type=True))
            except Exception:  # not encodable: dropped
                continue
            if used + size > MAX_EXTRA_BYTES:
                continue
            used += size
            err[key] = value
        return err

_POOL = Workers(32, "memex-door")


@dataclass(frozen=True, kw_only=True)
class DoorCall:
    """One door request as the host saw it."""

    op: str | None
    ok: bool
    error_kind: str | None
    duration: float
    request_bytes: int
    reply_bytes: int
    may_still_run: bool = False


_SERVING = threading.local()


def serving_door() -> Door | None:
    """The door whose handler this thread is running, if any (the re-entrancy guard: a
    handler must not run code in the sandbox that is waiting for it)."""
    return getattr(_SERVING, "door", None)


@contextlib.contextmanager
def _serving(door: Door) -> Iterator[None]:
    prev = getattr(_SERVING, "door", None)
    _SERVING.door = door
    try:
        yield
    finally:
        _SERVING.door = prev


@dataclass(frozen=True, kw_only=True)
class DoorContext:
    """What a handler registered with ``context=True`` gets as its first argument."""

    door: Door
    op: str
    deadline: float  # on time.monotonic(): when the calling turn ends
    request_bytes: int = 0  # size of the request frame
    # What decoding this frame may still cost: a handler decoding ext payloads in its
    # arguments (the tool codec) takes from the same budget as the frame itself.
    cost: DecodeCost | None = None

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def serving(self) -> contextlib.AbstractContextManager[None]:
        """Mark another thread (e.g. one running part of a batch) as serving this door."""
        return _serving(self.door)


def _invoke(door: Door, handler: Callable[..., Any], args: tuple[Any, ...],
            kwargs: dict[str, Any]) -> Any:
    prev = getattr(_SERVING, "door", None)
    _SERVING.door = door
    try:
        return handler(*args, **kwargs)
    finally:
        _SERVING.door = prev


class Door:
    """Registry of door handlers plus the dispatch the guest's ``_host.call`` reaches."""

    def __init__(
        self,
        *,
        max_request_bytes: int = 16 << 20,
        max_reply_bytes: int = 64 << 20,
        call_timeout: float = 60.0,
        keep_calls: int = 1000,
    ) -> None:
        if max_request_bytes <= 0 or max_reply_bytes <= 0 or call_timeout <= 0:
            raise ConfigError("door caps and timeout must be positive")
        self.max_request_bytes = max_request_bytes
        self.max_reply_bytes = max_reply_bytes
        self.call_timeout = call_timeout
        self._handlers: dict[str, tuple[Callable[..., Any], bool, bool]] = {}
        self._keep = keep_calls
        self.calls: list[DoorCall] = []

    def register(
        self, op: str, handler: Callable[..., Any], *, inline: bool = False,
        context: bool = False,
    ) -> None:
        """Expose ``handler(*args, **kwargs)`` to the guest as ``memex_guest.call(op, ...)``.

        ``inline=True`` runs it on the guest's own thread (no hand-off, ~50 us faster) for
        handlers that cannot block; it is then bounded only by the turn's deadline afterwards.
        ``context=True`` passes a :class:`DoorContext` (the turn's deadline) first.
        """
        if not isinstance(op, str) or not op:
            raise ConfigError("a door op name must be a non-empty string")
        self._handlers[op] = (handler, inline, context)

    def unregister(self, op: str) -> None:
        self._handlers.pop(op, None)

    @property
    def ops(self) -> tuple[str, ...]:
        return tuple(sorted(self._handlers))

    # ---- dispatch -----------------------------------------------------------------------
    def dispatch(self, frame: bytes, deadline: float = float("inf")) -> bytes:
        """Answer one request frame. Raises only GuestKilled (turn deadline reached)."""
        start = time.monotonic()
        req = self._parse(frame, start)
        if isinstance(req, bytes):
            return req  # the error reply to a frame that is not a valid request
        rid, op, (handler, inline, wants_context), args, kwargs, cost = req
        may_still_run = False
        try:
            call_args: tuple[Any, ...] = tuple(args)
            if wants_context:
                ctx = object.__new__(DoorContext)  # all fields, without the frozen __init__
                ctx.__dict__.update(door=self, op=op, deadline=deadline,
                                    request_bytes=len(frame), cost=cost)
                call_args = (ctx, *call_args)
            if inline:
                value = _invoke(self, handler, call_args, kwargs)
            else:
                job = _POOL.submit(lambda: _invoke(self, handler, call_args, kwargs))
                bound = min(self.call_timeout, deadline - time.monotonic())
                if not job.wait(bound):
                    may_still_run = True  # a Python thread cannot be stopped
                    if time.monotonic() >= deadline:
                        self._record(op, False, "timeout", start, frame, 0, may_still_run)
                        raise GuestKilled(
                            "deadline", f"door handler {op!r} still running at the turn deadline"
                        ) from None
                    return self._error(rid, "timeout", f"{op!r} exceeded its "
                                       f"{self.call_timeout:g}s bound", op, start, frame,
                                       may_still_run)
                if job.error is not None:
                    raise job.error
                value = job.value
        except GuestKilled:
            raise
        except DoorError as exc:
            return self._reply_error(rid, exc.error_map(), op, start, frame, may_still_run)
        except Exception as exc:
            return self._error(rid, "handler_error", _describe(exc), op, start, frame)
        return self._reply(rid, op, value, start, frame)

    def too_large(self, size: int) -> bytes:
        """The reply to a request of ``size`` bytes over the cap, for a caller that refuses
        it before reading it (the instance does not copy such a frame out of the guest)."""
        return self._error(None, "too_large", f"request of {size} bytes exceeds the "
                           f"{self.max_request_bytes}-byte cap", None, time.monotonic(), b"")

    def _parse(self, frame: bytes, start: float
               ) -> bytes | tuple[Any, str, tuple[Callable[..., Any], bool, bool], list[Any],
                                  dict[str, Any], DecodeCost]:
        """(id, op, handler entry, args, kwargs, what decoding may still cost) of a valid
        request, else the error reply. The frame is decoded under a cost cap proportional
        to the byte cap (``DecodeCost.for_bytes``): a frame of empty arrays or of a million
        small values is refused in milliseconds, before it costs the host its memory."""
        if len(frame) > self.max_request_bytes:
            return self._error(None, "too_large", f"request of {len(frame)} bytes exceeds "
                               f"the {self.max_request_bytes}-byte cap", None, start, frame)
        cost = DecodeCost.for_bytes(self.max_request_bytes)
        try:
            req = unpack_bounded(frame, cost)
        except DecodeLimit as exc:
            return self._error(None, "too_large", f"request too costly to decode: {exc} "
                               f"(send bulk data as bytes, arrays or DataFrames)", None, start,
                               frame)
        except ValueError as exc:  # malformed bytes of any kind
            return self._error(None, "protocol", f"malformed frame: {exc}", None, start, frame)
        if not isinstance(req, dict):
            return self._error(None, "protocol", "a frame must be a map", None, start, frame)
        rid = req.get("id")
        if not isinstance(rid, int) or isinstance(rid, bool):
            rid = None
        if req.get("v") != 1:
            return self._error(rid, "protocol", f"unsupported frame version {req.get('v')!r}",
                               None, start, frame)
        op = req.get("op")
        args = req.get("args", [])
        kwargs = req.get("kwargs", {})
        if not isinstance(op, str) or not isinstance(args, list) or not isinstance(
            kwargs, dict
        ) or (kwargs and not all(isinstance(k, str) for k in kwargs)):
            return self._error(rid, "protocol", "frame needs op:str, args:list, kwargs:map",
                               None, start, frame)
        entry = self._handlers.get(op)
        if entry is None:
            return self._error(rid, "unknown_op", f"no handler for {op!r}", op, start, frame)
        return rid, op, entry, args, kwargs, cost

    def _reply(self, rid: object, op: str, value: object, start: float, frame: bytes) -> bytes:
        try:
            reply: bytes = _msgpack().packb({"v": 1, "id": rid, "ok": True, "value": value},
                                         use_bin_type=True)
        except Exception as exc:
            return self._error(rid, "unencodable", f"result of {op!r} cannot be encoded: {exc}",
                               op, start, frame)
        if len(reply) > self.max_reply_bytes:
            return self._error(rid, "too_large", f"reply of {len(reply)} bytes exceeds the "
                               f"{self.max_reply_bytes}-byte cap", op, start, frame)
        self._record(op, True, None, start, frame, len(reply), False)
        return reply

    def _error(self, rid: object, kind: str, message: str, op: str | None, start: float,
               frame: bytes, may_still_run: bool = False) -> bytes:
        return self._reply_error(rid, {"kind": kind, "message": _text(message,
                                                                      MAX_MESSAGE_CHARS)},
                                 op, start, frame, may_still_run)

    def _reply_error(self, rid: object, err: dict[str, Any], op: str | None, start: float,
                     frame: bytes, may_still_run: bool) -> bytes:
        reply: bytes = _msgpack().packb({"v": 1, "id": rid, "ok": False, "error": err},
                                     use_bin_type=True)
        self._record(op, False, err["kind"], start, frame, len(reply), may_still_run)
        return reply

    def _record(self, op: str | None, ok: bool, kind: str | None, start: float, frame: bytes,
                reply_bytes: int, may_still_run: bool) -> None:
        # Every field given, set without the frozen __init__ (~2 us less per call).
        rec = object.__new__(DoorCall)
        rec.__dict__.update(op=op, ok=ok, error_kind=kind, duration=time.monotonic() - start,
                            request_bytes=len(frame), reply_bytes=reply_bytes,
                            may_still_run=may_still_run)
        self.calls.append(rec)
        if len(self.calls) > self._keep:
            del self.calls[: len(self.calls) - self._keep]
