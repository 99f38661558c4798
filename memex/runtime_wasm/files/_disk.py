"""Disk quotas, open-file caps, link rules and tree bounds, enforced on the guest's WASI file
calls.

A guest's files are host files: WASI hands it descriptors into host folders (its /tmp and its
mounts). wasmtime confines the paths but caps nothing, so MemEx shadows the WASI functions that
create, grow, link, move or open things (``_ffi.WASI_FILE_IMPORTS``) and each shadow asks this
module first, then calls the engine's own implementation.

What the bookkeeping trusts is what the kernel says, never a path remembered earlier:

* Every folder descriptor the guest holds in a writable place has a *mirror*: a host
  ``O_PATH`` descriptor of the same folder, opened relative to its parent's mirror when the
  engine opened it. A path the guest gives relative to a folder descriptor is resolved by the
  kernel relative to that mirror, so a folder renamed (or moved up) after it was opened is
  still the folder its descriptor names.
* Files are keyed by inode, taken from a descriptor of what the engine just opened (checked
  against the engine's own ``fd_filestat_get`` of its descriptor), so hard links and a file
  unlinked while open are counted once and for as long as they exist.

:class:`DiskLedger` (one per *fork family*: a sandbox and the forks made from it, shared by
the instances that replace each other after a trap) holds what the family's writable places
hold together — bytes (apparent sizes, so a sparse file counts whole) and entries (inodes:
files, folders, links, and each extra name a guest gives a file with a hard link) — against
the family's caps, so forks cannot multiply what a tenant may hold. A fork's /tmp shares its
parent's files (hard links; ``_tree.clone``) until one side opens one for writing: that side
then gets its own copy first (copy-up), which costs the family the file's bytes then, not at
fork time.

:class:`GuestFiles` (one per instance) is the instance's descriptor table as the host sees it,
the open-descriptor cap, and the shadows. :class:`DiskUse` is one sandbox's view of its family
ledger: the refusals of its own turns.

Rules in writable places, besides the caps: a folder at most :data:`MAX_DEPTH` levels below
its place's root, a path below the root at most :data:`MAX_PATH` bytes, at most
:data:`MAX_DIR_ENTRIES` names in one folder; a link only where the place allows links, and
then only one that *descends* (a relative target of plain names, no ``.`` or ``..``), so that
it points inside its place wherever it is moved; no rename between places (``EXDEV``, as
between two filesystems); a link that does not descend (one the host planted) may not be
moved, nor a folder holding one.

Refusals are errno values in the guest (``EDQUOT`` for bytes, entries and a full folder,
``ENAMETOOLONG`` past the depth or path bounds, ``EMFILE`` for descriptors, ``EPERM`` for a
link, ``EXDEV`` between places) and are remembered (``DiskUse.hit``) so the turn's result says
``limit="disk"`` / ``"open_files"``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import stat
import struct
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..engine._ffi import MemoryRef, WasiCall
from . import _tree

__all__ = ["MAX_DEPTH", "MAX_DIR_ENTRIES", "MAX_PATH", "DiskLedger", "DiskPlace", "DiskUse",
           "GuestFiles", "descends", "inside"]

MAX_DEPTH = 64
"""Parts of a path below a writable place's root, at most (``a/b/c`` has three): a guest
tree is at most this deep."""
MAX_PATH = 1024
"""Bytes of a path below a writable place's root, at most."""
MAX_DIR_ENTRIES = 10_000
"""Names in one folder of a writable place, at most."""
SCAN_LIMIT = 1_000_000
"""Entries a scan of a place counts at most (a mount holding more counts as full)."""

# WASI errno values
EDQUOT, EMFILE, EPERM, EIO, EFAULT, EXDEV, ENOTCAPABLE = 19, 33, 63, 29, 21, 75, 76
ENAMETOOLONG, ENOENT, EINVAL = 37, 44, 28
_O_CREAT, _O_DIRECTORY, _O_TRUNC = 1, 2, 8
_FOLLOW = 1  # lookupflags: symlink_follow
_FDFLAG_APPEND = 1
# rights that make wasmtime open a file for writing (fd_datasync, fd_write, fd_allocate,
# fd_filestat_set_size)
_WRITE_RIGHTS = (1 << 0) | (1 << 6) | (1 << 8) | (1 << 22)
_WASI_DIR, _WASI_FILE = 3, 4  # filetypes
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_IOVEC = struct.Struct("<II")
IOV_MAX = 1024
"""Buffers one write may gather, at most (wasi-libc's ``IOV_MAX``; more is ``EINVAL``, as in
POSIX ``writev``): the host reads the list before the data, and never a longer one."""
STDIO_WRITE_MAX = 16 << 20
"""Bytes one write to the guest's stdout or stderr hands over, at most (past the output caps
a sandbox usually has, so a plain ``os.write`` is whole); a longer write is a short one (the
C library and CPython's buffered streams write the rest), so a guest's list of buffers
naming its whole memory a thousand times costs the host 16 MiB, not a thousand memories."""
_STDIO_PIECE = 1 << 16  # bytes copied out of the guest's memory at a time
_FILESTAT = struct.Struct("<QQB7xQQQQQ")  # dev ino type nlink size atim mtim ctim
FIRST_PREOPEN_FD = 3  # WASI numbers the preopened folders 3, 4, ... in the order given
_PATH_FLAGS = os.O_PATH | os.O_CLOEXEC
_copies = itertools.count()

Key = tuple[int, int]  # (st_dev, st_ino)


def _key(st: os.stat_result) -> Key:
    return (st.st_dev, st.st_ino)


