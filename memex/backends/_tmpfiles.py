"""A session's /tmp files as a save keeps them (a server's keeper, a cluster's slab): read by
an iterative walk bounded in bytes and in entries, kept as msgpack (guest path -> bytes), and
read back under a decoding cost cap."""

from __future__ import annotations

from typing import Any

from ..errors import GuestFileTooLarge
from ..runtime_wasm import SandboxAPI
from ..runtime_wasm.internal import DecodeCost, unpack_bounded

__all__ = ["FILES_CAP", "FILES_ENTRIES", "tmp_files", "tmp_files_from"]

FILES_CAP = 64 << 20
"""Bytes of /tmp files a save keeps; past it only the interpreter state is kept."""
FILES_ENTRIES = 10_000
"""Files a save keeps at most (past it, as past FILES_CAP, only the interpreter state)."""


def tmp_files(sb: SandboxAPI[Any]) -> dict[str, bytes] | None:
    """The session's /tmp files by guest path, or None when they cannot all be kept (past
    the caps, or a sandbox that cannot list its files). Links and empty folders are not
    kept."""
    lister = getattr(sb, "list_files", None)
    if lister is None:
        return None
    out: dict[str, bytes] = {}
    total = entries = 0
    todo = ["/tmp"]
    while todo:  # iterative, bounded in bytes and in entries
        for f in lister(todo.pop()):
            entries += 1
            if entries > FILES_ENTRIES:
                return None
            if f.kind == "dir":
                todo.append(f.path)
            elif f.kind == "file":
                total += f.size
                if total > FILES_CAP:
                    return None
                try:
                    data = sb.read_file(f.path, max_bytes=FILES_CAP - total + f.size)
                except GuestFileTooLarge:
                    return None
                total += len(data) - f.size
                out[f.path] = data
    return out


def tmp_files_from(packed: bytes | None) -> dict[str, bytes]:
    """The /tmp files of a save, decoded under a cost cap (ValueError when they are not a
    map of paths to bytes)."""
    if not packed:
        return {}
    files = unpack_bounded(packed, DecodeCost(containers=4, items=2 * FILES_ENTRIES,
                                              ext_bytes=0))
    if not isinstance(files, dict) or not all(
            isinstance(k, str) and isinstance(v, bytes) for k, v in files.items()):
        raise ValueError("the saved files are not a map of paths to bytes")
    return files
