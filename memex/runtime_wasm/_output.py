"""Per-stream output capture with a byte cap and an explicit truncation marker, and an
optional listener that hears the kept text as the guest writes it (``Sandbox.run(...,
on_output=...)``)."""

from __future__ import annotations

import codecs
import contextlib
from collections.abc import Callable

__all__ = ["OutputListener", "StreamCapture"]

OutputListener = Callable[[str, str], None]  # (stream name, text)


class StreamCapture:
    """Collects what the guest writes to one stream during a turn, up to ``cap`` bytes.

    Bytes past the cap are counted, not kept, so a print flood costs the host nothing but the
    callback; the text ends with a marker saying how much was dropped.
    """

    __slots__ = ("_chunks", "_decoder", "_kept", "cap", "dropped", "listener", "name")

    def __init__(self, name: str, cap: int) -> None:
        self.name = name
        self.cap = cap
        self._chunks: list[bytes] = []
        self._kept = 0
        self.dropped = 0
        self.listener: OutputListener | None = None
        self._decoder: codecs.IncrementalDecoder | None = None

    def reset(self, cap: int, listener: OutputListener | None = None) -> None:
        self.cap = cap
        self._chunks = []
        self._kept = 0
        self.dropped = 0
        self.listener = listener
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace") if listener else None

    def write(self, data: bytes) -> None:
        room = self.cap - self._kept
        if room >= len(data):
            kept = bytes(data)
            self._chunks.append(kept)
            self._kept += len(data)
        else:
            kept = bytes(data[:room]) if room > 0 else b""
            if kept:
                self._chunks.append(kept)
                self._kept += room
            self.dropped += len(data) - max(room, 0)
        if self.listener is not None and kept:
            self._tell(kept, final=False)

    def _tell(self, data: bytes, *, final: bool) -> None:
        """Hand the listener the text of ``data`` (a listener that raises is ignored: what
        the host does with output must never stop the guest)."""
        assert self.listener is not None and self._decoder is not None
        text = self._decoder.decode(data, final)
        if text:
            with contextlib.suppress(Exception):
                self.listener(self.name, text)

    def finish(self) -> None:
        """End of the turn: the listener hears any bytes of an unfinished character, then
        nothing more."""
        if self.listener is not None:
            self._tell(b"", final=True)
        self.listener = self._decoder = None

    @property
    def truncated(self) -> bool:
        return self.dropped > 0

    def text(self) -> str:
        out = b"".join(self._chunks).decode("utf-8", errors="replace")
        if self.dropped:
            out += (
                f"\n[memex: {self.name} truncated at {self.cap} bytes; "
                f"{self.dropped} more bytes dropped]\n"
            )
        return out