@dataclass(frozen=True, kw_only=True)
class DiskPlace:
    """A writable folder of the sandbox: its resolved host path, whether links may be made
    in it, and whether it is a private /tmp (whose files forks share copy-on-write)."""

    root: str
    links: bool = False
    scratch: bool = False


def inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root + os.sep)


def descends(target: str) -> bool:
    """Whether a link's target stays below the folder holding the link wherever that is: a
    relative path of plain names (no ``.``, ``..``, empty parts or NUL)."""
    if not target or target.startswith("/") or "\0" in target or len(
            target.encode("utf-8", "surrogateescape")) > MAX_PATH:
        return False
    return all(part not in ("", ".", "..") for part in target.split("/"))


class DiskLedger:
    """What a fork family's writable places hold, against its caps (module docstring).
    Every method takes the lock: the members of a family run on threads of their own."""

    def __init__(self, places: Sequence[DiskPlace], *, max_bytes: int, max_entries: int,
                 max_open: int) -> None:
        self.max_bytes, self.max_entries, self.max_open = max_bytes, max_entries, max_open
        self.lock = threading.RLock()
        self.places: list[DiskPlace] = []
        self.bytes = 0
        self.known: dict[Key, int] = {}  # inode -> apparent size (0 for folders and links)
        self.extra_names = 0  # names given by hard links beyond each file's first
        self.refs: dict[Key, int] = {}  # inode -> descriptors open on it
        self.orphans: set[Key] = set()  # unlinked, still open
        self.dir_names: dict[Key, int] = {}  # folder -> names in it
        self.foreign: dict[str, int] = {}  # place root -> links in it that do not descend
        self.members = 0  # sandboxes sharing this ledger
        # per place: held by whoever changes which inode a name holds (the engine's open and
        # the host's own write_file), so that a name cannot change between the two opens of
        # one file in a place no one else writes to (a sandbox's /tmp)
        self._name_locks: dict[str, threading.Lock] = {}
        for place in places:
            self.add_place(place)

    @property
    def entries(self) -> int:
        return len(self.known) + self.extra_names

    # ---- places ---------------------------------------------------------------------------
    def add_place(self, place: DiskPlace) -> None:
        """Start counting ``place`` (what it holds already counts; inodes the family holds
        elsewhere, such as a fork's shared files, are not counted twice)."""
        with self.lock:
            if any(p.root == place.root for p in self.places):
                return
            self.places.append(place)
            self._scan(place)

    def names_lock(self, place: DiskPlace) -> threading.Lock:
        with self.lock:
            found = self._name_locks.get(place.root)
            if found is None:
                found = self._name_locks[place.root] = threading.Lock()
            return found

    def place_of(self, host: str) -> DiskPlace | None:
        """The place holding ``host`` (the innermost, when one mount's folder is inside
        another's)."""
        best: DiskPlace | None = None
        for place in self.places:
            if inside(host, place.root) and (best is None or len(place.root) > len(best.root)):
                best = place
        return best

    def _scan(self, place: DiskPlace) -> None:
        try:
            root_st = os.stat(place.root)
        except OSError:
            return
        self.dir_names.setdefault(_key(root_st), 0)
        foreign = 0
        parents: dict[int, Key] = {}  # open folder descriptor -> its inode
        for e in _tree.scan(place.root, limit=SCAN_LIMIT):
            pkey = parents.get(e.parent)
            if pkey is None:
                try:
                    pkey = parents[e.parent] = _key(os.fstat(e.parent))
                except OSError:
                    continue
            self.dir_names[pkey] = self.dir_names.get(pkey, 0) + 1
            key, st = _key(e.st), e.st
            if stat.S_ISLNK(st.st_mode):
                try:
                    if not descends(os.readlink(e.name, dir_fd=e.parent)):
                        foreign += 1
                except (OSError, ValueError):
                    foreign += 1
            if key in self.known:
                if place.links and stat.S_ISREG(st.st_mode):
                    self.extra_names += 1
                continue
            size = st.st_size if stat.S_ISREG(st.st_mode) else 0
            self.known[key] = size
            self.bytes += size
            if stat.S_ISDIR(st.st_mode):
                self.dir_names.setdefault(key, 0)
        self.foreign[place.root] = foreign

    def release_tree(self, place: DiskPlace) -> None:
        """``place`` (a member's /tmp, about to be deleted) stops counting: inodes only it
        names go, files it shares with another member stay."""
        with self.lock:
            self.places = [p for p in self.places if p.root != place.root]
            if self.members <= 0:
                return
            for e in _tree.scan(place.root, limit=SCAN_LIMIT):
                st = e.st
                if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                    continue  # another member's name keeps it
                self._forget(_key(st))

    def _forget(self, key: Key) -> None:
        if self.refs.get(key):
            self.orphans.add(key)
            return
        self.bytes -= self.known.pop(key, 0)
        self.dir_names.pop(key, None)

    # ---- accounting -----------------------------------------------------------------------
    def fits(self, growth: int, entries: int = 0) -> bool:
        """Whether ``growth`` more bytes and ``entries`` more entries fit."""
        with self.lock:
            return not ((growth > 0 and self.bytes + growth > self.max_bytes) or (
                entries > 0 and self.entries + entries > self.max_entries))

    def grow_to(self, key: Key, end: int) -> bool:
        """Reserve the bytes for the file ``key`` to reach ``end`` (nothing when it is that
        long already); False, nothing reserved, when they do not fit."""
        with self.lock:
            cur = self.known.get(key, 0)
            if end <= cur:
                return True
            if self.bytes + end - cur > self.max_bytes:
                return False
            self.known[key] = end
            self.bytes += end - cur
            return True

    def set_size(self, key: Key, size: int) -> None:
        with self.lock:
            self.bytes += size - self.known.get(key, 0)
            self.known[key] = size

    def size_of(self, key: Key) -> int:
        return self.known.get(key, 0)

    def created(self, st: os.stat_result, parent: Key | None) -> None:
        """A name was made for a new inode (a file, folder or link) in folder ``parent``."""
        with self.lock:
            key = _key(st)
            if key not in self.known:
                size = st.st_size if stat.S_ISREG(st.st_mode) else 0
                self.known[key] = size
                self.bytes += size
            if stat.S_ISDIR(st.st_mode):
                self.dir_names.setdefault(key, 0)
            if parent is not None:
                self.dir_names[parent] = self.dir_names.get(parent, 0) + 1

    def linked(self, parent: Key | None) -> None:
        """A hard link gave an existing file one more name, in folder ``parent``."""
        with self.lock:
            self.extra_names += 1
            if parent is not None:
                self.dir_names[parent] = self.dir_names.get(parent, 0) + 1

    def removed(self, st: os.stat_result, parent: Key | None, place: DiskPlace | None
                ) -> None:
        """A name was unlinked (or replaced by a rename): the inode goes once its last name
        is gone and no descriptor holds it."""
        with self.lock:
            if parent is not None and self.dir_names.get(parent, 0) > 0:
                self.dir_names[parent] -= 1
            key = _key(st)
            if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                if place is not None and place.links and self.extra_names > 0:
                    self.extra_names -= 1  # a guest's hard link (forks share only /tmp)
                return
            self._forget(key)

    def renamed(self, old_parent: Key | None, new_parent: Key | None) -> None:
        with self.lock:
            if old_parent is not None and self.dir_names.get(old_parent, 0) > 0:
                self.dir_names[old_parent] -= 1
            if new_parent is not None:
                self.dir_names[new_parent] = self.dir_names.get(new_parent, 0) + 1

    def opened(self, key: Key, size: int) -> None:
        with self.lock:
            self.bytes += size - self.known.get(key, 0)
            self.known[key] = size
            self.refs[key] = self.refs.get(key, 0) + 1

    def closed(self, key: Key) -> None:
        with self.lock:
            n = self.refs.get(key, 0) - 1
            if n > 0:
                self.refs[key] = n
                return
            self.refs.pop(key, None)
            if key in self.orphans:
                self.orphans.discard(key)
                self.bytes -= self.known.pop(key, 0)


