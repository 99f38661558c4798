"""Host-side copies of a guest's linear memory: the basis of rollback, checkpoint, fork,
preloading and save/load.

A guest's whole state lives in its linear memory (globals, heap, the interpreter), so copying
the memory of an idle guest into a fresh instance of the same binary reproduces it. Copies go
through ``ctypes.memmove`` between raw pointers into reusable anonymous mappings (no Python
``bytes`` of the image is ever built on the hot path). Host-side WASI state (open file
descriptors) is not part of an image.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import mmap
import os
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

MAGIC = b"MEMEXIMG"
FORMAT_VERSION = 2
_HEADER = struct.Struct("<8sII")
_CHUNK = 1 << 20
_END = b"MEMEXEND"  # a file cut anywhere, even at a chunk boundary, is detected


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.mmap.restype = ctypes.c_void_p
_PROT_RW = mmap.PROT_READ | mmap.PROT_WRITE
_MAP_PRIVATE = mmap.MAP_PRIVATE
_MAP_FIXED = 0x10
_MAP_FAILED = ctypes.c_void_p(-1).value


class MemoryImage:
    """One immutable image of a guest's linear memory, held in a memfd.

    Restoring maps the image copy-on-write over the fresh instance's memory (``mmap`` with
    ``MAP_PRIVATE | MAP_FIXED``), so a restore or fork costs page-table work, not a copy, and
    every sandbox restored from one image shares its unmodified pages. Because private
    mappings read through to the file, an image is never written after it is first used.
    """

    __slots__ = ("__weakref__", "_fd", "_view_map", "size")

    def __init__(self, fd: int, size: int) -> None:
        self._fd = fd
        self.size = size
        self._view_map: mmap.mmap | None = None

    @classmethod
    def _new_fd(cls, size: int) -> int:
        fd = os.memfd_create("memex-image", os.MFD_CLOEXEC)
        os.ftruncate(fd, size)
        return fd

    @classmethod
    def capture(cls, inst: Instance) -> MemoryImage:
        """Copy the live memory of an idle instance (the kernel copies: no user page faults)."""
        size = inst.memory_size()
        img = cls(cls._new_fd(size), size)
        try:
            img._write_from(inst.memory_address(), size)
        except BaseException:
            img.close()
            raise
        return img

    def overwrite_from(self, inst: Instance) -> None:
        """Recapture into this image's own pages (no page allocation). Only for an image that
        no instance maps and nobody else holds."""
        size = inst.memory_size()
        if size > self.size:
            os.ftruncate(self._fd, size)
        if self._view_map is not None:
            self._view_map.close()
            self._view_map = None
        self._write_from(inst.memory_address(), size)
        self.size = size

    def _write_from(self, addr: int, size: int) -> None:
        view = memoryview((ctypes.c_char * size).from_address(addr)).cast("B")
        off = 0
        while off < size:
            n = os.pwrite(self._fd, view[off : off + _CHUNK * 64], off)
            if n <= 0:
                raise ImageError("short write capturing a memory image")
            off += n

    @classmethod
    def from_chunks(cls, size: int, chunks: list[tuple[int, bytes]]) -> MemoryImage:
        fd = cls._new_fd(size)
        try:
            for offset, data in chunks:
                os.pwrite(fd, data, offset)
        except BaseException:
            os.close(fd)
            raise
        return cls(fd, size)

    def restore_into(self, inst: Instance) -> None:
        """Make ``inst`` (a fresh, idle instance of the same binary) hold this image."""
        if self._fd < 0:
            raise ImageError("memory image is closed")
        inst.grow_to(self.size)
        if inst.memory_size() < self.size:
            raise ImageError(
                f"memory size mismatch restoring an image ({inst.memory_size()} < {self.size})"
            )
        dst = inst.memory_address()
        got = _libc.mmap(dst, self.size, _PROT_RW, _MAP_PRIVATE | _MAP_FIXED, self._fd, 0)
        if got != dst:  # mapping refused (e.g. a seccomp policy): let the kernel copy instead
            target = memoryview((ctypes.c_char * self.size).from_address(dst)).cast("B")
            off = 0
            while off < self.size:
                n = os.preadv(self._fd, [target[off:]], off)
                if n <= 0:
                    raise ImageError("short read restoring a memory image")
                off += n

    def _mapped(self) -> mmap.mmap:
        if self._view_map is None:
            self._view_map = mmap.mmap(self._fd, self.size, mmap.MAP_SHARED, mmap.PROT_READ)
        return self._view_map

    def view(self) -> memoryview:
        return memoryview(self._mapped())[: self.size]

    def close(self) -> None:
        if self._view_map is not None:
            try:
                self._view_map.close()
            except BufferError:
                return  # a view is still exported; the fd is closed when this is collected
            self._view_map = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


@dataclass(frozen=True, kw_only=True)
class ImageInfo:
    binary_sha256: str
    memory_size: int
    meta: dict[str, object]


def write_image_file(
    path: Path, img: MemoryImage, binary_sha256: str, meta: dict[str, object]
) -> int:
    """Compressed image on disk: a header naming the format version and the binary, then
    1 MiB chunks (all-zero chunks are skipped). Returns the file size."""
    view = img.view()
    zero = bytes(_CHUNK)
    body: list[bytes] = []
    count = 0
    for off in range(0, img.size, _CHUNK):
        chunk = view[off : off + _CHUNK]
        if chunk == zero[: len(chunk)]:
            continue
        data = zlib.compress(chunk, 1)
        body.append(struct.pack("<QI", off, len(data)))
        body.append(data)
        count += 1
    del view
    header = json.dumps(
        {"binary_sha256": binary_sha256, "memory_size": img.size, "chunk": _CHUNK,
         "chunks": count, "meta": meta}
    ).encode()
    blob = b"".join([_HEADER.pack(MAGIC, FORMAT_VERSION, len(header)), header, *body, _END])
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
        count = int(header["chunks"])
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
    if not blob.endswith(_END):
        raise ImageError(f"{path} is truncated (no end marker)")
    end = len(blob) - len(_END)
    try:
        while pos < end:
            off, n = struct.unpack_from("<QI", blob, pos)
            if pos + 12 + n > end:
                raise ImageError(f"{path} is truncated or corrupt (chunk past the end)")
            pos += 12
            data = zlib.decompress(blob[pos : pos + n])
            pos += n
            if off % chunk or off + len(data) > size or len(data) > chunk:
                raise ImageError(f"{path} has a chunk outside the memory")
            chunks.append((off, data))
    except (struct.error, zlib.error) as exc:
        raise ImageError(f"{path} is truncated or corrupt: {exc}") from exc
    if len(chunks) != count:
        raise ImageError(f"{path} is truncated or corrupt ({len(chunks)} of {count} chunks)")
    img = MemoryImage.from_chunks(size, chunks)
    meta = header.get("meta") if isinstance(header.get("meta"), dict) else {}
    return img, ImageInfo(binary_sha256=sha, memory_size=size, meta=meta)


