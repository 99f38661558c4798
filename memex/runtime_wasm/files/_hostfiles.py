"""The guest's files seen from the host: ``Sandbox.read_file``, ``list_files`` and
``write_file``. A guest path resolves through the sandbox's preopened folders (``/tmp`` and
the mounts; never the stdlib or the guest bundle) to a host path that must stay inside its
folder once links are resolved; writes are held to the sandbox's disk quota."""

from __future__ import annotations

import contextlib
import itertools
import os
import posixpath
import stat
from collections.abc import Sequence
from pathlib import Path

from ...errors import GuestFileError, GuestFileTooLarge
from .._records import GuestFile
from ..engine._files import GUEST_BUNDLE, GUEST_LIB
from ._disk import MAX_DEPTH, MAX_DIR_ENTRIES, MAX_PATH, DiskUse

__all__ = ["host_path", "list_files", "read_file", "write_file"]

Preopens = Sequence[tuple[str, str, bool]]  # (host folder, guest folder, writable)
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_writes = itertools.count()


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


def read_file(preopens: Preopens, guest_path: str, max_bytes: int | None = None) -> bytes:
    """The file's bytes, its size checked on the open descriptor before any is read."""
    target = host_path(preopens, guest_path, write=False)
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise GuestFileError(f"cannot read {guest_path}: {exc.strerror}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise GuestFileError(f"cannot read {guest_path}: not a regular file")
        if max_bytes is not None and st.st_size > max_bytes:
            raise GuestFileTooLarge(f"{guest_path} is {st.st_size} bytes, more than the "
                                    f"{max_bytes} asked for")
        with os.fdopen(os.dup(fd), "rb") as f:
            if max_bytes is None:
                return f.read()
            data = f.read(max_bytes + 1)  # a file that grew since the check is caught too
        if len(data) > max_bytes:
            raise GuestFileTooLarge(f"{guest_path} grew past the {max_bytes} asked for")
        return data
    except OSError as exc:
        raise GuestFileError(f"cannot read {guest_path}: {exc.strerror}") from exc
    finally:
        os.close(fd)


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


def write_file(preopens: Preopens, disk: DiskUse, guest_path: str, data: bytes) -> None:
    """Place ``data`` at ``guest_path`` under the same bounds and quota as the guest's own
    writes. The file is written under a temporary name and renamed into place: a reader never
    sees half of it, and a file a fork shares is replaced, never changed in place."""
    target = host_path(preopens, guest_path, write=True)
    ledger = disk.ledger
    place = ledger.place_of(str(target))
    if place is None:
        raise GuestFileError(f"{guest_path} is not in a writable place")
    below = os.path.relpath(target, place.root)
    parts = [] if below == "." else below.split(os.sep)
    if not parts:
        raise GuestFileError(f"{guest_path} is a folder")
    if len(parts) > MAX_DEPTH + 1 or len(os.fsencode(below)) > MAX_PATH:
        raise GuestFileError(f"cannot write {guest_path}: deeper than {MAX_DEPTH} folders or "
                             f"longer than {MAX_PATH} bytes below its place")
    try:
        fd = os.open(place.root, _DIR)
    except OSError as exc:
        raise GuestFileError(f"cannot write {guest_path}: {exc.strerror}") from exc
    try:
        made = 0
        for i, name in enumerate(parts[:-1]):  # folders, made as needed, never through a link
            try:
                sub = os.open(name, _DIR, dir_fd=fd)
            except FileNotFoundError:
                if not ledger.fits(0, 1):
                    raise _quota(guest_path) from None
                os.mkdir(name, 0o755, dir_fd=fd)
                sub = os.open(name, _DIR, dir_fd=fd)
                ledger.created(os.fstat(sub), (os.fstat(fd).st_dev, os.fstat(fd).st_ino))
                made += 1
            except OSError as exc:
                raise GuestFileError(f"cannot write {guest_path}: {'/'.join(parts[:i + 1])} "
                                     f"is not a folder ({exc.strerror})") from None
            os.close(fd)
            fd = sub
        name = parts[-1]
        dst = os.fstat(fd)
        pkey = (dst.st_dev, dst.st_ino)
        try:
            old: os.stat_result | None = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            old = None
        if old is not None and not stat.S_ISREG(old.st_mode):
            raise GuestFileError(f"cannot write {guest_path}: it is not a regular file")
        mine = old is not None and old.st_nlink == 1  # replacing it frees it
        if not ledger.fits(len(data) - (old.st_size if mine and old else 0),
                           0 if mine else 1) or (
                old is None and ledger.dir_names.get(pkey, 0) >= MAX_DIR_ENTRIES):
            raise _quota(guest_path)
        tmp = f".memex-write-{os.getpid()}-{next(_writes)}"
        try:
            out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                          | os.O_CLOEXEC, 0o644, dir_fd=fd)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(out, view):]
            finally:
                os.close(out)
            with ledger.names_lock(place):  # not between the engine's open and the host's
                os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
            new = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=fd)
            raise GuestFileError(f"cannot write {guest_path}: {exc.strerror}") from exc
        if old is not None:
            ledger.removed(old, pkey, place)
        ledger.created(new, pkey)
    finally:
        os.close(fd)


def _quota(guest_path: str) -> GuestFileError:
    return GuestFileError(f"cannot write {guest_path}: the sandbox's disk quota "
                          f"(Limits.disk_bytes / disk_files) would be exceeded")
