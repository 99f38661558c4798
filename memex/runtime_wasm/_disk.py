"""Disk quotas, open-file caps and link rules, enforced on the guest's WASI file calls.

A guest's files are host files: WASI hands it descriptors into host folders (its /tmp and its
mounts). wasmtime confines the paths but caps nothing, so MemEx shadows the WASI functions that
create, grow, link or open things (``_ffi.WASI_FILE_IMPORTS``) and each shadow asks this module
first, then calls the engine's own implementation.

* :class:`DiskLedger` (one per sandbox, shared by the instances that replace each other after a
  trap): what the sandbox's writable places hold together — bytes (apparent sizes, so a sparse
  file counts whole) and entries (files, folders, links). It is filled by scanning the places
  when the sandbox starts (a fork's copied /tmp and pre-existing mount contents count) and kept
  exact by the shadows. Files are keyed by inode, so hard links and a file unlinked while open
  (its bytes stay on disk until the last close) are counted once and for as long as they exist.
* :class:`GuestFiles` (one per instance): the instance's descriptor table as the host sees it
  (which place each descriptor is in, which inode), the open-descriptor cap, and the shadows.

Refusals are errno values in the guest (``EDQUOT`` for bytes and entries, ``EMFILE`` for
descriptors, ``EPERM`` for a link) and are remembered (``DiskLedger.hit``) so the turn's result
says ``limit="disk"`` / ``"open_files"``. A guest runs single-threaded; the ledger's lock is for
the host helpers (``Sandbox.write_file``) that change the same folders from other threads.
"""

from __future__ import annotations

import os
import posixpath
import stat
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ._ffi import MemoryRef, WasiCall

__all__ = ["DiskLedger", "DiskPlace", "GuestFiles", "inside"]

EDQUOT = 19
EMFILE = 33
EPERM = 63
EIO = 29
EFAULT = 21
ENOTCAPABLE = 76
_O_CREAT, _O_DIRECTORY, _O_TRUNC = 1, 2, 8
_FDFLAG_APPEND = 1
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_IOVEC = struct.Struct("<II")
FIRST_PREOPEN_FD = 3  # WASI numbers the preopened folders 3, 4, ... in the order given


@dataclass(frozen=True, kw_only=True)
class DiskPlace:
    """A writable folder of the sandbox: its resolved host path and whether links may be made
    in it (only to targets inside it)."""

    root: str
    links: bool = False


def inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root + os.sep)


class DiskLedger:
    """What a sandbox's writable places hold, against its caps (see the module docstring)."""

    def __init__(self, places: Sequence[DiskPlace], *, max_bytes: int, max_entries: int,
                 max_open: int) -> None:
        self.places = tuple(places)
        self.max_bytes, self.max_entries, self.max_open = max_bytes, max_entries, max_open
        self.lock = threading.Lock()
        self.bytes = 0
        self.entries = 0
        self.sizes: dict[tuple[int, int], int] = {}
        self.refs: dict[tuple[int, int], int] = {}  # inode -> descriptors open on it
        self.orphans: set[tuple[int, int]] = set()  # unlinked, still open
        self.hit: str | None = None  # the first cap refused since the last take_hit()
        self.rescan()

    def rescan(self) -> None:
        """Count the places from scratch (at start, and after the host copies files in)."""
        with self.lock:
            self.bytes = self.entries = 0
            self.sizes = {k: v for k, v in self.sizes.items() if k in self.orphans}
            self.bytes = sum(self.sizes.values())
            for place in self.places:
                self._scan(place.root)

    def _scan(self, folder: str) -> None:
        try:
            it = os.scandir(folder)
        except OSError:
            return
        with it:
            for entry in it:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                self.entries += 1
                if stat.S_ISDIR(st.st_mode):
                    self._scan(entry.path)
                elif stat.S_ISREG(st.st_mode):
                    key = (st.st_dev, st.st_ino)
                    if key not in self.sizes:
                        self.sizes[key] = st.st_size
                        self.bytes += st.st_size

    def place_of(self, host: str) -> DiskPlace | None:
        for place in self.places:
            if inside(host, place.root):
                return place
        return None

    # ---- accounting (callers hold no lock; each call takes it) ---------------------------
    def refuse(self, what: str) -> None:
        if self.hit is None:
            self.hit = what
        return None

    def take_hit(self) -> str | None:
        hit, self.hit = self.hit, None
        return hit

    def fits(self, growth: int, entries: int = 0) -> bool:
        """Whether ``growth`` more bytes and ``entries`` more entries fit."""
        return not ((growth > 0 and self.bytes + growth > self.max_bytes) or (
            entries > 0 and self.entries + entries > self.max_entries))

    def room(self, growth: int, entries: int = 0) -> bool:
        """:meth:`fits`, recording a refusal for the turn's result when it does not."""
        if self.fits(growth, entries):
            return True
        self.refuse("disk")
        return False

    def set_size(self, key: tuple[int, int], size: int) -> None:
        with self.lock:
            self.bytes += size - self.sizes.get(key, 0)
            self.sizes[key] = size

    def add_entries(self, n: int) -> None:
        with self.lock:
            self.entries = max(0, self.entries + n)

    def opened(self, key: tuple[int, int], size: int) -> None:
        with self.lock:
            self.bytes += size - self.sizes.get(key, 0)
            self.sizes[key] = size
            self.refs[key] = self.refs.get(key, 0) + 1

    def closed(self, key: tuple[int, int]) -> None:
        with self.lock:
            n = self.refs.get(key, 0) - 1
            if n > 0:
                self.refs[key] = n
                return
            self.refs.pop(key, None)
            if key in self.orphans:
                self.orphans.discard(key)
                self.bytes -= self.sizes.pop(key, 0)

    def removed(self, st: os.stat_result) -> None:
        """A name was unlinked (or replaced by a rename): one entry less, and the inode's bytes
        once its last name is gone and no descriptor holds it."""
        with self.lock:
            self.entries = max(0, self.entries - 1)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
                return
            key = (st.st_dev, st.st_ino)
            if self.refs.get(key):
                self.orphans.add(key)
            else:
                self.bytes -= self.sizes.pop(key, 0)


