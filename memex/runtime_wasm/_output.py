"""Per-stream output capture with a byte cap and an explicit truncation marker."""

from __future__ import annotations

__all__ = ["StreamCapture"]


class StreamCapture:
    """Collects what the guest writes to one stream during a turn, up to ``cap`` bytes.

    Bytes past the cap are counted, not kept, so a print flood costs the host nothing but the
    callback; the text ends with a marker saying how much was dropped.
    """

    __slots__ = ("_chunks", "_kept", "cap", "dropped", "name")

    def __init__(self, name: str, cap: int) -> None:
        self.name = name
        self.cap = cap
        self._chunks: list[bytes] = []
        self._kept = 0
        self.dropped = 0

    def reset(self, cap: int) -> None:
        self.cap = cap
        self._chunks = []
        self._kept = 0
        self.dropped = 0

    def write(self, data: bytes) -> None:
        room = self.cap - self._kept
        if room >= len(data):
            self._chunks.append(bytes(data))
            self._kept += len(data)
        else:
            if room > 0:
                self._chunks.append(bytes(data[:room]))
                self._kept += room
            self.dropped += len(data) - max(room, 0)

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
