"""The guest's files seen from the host: ``Sandbox.read_file``, ``list_files`` and
``write_file``. A guest path resolves through the sandbox's preopened folders (``/tmp`` and
the mounts; never the stdlib or the guest bundle) to a host path that must stay inside its
folder once links are resolved; writes are held to the sandbox's disk quota."""

from __future__ import annotations

import os
import posixpath
import stat
from collections.abc import Sequence
from pathlib import Path

from ..errors import GuestFileError
from ._disk import DiskLedger
from ._files import GUEST_BUNDLE, GUEST_LIB
from ._records import GuestFile

__all__ = ["host_path", "list_files", "read_file", "write_file"]

Preopens = Sequence[tuple[str, str, bool]]  # (host folder, guest folder, writable)


def host_path(preopens: Preopens, guest_path: str, *, write: bool) -> Path:
    """The host path of ``guest_path`` (absolute, under /tmp or a mount; writable if
    ``write``), resolved, and refused if it escapes its folder."""
    if not isinstance(guest_path, str) or not guest_path.startswith("/"):
        raise GuestFileError(f"guest path must be absolute, got {guest_path!r}")
    norm = posixpath.normpath(guest_path)
    best: tuple[str, str, bool] | None = None
    for host, guest, writable in preopens:
        if guest in (GUEST_LIB, GUEST_BUNDLE) or guest.startswith(GUEST_LIB + "/"):
            continue
        if (norm == guest or norm.startswith(guest + "/")) and (
            best is None or len(guest) > len(best[1])
        ):
            best = (host, guest, writable)
    if best is None:
        raise GuestFileError(f"{guest_path} is not under /tmp or a mount")
    host, guest, writable = best
    if write and not writable:
        raise GuestFileError(f"{guest_path} is on a read-only mount")
    root = Path(host).resolve()
    rel = posixpath.relpath(norm, guest)
    target = (root / rel).resolve()
    if target != root and root not in target.parents:
        raise GuestFileError(f"{guest_path} escapes its mount")
    return target


def read_file(preopens: Preopens, guest_path: str) -> bytes:
    target = host_path(preopens, guest_path, write=False)
    try:
        return target.read_bytes()
    except OSError as exc:
        raise GuestFileError(f"cannot read {guest_path}: {exc.strerror}") from exc


def list_files(preopens: Preopens, guest_path: str, limit: int) -> list[GuestFile]:
    target = host_path(preopens, guest_path, write=False)
    base = posixpath.normpath(guest_path)
    out: list[GuestFile] = []
    try:
        with os.scandir(target) as it:
            for entry in it:
                if entry.is_symlink():
                    kind, size = "link", 0
                elif entry.is_dir(follow_symlinks=False):
                    kind, size = "dir", 0
                else:
                    kind, size = "file", entry.stat(follow_symlinks=False).st_size
                out.append(GuestFile(name=entry.name, path=posixpath.join(base, entry.name),
                                     kind=kind, size=size))
                if len(out) >= limit:
                    break
    except NotADirectoryError as exc:
        raise GuestFileError(f"{guest_path} is not a folder") from exc
    except OSError as exc:
        raise GuestFileError(f"cannot list {guest_path}: {exc.strerror}") from exc
    return sorted(out, key=lambda f: f.name)


def write_file(preopens: Preopens, disk: DiskLedger, guest_path: str, data: bytes) -> None:
    target = host_path(preopens, guest_path, write=True)
    try:
        old: os.stat_result | None = target.lstat()
    except OSError:
        old = None
    missing = 0  # folders write_file will create
    parent = target.parent
    while not parent.exists():
        missing += 1
        parent = parent.parent
    was = old.st_size if old is not None and stat.S_ISREG(old.st_mode) else 0
    new_entries = missing + (old is None)
    if not disk.fits(len(data) - was, new_entries):
        raise GuestFileError(f"cannot write {guest_path}: the sandbox's disk quota "
                             f"(Limits.disk_bytes / disk_files) would be exceeded")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        st = target.stat()
    except OSError as exc:
        disk.rescan()  # a partial write: count what is there
        raise GuestFileError(f"cannot write {guest_path}: {exc.strerror}") from exc
    disk.set_size((st.st_dev, st.st_ino), st.st_size)
    disk.add_entries(new_entries)