@dataclass(kw_only=True)
class _Fd:
    host: str
    place: DiskPlace | None  # None: outside the writable places (read-only, not accounted)
    key: tuple[int, int] | None = None  # the inode of a regular file in a writable place
    append: bool = False
    preopen: bool = False


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


class GuestFiles:
    """The shadowed WASI file functions of one instance (method names are the WASI names; the
    trampolines in ``_ffi`` call them with the raw arguments and write back the errno)."""

    def __init__(self, ledger: DiskLedger, preopens: Sequence[tuple[str, str, bool]],
                 mem: Callable[[], MemoryRef], calls: Callable[[], dict[str, WasiCall]],
                 ctx: int) -> None:
        self.ledger = ledger
        self._mem = mem
        self._calls_fn = calls
        self._calls: dict[str, WasiCall] | None = None
        self._ctx = ctx
        self.fds: dict[int, _Fd] = {}
        self.open_count = 0
        for i, (host, _guest, writable) in enumerate(preopens):
            # only a writable folder is ever a base for host paths (the others: place None)
            root = os.path.realpath(host) if writable else host
            self.fds[FIRST_PREOPEN_FD + i] = _Fd(
                host=root, place=ledger.place_of(root) if writable else None, preopen=True)

    # ---- plumbing -------------------------------------------------------------------------
    def _orig(self, name: str, *args: int) -> int:
        calls = self._calls
        if calls is None:
            calls = self._calls = self._calls_fn()
        return calls[name](self._ctx, *args)

    def _path(self, dirfd: int, ptr: int, n: int) -> tuple[_Fd, str] | None:
        """The host path a guest path names relative to ``dirfd``, when ``dirfd`` is a folder
        in a writable place (else None: nothing to account for, the engine decides)."""
        d = self.fds.get(dirfd)
        if d is None or d.place is None:
            return None
        raw = self._mem().read(ptr, n)
        if raw is None:
            return None
        rel = raw.decode("utf-8", "surrogateescape")
        return d, os.path.normpath(os.path.join(d.host, rel))

    def _tell(self, fd: int, scratch: int) -> int | None:
        """The descriptor's offset, through the engine's ``fd_tell`` with 8 bytes of guest
        memory at ``scratch`` borrowed and put back."""
        mem = self._mem()
        saved = mem.read(scratch, 8)
        if saved is None:
            return None
        try:
            if self._orig("fd_tell", fd, scratch) != 0:
                return None
            got = mem.read(scratch, 8)
            return None if got is None else int(_U64.unpack(got)[0])
        finally:
            mem.write(scratch, saved)

    def _register(self, fd: int, host: str, place: DiskPlace | None, append: bool) -> int:
        """Record a descriptor the engine just opened; 0, or an errno after closing it again
        when a file in a writable place cannot be identified (never an unaccounted file)."""
        entry = _Fd(host=host, place=place, append=append)
        if place is not None:
            try:
                st = os.stat(host)
            except OSError:
                self._orig("fd_close", fd)
                return EIO
            if stat.S_ISREG(st.st_mode):
                entry.key = (st.st_dev, st.st_ino)
                self.ledger.opened(entry.key, st.st_size)
        self.fds[fd] = entry
        self.open_count += 1
        return 0

    def _release(self, fd: int) -> None:
        entry = self.fds.pop(fd, None)
        if entry is None:
            return
        if not entry.preopen:
            self.open_count -= 1
        if entry.key is not None:
            self.ledger.closed(entry.key)

    def close_all(self) -> None:
        """The instance is gone: its descriptors with it."""
        for fd in list(self.fds):
            self._release(fd)

    # ---- descriptors ----------------------------------------------------------------------
    def path_open(self, dirfd: int, dirflags: int, path: int, path_len: int, oflags: int,
                  rights: int, inheriting: int, fdflags: int, fd_out: int) -> int:
        led = self.ledger
        if self.open_count >= led.max_open:
            led.refuse("open_files")
            return EMFILE
        target = self._path(dirfd, path, path_len)
        args = (dirfd, dirflags, path, path_len, oflags, rights, inheriting, fdflags, fd_out)
        if target is None:
            r = self._orig("path_open", *args)
            if r == 0:
                got = self._mem().read(fd_out, 4)
                if got is not None:
                    self._register(_U32.unpack(got)[0], "", None, False)
            return r
        d, host = target
        assert d.place is not None
        if not inside(host, d.place.root):
            return ENOTCAPABLE
        creates = bool(oflags & _O_CREAT) and _lstat(host) is None
        if creates and not led.room(0, 1):
            return EDQUOT
        r = self._orig("path_open", *args)
        if r != 0:
            return r
        got = self._mem().read(fd_out, 4)
        if got is None:
            return r
        if creates:
            led.add_entries(1)
        # The engine resolved the path inside the place (it refuses links that lead out), and
        # os.stat follows the same links: no realpath needed to find the inode.
        return self._register(_U32.unpack(got)[0], host, d.place, bool(fdflags & _FDFLAG_APPEND))

    def fd_close(self, fd: int) -> int:
        r = self._orig("fd_close", fd)
        if r == 0:
            self._release(fd)
        return r

    def fd_renumber(self, fd: int, to: int) -> int:
        r = self._orig("fd_renumber", fd, to)
        if r == 0 and fd != to:
            self._release(to)
            moved = self.fds.pop(fd, None)
            if moved is not None:
                self.fds[to] = moved
        return r

    def fd_fdstat_set_flags(self, fd: int, flags: int) -> int:
        r = self._orig("fd_fdstat_set_flags", fd, flags)
        entry = self.fds.get(fd)
        if r == 0 and entry is not None:
            entry.append = bool(flags & _FDFLAG_APPEND)
        return r

    # ---- growth -----------------------------------------------------------------------------
    def fd_write(self, fd: int, iovs: int, n_iovs: int, nwritten: int) -> int:
        entry = self.fds.get(fd)
        if entry is None or entry.key is None or n_iovs <= 0:
            return self._orig("fd_write", fd, iovs, n_iovs, nwritten)
        key, led = entry.key, self.ledger
        raw = self._mem().read(iovs, 8 * n_iovs)
        if raw is None:
            return EFAULT
        total = sum(ln for _, ln in _IOVEC.iter_unpack(raw))
        cur = led.sizes.get(key, 0)
        # Where the write lands: an append goes to the end; otherwise the offset, which may lie
        # past the end (a seek there makes a sparse file, counted whole).
        pos = cur if entry.append else self._tell(fd, iovs)
        if pos is None:  # no offset to account at: refuse rather than write uncounted
            return EIO
        if not led.room(pos + total - cur):
            return EDQUOT
        return self._wrote(key, pos, nwritten,
                           self._orig("fd_write", fd, iovs, n_iovs, nwritten))

    def fd_pwrite(self, fd: int, iovs: int, n_iovs: int, offset: int, nwritten: int) -> int:
        entry = self.fds.get(fd)
        if entry is None or entry.key is None or n_iovs <= 0:
            return self._orig("fd_pwrite", fd, iovs, n_iovs, offset, nwritten)
        key, led = entry.key, self.ledger
        raw = self._mem().read(iovs, 8 * n_iovs)
        if raw is None:
            return EFAULT
        total = sum(ln for _, ln in _IOVEC.iter_unpack(raw))
        if not led.room(max(0, offset + total - led.sizes.get(key, 0))):
            return EDQUOT
        return self._wrote(key, offset, nwritten,
                           self._orig("fd_pwrite", fd, iovs, n_iovs, offset, nwritten))

    def _wrote(self, key: tuple[int, int], pos: int, nwritten: int, r: int) -> int:
        """After a write at ``pos`` returned ``r``: the file now reaches at least the end of
        what the engine says it wrote."""
        got = self._mem().read(nwritten, 4) if r == 0 else None
        if got is not None:
            end = pos + _U32.unpack(got)[0]
            if end > self.ledger.sizes.get(key, 0):
                self.ledger.set_size(key, end)
        return r

    def _resize(self, name: str, fd: int, new_size: Callable[[int], int], *args: int) -> int:
        entry = self.fds.get(fd)
        if entry is None or entry.key is None:
            return self._orig(name, fd, *args)
        cur = self.ledger.sizes.get(entry.key, 0)
        size = new_size(cur)
        if not self.ledger.room(size - cur):
            return EDQUOT
        r = self._orig(name, fd, *args)
        if r == 0:
            self.ledger.set_size(entry.key, size)
        return r

    def fd_filestat_set_size(self, fd: int, size: int) -> int:
        return self._resize("fd_filestat_set_size", fd, lambda _cur: size, size)

    def fd_allocate(self, fd: int, offset: int, length: int) -> int:
        return self._resize("fd_allocate", fd, lambda cur: max(cur, offset + length),
                            offset, length)

    # ---- names ------------------------------------------------------------------------------
    def path_create_directory(self, dirfd: int, path: int, path_len: int) -> int:
        target = self._path(dirfd, path, path_len)
        if target is not None and not self.ledger.room(0, 1):
            return EDQUOT
        r = self._orig("path_create_directory", dirfd, path, path_len)
        if r == 0 and target is not None:
            self.ledger.add_entries(1)
        return r

    def path_remove_directory(self, dirfd: int, path: int, path_len: int) -> int:
        target = self._path(dirfd, path, path_len)
        r = self._orig("path_remove_directory", dirfd, path, path_len)
        if r == 0 and target is not None:
            self.ledger.add_entries(-1)
        return r

    def path_unlink_file(self, dirfd: int, path: int, path_len: int) -> int:
        target = self._path(dirfd, path, path_len)
        before = _lstat(target[1]) if target is not None else None
        r = self._orig("path_unlink_file", dirfd, path, path_len)
        if r == 0 and before is not None:
            self.ledger.removed(before)
        return r

    def path_rename(self, fd: int, old: int, old_len: int, new_fd: int, new: int,
                    new_len: int) -> int:
        target = self._path(new_fd, new, new_len)
        replaced = _lstat(target[1]) if target is not None else None
        if replaced is not None:
            source = self._path(fd, old, old_len)
            moved = _lstat(source[1]) if source is not None else None
            if moved is not None and (moved.st_dev, moved.st_ino) == (
                    replaced.st_dev, replaced.st_ino):
                replaced = None  # onto itself (or a hard link of itself): POSIX does nothing
        r = self._orig("path_rename", fd, old, old_len, new_fd, new, new_len)
        if r == 0 and replaced is not None:
            self.ledger.removed(replaced)
        return r

    def path_symlink(self, old: int, old_len: int, dirfd: int, new: int, new_len: int) -> int:
        target = self._path(dirfd, new, new_len)
        if target is not None:
            d, host = target
            assert d.place is not None
            raw = self._mem().read(old, old_len)
            if not d.place.links or raw is None:
                return EPERM
            dest = raw.decode("utf-8", "surrogateescape")
            resolved = os.path.normpath(os.path.join(os.path.dirname(host), dest))
            if posixpath.isabs(dest) or not inside(resolved, d.place.root):
                return EPERM
            if not self.ledger.room(0, 1):
                return EDQUOT
        r = self._orig("path_symlink", old, old_len, dirfd, new, new_len)
        if r == 0 and target is not None:
            self.ledger.add_entries(1)
        return r

    def path_link(self, fd: int, flags: int, old: int, old_len: int, new_fd: int, new: int,
                  new_len: int) -> int:
        target = self._path(new_fd, new, new_len)
        if target is not None:
            src = self._path(fd, old, old_len)
            place = target[0].place
            assert place is not None
            if not place.links or src is None or src[0].place is not place or not inside(
                    src[1], place.root):
                return EPERM
            if not self.ledger.room(0, 1):
                return EDQUOT
        r = self._orig("path_link", fd, flags, old, old_len, new_fd, new, new_len)
        if r == 0 and target is not None:
            self.ledger.add_entries(1)
        return r
