"""The seam backends use to move a guest between processes (``memex.backends``).

A checkpoint's memory image crosses a process boundary as a file descriptor (a memfd, passed
over a Unix socket: no copy) or as compressed bytes (to another machine), and a sandbox is
rebuilt around it with its own door. These functions are public (``memex.runtime_wasm``) so
that no other package reaches into the sandbox's private state.
"""

from __future__ import annotations

import array
import contextlib
import os
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError, ImageError
from ._bounded import DecodeCost, inflate, unpack_bounded
from ._door import Door, _msgpack
from ._records import Limits, Mount
from ._sandbox import Checkpoint, Sandbox
from .images._dirty import PAGE
from .images._image import MemoryImage

__all__ = [
    "checkpoint_from_bytes",
    "checkpoint_from_fds",
    "checkpoint_to_bytes",
    "checkpoint_to_fds",
    "open_from_checkpoint",
    "scratch_dir",
]


def _key_to_wire(key: tuple[Any, ...]) -> list[Any]:
    flavour, paths, env = key
    return [flavour, [[g, bool(w)] for g, w in paths], [[k, v] for k, v in env]]


def _key_from_wire(wire: Any) -> tuple[Any, ...]:
    try:
        flavour, paths, env = wire
        return (str(flavour), tuple((str(g), bool(w)) for g, w in paths),
                tuple((str(k), str(v)) for k, v in env))
    except (TypeError, ValueError) as exc:
        raise ImageError(f"a checkpoint's description is malformed: {exc}") from exc


def checkpoint_to_fds(cp: Checkpoint) -> tuple[list[int], dict[str, Any]]:
    """New file descriptors of the checkpoint's image chain, root first (the caller closes
    them), and the msgpack-able description ``checkpoint_from_fds`` needs. A delta crosses as
    its own memfd and page map, so handing a checkpoint to another process costs what the
    session changed, not a copy of its memory."""
    chain = cp._image.chain()
    layers: list[dict[str, Any]] = [{"size": chain[0].size, "offset": chain[0].file_offset}]
    for layer in chain[1:]:
        flat_map = array.array("Q", [x for pair in sorted(layer.pages.items()) for x in pair])
        layers.append({"size": layer.size, "pages": flat_map.tobytes()})
    fds: list[int] = []
    try:
        for img in chain:
            fds.append(os.dup(img.fd))
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return fds, {"size": cp.size, "turns": cp.turns, "key": _key_to_wire(cp._owner_key),
                 "layers": layers}


def checkpoint_from_fds(fds: Sequence[int], meta: dict[str, Any]) -> Checkpoint:
    """A checkpoint owning ``fds`` (from ``checkpoint_to_fds``, possibly of another process).
    Closes them all when the description is malformed or does not fit the files."""
    try:
        size, turns = int(meta["size"]), int(meta["turns"])
        key = _key_from_wire(meta["key"])
        layers = meta["layers"]
        if not isinstance(layers, list) or len(layers) != len(fds) or not layers:
            raise ImageError(f"a checkpoint of {len(fds)} files describes {len(layers)} layers")
        img: MemoryImage | None = None
        for fd, layer in zip(fds, layers, strict=True):
            img = _layer(fd, layer, img)
        assert img is not None
        if img.size != size:
            raise ImageError("a checkpoint's layers do not add up to its size")
    except (KeyError, TypeError, ValueError, OSError, ImageError) as exc:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        if isinstance(exc, ImageError):
            raise
        raise ImageError(f"a checkpoint's description is malformed: {exc}") from exc
    return Checkpoint(img, key, turns)


def _layer(fd: int, layer: dict[str, Any], parent: MemoryImage | None) -> MemoryImage:
    size = int(layer["size"])
    have = os.fstat(fd).st_size
    if size <= 0 or size % 65536 or size > (4 << 30):
        raise ImageError(f"a checkpoint layer of {size} bytes is not a guest memory")
    if parent is None:
        offset = int(layer.get("offset", 0))
        if offset < 0 or offset % PAGE or have < offset + size:
            raise ImageError(f"a checkpoint image of {size} bytes does not fit its file")
        img = MemoryImage(fd, size, offset=offset)
    else:
        flat = bytes(layer["pages"])
        if len(flat) % 16 or len(flat) // 16 > size // PAGE:
            raise ImageError("a checkpoint delta's page map does not fit its memory")
        raw = array.array("Q")
        raw.frombytes(flat)
        pages = dict(zip(raw[0::2], raw[1::2], strict=True))
        if size < parent.size or any(p * PAGE >= size or at % PAGE or at + PAGE > have
                                     for p, at in pages.items()):
            raise ImageError("a checkpoint delta has pages outside its memory or its file")
        img = MemoryImage(fd, size, parent=parent, pages=pages)
    img.freeze()
    return img


_MAGIC = b"MEMEXCP1"
_CHUNK = 1 << 20
_ENTRY = struct.Struct("<QI")
_MAX_MEMORY = 4 << 30  # a wasm32 memory
_MAX_HEADER = 64 << 10


