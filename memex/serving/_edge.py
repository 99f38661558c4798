"""The connection edge of MemEx's HTTP servers (``memex serve``, ``memex mcp --http``): what
a client that never finishes a request can hold, bounded in the protocol, before any
application code runs. Uvicorn (with httptools) bounds neither how long a request's head may
take nor how many connections a peer may hold, so a few thousand half-open connections used
to hold every descriptor of a server for as long as they liked.

:class:`ConnectionGuard` counts every connection of one server (HTTP and the WebSockets they
upgrade to) and gives its protocol class (:meth:`ConnectionGuard.protocol`, a subclass of
uvicorn's httptools protocol), which:

* closes a connection whose request head has not arrived within ``header_timeout`` seconds
  of its first byte (or of the connection, for one that sends nothing), or grows past
  ``max_header_bytes``;
* closes a connection whose request body stops for ``body_timeout`` seconds;
* keeps at most ``max_pending_per_peer`` connections of one address, and ``max_pending`` in
  all, that have not sent a whole request head yet: a new one past either bound closes the
  oldest of them (a slow client cannot lock a fast one out, even from the same address);
* keeps at most ``max_connections`` in all; past it, a new connection gets ``503`` and is
  closed (an idle keep-alive connection closes after uvicorn's ``timeout_keep_alive``).

The figures are :class:`EdgeLimits` (documented defaults; ``[server]`` in serve.toml, ``[http]``
in the MCP config). This module imports no web framework: both servers use it.
"""

from __future__ import annotations

import asyncio
import collections
import resource
import threading
from dataclasses import dataclass
from typing import Any

from pydantic import Field
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ._settings import FileModel, Seconds, Size

__all__ = ["ConnectionGuard", "EdgeLimits", "EdgeTable"]


def _default_max_connections() -> int:
    """Half the process's descriptors (the other half: sandboxes, workers, files)."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        soft = 1024
    if soft == resource.RLIM_INFINITY or soft <= 0:
        soft = 1 << 16
    return max(32, min(10_000, soft // 2))


@dataclass(frozen=True, kw_only=True)
class EdgeLimits:
    """What one client may hold of a server's connections (see the module docstring)."""

    max_connections: int = 0  # 0: half the process's descriptor limit (at most 10,000)
    max_pending: int = 256
    max_pending_per_peer: int = 32
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    max_header_bytes: int = 64 << 10
    keep_alive_timeout: float = 5.0

    def connections(self) -> int:
        return self.max_connections if self.max_connections > 0 else \
            _default_max_connections()


class EdgeTable(FileModel):
    """The edge's keys in a config file (serve.toml's ``[server]``, the MCP config's
    ``[http]``): each unset key keeps :class:`EdgeLimits`' default, the one home of them."""

    max_connections: int | None = Field(default=None, ge=0)
    max_pending: int | None = Field(default=None, gt=0)
    max_pending_per_peer: int | None = Field(default=None, gt=0)
    header_timeout: Seconds | None = None
    body_timeout: Seconds | None = None
    max_header_bytes: Size | None = Field(default=None, gt=0)
    keep_alive_timeout: Seconds | None = None

    @property
    def edge(self) -> EdgeLimits:
        """The connection edge's settings: those set here, the defaults for the rest."""
        return EdgeLimits(**{k: getattr(self, k) for k in EdgeTable.model_fields
                             if getattr(self, k) is not None})


