"""The door of a remote session: every frame the guest sends goes over the session's door
WebSocket to the client, whose own :class:`~memex.runtime_wasm.Door` (and host tools) answers
it, exactly as a worker forwards frames to its caller in the subprocess backend. Ops the
server registers on this door itself (``net.fetch`` under the tenant's egress policy) are
answered here and never forwarded. A client
connects only once its door has a handler; until then the guest's calls are answered here as
an empty door answers them (``unknown_op``).

Messages are msgpack arrays in binary WebSocket messages::

    server -> client  ["ready"]                              (once, when attached)
    server -> client  ["door", seq, seconds_left | None, frame, turn_key | None]
    client -> server  ["door_reply", seq, "ok", frame]
    client -> server  ["door_reply", seq, "killed", limit, detail]

Seconds left, not a deadline: the two machines' clocks are not the same. ``turn_key`` (the
deadline on the server's clock) is the same for every call of one turn, so the client keeps
one local deadline per turn (what per-turn tool budgets count by). A call with no
client attached any more, or whose client disconnects before answering, traps the turn with
``limit="cancelled"`` (rolled back, as any trap): it fails cleanly and never hangs the guest.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

import msgpack

from ..runtime_wasm import Door, GuestKilled

__all__ = ["DOOR_GRACE", "ClientDoor"]

DOOR_GRACE = 5.0
"""Seconds past the turn's deadline a call waits for the client (which answers by the deadline
itself; this covers only a client that stopped answering without disconnecting)."""

Send = Callable[[bytes], Coroutine[Any, Any, None]]


class _Gone:
    def __init__(self, why: str) -> None:
        self.why = why


class ClientDoor(Door):
    """Forwards each door frame to a connection of the client. A session and its forks share
    one client-side door (``fork().door is door`` on every backend), so they share this one
    too: each of their handles attaches its own connection, and a call goes to the least busy
    of them, so a fork's calls do not wait behind its parent's and outlive its parent's
    close."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._seq = 0
        self._token = 0
        self._ever = False  # a client connected once: from then on a call needs one
        self._conns: dict[int, tuple[Send, asyncio.AbstractEventLoop]] = {}
        self._busy: dict[int, int] = {}
        self._pending: dict[int, tuple[int, concurrent.futures.Future[Any]]] = {}

    @property
    def attached(self) -> bool:
        return bool(self._conns)

    def attach(self, send: Send, loop: asyncio.AbstractEventLoop) -> int:
        """Route calls to this connection too; returns its token for :meth:`detach`."""
        with self._lock:
            self._token += 1
            self._ever = True
            self._conns[self._token] = (send, loop)
            self._busy[self._token] = 0
            return self._token

    def detach(self, token: int, why: str = "the client disconnected during a tool call") -> None:
        """Stop routing to a connection; the calls waiting on it fail (``cancelled``)."""
        with self._lock:
            self._conns.pop(token, None)
            self._busy.pop(token, None)
            for seq, (t, fut) in list(self._pending.items()):
                if t == token:
                    del self._pending[seq]
                    if not fut.done():
                        fut.set_result(_Gone(why))

    def answer(self, data: bytes) -> bool:
        """Take one message from the client; False if it is not a door reply."""
        try:
            msg = msgpack.unpackb(data, raw=False)
        except Exception:
            return False
        if not (isinstance(msg, list) and len(msg) >= 3 and msg[0] == "door_reply"
                and isinstance(msg[1], int)):
            return False
        with self._lock:
            entry = self._pending.pop(msg[1], None)
        if entry is not None and not entry[1].done():
            entry[1].set_result(msg)
        return True

    def _local(self, frame: bytes) -> bool:
        """The frame asks for an op the server serves itself (the tenant's egress): those
        are never forwarded, so a client cannot answer in the operator's place."""
        if not self.ops:
            return False
        try:
            req = msgpack.unpackb(frame, raw=False, strict_map_key=False)
        except Exception:
            return False
        return isinstance(req, dict) and req.get("op") in self.ops

    def dispatch(self, frame: bytes, deadline: float = float("inf")) -> bytes:
        if self._local(frame):
            return super().dispatch(frame, deadline)
        finite = deadline != float("inf")
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._lock:
            if not self._conns:
                if not self._ever:  # no client door has ever been here to answer
                    return super().dispatch(frame, deadline)
                raise GuestKilled("cancelled", "a tool call needs the client, and no client is "
                                  "connected to this session's door any more")
            token = min(self._conns, key=lambda t: self._busy.get(t, 0))
            send, loop = self._conns[token]
            self._busy[token] += 1
            self._seq += 1
            seq = self._seq
            self._pending[seq] = (token, fut)
        left = max(0.0, deadline - time.monotonic()) if finite else None
        out = msgpack.packb(["door", seq, left, bytes(frame), deadline if finite else None],
                            use_bin_type=True)
        try:
            asyncio.run_coroutine_threadsafe(send(out), loop)
            msg = fut.result(timeout=None if left is None else left + DOOR_GRACE)
        except (concurrent.futures.TimeoutError, TimeoutError):
            raise GuestKilled("deadline", "the client did not answer a tool call by the turn's "
                              "deadline") from None
        except RuntimeError:  # the event loop is closed: the server is stopping
            raise GuestKilled("cancelled", "the server is shutting down") from None
        finally:
            with self._lock:
                self._pending.pop(seq, None)
                if token in self._busy:
                    self._busy[token] -= 1
        if isinstance(msg, _Gone):
            raise GuestKilled("cancelled", msg.why)
        if msg[2] == "ok" and len(msg) >= 4 and isinstance(msg[3], bytes):
            return msg[3]
        if msg[2] == "killed" and len(msg) >= 5:
            raise GuestKilled(str(msg[3]), str(msg[4]))
        raise GuestKilled("trap", f"malformed door reply from the client: {msg[:3]!r}")
