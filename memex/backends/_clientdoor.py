"""The door of a remote session: every frame the guest sends goes over the session's door
WebSocket to the client, whose own :class:`~memex.runtime_wasm.Door` (and host tools) answers
it, exactly as a worker forwards frames to its caller in the subprocess backend. Ops the
server registers on this door itself (``net.fetch`` under the tenant's egress policy) are
answered here and never forwarded. A client
connects only once its door has a handler; until then the guest's calls are answered here as
an empty door answers them (``unknown_op``).

Messages are msgpack arrays in binary WebSocket messages::

    server -> client  ["ready"]              (once, when the guest's calls reach this connection)
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
import contextlib
import threading
import time
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

import msgpack

from ..runtime_wasm import Door, GuestKilled
from ..runtime_wasm.internal import DecodeCost, unpack_bounded

__all__ = ["DOOR_GRACE", "ClientDoor"]

DOOR_GRACE = 5.0
"""Seconds past the turn's deadline a call waits for the client (which answers by the deadline
itself; this covers only a client that stopped answering without disconnecting)."""

Send = Callable[[bytes], Coroutine[Any, Any, None]]


_TOOL_OPS = frozenset({"tools.call", "tools.batch", "tools.list"})
_HERE, _THERE, _LIST = object(), object(), object()


def _pack(obj: object) -> bytes:
    out: bytes = msgpack.packb(obj, use_bin_type=True)
    return out


def _unpack(data: bytes, cap: int) -> Any:
    """A door frame or reply from outside the server, decoded under the cost of ``cap``
    bytes (``ValueError`` for what is malformed or too costly)."""
    if len(data) > cap:
        raise ValueError(f"{len(data)} bytes, more than {cap}")
    return unpack_bounded(data, DecodeCost.for_bytes(cap))


class _Gone:
    def __init__(self, why: str) -> None:
        self.why = why


def _failed_send(sent: concurrent.futures.Future[None], fut: concurrent.futures.Future[Any]
                 ) -> None:
    """A call the connection would not send (closed, or its key rotated out) fails at once,
    not at the turn's deadline."""
    exc = None if sent.cancelled() else sent.exception()
    if (sent.cancelled() or exc is not None) and not fut.done():
        with contextlib.suppress(concurrent.futures.InvalidStateError):
            fut.set_result(_Gone("the tool call could not reach the client "
                                 f"({exc or 'cancelled'})"))


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
        self._tools: frozenset[str] = frozenset()
        self._joined = threading.Condition(self._lock)
        self._expect = 0.0

    @property
    def ever_attached(self) -> bool:
        return self._ever

    def expect_client(self, seconds: float) -> None:
        """A client had a connection here before this door was made (its session was
        opened again elsewhere): a call waits up to ``seconds`` for it to reconnect."""
        with self._lock:
            self._ever, self._expect = True, seconds

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
            self._joined.notify_all()
            return self._token

    async def joined(self, token: int) -> bool:
        """True once calls are routed to connection ``token``: here at once (:meth:`attach`
        routes to it before it returns). A door whose guest is elsewhere (the cluster's
        relay) answers once its far end routes to the connection, so the client is told
        ``ready`` only when its tools can be called."""
        return token in self._conns

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
            msg = _unpack(data, self.max_reply_bytes + 4096)
        except ValueError:
            return False
        if not (isinstance(msg, list) and len(msg) >= 3 and msg[0] == "door_reply"
                and isinstance(msg[1], int)):
            return False
        with self._lock:
            entry = self._pending.pop(msg[1], None)
        if entry is not None and not entry[1].done():
            entry[1].set_result(msg)
        return True

    def serve_tools(self, names: Iterable[str]) -> None:
        """Tool calls to these names are the server's (an operator's ToolHost registered on
        this door answers them); every other tool call still goes to the client."""
        self._tools = frozenset(names)

    def _route(self, frame: bytes) -> Any:
        """``_HERE`` for a frame the server answers (the tenant's egress, an operator tool),
        ``_THERE`` for the client's, or ``(request, here_indexes)`` for a tool batch that
        holds both kinds of call, or ``_LIST`` for ``tools.list`` when both serve tools."""
        if not self.ops:
            return _THERE
        try:
            req = _unpack(frame, self.max_request_bytes)
        except ValueError:
            return _HERE  # malformed or too costly: answered here, as the guest's error
        op = req.get("op") if isinstance(req, dict) else None
        if op not in self.ops:
            return _THERE
        if op not in _TOOL_OPS:
            return _HERE
        if op == "tools.list":
            return _LIST
        args = req.get("args")
        if not isinstance(args, list) or not args:
            return _HERE  # malformed: the operator's host answers with a typed error
        if op == "tools.call":
            return _HERE if args[0] in self._tools or not self._ever else _THERE
        calls = args[0]
        if not isinstance(calls, list) or not all(isinstance(c, list) and len(c) == 3
                                                  for c in calls):
            return _HERE
        here = [i for i, c in enumerate(calls) if isinstance(c[1], str) and c[1] in self._tools]
        if len(here) == len(calls) or not self._ever:
            return _HERE
        return (req, here) if here else _THERE

    def dispatch(self, frame: bytes, deadline: float = float("inf")) -> bytes:
        route = self._route(frame)
        if route is _HERE:
            return super().dispatch(frame, deadline)
        if route is _LIST:
            return self._list(frame, deadline)
        if isinstance(route, tuple):
            return self._split(route[0], route[1], deadline)
        return self._forward(frame, deadline)

    def _list(self, frame: bytes, deadline: float) -> bytes:
        """``tools.list``: the operator's tools, then the client's (when it serves any)."""
        mine = msgpack.unpackb(super().dispatch(frame, deadline), raw=False)
        if not self._conns or not mine.get("ok"):  # no client to add its own tools
            return _pack(mine)
        try:
            theirs = _unpack(self._forward(frame, deadline), self.max_reply_bytes)
        except ValueError:
            return _pack(mine)
        if isinstance(theirs, dict) and theirs.get("ok") and isinstance(theirs.get("value"),
                                                                         list):
            seen = {d.get("name") for d in mine["value"] if isinstance(d, dict)}
            mine["value"] += [d for d in theirs["value"]
                              if isinstance(d, dict) and d.get("name") not in seen]
        return _pack(mine)

    def _split(self, req: dict[str, Any], here: list[int], deadline: float) -> bytes:
        """A ``tools.batch`` with operator and client calls: each part goes to its side at
        once, and the answers come back in the order the guest sent the calls."""
        calls = req["args"][0]
        mark = set(here)
        parts = ([calls[i] for i in here], [c for i, c in enumerate(calls) if i not in mark])

        def frame(part: list[Any]) -> bytes:
            return _pack({**req, "args": [part], "kwargs": {}})

        box: dict[str, Any] = {}

        def local() -> None:
            try:
                box["reply"] = super(ClientDoor, self).dispatch(frame(parts[0]), deadline)
            except GuestKilled as exc:
                box["killed"] = exc

        worker = threading.Thread(target=local, name="memex-door-split", daemon=True)
        worker.start()
        try:
            raw = self._forward(frame(parts[1]), deadline)
        finally:
            worker.join()
        if "killed" in box:
            raise box["killed"]
        try:
            theirs = _unpack(raw, self.max_reply_bytes)
        except ValueError as exc:
            theirs = {"v": 1, "ok": False, "error": {"kind": "protocol", "message":
                                                      f"the client's reply: {exc}"}}
        if not isinstance(theirs, dict):
            theirs = {"v": 1, "ok": False, "error": {"kind": "protocol", "message":
                                                      "the client's reply is not a map"}}
        mine = msgpack.unpackb(box["reply"], raw=False)
        for reply in (mine, theirs):
            if not reply.get("ok") or not isinstance(reply.get("value"), list) or len(
                    reply["value"]) != len(parts[0] if reply is mine else parts[1]):
                reply["id"] = req.get("id")
                return _pack(reply)  # the whole batch failed
        ours, others = iter(mine["value"]), iter(theirs["value"])
        merged = [next(ours) if i in mark else next(others) for i in range(len(calls))]
        return _pack({"v": 1, "id": req.get("id"), "ok": True, "value": merged})

    def _forward(self, frame: bytes, deadline: float) -> bytes:
        finite = deadline != float("inf")
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._lock:
            if not self._conns and self._expect > 0:
                wait = self._expect if not finite else min(
                    self._expect, max(0.0, deadline - time.monotonic()))
                self._joined.wait_for(lambda: bool(self._conns), wait)
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
            sent = asyncio.run_coroutine_threadsafe(send(out), loop)
            sent.add_done_callback(lambda f: _failed_send(f, fut))
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