class ConnectionGuard:
    """The connections of one server (thread-safe; all callbacks run on its event loop)."""

    def __init__(self, limits: EdgeLimits) -> None:
        self.limits = limits
        self.max_connections = limits.connections()
        self._lock = threading.Lock()
        self._open: set[object] = set()  # transports
        # transports that have not sent a whole request head yet, oldest first
        self._pending: collections.OrderedDict[object, Any] = collections.OrderedDict()
        self._pending_of: dict[str, collections.OrderedDict[object, Any]] = {}
        self._peer: dict[object, str] = {}
        self.refused = 0  # connections refused past max_connections
        self.evicted = 0  # pending connections closed for a newer one
        self.timed_out = 0  # connections closed for a slow head or body

    # ---- bookkeeping ------------------------------------------------------------------------
    def admit(self, transport: object, peer: str, proto: object) -> bool:
        evict: list[Any] = []
        with self._lock:
            if len(self._open) >= self.max_connections:
                if not self._pending:
                    self.refused += 1
                    return False
                evict.append(self._drop_oldest(None))
            mine = self._pending_of.setdefault(peer, collections.OrderedDict())
            if len(mine) >= self.limits.max_pending_per_peer:
                evict.append(self._drop_oldest(peer))
            elif len(self._pending) >= self.limits.max_pending:
                evict.append(self._drop_oldest(None))
            self._open.add(transport)
            self._peer[transport] = peer
            self._pending[transport] = proto
            mine[transport] = proto
        for p in evict:
            if p is not None:
                p.evicted()
        return True

    def _drop_oldest(self, peer: str | None) -> Any:
        """(lock held) Stop counting the oldest pending connection (of ``peer``, or of
        anyone); its protocol, for the caller to close."""
        pool = self._pending if peer is None else self._pending_of.get(peer)
        if not pool:
            return None
        transport, proto = next(iter(pool.items()))
        self._forget_pending(transport)
        self.evicted += 1
        return proto

    def _forget_pending(self, transport: object) -> None:
        self._pending.pop(transport, None)
        peer = self._peer.get(transport)
        if peer is not None:
            mine = self._pending_of.get(peer)
            if mine is not None:
                mine.pop(transport, None)
                if not mine:
                    del self._pending_of[peer]

    def headed(self, transport: object) -> None:
        """A whole request head arrived: the connection is no longer pending."""
        with self._lock:
            self._forget_pending(transport)

    def waiting(self, transport: object, proto: object) -> None:
        """A keep-alive connection began a new request: pending again until its head is in."""
        with self._lock:
            if transport in self._open and transport not in self._pending:
                peer = self._peer.get(transport, "?")
                self._pending[transport] = proto
                self._pending_of.setdefault(peer, collections.OrderedDict())[transport] = proto

    def release(self, transport: object) -> None:
        with self._lock:
            self._forget_pending(transport)
            self._open.discard(transport)
            self._peer.pop(transport, None)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"open": len(self._open), "pending": len(self._pending),
                    "refused": self.refused, "evicted": self.evicted,
                    "timed_out": self.timed_out}

    # ---- the protocol -----------------------------------------------------------------------
    def protocol(self) -> type[asyncio.Protocol]:
        """uvicorn's httptools protocol, held to this guard (``uvicorn.Config(http=...)``)."""
        guard = self
        limits = self.limits
        ws_classes: dict[type[Any], type[Any]] = {}

        def guarded_ws(cls: type[Any]) -> type[Any]:
            """The WebSocket protocol a connection upgrades to, released from the guard when
            it closes (the HTTP protocol's own ``connection_lost`` is not called then)."""
            made = ws_classes.get(cls)
            if made is None:
                def connection_lost(self: object, exc: Exception | None) -> None:
                    guard.release(getattr(self, "transport", None))
                    cls.connection_lost(self, exc)

                made = ws_classes[cls] = type(f"Guarded{cls.__name__}", (cls,),
                                              {"connection_lost": connection_lost})
            return made

        class GuardedHttpTools(HttpToolsProtocol):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                if self.ws_protocol_class is not None:
                    self.ws_protocol_class = guarded_ws(self.ws_protocol_class)
                self._head_timer: asyncio.TimerHandle | None = None
                self._body_timer: asyncio.TimerHandle | None = None
                self._head_bytes = 0
                self._refused = False

            # lifecycle
            def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
                super().connection_made(transport)
                peer = self.client[0] if self.client else "?"
                if not guard.admit(transport, peer, self):
                    self._refused = True
                    transport.write(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0"
                                    b"\r\nconnection: close\r\nretry-after: 1\r\n\r\n")
                    transport.close()
                    return
                self._arm_head()

            def connection_lost(self, exc: Exception | None) -> None:
                guard.release(self.transport)
                self._disarm()
                super().connection_lost(exc)

            def data_received(self, data: bytes) -> None:
                if self._refused:
                    return
                super().data_received(data)

            def evicted(self) -> None:
                self._close("evicted")

            # timers
            def _close(self, why: str) -> None:
                self._disarm()
                if why != "evicted":
                    guard.timed_out += 1
                if self.transport is not None and not self.transport.is_closing():
                    self.transport.close()

            def _arm_head(self) -> None:
                if self._head_timer is not None:
                    self._head_timer.cancel()
                self._head_timer = self.loop.call_later(limits.header_timeout, self._close,
                                                        "head")

            def _arm_body(self) -> None:
                if self._body_timer is not None:
                    self._body_timer.cancel()
                self._body_timer = self.loop.call_later(limits.body_timeout, self._close,
                                                        "body")

            def _disarm(self) -> None:
                for timer in (self._head_timer, self._body_timer):
                    if timer is not None:
                        timer.cancel()
                self._head_timer = self._body_timer = None

            # the parser's callbacks
            def on_message_begin(self) -> None:
                super().on_message_begin()
                self._head_bytes = 0
                guard.waiting(self.transport, self)
                self._arm_head()

            def on_url(self, url: bytes) -> None:
                self._count(len(url))
                super().on_url(url)

            def on_header(self, name: bytes, value: bytes) -> None:
                self._count(len(name) + len(value) + 4)
                super().on_header(name, value)

            def _count(self, n: int) -> None:
                self._head_bytes += n
                if self._head_bytes > limits.max_header_bytes:
                    self._close("head too large")

            def on_headers_complete(self) -> None:
                if self._head_timer is not None:
                    self._head_timer.cancel()
                    self._head_timer = None
                guard.headed(self.transport)
                super().on_headers_complete()
                if self.scope.get("method") not in ("GET", "HEAD", "DELETE", "OPTIONS"):
                    self._arm_body()

            def on_body(self, body: bytes) -> None:
                if self._body_timer is not None:
                    self._arm_body()
                super().on_body(body)

            def on_message_complete(self) -> None:
                if self._body_timer is not None:
                    self._body_timer.cancel()
                    self._body_timer = None
                super().on_message_complete()

        return GuardedHttpTools

    def config(self) -> dict[str, Any]:
        """The ``uvicorn.Config`` arguments that go with :meth:`protocol`."""
        return {"http": self.protocol(), "timeout_keep_alive": self.limits.keep_alive_timeout,
                "h11_max_incomplete_event_size": self.limits.max_header_bytes}