class DiskUse:
    """One sandbox's side of its family's :class:`DiskLedger`: the first cap its own turn
    hit (for the turn's result), and the family's figures."""

    __slots__ = ("hit", "ledger")

    def __init__(self, ledger: DiskLedger) -> None:
        self.ledger = ledger
        self.hit: str | None = None

    @property
    def bytes(self) -> int:
        return self.ledger.bytes

    @property
    def entries(self) -> int:
        return self.ledger.entries

    @property
    def max_open(self) -> int:
        return self.ledger.max_open

    def refuse(self, what: str) -> None:
        if self.hit is None:
            self.hit = what

    def take_hit(self) -> str | None:
        hit, self.hit = self.hit, None
        return hit

    def room(self, growth: int, entries: int = 0) -> bool:
        """``ledger.fits``, recording a refusal for the turn's result when it does not."""
        if self.ledger.fits(growth, entries):
            return True
        self.refuse("disk")
        return False


@dataclass(kw_only=True, slots=True)
class _Fd:
    place: DiskPlace | None  # None: outside the writable places (read-only, not accounted)
    mirror: int = -1  # a host O_PATH descriptor of a folder in a writable place
    key: Key | None = None  # the inode of a folder or regular file in a writable place
    append: bool = False
    writes: bool = False  # opened for writing (a fork copies such a file, never shares it)
    preopen: bool = False


class _Refused(Exception):
    def __init__(self, errno: int) -> None:
        self.errno = errno


@dataclass(slots=True)
class _Parent:
    """Where a guest path's last part would sit: its folder (a host descriptor, owned or the
    mirror itself), that folder's inode, depth and path length below the place's root."""

    fd: int
    owned: bool
    key: Key | None  # None when names per folder are not counted
    depth: int
    path_len: int
    name: str
    head: str = ""  # the parts from ``fd`` to the folder (resolved lexically), "" if none

    def close(self) -> None:
        if self.owned:
            os.close(self.fd)
            self.owned = False


def _stat_at(fd: int, rel: str, follow: bool = False) -> os.stat_result | None:
    try:
        return os.stat(rel, dir_fd=fd, follow_symlinks=follow)
    except (OSError, ValueError):
        return None