def _header_cost() -> DecodeCost:
    return DecodeCost(containers=256, items=4096, ext_bytes=0)


def checkpoint_to_bytes(cp: Checkpoint, *, level: int = 1) -> bytes:
    """The checkpoint as one self-describing blob (zlib chunks; all-zero chunks skipped), to
    move a session to another machine."""
    img = cp._image
    view = img.view()
    zero = bytes(_CHUNK)
    body: list[bytes] = []
    try:
        for off in range(0, img.size, _CHUNK):
            chunk = view[off: off + _CHUNK]
            if chunk == zero[: len(chunk)]:
                continue
            data = zlib.compress(chunk, level)
            body += [_ENTRY.pack(off, len(data)), data]
    finally:
        del view
    head: bytes = _msgpack().packb({"size": img.size, "turns": cp.turns,
                                 "key": _key_to_wire(cp._owner_key)}, use_bin_type=True)
    return b"".join([_MAGIC, struct.pack("<I", len(head)), head, *body])


def checkpoint_from_bytes(blob: bytes | bytearray | memoryview, *,
                          max_memory: int = _MAX_MEMORY) -> Checkpoint:
    """Rebuild a checkpoint from ``checkpoint_to_bytes``; a corrupt blob, or one whose memory
    would pass ``max_memory`` bytes, raises ImageError. Decoding is bounded before it
    allocates: the header is small, chunks come in ascending order and each inflates to at
    most 1 MiB, so a blob never costs more than the memory it declares."""
    data = memoryview(blob).cast("B")
    if len(data) < 12 or bytes(data[:8]) != _MAGIC:
        raise ImageError("not a MemEx checkpoint blob (bad magic)")
    (hlen,) = struct.unpack_from("<I", data, 8)
    if hlen > _MAX_HEADER or 12 + hlen > len(data):
        raise ImageError("checkpoint blob truncated or corrupt in its header")
    try:
        meta = unpack_bounded(data[12: 12 + hlen], _header_cost())
        size, turns = int(meta["size"]), int(meta["turns"])
        key = _key_from_wire(meta["key"])
    except ImageError:
        raise
    except Exception as exc:
        raise ImageError(f"checkpoint blob has a corrupt header: {exc}") from exc
    if size <= 0 or size % 65536 or size > min(max_memory, _MAX_MEMORY):
        raise ImageError(f"checkpoint blob has an invalid memory size {size}"
                         + (f" (at most {max_memory})" if size > max_memory else ""))
    pos = 12 + hlen
    fd = MemoryImage._new_fd(size)
    try:
        end = 0  # chunks are in ascending order and never overlap
        while pos < len(data):
            if pos + _ENTRY.size > len(data):
                raise ImageError("checkpoint blob truncated in a chunk's head")
            off, n = _ENTRY.unpack_from(data, pos)
            pos += _ENTRY.size
            if pos + n > len(data):
                raise ImageError("checkpoint blob truncated in a chunk")
            if off % _CHUNK or off < end or off >= size:
                raise ImageError("checkpoint blob has a chunk outside the memory or out of "
                                 "order")
            try:
                chunk = inflate(data[pos: pos + n], min(_CHUNK, size - off))
            except ValueError as exc:
                raise ImageError(f"checkpoint blob is corrupt at offset {off}: {exc}") from None
            pos += n
            os.pwrite(fd, chunk, off)
            end = off + len(chunk)
    except BaseException:
        os.close(fd)
        raise
    return Checkpoint(MemoryImage(fd, size), key, turns)


def open_from_checkpoint(cp: Checkpoint | None, *, limits: Limits | None,
                         mounts: Sequence[Mount], preload: Sequence[str], door: Door,
                         env: dict[str, str] | None, scratch_from: Path | None = None,
                         packages: Sequence[str] = ()) -> Sandbox:
    """A new sandbox serving ``door``, holding ``cp``'s guest state (a fresh one for None)
    and a copy of the files in ``scratch_from`` in its /tmp: how a backend resumes a session
    in another process (a fork within one process is ``Sandbox.fork``, which shares the
    files copy-on-write). The checkpoint must come from a sandbox with the same mounts, env,
    packages and engine flavour (ConfigError otherwise)."""
    pkgs = list(packages) or None
    if cp is None:
        return Sandbox(limits=limits, mounts=mounts, preload=preload, door=door, env=env,
                       packages=pkgs, _scratch_from=scratch_from)
    sb = Sandbox(limits=limits, mounts=mounts, door=door, env=env, packages=pkgs,
                 _image=cp._image, _scratch_from=scratch_from)
    if sb._key() != cp._owner_key:
        sb.close()
        raise ConfigError("checkpoint comes from a sandbox with other mounts, packages or "
                          "engine")
    return sb


def scratch_dir(sb: Sandbox) -> Path:
    """The host directory behind the sandbox's private /tmp."""
    return sb._scratch
