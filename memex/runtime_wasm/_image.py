"""Host-side copies of a guest's linear memory: the basis of rollback, checkpoint, fork,
preloading and save/load.

A guest's whole state lives in its linear memory (globals, heap, the interpreter), so copying
the memory of an idle guest into a fresh instance of the same binary reproduces it. Copies go
through ``ctypes.memmove`` between raw pointers into reusable anonymous mappings (no Python
``bytes`` of the image is ever built on the hot path). Host-side WASI state (open file
descriptors) is not part of an image.
"""

from __future__ import annotations

import ctypes
import json
import mmap

import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ImageError
from ._cache import atomic_write

if TYPE_CHECKING:
    from ._instance import Instance

__all__ = ["ImageInfo", "MemoryImage", "read_image_file", "write_image_file"]

_HUGE = 2 << 20
MAGIC = b"MEMEXIMG"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sII")
_CHUNK = 1 << 20


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", 14)


def advise_hugepages(addr: int, length: int) -> None:
    """Ask for transparent huge pages on a region about to be written in full: one fault per
    2 MiB instead of per 4 KiB is most of the cost of filling a fresh memory."""
    start = _round_up(addr, _HUGE)
    end = (addr + length) // _HUGE * _HUGE
    if end > start:
        _libc.madvise(start, end - start, _MADV_HUGEPAGE)


class MemoryImage:
    """A reusable buffer holding one image of a guest's linear memory."""

    __slots__ = ("_addr", "_buf", "size")

    def __init__(self, capacity: int) -> None:
        capacity = max(_round_up(capacity, _HUGE), _HUGE)
        self._buf = mmap.mmap(-1, capacity)
        self._addr = ctypes.addressof(ctypes.c_char.from_buffer(self._buf))
        advise_hugepages(self._addr, capacity)
        self.size = 0

    @property
    def capacity(self) -> int:
        return len(self._buf)

    @classmethod
    def capture(cls, inst: Instance, reuse: MemoryImage | None = None) -> MemoryImage:
        size = inst.memory_size()
        img = reuse if reuse is not None and reuse.capacity >= size else cls(size)
        ctypes.memmove(img._addr, inst.memory_address(), size)
        img.size = size
        return img

    @classmethod
    def from_chunks(cls, size: int, chunks: list[tuple[int, bytes]]) -> MemoryImage:
        img = cls(size)
        for offset, data in chunks:
            img._buf[offset : offset + len(data)] = data
        img.size = size
        return img

    def copy(self) -> MemoryImage:
        other = MemoryImage(self.size)
        ctypes.memmove(other._addr, self._addr, self.size)
        other.size = self.size
        return other

    def restore_into(self, inst: Instance) -> None:
        """Make ``inst`` (a fresh, idle instance of the same binary) hold this image."""
        inst.grow_to(self.size)
        if inst.memory_size() != self.size:
            raise ImageError(
                f"memory size mismatch restoring an image ({inst.memory_size()} != {self.size})"
            )
        dst = inst.memory_address()
        advise_hugepages(dst, self.size)
        ctypes.memmove(dst, self._addr, self.size)

    def view(self) -> memoryview:
        return memoryview(self._buf)[: self.size]

    def close(self) -> None:
        if not self._buf.closed:
            self._buf.close()


@dataclass(frozen=True, kw_only=True)
class ImageInfo:
    binary_sha256: str
    memory_size: int
    meta: dict[str, object]


def write_image_file(path: Path, img: MemoryImage, binary_sha256: str, meta: dict[str, object]) -> int:
    """Compressed image on disk: a header naming the format version and the binary, then
    1 MiB chunks (all-zero chunks are skipped). Returns the file size."""
    header = json.dumps(
        {"binary_sha256": binary_sha256, "memory_size": img.size, "chunk": _CHUNK, "meta": meta}
    ).encode()
    parts = [_HEADER.pack(MAGIC, FORMAT_VERSION, len(header)), header]
    view = img.view()
    zero = bytes(_CHUNK)
    for off in range(0, img.size, _CHUNK):
        chunk = view[off : off + _CHUNK]
        if chunk == zero[: len(chunk)]:
            continue
        data = zlib.compress(chunk, 1)
        parts.append(struct.pack("<QI", off, len(data)))
        parts.append(data)
    blob = b"".join(parts)
    atomic_write(path, blob)
    return len(blob)


def read_image_file(path: Path, binary_sha256: str) -> tuple[MemoryImage, ImageInfo]:
    try:
        blob = Path(path).read_bytes()
    except OSError as exc:
        raise ImageError(f"cannot read image {path}: {exc}") from exc
    if len(blob) < _HEADER.size:
        raise ImageError(f"{path} is not a MemEx image (too short)")
    magic, version, hlen = _HEADER.unpack_from(blob)
    if magic != MAGIC:
        raise ImageError(f"{path} is not a MemEx image (bad magic)")
    if version != FORMAT_VERSION:
        raise ImageError(f"{path} has image format {version}; this MemEx reads {FORMAT_VERSION}")
    try:
        header = json.loads(blob[_HEADER.size : _HEADER.size + hlen])
        size = int(header["memory_size"])
        chunk = int(header["chunk"])
        sha = str(header["binary_sha256"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ImageError(f"{path} has a corrupt header") from exc
    if sha != binary_sha256:
        raise ImageError(
            f"{path} was saved from another guest binary ({sha[:12]}...; this one is "
            f"{binary_sha256[:12]}...)"
        )
    if size <= 0 or size % 65536 or size > (4 << 30):
        raise ImageError(f"{path} has an invalid memory size {size}")
    pos = _HEADER.size + hlen
    chunks: list[tuple[int, bytes]] = []
    try:
        while pos < len(blob):
            off, n = struct.unpack_from("<QI", blob, pos)
            pos += 12
            data = zlib.decompress(blob[pos : pos + n])
            pos += n
            if off % chunk or off + len(data) > size or len(data) > chunk:
                raise ImageError(f"{path} has a chunk outside the memory")
            chunks.append((off, data))
    except (struct.error, zlib.error) as exc:
        raise ImageError(f"{path} is truncated or corrupt: {exc}") from exc
    img = MemoryImage.from_chunks(size, chunks)
    meta = header.get("meta") if isinstance(header.get("meta"), dict) else {}
    return img, ImageInfo(binary_sha256=sha, memory_size=size, meta=meta)


