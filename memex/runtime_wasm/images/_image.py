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
import errno
import mmap
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from ...errors import ImageError
from ._dirty import PAGE as _PAGE
from ._dirty import Runs, joined

if TYPE_CHECKING:
    from .._instance import Instance

__all__ = ["MemoryImage", "mapped"]

_CHUNK = 1 << 20
_MAX_DEPTH = 8  # deltas above a flat root before they are merged into one


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.mmap.restype = ctypes.c_void_p
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.munmap.restype = ctypes.c_int
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.madvise.restype = ctypes.c_int
_PROT_RW = mmap.PROT_READ | mmap.PROT_WRITE
_MAP_PRIVATE = mmap.MAP_PRIVATE
_MAP_FIXED = 0x10
_MAP_FAILED = ctypes.c_void_p(-1).value
_MADV_HUGEPAGE = 14
_MADV_POPULATE_WRITE = 23  # Linux 5.14
_HOT_MAX = 2 << 20
_HOT_TRIES = 8  # first turns over _HOT_MAX after which learn_hot stops asking
_FRESH_MIN = 2 << 20  # stretches a load writes whole get fresh (huge) pages from this size up

Fill = Callable[[list[int]], None]
"""Writes each run of a pending image at the address given for it (see ``from_runs``)."""


class MemoryImage:
    """One image of a guest's linear memory: *flat* (the whole memory in a memfd) or a
    *delta* (the pages that differ from a parent image, packed in a memfd of their own).

    Restoring maps the chain's flat root copy-on-write over the fresh instance's memory
    (``mmap`` with ``MAP_PRIVATE | MAP_FIXED``), so a restore or fork costs page-table work,
    not a copy, and every sandbox restored from one image shares its unmodified pages; the
    deltas above it are then copied in, so a restore pays for what changed since the root.
    Because private mappings read through to the file, an image that someone else holds, maps
    or builds on (``frozen``) is never written again; only the sandbox that owns an image may
    update it in place (``update``), and only with pages its live instance has written
    (which that instance holds as private copies, so its own view never changes).
    """

    __slots__ = ("__weakref__", "_fd", "_fill", "_fill_at", "_fill_lock", "_flat", "_frozen",
                 "_hot", "_hot_done", "_hot_refused", "_hot_seen", "_offset", "_origin",
                 "_pages", "_parent", "_runs", "_used", "_view_map", "_written_into", "depth",
                 "size")

    def __init__(self, fd: int, size: int, *, parent: MemoryImage | None = None,
                 pages: dict[int, int] | None = None, offset: int = 0,
                 origin: str | None = None) -> None:
        self._fd = fd
        self._origin = origin  # a warm image's name, which saves made on top of it record
        self._offset = offset  # where the memory starts in the file (a raw image file: 4096)
        self.size = size
        self._view_map: mmap.mmap | None = None
        self._parent = parent
        self._pages = pages  # delta only: page number -> offset in this image's file
        self._used = len(pages) * _PAGE if pages is not None else 0
        self._flat: MemoryImage | None = None  # a flat copy of a delta, made on demand
        self._frozen = False
        self.depth: int = 0 if parent is None else parent.depth + 1
        # A pending image (a load): its file is written by ``_fill`` when first needed, and
        # restoring it writes the runs straight into the instance instead (see restore_into).
        self._fill: Fill | None = None
        self._runs: list[tuple[int, int]] = []  # (memory offset, bytes) of each run
        self._fill_at: list[int] = []  # where each run goes in this image's file
        self._fill_lock: threading.Lock | None = None
        self._written_into = False  # a pending image was restored once by writing its runs
        self._hot: tuple[tuple[int, int], ...] = ()  # see learn_hot
        self._hot_refused = 0
        self._hot_done = False
        self._hot_seen: frozenset[int] | None = None  # the first of two turns compared

    @property
    def origin(self) -> str | None:
        """The name of a warm image (None for any other image)."""
        return self._origin

    @property
    def fd(self) -> int:
        self._materialize()
        return self._fd

    @property
    def file_offset(self) -> int:
        """Where the memory starts in this image's file (a raw image file: one page in)."""
        return self._offset

    @property
    def pages(self) -> dict[int, int]:
        """A delta's pages: page number -> offset in its file (empty for a flat image)."""
        return dict(self._pages) if self._pages is not None else {}

    @property
    def root(self) -> MemoryImage:
        """The flat image at the bottom of this one's chain (itself when it is flat)."""
        return self.chain()[0]

    @property
    def frozen(self) -> bool:
        """Held, mapped or built on by someone else: never written again."""
        return self._frozen

    def freeze(self) -> None:
        self._frozen = True

    @property
    def is_delta(self) -> bool:
        return self._parent is not None

    @property
    def layer_bytes(self) -> int:
        """Bytes of memory this image holds itself (the whole memory for a flat one)."""
        return self._used if self._pages is not None else self.size

    @property
    def delta_bytes(self) -> int:
        """Bytes held by the deltas from the flat root to this image (0 for a flat one)."""
        img: MemoryImage | None = self
        total = 0
        while img is not None and img._pages is not None:
            total += img._used
            img = img._parent
        return total

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
            _write_out(img._fd, inst.memory_address(), 0, size)
        except BaseException:
            img.close()
            raise
        return img

    def overwrite_from(self, inst: Instance) -> None:
        """Recapture the whole memory into this flat image's own pages (no page allocation).
        Only for an image that no instance maps and nobody else holds."""
        assert self._pages is None and not self._frozen
        size = inst.memory_size()
        if size > self.size:
            os.ftruncate(self._fd, size)
        self._drop_views()
        _write_out(self._fd, inst.memory_address(), 0, size)
        self.size = size

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

    @classmethod
    def from_runs(cls, size: int, runs: Sequence[tuple[int, int]], fill: Fill, *,
                  root: MemoryImage | None = None, pending: bool = False) -> MemoryImage:
        """An image of a ``size``-byte memory whose ``runs`` (page-aligned offset, bytes)
        ``fill`` writes, given the address of each run in the new image's mapped file: a
        flat image (zeros elsewhere), or with ``root`` a delta on it holding just the runs
        (how a saved session loads on the warm image it was saved on). The bytes go
        straight into the image: no copy is made on the way.

        ``pending``: the file is written only when something needs it (a fork, a rollback, a
        save); restoring the image first (a load) writes the runs straight into the new
        instance's memory instead, on fresh pages (see :meth:`restore_into`), so that a load
        costs one pass over the memory, not two."""
        used = sum(n for _, n in runs)
        fd = cls._new_fd(size if root is None else max(used, _PAGE))
        pages: dict[int, int] = {}
        at_list: list[int] = []
        at = 0
        for off, n in runs:
            if root is None:
                at_list.append(off)
            else:
                at_list.append(at)
                for k in range(n // _PAGE):
                    pages[off // _PAGE + k] = at + k * _PAGE
                at += n
        img = cls(fd, size) if root is None else cls(fd, size, parent=root, pages=pages)
        img._fill, img._runs, img._fill_at = fill, list(runs), at_list
        img._fill_lock = threading.Lock()
        if not pending:
            try:
                img._materialize()
            except BaseException:
                img.close()
                raise
        return img

    def learn_hot(self, runs: Runs) -> None:
        """Learn from the first turn of a guest restored from this (root) image which pages
        such a turn writes: later restores write them in one ``madvise`` per stretch before
        the guest runs (the driver's own working set, ~155 scattered pages), where the turn
        would take a copy-on-write fault for each. What is kept is what two first turns
        both wrote, so the pages of one workload's first cell (a big list, an import) are not
        paid for by every later sandbox; a first turn over ``_HOT_MAX`` is not counted."""
        if not self.learns_hot:
            return
        if sum(n for _, n in runs) > _HOT_MAX:
            self._hot_refused += 1
            return
        pages = {off + k for off, n in runs for k in range(0, n, _PAGE)}
        seen = self._hot_seen  # read once: two sandboxes may close at the same moment
        if seen is None:
            self._hot_seen = frozenset(pages)
            return
        both = sorted(pages & seen)
        self._hot = tuple(joined([(off, _PAGE) for off in both]))
        self._hot_seen = None
        self._hot_done = True

    @property
    def learns_hot(self) -> bool:
        """A flat image still learning what a first turn writes: not yet two first turns
        compared, nor so many too large that asking again is not worth a scan of the
        memory. (A delta never learns: the turns after a fork or a load are not alike.)"""
        return (self._pages is None and not self._hot_done
                and self._hot_refused < _HOT_TRIES)

    @property
    def pending(self) -> bool:
        """Its file is not written yet (a load that nothing has forked, rolled back to or
        saved)."""
        return self._fill is not None

    def _materialize(self) -> None:
        """Write a pending image's file (once; any thread)."""
        if self._fill is None or self._fill_lock is None:
            return
        with self._fill_lock:
            fill = self._fill
            if fill is None:
                return
            length = os.fstat(self._fd).st_size
            with mapped(self._fd, length, write=True) as base:
                fill([base + at for at in self._fill_at])
            self._fill = None
            self._runs, self._fill_at = [], []

    # ---- deltas ---------------------------------------------------------------------------
    def derive(self, inst: Instance, runs: Runs) -> MemoryImage:
        """A new image of ``inst``'s memory, which equals this image except in ``runs`` (the
        pages written since): a delta on this one; when the chain is deep, a delta that folds
        the small recent layers together; a flat copy when that would be most of it."""
        size = inst.memory_size()
        parent: MemoryImage = self
        pages = _pages_of(runs)
        if self.depth >= _MAX_DEPTH:
            # Merge the top of the chain down to the first layer bigger than everything above
            # it (the root at the latest): small recent layers fold together, a big old one
            # is not copied again each time.
            assert self._pages is not None and self._parent is not None
            pages.update(self._pages)
            parent = self._parent
            while parent._pages is not None and parent._parent is not None \
                    and parent._used <= len(pages) * _PAGE:
                pages.update(parent._pages)
                parent = parent._parent
        if _mostly(len(pages) * _PAGE, size):
            return MemoryImage.capture(inst)
        order = sorted(pages)
        fd = self._new_fd(len(order) * _PAGE)
        delta = MemoryImage(fd, size, parent=parent,
                            pages={p: i * _PAGE for i, p in enumerate(order)})
        try:
            _copy_pages(fd, inst.memory_address(), [(p, i * _PAGE) for i, p in enumerate(order)])
        except BaseException:
            delta.close()
            raise
        parent._frozen = True
        return delta

    def update(self, inst: Instance, runs: Runs) -> MemoryImage:
        """Bring this image (owned by the caller, not frozen) up to ``inst``'s memory, which
        differs from it only in ``runs``: a flat image is written in place, a delta gets the
        pages overwritten or appended. Returns this image, or a flat copy of the memory when
        the chain's deltas have become most of it."""
        assert not self._frozen
        size = inst.memory_size()
        self._drop_views()
        self._flat = None
        addr = inst.memory_address()
        if self._pages is None:
            if size > self.size:
                os.ftruncate(self._fd, size)
            for off, n in runs:
                _write_out(self._fd, addr + off, off, n)
        else:
            todo: list[tuple[int, int]] = []
            for page in _pages_of(runs):
                at = self._pages.get(page)
                if at is None:
                    at = self._pages[page] = self._used
                    self._used += _PAGE
                todo.append((page, at))
            todo.sort(key=lambda t: t[1])
            os.ftruncate(self._fd, self._used)
            _copy_pages(self._fd, addr, todo)
        self.size = max(size, self.size)
        if self._pages is not None and _mostly(self.delta_bytes, self.size):
            return MemoryImage.capture(inst)
        return self

    def flat(self) -> MemoryImage:
        """This image as one flat memfd (itself when it is flat; a delta builds a copy once)."""
        if self._pages is None and self._offset == 0:
            return self
        if self._flat is None:
            fd = self._new_fd(self.size)
            flat = MemoryImage(fd, self.size)
            try:
                chain = self.chain()
                root = chain[0]
                _copy_file(root._fd, root._offset, fd, root.size)
                for layer in chain[1:]:
                    assert layer._pages is not None
                    for page, at, n in _extents(layer._pages):
                        os.pwrite(fd, os.pread(layer._fd, n, at), page * _PAGE)
            except BaseException:
                flat.close()
                raise
            self._flat = flat
        return self._flat

    def chain(self) -> list[MemoryImage]:
        """The flat root first, then every delta up to this image (each file written)."""
        chain = self._layers()
        for layer in chain:
            layer._materialize()
        return chain

    def _layers(self) -> list[MemoryImage]:
        chain: list[MemoryImage] = []
        img: MemoryImage | None = self
        while img is not None:
            if img._fd < 0:
                raise ImageError("memory image is closed")
            chain.append(img)
            img = img._parent
        chain.reverse()
        return chain

    def newest_extents(self) -> list[tuple[int, int, int, int]]:
        """What the deltas above the root hold, the newest copy of each page: (first page,
        layer fd, offset in its file, bytes) per stretch, in page order."""
        owner: dict[int, MemoryImage] = {}
        layers = self.chain()[1:]
        for layer in layers:
            assert layer._pages is not None
            owner.update(dict.fromkeys(layer._pages, layer))
        out: list[tuple[int, int, int, int]] = []
        for layer in layers:
            assert layer._pages is not None
            mine = {p: at for p, at in layer._pages.items() if owner[p] is layer}
            out += [(page, layer._fd, at, n) for page, at, n in _extents(mine)]
        out.sort()
        return out

    # ---- restore --------------------------------------------------------------------------
    def restore_into(self, inst: Instance) -> int | None:
        """Make ``inst`` (a fresh, idle instance of the same binary) hold this image. A
        pending image's runs are written straight into the instance's memory (the image's
        own file stays unwritten until something needs it). Returns how many bytes from the
        start of the memory are the root's file mapped privately (None: none are), the
        rest written: what a watch of the new memory may take as unwritten so far."""
        chain = self._layers()
        # The first restore of a pending image (the load itself) writes its runs into the
        # instance; a later one (a fork, a rollback) maps its file, written by then.
        pending = self if self._fill is not None and not self._written_into else None
        for layer in chain:
            if layer is not pending:
                layer._materialize()
        root = chain[0]
        inst.grow_to(self.size)
        if inst.memory_size() < self.size:
            raise ImageError(
                f"memory size mismatch restoring an image ({inst.memory_size()} < {self.size})"
            )
        dst = inst.memory_address()
        mapped: int | None = None
        if root is pending:  # a flat image: zeros wherever its runs do not write
            _fresh_pages(dst, root.size, zero_fallback=True)
        else:
            got = _libc.mmap(dst, root.size, _PROT_RW, _MAP_PRIVATE | _MAP_FIXED, root._fd,
                             root._offset)
            if got != dst:  # mapping refused (e.g. a seccomp policy): the kernel copies
                _read_into(root._fd, dst, root._offset, root.size)
            else:
                mapped = root.size
            for off, n in root._hot:
                _libc.madvise(dst + off, n, _MADV_POPULATE_WRITE)  # unsupported: no harm
        deltas = [layer for layer in chain[1:] if layer is not pending]
        if deltas:
            memory = memoryview((ctypes.c_char * self.size).from_address(dst)).cast("B")
            for layer in deltas:
                assert layer._pages is not None
                _read_extents(layer._fd, memory, _extents(layer._pages))
        if pending is not None:
            pending._write_runs_into(dst)
            pending._written_into = True
            if pending._parent is not None:
                mapped = None  # fresh pages of its own over parts of the mapping
        return mapped

    def _write_runs_into(self, dst: int) -> None:
        """A pending image's runs, written into the memory at ``dst``: each stretch of at
        least 2 MiB that the runs cover whole is first replaced by fresh zero pages, huge
        where the kernel allows (so its pages are neither copied from what was mapped below
        nor faulted in one by one), the rest written in place."""
        fill = self._fill
        assert fill is not None
        if self._parent is not None:  # a flat image's memory is all fresh already
            for start, n in _stretches_of(self._runs):
                if n >= _FRESH_MIN:
                    _fresh_pages(dst + start, n, zero_fallback=False)
        fill([dst + off for off, _ in self._runs])

    def _mapped(self) -> mmap.mmap:
        if self._view_map is None:
            self._view_map = mmap.mmap(self._fd, self._offset + self.size, mmap.MAP_SHARED,
                                       mmap.PROT_READ)
        return self._view_map

    def view(self) -> memoryview:
        """The whole memory, read-only (a delta is flattened first)."""
        if self._pages is None:
            return memoryview(self._mapped())[self._offset : self._offset + self.size]
        flat = self.flat()
        return memoryview(flat._mapped())[: flat.size]

    def _drop_views(self) -> None:
        if self._view_map is not None:
            self._view_map.close()
            self._view_map = None

    def close(self) -> None:
        self._fill = None  # a pending image's source (the loaded file's bytes) goes too
        if self._flat is not None:
            self._flat.close()
            self._flat = None
        if self._view_map is not None:
            try:
                self._view_map.close()
            except BufferError:
                return  # a view is still exported; the fd is closed when this is collected
            self._view_map = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._parent = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


@contextlib.contextmanager
def mapped(fd: int, size: int, *, offset: int = 0, write: bool = False) -> Iterator[int]:
    """The address of ``size`` bytes of ``fd`` from ``offset`` (page-aligned), mapped shared
    for as long as the block runs: for the C code that reads or writes an image in place."""
    prot = mmap.PROT_READ | (mmap.PROT_WRITE if write else 0)
    addr = _libc.mmap(None, size, prot, mmap.MAP_SHARED, fd, offset)
    if addr in (None, _MAP_FAILED):
        err = ctypes.get_errno()
        raise ImageError(f"cannot map a memory image: {os.strerror(err)}")
    try:
        yield addr
    finally:
        _libc.munmap(addr, size)


def _pages_of(runs: Runs) -> dict[int, int]:
    """The page numbers in ``runs`` (values unused: a dict keeps them in order)."""
    pages: dict[int, int] = {}
    for off, n in runs:
        for page in range(off // _PAGE, (off + n + _PAGE - 1) // _PAGE):
            pages[page] = 0
    return pages


def _extents(pages: dict[int, int]) -> list[tuple[int, int, int]]:
    """(first page, file offset, bytes) for each stretch of pages that is contiguous both in
    memory and in the file."""
    return _stretches(sorted(pages.items()))


def _stretches(pairs: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """(page, file offset) pairs, in order, joined where both sides are contiguous."""
    out: list[tuple[int, int, int]] = []
    for page, at in pairs:
        if out:
            p0, a0, n0 = out[-1]
            if p0 + n0 // _PAGE == page and a0 + n0 == at:
                out[-1] = (p0, a0, n0 + _PAGE)
                continue
        out.append((page, at, _PAGE))
    return out


def _fresh_pages(addr: int, n: int, *, zero_fallback: bool) -> None:
    """Replace ``[addr, addr + n)`` with fresh zero pages, huge ones where the kernel allows
    (a fault per 2 MiB instead of per 4 KiB). Where mapping is refused (a seccomp policy, a
    limit on mappings), ``zero_fallback`` zeroes the memory in place; otherwise it is left
    as it is (its caller overwrites it whole)."""
    got = _libc.mmap(addr, n, _PROT_RW, _MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_FIXED, -1, 0)
    if got == addr:
        _libc.madvise(addr, n, _MADV_HUGEPAGE)  # advice: where THP is off, no harm done
    elif zero_fallback:
        ctypes.memset(addr, 0, n)


def _stretches_of(runs: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """(offset, bytes) runs joined where one ends where the next begins."""
    return joined(sorted(runs))


def _mostly(nbytes: int, size: int) -> bool:
    """Deltas of more than half the memory cost more to restore than a flat image."""
    return nbytes * 2 > size


_IOV_MAX = 1024
_BATCH_MAX = 64 << 20


def _copy_pages(fd: int, addr: int, todo: list[tuple[int, int]]) -> None:
    """Write memory page ``page`` (at ``addr``) to file offset ``at`` for each pair: one
    ``pwritev`` per stretch that is contiguous in the file (a delta's pages are packed, so
    the ~100 scattered runs a turn writes go out in one call, not one call each)."""
    stretches = _stretches(todo)
    if not stretches:
        return
    end = max(page * _PAGE + n for page, _, n in stretches)
    mem = memoryview((ctypes.c_char * end).from_address(addr)).cast("B")
    batch: list[memoryview] = []
    start = nxt = size = 0
    for page, at, n in stretches:
        if batch and (at != nxt or len(batch) >= _IOV_MAX or size + n > _BATCH_MAX):
            _write_all(fd, batch, start, size)
            batch, size = [], 0
        if not batch:
            start = at
        batch.append(mem[page * _PAGE : page * _PAGE + n])
        nxt, size = at + n, size + n
    _write_all(fd, batch, start, size)


def _write_all(fd: int, bufs: list[memoryview], at: int, size: int) -> None:
    """``bufs`` written back to back from offset ``at`` (a short write goes on where it
    stopped)."""
    done = os.pwritev(fd, bufs, at)
    if done == size:
        return
    flat = 0
    for buf in bufs:
        n = len(buf)
        if done < flat + n:
            k = max(done - flat, 0)
            while k < n:
                w = os.pwrite(fd, buf[k:], at + flat + k)
                if w <= 0:
                    raise ImageError("short write updating a memory image")
                k += w
        flat += n


def _write_out(fd: int, addr: int, at: int, n: int) -> None:
    """``n`` bytes of memory at ``addr`` to offset ``at`` of ``fd`` (at most 64 MiB a call)."""
    view = memoryview((ctypes.c_char * n).from_address(addr)).cast("B")
    done = 0
    while done < n:
        k = os.pwrite(fd, view[done : done + _CHUNK * 64], at + done)
        if k <= 0:
            raise ImageError("short write updating a memory image")
        done += k


def _copy_file(src: int, at: int, dst: int, n: int) -> None:
    """Bytes ``[at, at+n)`` of ``src`` to the start of ``dst``: in the kernel when both are on
    one filesystem (memfd to memfd), else through a buffer (a raw image file to a memfd)."""
    off = 0
    try:
        while off < n:
            k = os.copy_file_range(src, dst, n - off, at + off, off)
            if k <= 0:
                break
            off += k
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise
    while off < n:
        data = os.pread(src, min(n - off, _CHUNK * 8), at + off)
        if not data:
            raise ImageError("short read copying a memory image")
        os.pwrite(dst, data, off)
        off += len(data)


_IOV_MAX = 1024  # pieces one preadv fills at most (Linux's UIO_MAXIOV)


def _read_extents(fd: int, memory: memoryview, extents: Sequence[tuple[int, int, int]]
                  ) -> None:
    """The (first page, file offset, bytes) ``extents`` of ``fd`` read into ``memory``: one
    ``preadv`` per stretch contiguous in the file (a delta's pages lie in the file in page
    order, so mostly one call a layer), not one call per stretch of memory. A fork of a
    session whose last turn wrote 0.6 MiB in 91 stretches made 91 calls, each with its own
    view of the memory, and those were most of the fork's time."""
    i, count = 0, len(extents)
    while i < count:
        page, start, n = extents[i]
        pieces: list[tuple[int, int]] = [(page * _PAGE, n)]
        end = start + n
        i += 1
        while i < count and len(pieces) < _IOV_MAX and extents[i][1] == end:
            page, _, n = extents[i]
            pieces.append((page * _PAGE, n))
            end += n
            i += 1
        if any(off + n > len(memory) for off, n in pieces):
            raise ImageError("a memory image's page lies past its size")
        done = os.preadv(fd, [memory[off:off + n] for off, n in pieces], start)
        for off, n in pieces:  # a short read (rare): the rest piece by piece
            if done < n:
                _read_whole(fd, memory[off + done:off + n], start + done)
            start += n
            done = max(0, done - n)


def _read_into(fd: int, addr: int, at: int, n: int) -> None:
    _read_whole(fd, memoryview((ctypes.c_char * n).from_address(addr)).cast("B"), at)


def _read_whole(fd: int, target: memoryview, at: int) -> None:
    """``target`` filled from ``fd`` at ``at``, over as many reads as the kernel takes."""
    done, n = 0, len(target)
    while done < n:
        k = os.preadv(fd, [target[done:]], at + done)
        if k <= 0:
            raise ImageError("short read restoring a memory image")
        done += k
