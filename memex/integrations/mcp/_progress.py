"""A running cell's partial output as MCP progress notifications, for a client that sent a
progress token with its ``tools/call`` (the protocol's way to hear about a long request
before its result). Without a token nothing is listened to and nothing is sent.

Each notification's ``message`` is what the guest printed since the last one (stdout and
stderr in the order written), at most :data:`CHUNK` characters; with nothing printed, one
every :data:`HEARTBEAT` seconds says the cell still runs. ``progress`` is the seconds the
cell has run, so it only grows, as the protocol requires; there is no ``total``. What waits
to be sent is bounded (:data:`PENDING`): a cell printing faster than notifications go out
has the excess said as skipped, never held. The result still carries the whole output.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any

__all__ = ["CHUNK", "EVERY", "HEARTBEAT", "PENDING", "Progress", "progress_token"]

EVERY = 0.25
"""Seconds between two notifications, at least."""
HEARTBEAT = 5.0
"""Seconds of silence after which a notification says the cell still runs."""
CHUNK = 8192
"""Characters of output in one notification at most."""
PENDING = 65536
"""Characters of output waiting to be sent at most (the rest is counted as skipped)."""


def progress_token(ctx: Any) -> str | int | None:
    """The progress token the request carried, if any."""
    meta = getattr(ctx.request_context, "meta", None)
    token = meta.get("progress_token") if isinstance(meta, dict) else None
    return token if isinstance(token, (str, int)) and not isinstance(token, bool) else None


class Progress:
    """Hears a cell's output on the sandbox's thread (:meth:`heard`, quick and bounded) and
    sends it from the event loop (:meth:`pump`, cancelled when the call ends)."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.loop = asyncio.get_running_loop()
        self.wake = asyncio.Event()
        self.lock = threading.Lock()
        self.pending: list[str] = []
        self.size = 0
        self.skipped = 0
        self.sent = 0  # notifications sent

    def heard(self, stream: str, text: str) -> None:
        with self.lock:
            room = PENDING - self.size
            if room <= 0:
                self.skipped += len(text)
                return
            if len(text) > room:
                self.skipped += len(text) - room
                text = text[:room]
            self.pending.append(text)
            self.size += len(text)
        self.loop.call_soon_threadsafe(self.wake.set)

    def _take(self) -> str:
        with self.lock:
            text = "".join(self.pending)
            head, rest = text[:CHUNK], text[CHUNK:]
            self.pending, self.size = ([rest], len(rest)) if rest else ([], 0)
            skipped, self.skipped = self.skipped, 0
        if skipped:
            head += f"\n[{skipped} characters of output not sent as progress: the result " \
                    "holds them]\n"
        return head

    async def pump(self) -> None:
        began = last = time.monotonic()
        progress = 0.0
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), HEARTBEAT)
            self.wake.clear()
            wait = last + EVERY - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            message = self._take()
            now = time.monotonic()
            if not message:
                if now - last < HEARTBEAT:
                    continue
                message = f"running ({now - began:.0f} s)"
            with self.lock:
                if self.size:  # more than one chunk waits: go on at once
                    self.wake.set()
            progress = max(round(now - began, 3), progress + 0.001)
            await self.ctx.report_progress(progress, None, message)
            self.sent += 1
            last = now
