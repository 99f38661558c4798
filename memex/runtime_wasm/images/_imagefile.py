"""Image files: ``Sandbox.save``/``load`` files and the raw warm-image files of the cache.

A saved image stores only the pages that matter, compressed with LZ4, each run with a CRC-32:
when the session started from a warm image of this machine (most do), the pages its turns
changed, with the warm image named by its content hash; otherwise (or ``portable=True``) the
non-zero pages of the whole memory. Loading a file of the first kind maps that warm image and
copies the saved pages in. Any damage (a cut, a flipped byte, a header that lies) is an
``ImageError`` naming what is wrong; nothing half-loaded is ever used.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import lz4.block

from ...errors import ImageError
from .._bounded import inflate, json_loads
from ..engine._cache import atomic_write
from ._dirty import PAGE
from ._image import MemoryImage, mapped
from ._lz4 import compress_at, decompress_into, parallel_map

__all__ = ["ImageInfo", "open_raw_image", "read_image_file", "write_image_file",
           "write_raw_image"]

MAGIC = b"MEMEXIMG"
FORMAT_VERSION = 3
_HEADER = struct.Struct("<8sII")  # magic, version, header length
_RUN = struct.Struct("<QIII")  # memory offset, bytes, stored bytes, CRC-32 of the stored bytes
_V2_CHUNK = struct.Struct("<QI")
_RUN_MAX = 1 << 20
_END = b"MEMEXEND"  # a file cut anywhere, even at a run boundary, is detected
_MAX_MEMORY = 4 << 30
_MAX_HEADER = 1 << 20  # a save's description: its metadata (env, guest paths...)
_MAX_HEADER_CONTAINERS = 4096


@dataclass(frozen=True, kw_only=True)
class ImageInfo:
    binary_sha256: str
    memory_size: int
    meta: dict[str, object]


# ---- saves ------------------------------------------------------------------------------------
def write_image_file(path: Path, img: MemoryImage, binary_sha256: str,
                     meta: dict[str, object], *, portable: bool = False) -> int:
    """Write ``img`` to ``path`` (atomically); returns the file size."""
    base = None if portable else img.root.origin
    runs = _changed_runs(img) if base is not None else _whole_runs(img)
    body: list[bytes] = []
    count = 0
    for off, n, packed in runs:
        if packed:
            body += [_RUN.pack(off, n, len(packed), zlib.crc32(packed)), packed]
            count += 1
    header = json.dumps({"binary_sha256": binary_sha256, "memory_size": img.size,
                         "base": base, "codec": "lz4", "runs": count,
                         "meta": meta}).encode()
    blob = b"".join([_HEADER.pack(MAGIC, FORMAT_VERSION, len(header)), header, *body, _END])
    atomic_write(path, blob)
    return len(blob)


def _changed_runs(img: MemoryImage) -> list[tuple[int, int, bytes]]:
    """The pages the deltas above the root hold (the newest copy of each), as compressed runs
    of at most 1 MiB, read in place from the layers' files."""
    extents = img.newest_extents()
    sizes = {fd: os.fstat(fd).st_size for _, fd, _, _ in extents}
    with contextlib.ExitStack() as stack:
        base = {fd: stack.enter_context(mapped(fd, size)) for fd, size in sizes.items() if size}
        todo = [(page * PAGE + k, base[fd] + at + k, min(_RUN_MAX, n - k))
                for page, fd, at, n in extents for k in range(0, n, _RUN_MAX)]
        packed = parallel_map(lambda t: compress_at(t[1], t[2]), todo,
                              sum(t[2] for t in todo))
    return [(off, n, p) for (off, _, n), p in zip(todo, packed, strict=True)]