class GuestFiles:
    """The shadowed WASI file functions of one instance (method names are the WASI names; the
    trampolines in ``_ffi`` call them with the raw arguments and write back the errno)."""

    def __init__(self, use: DiskUse, preopens: Sequence[tuple[str, str, bool]],
                 mem: Callable[[], MemoryRef], calls: Callable[[], dict[str, WasiCall]],
                 ctx: int, stdio: Mapping[int, Callable[[bytes], object]] | None = None) -> None:
        """``stdio``: the sinks of the guest's standard streams, by descriptor (1 and 2). A
        write to one is handed to its sink here, on the thread running the guest. The
        engine's own stdout would hand it to a callback on a thread of its async runtime, a
        thread Python does not know: a Python callback there, run while the interpreter
        finalizes, ends that thread with a forced unwind, which Rust turns into an abort of
        the whole process (seen at the exit of a script whose last sandbox had just
        closed)."""
        self.use = use
        self.stdio: dict[int, Callable[[bytes], object]] = dict(stdio or {})
        self.ledger = use.ledger
        self._mem = mem
        self._calls_fn = calls
        self._calls: dict[str, WasiCall] | None = None
        self._ctx = ctx
        self.fds: dict[int, _Fd] = {}
        self.open_count = 0
        try:
            for i, (host, _guest, writable) in enumerate(preopens):
                entry = _Fd(place=None, preopen=True)
                if writable:
                    root = os.path.realpath(host)
                    entry.place = self.ledger.place_of(root)
                    if entry.place is not None:
                        entry.mirror = os.open(root, _PATH_FLAGS | os.O_DIRECTORY)
                        entry.key = _key(os.fstat(entry.mirror))
                self.fds[FIRST_PREOPEN_FD + i] = entry
        except BaseException:
            self.close_all()
            raise

    # ---- plumbing -------------------------------------------------------------------------
    def _orig(self, name: str, *args: int) -> int:
        calls = self._calls
        if calls is None:
            calls = self._calls = self._calls_fn()
        return calls[name](self._ctx, *args)

    def _target(self, dirfd: int, ptr: int, n: int) -> tuple[_Fd, str] | int | None:
        """The folder entry and the guest path of a call naming ``ptr``/``n`` relative to
        ``dirfd``, when ``dirfd`` is a folder in a writable place (None: nothing to account
        for, the engine decides); an errno for a path no engine would take."""
        d = self.fds.get(dirfd)
        if d is None or d.mirror < 0:
            return None
        raw = self._mem().read(ptr, n)
        if raw is None:
            return EFAULT
        rel = raw.decode("utf-8", "surrogateescape")
        if not rel:
            return ENOENT
        if "\0" in rel:
            return EINVAL
        if rel.startswith("/"):
            return ENOTCAPABLE
        return d, rel

    def _parent(self, d: _Fd, rel: str) -> _Parent | int:
        """The folder a path's last part sits in, resolved by the kernel from ``d``'s mirror
        (following links in between, as the engine does); an errno when it is not in the
        place any more."""
        assert d.place is not None
        path = rel.rstrip("/") or "."
        head, _, name = path.rpartition("/")
        if head and d.place.scratch:
            # A private /tmp holds no links: the parent's place is its mirror's (read from
            # the kernel) plus the plain parts in between (and, where names per folder are
            # counted, its inode from one stat)
            return self._parent_lexical(d, head, name)
        if head:
            try:
                fd = os.open(head, _PATH_FLAGS | os.O_DIRECTORY, dir_fd=d.mirror)
            except (OSError, ValueError):
                return ENOENT
            owned = True
        else:
            fd, owned = d.mirror, False
        try:
            real = os.readlink(f"/proc/self/fd/{fd}")
            root = d.place.root
            if not inside(real, root):
                raise _Refused(ENOENT)  # deleted, or moved out by someone else
            below = real[len(root) + 1:]
            depth = below.count("/") + 1 if below else 0
            return _Parent(fd=fd, owned=owned, key=_key(os.fstat(fd)), depth=depth,
                           path_len=len(os.fsencode(below)), name=name)
        except _Refused as exc:
            if owned:
                os.close(fd)
            return exc.errno
        except OSError:
            if owned:
                os.close(fd)
            return ENOENT

    def _parent_lexical(self, d: _Fd, head: str, name: str) -> _Parent | int:
        assert d.place is not None
        parts = [x for x in head.split("/") if x not in ("", ".")]
        if ".." in parts:
            norm = os.path.normpath(head)
            if norm == ".." or norm.startswith("../"):
                return ENOTCAPABLE
            parts = [x for x in norm.split("/") if x not in ("", ".")]
        try:
            real = os.readlink(f"/proc/self/fd/{d.mirror}")
        except OSError:
            return ENOENT
        root = d.place.root
        if not inside(real, root):
            return ENOENT
        below = real[len(root) + 1:]
        tail = "/".join(parts)
        rel = f"{below}/{tail}" if below and tail else below or tail
        key = None
        if self._count_names:
            st = _stat_at(d.mirror, head, follow=True)
            if st is None or not stat.S_ISDIR(st.st_mode):
                return ENOENT
            key = _key(st)
        return _Parent(fd=d.mirror, owned=False, key=key,
                       depth=rel.count("/") + 1 if rel else 0,
                       path_len=len(os.fsencode(rel)), name=name, head=tail)

    @property
    def _count_names(self) -> bool:
        """Whether names per folder are counted: only when the entry cap is above the
        per-folder cap (below it, the one implies the other)."""
        return self.ledger.max_entries > MAX_DIR_ENTRIES

    def _room_for_name(self, p: _Parent, *, height: int = 0, tail_len: int = 0,
                       new_inodes: int = 1, same_parent: bool = False) -> int:
        """0 when a new name ``p.name`` (holding a tree ``height`` levels deep whose longest
        path below it is ``tail_len`` bytes) fits the bounds and the caps, else the errno."""
        name_len = len(os.fsencode(p.name))
        if p.depth + 1 + height > MAX_DEPTH or (
                p.path_len + 1 + name_len + (tail_len + 1 if tail_len else 0) > MAX_PATH):
            self.use.refuse("disk")
            return ENAMETOOLONG
        if not same_parent and self._count_names and p.key is not None and \
                self.ledger.dir_names.get(p.key, 0) >= MAX_DIR_ENTRIES:
            self.use.refuse("disk")
            return EDQUOT
        if new_inodes and not self.use.room(0, new_inodes):
            return EDQUOT
        return 0

    def _engine_stat(self, fd: int, scratch: int) -> tuple[int, int, int, int] | None:
        """(filetype, size, mtime, link count) of descriptor ``fd`` from the engine's own
        ``fd_filestat_get`` (its ``ctim`` is the birth time, not the host's ctime), with 64
        bytes of guest memory near ``scratch`` borrowed and put back."""
        mem = self._mem()
        size = mem.current_size()
        at = max(0, min(scratch, size - _FILESTAT.size)) & ~7
        saved = mem.read(at, _FILESTAT.size)
        if saved is None:
            return None
        try:
            if self._orig("fd_filestat_get", fd, at) != 0:
                return None
            got = mem.read(at, _FILESTAT.size)
            if got is None:
                return None
            _dev, _ino, ftype, nlink, fsize, _atim, mtim, _ctim = _FILESTAT.unpack(got)
            return ftype, fsize, mtim, nlink
        finally:
            mem.write(at, saved)

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

    def _release(self, fd: int) -> None:
        entry = self.fds.pop(fd, None)
        if entry is None:
            return
        if not entry.preopen:
            self.open_count -= 1
        if entry.mirror >= 0:
            with contextlib.suppress(OSError):
                os.close(entry.mirror)
            entry.mirror = -1
        elif entry.key is not None:
            self.ledger.closed(entry.key)

    def close_all(self) -> None:
        """The instance is gone: its descriptors with it."""
        for fd in list(self.fds):
            self._release(fd)

    def writing_keys(self) -> set[Key]:
        """The files this instance holds open for writing (a fork copies them rather than
        share them: this instance may still write to them)."""
        return {e.key for e in self.fds.values() if e.writes and e.key is not None}

    # ---- copy-on-write ------------------------------------------------------------------------
    def _copy_up(self, p: _Parent, st: os.stat_result, *, empty: bool) -> int:
        """Give the name ``p.name`` a copy of the file a fork shares with it (``empty``: an
        empty one, for an open that truncates), so that writing to it changes this sandbox's
        file only; 0, or the errno."""
        size = 0 if empty else st.st_size
        if not self.use.room(size, 1):
            return EDQUOT
        tmp = f".memex-cow-{os.getpid()}-{next(_copies)}"
        try:
            dfd = os.open(p.head or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC,
                          dir_fd=p.fd)
        except OSError:
            return EIO
        try:
            _tree.copy_file(p.name, dfd, tmp, dfd, st, length=size)
            os.rename(tmp, p.name, src_dir_fd=dfd, dst_dir_fd=dfd)
            new = os.stat(p.name, dir_fd=dfd, follow_symlinks=False)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            return EIO
        finally:
            os.close(dfd)
        self.ledger.created(new, None)  # the name stays: only the inode is new
        return 0

    def _shared(self, d: _Fd, st: os.stat_result | None) -> bool:
        return (d.place is not None and d.place.scratch and st is not None
                and stat.S_ISREG(st.st_mode) and st.st_nlink > 1)

    # ---- descriptors ----------------------------------------------------------------------
    def path_open(self, dirfd: int, dirflags: int, path: int, path_len: int, oflags: int,
                  rights: int, inheriting: int, fdflags: int, fd_out: int) -> int:
        if self.open_count >= self.ledger.max_open:
            self.use.refuse("open_files")
            return EMFILE
        args = (dirfd, dirflags, path, path_len, oflags, rights, inheriting, fdflags, fd_out)
        target = self._target(dirfd, path, path_len)
        if target is None:
            r = self._orig("path_open", *args)
            if r == 0:
                got = self._mem().read(fd_out, 4)
                if got is not None:
                    self.fds[_U32.unpack(got)[0]] = _Fd(place=None)
                    self.open_count += 1
            return r
        if isinstance(target, int):
            return target
        d, rel = target
        follow = bool(dirflags & _FOLLOW)
        writes = bool(rights & _WRITE_RIGHTS) or bool(oflags & _O_TRUNC)
        before = _stat_at(d.mirror, rel, follow)
        creates = bool(oflags & _O_CREAT) and before is None
        if creates and follow and d.place is not None and d.place.links and _stat_at(
                d.mirror, rel) is not None:
            return EPERM  # a file made through a dangling link lands where it points: no
        parent: _Parent | None = None
        try:
            if creates or (writes and self._shared(d, before)):
                got_parent = self._parent(d, rel)
                if isinstance(got_parent, int):
                    return got_parent
                parent = got_parent
                if creates:
                    err = self._room_for_name(parent)
                else:
                    assert before is not None
                    err = self._copy_up(parent, before, empty=bool(oflags & _O_TRUNC))
                if err:
                    return err
            assert d.place is not None
            if d.place.scratch:  # no one else changes its names: no need to check, but lock
                with self.ledger.names_lock(d.place):
                    return self._open(args, d, rel, follow, writes, parent if creates else None,
                                      check=False)
            return self._open(args, d, rel, follow, writes, parent if creates else None,
                              check=True)
        finally:
            if parent is not None:
                parent.close()

    def _open(self, args: tuple[int, ...], d: _Fd, rel: str, follow: bool, writes: bool,
              parent: _Parent | None, *, check: bool) -> int:
        r = self._orig("path_open", *args)
        if r != 0:
            return r
        got = self._mem().read(args[8], 4)
        if got is None:
            return r
        return self._register(_U32.unpack(got)[0], d, rel, follow, args[2], writes,
                              bool(args[7] & _FDFLAG_APPEND), parent, check)

    def _register(self, fd: int, d: _Fd, rel: str, follow: bool, scratch: int, writes: bool,
                  append: bool, parent: _Parent | None, check: bool) -> int:
        """Record a descriptor the engine just opened in a writable place: a mirror of it,
        checked (``check``: in a place others may write to) to be what the engine opened by
        the engine's own ``fd_filestat_get``; 0, or an errno after closing it again (never an
        unaccounted file)."""
        assert d.place is not None
        if not check:  # a private /tmp, its names locked: a stat names what the engine opened
            st0 = _stat_at(d.mirror, rel, follow)
            if st0 is not None and not stat.S_ISDIR(st0.st_mode):
                return self._record(fd, d, st0, writes, append, parent, -1)
        try:
            mirror = os.open(rel, _PATH_FLAGS | (0 if follow else os.O_NOFOLLOW),
                             dir_fd=d.mirror)
        except (OSError, ValueError):
            self._orig("fd_close", fd)
            return EIO
        try:
            st = os.fstat(mirror)
            is_dir, is_reg = stat.S_ISDIR(st.st_mode), stat.S_ISREG(st.st_mode)
            if check:
                seen = self._engine_stat(fd, scratch)
                kind = _WASI_DIR if is_dir else _WASI_FILE if is_reg else None
                if seen is None or (kind is not None and (seen[0] != kind or (
                        is_reg and (seen[1], seen[2], seen[3]) != (
                            st.st_size, st.st_mtime_ns, st.st_nlink)))):
                    raise _Refused(EIO)  # the name changed between the engine's open and ours
        except (OSError, _Refused):
            os.close(mirror)
            self._orig("fd_close", fd)
            return EIO
        if not is_dir:
            os.close(mirror)
            mirror = -1
        return self._record(fd, d, st, writes, append, parent, mirror)

    def _record(self, fd: int, d: _Fd, st: os.stat_result, writes: bool, append: bool,
                parent: _Parent | None, mirror: int) -> int:
        if parent is not None:
            self.ledger.created(st, parent.key)
        entry = _Fd(place=d.place, writes=writes, append=append, key=_key(st), mirror=mirror)
        if mirror < 0:
            if stat.S_ISREG(st.st_mode):
                self.ledger.opened(_key(st), st.st_size)
            else:
                entry.key = None
        self.fds[fd] = entry
        self.open_count += 1
        return 0

    def fd_close(self, fd: int) -> int:
        r = self._orig("fd_close", fd)
        if r == 0:
            self._release(fd)
            self.stdio.pop(fd, None)
        return r

    def fd_renumber(self, fd: int, to: int) -> int:
        r = self._orig("fd_renumber", fd, to)
        if r == 0 and fd != to:
            self._release(to)
            moved = self.fds.pop(fd, None)
            if moved is not None:
                self.fds[to] = moved
            self.stdio.pop(to, None)
            sink = self.stdio.pop(fd, None)
            if sink is not None:
                self.stdio[to] = sink
        return r

    def fd_fdstat_set_flags(self, fd: int, flags: int) -> int:
        r = self._orig("fd_fdstat_set_flags", fd, flags)
        entry = self.fds.get(fd)
        if r == 0 and entry is not None:
            entry.append = bool(flags & _FDFLAG_APPEND)
        return r

    # ---- growth -----------------------------------------------------------------------------
    def _file(self, fd: int) -> _Fd | None:
        entry = self.fds.get(fd)
        return entry if entry is not None and entry.key is not None and entry.mirror < 0 \
            else None

    def fd_write(self, fd: int, iovs: int, n_iovs: int, nwritten: int) -> int:
        if n_iovs > IOV_MAX:
            return EINVAL
        sink = self.stdio.get(fd)
        if sink is not None:
            return self._write_stdio(sink, iovs, n_iovs, nwritten)
        entry = self._file(fd)
        if entry is None or n_iovs <= 0:
            return self._orig("fd_write", fd, iovs, n_iovs, nwritten)
        raw = self._mem().read(iovs, 8 * n_iovs)
        if raw is None:
            return EFAULT
        total = sum(ln for _, ln in _IOVEC.iter_unpack(raw))
        # Where the write lands: an append goes to the end; otherwise the offset, which may lie
        # past the end (a seek there makes a sparse file, counted whole).
        pos = self.ledger.size_of(entry.key) if entry.append else self._tell(fd, iovs)  # type: ignore[arg-type]
        if pos is None:  # no offset to account at: refuse rather than write uncounted
            return EIO
        return self._write(entry, fd, pos, total, iovs, nwritten,
                           lambda: self._orig("fd_write", fd, iovs, n_iovs, nwritten))

    def _write_stdio(self, sink: Callable[[bytes], object], iovs: int, n_iovs: int,
                     nwritten: int) -> int:
        """A write to stdout or stderr: the buffers in order, up to :data:`STDIO_WRITE_MAX`
        bytes (the rest is left to the guest's next write), copied out a piece at a time."""
        mem = self._mem()
        raw = mem.read(iovs, 8 * max(n_iovs, 0))
        if raw is None or mem.read(nwritten, 4) is None:
            return EFAULT
        bufs = list(_IOVEC.iter_unpack(raw))
        if any(mem.read(ptr + ln, 0) is None for ptr, ln in bufs):
            return EFAULT  # every buffer is checked before any is handed over
        done = 0
        for ptr, ln in bufs:
            ln = min(ln, STDIO_WRITE_MAX - done)
            for at in range(ptr, ptr + ln, _STDIO_PIECE):
                piece = mem.read(at, min(_STDIO_PIECE, ptr + ln - at))
                if piece is None:  # the memory cannot shrink; kept for the type checker
                    return EFAULT
                try:
                    sink(piece)
                except Exception:
                    return EIO  # as the engine's stream answers a callback that failed
            done += ln
            if done >= STDIO_WRITE_MAX:
                break
        mem.write(nwritten, _U32.pack(done))
        return 0

    def fd_pwrite(self, fd: int, iovs: int, n_iovs: int, offset: int, nwritten: int) -> int:
        if n_iovs > IOV_MAX:
            return EINVAL
        entry = self._file(fd)
        if entry is None or n_iovs <= 0:
            return self._orig("fd_pwrite", fd, iovs, n_iovs, offset, nwritten)
        raw = self._mem().read(iovs, 8 * n_iovs)
        if raw is None:
            return EFAULT
        total = sum(ln for _, ln in _IOVEC.iter_unpack(raw))
        return self._write(entry, fd, offset, total, iovs, nwritten,
                           lambda: self._orig("fd_pwrite", fd, iovs, n_iovs, offset, nwritten))

    def _write(self, entry: _Fd, fd: int, pos: int, total: int, scratch: int, nwritten: int,
               call: Callable[[], int]) -> int:
        """Reserve the bytes a write at ``pos`` may add, make it, then settle on what the
        kernel says the file holds when less was written than reserved."""
        key = entry.key
        assert key is not None
        end = pos + total
        before = self.ledger.size_of(key)
        if not self.ledger.grow_to(key, end):
            self.use.refuse("disk")
            return EDQUOT
        r = call()
        if end > before:
            got = self._mem().read(nwritten, 4) if r == 0 else None
            if got is None or pos + _U32.unpack(got)[0] < end:
                self._settle(fd, key, scratch)
        return r

    def _settle(self, fd: int, key: Key, scratch: int) -> None:
        """The file's size as the engine's descriptor sees it now (after a failed or short
        write, a reservation is given back)."""
        seen = self._engine_stat(fd, scratch)
        if seen is not None:
            self.ledger.set_size(key, seen[1])

    def _resize(self, name: str, fd: int, new_size: Callable[[int], int], *args: int) -> int:
        entry = self._file(fd)
        if entry is None:
            return self._orig(name, fd, *args)
        key = entry.key
        assert key is not None
        cur = self.ledger.size_of(key)
        size = new_size(cur)
        if not self.ledger.grow_to(key, size):
            self.use.refuse("disk")
            return EDQUOT
        r = self._orig(name, fd, *args)
        if r == 0:
            self.ledger.set_size(key, size)
        elif size > cur:
            self.ledger.set_size(key, cur)
        return r

    def fd_filestat_set_size(self, fd: int, size: int) -> int:
        return self._resize("fd_filestat_set_size", fd, lambda _cur: size, size)

    def fd_allocate(self, fd: int, offset: int, length: int) -> int:
        return self._resize("fd_allocate", fd, lambda cur: max(cur, offset + length),
                            offset, length)

    # ---- names ------------------------------------------------------------------------------
    def _made(self, d: _Fd, rel: str, parent: _Parent) -> None:
        st = _stat_at(d.mirror, rel)
        if st is not None:
            self.ledger.created(st, parent.key)

    def path_create_directory(self, dirfd: int, path: int, path_len: int) -> int:
        target = self._target(dirfd, path, path_len)
        if target is None:
            return self._orig("path_create_directory", dirfd, path, path_len)
        if isinstance(target, int):
            return target
        d, rel = target
        p = self._parent(d, rel)
        if isinstance(p, int):
            return p
        try:
            err = self._room_for_name(p)
            if err:
                return err
            r = self._orig("path_create_directory", dirfd, path, path_len)
            if r == 0:
                self._made(d, rel, p)
            return r
        finally:
            p.close()

    def _remove(self, call: str, dirfd: int, path: int, path_len: int) -> int:
        target = self._target(dirfd, path, path_len)
        if target is None:
            return self._orig(call, dirfd, path, path_len)
        if isinstance(target, int):
            return target
        d, rel = target
        before = _stat_at(d.mirror, rel)
        p = self._parent(d, rel) if before is not None else None
        try:
            r = self._orig(call, dirfd, path, path_len)
            if r == 0 and before is not None:
                self.ledger.removed(before, p.key if isinstance(p, _Parent) else None,
                                    d.place)
            return r
        finally:
            if isinstance(p, _Parent):
                p.close()

    def path_remove_directory(self, dirfd: int, path: int, path_len: int) -> int:
        return self._remove("path_remove_directory", dirfd, path, path_len)

    def path_unlink_file(self, dirfd: int, path: int, path_len: int) -> int:
        return self._remove("path_unlink_file", dirfd, path, path_len)

    def _tree_facts(self, d: _Fd, rel: str) -> tuple[int, int, bool] | None:
        """(height, longest path length below it, holds a link that does not descend) of the
        folder at ``rel``; None when it cannot be walked."""
        try:
            fd = os.open(rel, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                         dir_fd=d.mirror)
        except (OSError, ValueError):
            return None
        assert d.place is not None
        check_links = self.ledger.foreign.get(d.place.root, 0) > 0
        height = longest = 0
        foreign = False
        try:
            for e in _tree.scan(fd, limit=self.ledger.entries + MAX_DIR_ENTRIES):
                height, longest = max(height, e.depth), max(longest, e.path_len)
                if check_links and stat.S_ISLNK(e.st.st_mode):
                    try:
                        foreign = foreign or not descends(os.readlink(e.name, dir_fd=e.parent))
                    except (OSError, ValueError):
                        foreign = True
        finally:
            os.close(fd)
        return height, longest, foreign

    def path_rename(self, fd: int, old: int, old_len: int, new_fd: int, new: int,
                    new_len: int) -> int:
        args = (fd, old, old_len, new_fd, new, new_len)
        src = self._target(fd, old, old_len)
        dst = self._target(new_fd, new, new_len)
        if src is None and dst is None:
            return self._orig("path_rename", *args)
        for t in (src, dst):
            if isinstance(t, int):
                return t
        if src is None or dst is None:
            return EXDEV  # between a writable place and somewhere else
        assert not isinstance(src, int) and not isinstance(dst, int)
        (sd, srel), (dd, drel) = src, dst
        if sd.place is not dd.place:
            return EXDEV  # each place is a filesystem of its own
        moved = _stat_at(sd.mirror, srel)
        if moved is None:
            return self._orig("path_rename", *args)  # the engine says why (ENOENT...)
        replaced = _stat_at(dd.mirror, drel)
        if replaced is not None and _key(replaced) == _key(moved):
            return self._orig("path_rename", *args)  # onto itself: POSIX does nothing
        height = tail = 0
        if stat.S_ISLNK(moved.st_mode):
            try:
                ok = descends(os.readlink(srel, dir_fd=sd.mirror))
            except (OSError, ValueError):
                ok = False
            if not ok:
                return EPERM  # a link the host planted stays where it points from
        elif stat.S_ISDIR(moved.st_mode):
            facts = self._tree_facts(sd, srel)
            if facts is None:
                return EIO
            height, tail, foreign = facts
            if foreign:
                return EPERM
        old_p = self._parent(sd, srel)
        if isinstance(old_p, int):
            return old_p
        new_p = self._parent(dd, drel)
        if isinstance(new_p, int):
            old_p.close()
            return new_p
        try:
            same = old_p.key == new_p.key or replaced is not None
            err = self._room_for_name(new_p, height=height, tail_len=tail, new_inodes=0,
                                      same_parent=same)
            if err:
                return err
            r = self._orig("path_rename", *args)
            if r == 0:
                if replaced is not None:
                    self.ledger.removed(replaced, None, dd.place)
                    self.ledger.renamed(old_p.key, None)
                else:
                    self.ledger.renamed(old_p.key, new_p.key)
            return r
        finally:
            old_p.close()
            new_p.close()

    def path_symlink(self, old: int, old_len: int, dirfd: int, new: int, new_len: int) -> int:
        target = self._target(dirfd, new, new_len)
        if target is None:
            return self._orig("path_symlink", old, old_len, dirfd, new, new_len)
        if isinstance(target, int):
            return target
        d, rel = target
        assert d.place is not None
        raw = self._mem().read(old, old_len)
        if not d.place.links or raw is None or not descends(
                raw.decode("utf-8", "surrogateescape")):
            return EPERM
        p = self._parent(d, rel)
        if isinstance(p, int):
            return p
        try:
            err = self._room_for_name(p)
            if err:
                return err
            r = self._orig("path_symlink", old, old_len, dirfd, new, new_len)
            if r == 0:
                self._made(d, rel, p)
            return r
        finally:
            p.close()

    def path_link(self, fd: int, flags: int, old: int, old_len: int, new_fd: int, new: int,
                  new_len: int) -> int:
        args = (fd, flags, old, old_len, new_fd, new, new_len)
        dst = self._target(new_fd, new, new_len)
        if dst is None:
            return self._orig("path_link", *args)
        if isinstance(dst, int):
            return dst
        src = self._target(fd, old, old_len)
        d, rel = dst
        place = d.place
        assert place is not None
        if not isinstance(src, tuple) or src[0].place is not place or not place.links:
            return EPERM
        sd, srel = src
        st = _stat_at(sd.mirror, srel, bool(flags & _FOLLOW))
        if st is None:
            return self._orig("path_link", *args)
        if stat.S_ISLNK(st.st_mode):
            try:
                if not descends(os.readlink(srel, dir_fd=sd.mirror)):
                    return EPERM
            except (OSError, ValueError):
                return EPERM
        p = self._parent(d, rel)
        if isinstance(p, int):
            return p
        try:
            err = self._room_for_name(p)  # one more entry: the new name
            if err:
                return err
            r = self._orig("path_link", *args)
            if r == 0:
                self.ledger.linked(p.key)
            return r
        finally:
            p.close()

    def path_filestat_set_times(self, fd: int, flags: int, path: int, path_len: int,
                                atim: int, mtim: int, fst_flags: int) -> int:
        args = (fd, flags, path, path_len, atim, mtim, fst_flags)
        target = self._target(fd, path, path_len)
        if isinstance(target, tuple):
            d, rel = target
            st = _stat_at(d.mirror, rel, bool(flags & _FOLLOW))
            if self._shared(d, st):  # a fork's file: its times are this sandbox's to change
                p = self._parent(d, rel)
                if isinstance(p, int):
                    return p
                try:
                    assert st is not None
                    err = self._copy_up(p, st, empty=False)
                    if err:
                        return err
                finally:
                    p.close()
        elif isinstance(target, int):
            return target
        return self._orig("path_filestat_set_times", *args)
