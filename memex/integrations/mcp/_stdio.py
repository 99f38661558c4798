"""``memex mcp``'s stdio wire, read and written in the event loop. The SDK's own transport
takes a worker thread for every line read, every write and every flush: three thread hops on
each call, about as much as the rest of the server's part of a call (bench/mcp.py).

Standard input and output are claimed as the SDK claims them (while serving, fd 0 reads the
null device and fd 1 writes to stderr, so stray output of a handler or a child process never
lands on the wire) and given back at the end. Only pipes and sockets are read this way; a
file or a terminal is left to the SDK's transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import stat
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio

__all__ = ["OVERLONG", "Lines", "wire"]

OVERLONG = "(a line over the server's bound, dropped unread)"
"""What a line over the bound reads as: no JSON, so the server answers it with a parse error."""

_CHUNK = 1 << 16
_log = logging.getLogger(__name__)


class Lines:
    """The wire's lines as text (UTF-8, undecodable bytes replaced, as the SDK reads them).
    A line over ``limit`` bytes reads as :data:`OVERLONG`; at most ``limit`` and one chunk
    are held: the rest of a longer line is dropped as it comes."""

    def __init__(self, reader: asyncio.StreamReader, limit: int,
                 stopped: asyncio.Future[None] | None = None) -> None:
        self._reader, self._limit, self._stopped = reader, limit, stopped
        self._buf = bytearray()
        self._seen = 0  # bytes of _buf already searched for a newline
        self._dropping = False

    def __aiter__(self) -> Lines:
        return self

    async def __anext__(self) -> str:
        while True:
            if self._stopped is not None and self._stopped.done():
                raise StopAsyncIteration  # no one reads the answers: the lines end here
            i = self._buf.find(b"\n", self._seen)
            if i >= 0:
                over = self._dropping or i > self._limit
                line = "" if over else self._buf[:i].decode("utf-8", "replace")
                del self._buf[:i + 1]
                self._seen, self._dropping = 0, False
                return OVERLONG if over else line
            if len(self._buf) > self._limit:
                self._buf.clear()
                self._dropping = True
            self._seen = len(self._buf)
            chunk = await self._reader.read(_CHUNK)
            if not chunk:  # the end: a last line without its newline is still a line
                if not self._buf and not self._dropping:
                    raise StopAsyncIteration
                chunk = b"\n"
            self._buf += chunk


class _Out:
    """The wire's writing side: ``write`` queues, ``flush`` waits while the reader lags.
    Once the reader is gone, what is written goes nowhere (the input ends: see ``wire``)."""

    def __init__(self, writer: asyncio.StreamWriter, gone: asyncio.Future[None]) -> None:
        self._writer, self._gone = writer, gone

    async def write(self, text: str) -> None:
        if not self._gone.done():
            self._writer.write(text.encode("utf-8"))

    async def flush(self) -> None:
        if self._gone.done():
            return
        with contextlib.suppress(ConnectionError):  # the reader just went: gone is set
            await self._writer.drain()


class _Flow(asyncio.streams.FlowControlMixin):
    """The writing pipe's protocol: pauses ``drain`` while the reader lags; ``gone`` is set
    once the pipe is closed (all that was queued written, or the reader gone)."""

    def __init__(self) -> None:
        super().__init__()
        self.gone = asyncio.get_running_loop().create_future()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if not self.gone.done():
            self.gone.set_result(None)


def _pipe_or_socket(fd: int) -> bool:
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def _stderr_or_null() -> int:
    """Where stray writes to fd 1 go while serving: stderr, or nowhere when it is closed."""
    try:
        return os.dup(2)
    except OSError:
        return os.open(os.devnull, os.O_WRONLY)


@contextlib.contextmanager
def _claimed(fd: int, diversion: int) -> Iterator[int]:
    """fd's wire on a private descriptor while fd points at ``diversion`` (which this
    closes); at the end fd is the wire again, in blocking mode as it was given."""
    try:
        private = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
        try:
            os.dup2(diversion, fd)
        except OSError:
            os.close(private)
            raise
    finally:
        os.close(diversion)
    try:
        yield private
    finally:
        with contextlib.suppress(OSError):
            os.set_blocking(private, True)
        os.dup2(private, fd)
        os.close(private)


def _reader_left(r_transport: asyncio.BaseTransport, serving: list[bool]) -> None:
    if not serving:
        return  # the wire's own close at the end of serving, not the reader leaving
    _log.warning("the client stopped reading the server's output: stopping as at the end "
                 "of the input")
    r_transport.close()


@contextlib.asynccontextmanager
async def wire(limit: int) -> AsyncIterator[tuple[Any, Any]]:
    """(lines in, text out) for the SDK's ``stdio_server(stdin, stdout)``, or (None, None)
    when stdin or stdout is no pipe or socket (the SDK's transport then claims them)."""
    if not (_pipe_or_socket(0) and _pipe_or_socket(1)):
        yield None, None
        return
    loop = asyncio.get_running_loop()
    with _claimed(0, os.open(os.devnull, os.O_RDONLY)) as fd_in, \
            _claimed(1, _stderr_or_null()) as fd_out:
        reader = asyncio.StreamReader(loop=loop)
        r_transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader, loop=loop),
            os.fdopen(fd_in, "rb", buffering=0, closefd=False))
        try:
            w_transport, w_protocol = await loop.connect_write_pipe(
                _Flow, os.fdopen(fd_out, "wb", buffering=0, closefd=False))
            writer = asyncio.StreamWriter(w_transport, w_protocol, None, loop)
            gone = w_protocol.gone
            # The client closed its end of our output: nothing it sends can be answered, so
            # the input ends as at the end of stdin (the server stops, sessions are ended).
            serving = [True]
            gone.add_done_callback(lambda _: _reader_left(r_transport, serving))
            try:
                yield Lines(reader, limit, gone), _Out(writer, gone)
            finally:
                serving.clear()
                # What is still queued goes out, unless the reader stopped reading.
                writer.close()
                with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                    await w_protocol.gone
                if not w_protocol.gone.done():
                    w_transport.abort()
        finally:
            r_transport.close()