def _whole_runs(img: MemoryImage) -> list[tuple[int, int, bytes]]:
    """Every megabyte of the memory, compressed (an all-zero one as b"", to be left out),
    read in place: from the chain's root where no delta above it has a page in that
    megabyte, else from a copy with the newest pages laid over the root's."""
    root = img.root
    overlays: dict[int, list[tuple[int, int, int, int]]] = {}
    for page, fd, at, n in img.newest_extents() if img.is_delta else []:
        off, end = page * PAGE, page * PAGE + n
        while off < end:
            chunk = off // _RUN_MAX
            k = min(end, (chunk + 1) * _RUN_MAX) - off
            overlays.setdefault(chunk, []).append((off - chunk * _RUN_MAX, fd, at, k))
            at += k
            off += k
    zeros: dict[int, bytes] = {}
    with mapped(root.fd, root.size, offset=root.file_offset) as rbase:

        def one(off: int) -> bytes:
            n = min(_RUN_MAX, img.size - off)
            over = overlays.get(off // _RUN_MAX)
            if over is None and off + n <= root.size:
                packed = compress_at(rbase + off, n)
            else:
                buf = ctypes.create_string_buffer(n)
                have = max(0, min(n, root.size - off))
                if have:
                    ctypes.memmove(buf, rbase + off, have)
                view = memoryview(buf).cast("B")
                for into, fd, at, k in over or ():
                    if os.preadv(fd, [view[into : into + k]], at) != k:
                        raise ImageError("short read saving a memory image")
                del view
                packed = compress_at(ctypes.addressof(buf), n)
            if n not in zeros:
                zeros[n] = lz4.block.compress(bytes(n), store_size=False)
            return b"" if packed == zeros[n] else packed

        offs = range(0, img.size, _RUN_MAX)
        packed = parallel_map(one, offs, img.size)
    return [(off, min(_RUN_MAX, img.size - off), p)
            for off, p in zip(offs, packed, strict=True)]


def read_image_file(path: Path, binary_sha256: str, base: object = None, *,
                    pending: bool = False, max_memory: int = _MAX_MEMORY
                    ) -> tuple[MemoryImage, ImageInfo]:
    """The image saved in ``path``. ``base(name)`` finds a warm image by the name a save
    recorded (None when this machine has none); a save on a base it cannot find is refused.
    Every run's head and checksum is checked here; ``pending`` leaves the decompression to
    the image's first use (a load's restore decompresses straight into the new instance,
    where a run that does not decode is the same ImageError). Runs are in ascending order
    and never overlap, so decoding a file never writes more than the memory it declares,
    which may not pass ``max_memory``."""
    try:
        blob = Path(path).read_bytes()
    except OSError as exc:
        raise ImageError(f"cannot read image {path}: {exc}") from exc
    if len(blob) < _HEADER.size:
        raise ImageError(f"{path} is not a MemEx image (too short)")
    magic, version, hlen = _HEADER.unpack_from(blob)
    if magic != MAGIC:
        raise ImageError(f"{path} is not a MemEx image (bad magic)")
    if hlen > min(_MAX_HEADER, len(blob) - _HEADER.size):
        raise ImageError(f"{path} has a corrupt header (length {hlen})")
    if version not in (2, FORMAT_VERSION):
        raise ImageError(f"{path} has image format {version}; this MemEx reads 2 and "
                         f"{FORMAT_VERSION}")
    try:
        header = json_loads(blob[_HEADER.size : _HEADER.size + hlen], max_bytes=_MAX_HEADER,
                            max_containers=_MAX_HEADER_CONTAINERS)
        if not isinstance(header, dict):
            raise TypeError("not a map")
        size = int(header["memory_size"])
        sha = str(header["binary_sha256"])
        count = int(header["runs"] if version == 3 else header["chunks"])
        base_name = header.get("base") if version == 3 else None
        if version == 3 and header.get("codec") != "lz4":
            raise ValueError(f"unknown codec {header.get('codec')!r}")
    except (ValueError, KeyError, TypeError) as exc:
        raise ImageError(f"{path} has a corrupt header: {exc}") from exc
    if sha != binary_sha256:
        raise ImageError(
            f"{path} was saved from another guest binary ({sha[:12]}...; this one is "
            f"{binary_sha256[:12]}...)"
        )
    if size <= 0 or size % 65536 or size > _MAX_MEMORY:
        raise ImageError(f"{path} has an invalid memory size {size}")
    if size > max_memory:
        raise ImageError(f"{path} holds a memory of {size} bytes, more than the "
                         f"{max_memory} allowed (Limits.memory)")
    if not blob.endswith(_END):
        raise ImageError(f"{path} is truncated (no end marker)")
    body = memoryview(blob)[_HEADER.size + hlen : len(blob) - len(_END)]
    meta: dict[str, object] = header["meta"] if isinstance(header.get("meta"), dict) else {}
    info = ImageInfo(binary_sha256=sha, memory_size=size, meta=meta)
    if version == 2:
        chunks = _v2_runs(path, body, size)
        if len(chunks) != count:
            raise ImageError(f"{path} is truncated or corrupt ({len(chunks)} of {count} runs)")
        return MemoryImage.from_chunks(size, chunks), info
    runs = _v3_runs(path, body, size)
    if len(runs) != count:
        raise ImageError(f"{path} is truncated or corrupt ({len(runs)} of {count} runs)")
    root = None
    if base_name is not None:
        if not isinstance(base_name, str) or not callable(base):
            raise ImageError(f"{path} has a corrupt header (base {base_name!r})")
        root = base(base_name)
        if not isinstance(root, MemoryImage):
            raise ImageError(
                f"{path} was saved on top of warm image {base_name}, which this machine does "
                f"not have (it was built elsewhere or by another MemEx version); load it where "
                f"it was saved, or save it with portable=True")
        if root.size > size:
            raise ImageError(f"{path} is smaller than the warm image it was saved on")

    def fill(where: list[int]) -> None:
        def one(i: int) -> None:
            off, n, packed = runs[i]
            try:
                decompress_into(packed, where[i], n)
            except ValueError as exc:
                raise ImageError(f"{path} is corrupt: the run at offset {off}: {exc}") from exc

        parallel_map(one, range(len(runs)), sum(n for _, n, _ in runs))

    image = MemoryImage.from_runs(size, [(off, n) for off, n, _ in runs], fill, root=root,
                                  pending=pending)
    return image, info


def _v3_runs(path: Path, body: memoryview, size: int) -> list[tuple[int, int, memoryview]]:
    """The runs (offset, bytes, LZ4 block), every head and checksum checked before any is
    decompressed (the checksums on every core: zlib releases the GIL for them)."""
    runs: list[tuple[int, int, memoryview]] = []
    crcs: list[int] = []
    pos = end = 0
    while pos < len(body):
        if pos + _RUN.size > len(body):
            raise ImageError(f"{path} is truncated or corrupt (cut in a run's head)")
        off, n, stored, crc = _RUN.unpack_from(body, pos)
        pos += _RUN.size
        if pos + stored > len(body):
            raise ImageError(f"{path} is truncated or corrupt (run past the end)")
        if off % PAGE or n % PAGE or not 0 < n <= _RUN_MAX or off + n > size or off < end:
            raise ImageError(f"{path} has a run outside the memory or out of order (offset "
                             f"{off}, {n} bytes)")
        end = off + n
        runs.append((off, n, body[pos : pos + stored]))
        crcs.append(crc)
        pos += stored
    sums = parallel_map(lambda run: zlib.crc32(run[2]), runs, len(body))
    for (off, _, _), want, got in zip(runs, crcs, sums, strict=True):
        if got != want:
            raise ImageError(f"{path} is corrupt: the run at offset {off} fails its checksum")
    return runs


def _v2_runs(path: Path, body: memoryview, size: int) -> list[tuple[int, bytes]]:
    """Format 2 (zlib, 1 MiB chunks): files saved by earlier MemEx versions still load. Each
    chunk inflates to at most 1 MiB, in ascending order."""
    runs: list[tuple[int, bytes]] = []
    pos = end = 0
    try:
        while pos < len(body):
            off, n = _V2_CHUNK.unpack_from(body, pos)
            if pos + _V2_CHUNK.size + n > len(body):
                raise ImageError(f"{path} is truncated or corrupt (chunk past the end)")
            pos += _V2_CHUNK.size
            if off % _RUN_MAX or off < end or off >= size:
                raise ImageError(f"{path} has a chunk outside the memory or out of order")
            data = inflate(body[pos : pos + n], min(_RUN_MAX, size - off))
            pos += n
            end = off + len(data)
            runs.append((off, data))
    except (struct.error, ValueError) as exc:
        raise ImageError(f"{path} is truncated or corrupt: {exc}") from exc
    return runs


# ---- raw files (warm images) ----------------------------------------------------------------
_RAW_MAGIC = b"MEMEXRAW"
_RAW_VERSION = 1
_RAW_HEAD = 4096  # the memory starts one page in, so the file maps without a copy


def write_raw_image(path: Path, img: MemoryImage, binary_sha256: str,
                    meta: dict[str, object], *, name: str | None = None) -> None:
    """An image file that is mapped, not read: a one-page header, then the memory as it is
    (all-zero megabytes left as holes, so the file is sparse). For images every process of a
    machine starts from (warm images): opening one costs a system call, not a decompression.
    ``name`` (with the content's hash) is what saves made on top of it record.
    Written to a temporary name and renamed, so a process that has one open keeps its own."""
    view = img.view()
    try:
        content = hashlib.sha256(view).hexdigest()[:32] if name else ""
        header = json.dumps({"binary_sha256": binary_sha256, "memory_size": img.size,
                             "name": f"{name}:{content}" if name else None,
                             "meta": meta}).encode()
        head = _HEADER.pack(_RAW_MAGIC, _RAW_VERSION, len(header)) + header
        if len(head) > _RAW_HEAD:
            raise ImageError("an image's description does not fit its header page")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                os.pwrite(fd, head, 0)
                zero = bytes(_RUN_MAX)
                for off in range(0, img.size, _RUN_MAX):
                    chunk = view[off : off + _RUN_MAX]
                    if chunk != zero[: len(chunk)]:
                        done = 0
                        while done < len(chunk):
                            done += os.pwrite(fd, chunk[done:], _RAW_HEAD + off + done)
                os.ftruncate(fd, _RAW_HEAD + img.size)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    finally:
        del view


def open_raw_image(path: Path, binary_sha256: str) -> MemoryImage:
    """The image in a file from ``write_raw_image``, mapped from the file itself (frozen)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise ImageError(f"cannot open image {path}: {exc}") from exc
    try:
        head = os.pread(fd, _RAW_HEAD, 0)
        if len(head) < _HEADER.size:
            raise ImageError(f"{path} is not a MemEx raw image (too short)")
        magic, version, hlen = _HEADER.unpack_from(head)
        if magic != _RAW_MAGIC or version != _RAW_VERSION or _HEADER.size + hlen > _RAW_HEAD:
            raise ImageError(f"{path} is not a MemEx raw image of version {_RAW_VERSION}")
        try:
            header = json_loads(head[_HEADER.size : _HEADER.size + hlen], max_bytes=_RAW_HEAD,
                                max_containers=_MAX_HEADER_CONTAINERS)
            if not isinstance(header, dict):
                raise TypeError("not a map")
            size, sha = int(header["memory_size"]), str(header["binary_sha256"])
            name = header.get("name")
            if name is not None and not isinstance(name, str):
                raise TypeError("name")
        except (ValueError, KeyError, TypeError) as exc:
            raise ImageError(f"{path} has a corrupt header") from exc
        if sha != binary_sha256:
            raise ImageError(f"{path} was made from another guest binary")
        if size <= 0 or size % 65536 or size > _MAX_MEMORY:
            raise ImageError(f"{path} has an invalid memory size {size}")
        if os.fstat(fd).st_size != _RAW_HEAD + size:
            raise ImageError(f"{path} is truncated or padded (size does not match its header)")
    except BaseException:
        os.close(fd)
        raise
    img = MemoryImage(fd, size, offset=_RAW_HEAD, origin=name)
    img.freeze()
    return img
