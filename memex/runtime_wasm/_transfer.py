"""The seam backends use to move a guest between processes (``memex.backends``).

A checkpoint's memory image crosses a process boundary as a file descriptor (a memfd, passed
over a Unix socket: no copy) or as compressed bytes (to another machine), and a sandbox is
rebuilt around it with its own door. These functions are public (``memex.runtime_wasm``) so
that no other package reaches into the sandbox's private state.
"""

from __future__ import annotations

import os
import shutil
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgpack

from ..errors import ConfigError, ImageError
from ._door import Door
from ._image import MemoryImage
from ._records import Limits, Mount
from ._sandbox import Checkpoint, Sandbox

__all__ = [
    "checkpoint_from_bytes",
    "checkpoint_from_fd",
    "checkpoint_to_bytes",
    "checkpoint_to_fd",
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


def checkpoint_to_fd(cp: Checkpoint) -> tuple[int, dict[str, Any]]:
    """A new file descriptor of the checkpoint's image (the caller closes it) and the
    msgpack-able description ``checkpoint_from_fd`` needs."""
    fd = os.dup(cp._image.flat()._fd)
    return fd, {"size": cp.size, "turns": cp.turns, "key": _key_to_wire(cp._owner_key)}


def checkpoint_from_fd(fd: int, meta: dict[str, Any]) -> Checkpoint:
    """A checkpoint owning ``fd`` (a memfd from ``checkpoint_to_fd``, possibly of another
    process). Closes ``fd`` when the description is malformed."""
    try:
        size, turns = int(meta["size"]), int(meta["turns"])
        key = _key_from_wire(meta["key"])
        if size <= 0 or size % 65536 or size > (4 << 30) or os.fstat(fd).st_size < size:
            raise ImageError(f"a checkpoint image of {size} bytes does not fit its file")
    except (KeyError, TypeError, ValueError, OSError, ImageError) as exc:
        os.close(fd)
        if isinstance(exc, ImageError):
            raise
        raise ImageError(f"a checkpoint's description is malformed: {exc}") from exc
    return Checkpoint(MemoryImage(fd, size), key, turns)


_MAGIC = b"MEMEXCP1"
_CHUNK = 1 << 20
_ENTRY = struct.Struct("<QI")


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
    head: bytes = msgpack.packb({"size": img.size, "turns": cp.turns,
                                 "key": _key_to_wire(cp._owner_key)}, use_bin_type=True)
    return b"".join([_MAGIC, struct.pack("<I", len(head)), head, *body])


def checkpoint_from_bytes(blob: bytes | bytearray | memoryview) -> Checkpoint:
    """Rebuild a checkpoint from ``checkpoint_to_bytes``; a corrupt blob raises ImageError."""
    data = memoryview(blob).cast("B")
    if len(data) < 12 or bytes(data[:8]) != _MAGIC:
        raise ImageError("not a MemEx checkpoint blob (bad magic)")
    (hlen,) = struct.unpack_from("<I", data, 8)
    if 12 + hlen > len(data):
        raise ImageError("checkpoint blob truncated in its header")
    try:
        meta = msgpack.unpackb(data[12: 12 + hlen], raw=False)
        size, turns = int(meta["size"]), int(meta["turns"])
        key = _key_from_wire(meta["key"])
    except ImageError:
        raise
    except Exception as exc:
        raise ImageError(f"checkpoint blob has a corrupt header: {exc}") from exc
    if size <= 0 or size % 65536 or size > (4 << 30):
        raise ImageError(f"checkpoint blob has an invalid memory size {size}")
    pos = 12 + hlen
    chunks: list[tuple[int, bytes]] = []
    try:
        while pos < len(data):
            off, n = _ENTRY.unpack_from(data, pos)
            pos += _ENTRY.size
            if pos + n > len(data):
                raise ImageError("checkpoint blob truncated in a chunk")
            chunk = zlib.decompress(data[pos: pos + n])
            pos += n
            if off % _CHUNK or len(chunk) > _CHUNK or off + len(chunk) > size:
                raise ImageError("checkpoint blob has a chunk outside the memory")
            chunks.append((off, chunk))
    except (struct.error, zlib.error) as exc:
        raise ImageError(f"checkpoint blob is corrupt: {exc}") from exc
    return Checkpoint(MemoryImage.from_chunks(size, chunks), key, turns)


def open_from_checkpoint(cp: Checkpoint | None, *, limits: Limits | None,
                         mounts: Sequence[Mount], preload: Sequence[str], door: Door,
                         env: dict[str, str] | None, scratch_from: Path | None = None
                         ) -> Sandbox:
    """A new sandbox serving ``door``, holding ``cp``'s guest state (a fresh one for None)
    and a copy of the files in ``scratch_from`` in its /tmp: how a backend resumes a session
    in another process. The checkpoint must come from a sandbox with the same mounts, env and
    engine flavour (ConfigError otherwise)."""
    if cp is None:
        sb = Sandbox(limits=limits, mounts=mounts, preload=preload, door=door, env=env)
        if scratch_from is not None:
            try:
                shutil.copytree(scratch_from, sb._scratch, dirs_exist_ok=True, symlinks=True)
            except BaseException:
                sb.close()
                raise
            sb._disk.rescan()  # the copied files count against the new sandbox's quota
        return sb
    sb = Sandbox(limits=limits, mounts=mounts, door=door, env=env, _image=cp._image,
                 _scratch_from=scratch_from)
    if sb._key() != cp._owner_key:
        sb.close()
        raise ConfigError("checkpoint comes from a sandbox with other mounts or engine")
    return sb


def scratch_dir(sb: Sandbox) -> Path:
    """The host directory behind the sandbox's private /tmp."""
    return sb._scratch
