"""Which pages of a guest's memory a turn wrote: what makes a checkpoint cost what the turn
changed instead of the size of the memory.

Linux (6.7 and later) can write-protect a range *asynchronously* through ``userfaultfd``:
the kernel resolves each first write itself (no fault handler, no signal) and remembers it in
the page table; the ``PAGEMAP_SCAN`` ioctl on ``/proc/self/pagemap`` then lists the written
pages and protects them again in one atomic walk. ``UFFD_USER_MODE_ONLY`` makes this
available without privileges even where ``vm.unprivileged_userfaultfd`` is 0. Where any part
of it is missing (an older kernel, a seccomp profile that refuses ``userfaultfd``, another
OS), or ``MEMEX_DIRTY_TRACKING=off`` is set, :data:`TRACKER` reports ``mode == "off"`` and
every checkpoint copies the whole memory, as before: the same results, at the old cost.

All offsets are bytes from the start of the guest memory; runs are page-aligned.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import threading

__all__ = ["TRACKER", "DirtyTracker", "MemoryWatch", "Runs", "dirty_tracking", "joined"]

Runs = list[tuple[int, int]]  # (offset, length), sorted, non-overlapping, page-aligned

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

_SYS_USERFAULTFD = {"x86_64": 323, "aarch64": 282}
_UFFD_USER_MODE_ONLY = 1
_UFFD_API = 0xAA
_FEATURE_WP_UNPOPULATED = 1 << 13
_FEATURE_WP_ASYNC = 1 << 15
_UFFDIO_API = 0xC018AA3F
_UFFDIO_REGISTER = 0xC020AA00
_UFFDIO_UNREGISTER = 0x8010AA01
_REGISTER_MODE_WP = 1 << 1
_PAGEMAP_SCAN = 0xC0606610
_PM_SCAN_WP_MATCHING = 1 << 0
_PM_SCAN_CHECK_WPASYNC = 1 << 1
_PAGE_IS_WRITTEN = 1 << 1
_PAGE_IS_FILE = 1 << 2
_PAGE_IS_PRESENT = 1 << 3
_PAGE_IS_SWAPPED = 1 << 4
_VEC = 4096  # regions per ioctl call


class _ScanArg(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "size", "flags", "start", "end", "walk_end", "vec", "vec_len", "max_pages",
        "category_inverted", "category_mask", "category_anyof_mask", "return_mask")]


class _Region(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint64), ("end", ctypes.c_uint64),
                ("categories", ctypes.c_uint64)]


def _above_standard(fd: int) -> int:
    """``fd`` moved to a number above 2: a process started with stdin, stdout or stderr
    closed must not find this process-long descriptor where writes to "stderr" would go."""
    if fd > 2:
        return fd
    try:
        return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    finally:
        os.close(fd)


class DirtyTracker:
    """One ``userfaultfd`` (async write-protect) and one ``/proc/self/pagemap`` descriptor
    for the whole process; thread-safe. ``mode`` is ``"uffd-wp"`` or ``"off"``; ``reason``
    says why it is off."""

    def __init__(self) -> None:
        self.mode = "off"
        self.reason = ""
        self._uffd = -1
        self._pagemap = -1
        self._lock = threading.RLock()
        self._libc: ctypes.CDLL | None = None
        self._vec = (_Region * _VEC)()
        self._setup()

    def _setup(self) -> None:
        if os.environ.get("MEMEX_DIRTY_TRACKING", "").strip().lower() in ("off", "0", "no"):
            self.reason = "MEMEX_DIRTY_TRACKING=off"
            return
        nr = _SYS_USERFAULTFD.get(os.uname().machine) if hasattr(os, "uname") else None
        if nr is None:
            self.reason = "userfaultfd is Linux on x86_64 or aarch64 only"
            return
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.syscall.restype = ctypes.c_long
            libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
            libc.ioctl.restype = ctypes.c_int
        except (OSError, AttributeError) as exc:
            self.reason = f"no libc: {exc}"
            return
        fd = int(libc.syscall(nr, os.O_CLOEXEC | os.O_NONBLOCK | _UFFD_USER_MODE_ONLY))
        if fd < 0:
            self.reason = f"userfaultfd refused: {os.strerror(ctypes.get_errno())}"
            return
        try:
            fd = _above_standard(fd)
        except OSError as exc:  # no descriptor free above 2
            self.reason = f"userfaultfd: {exc}"
            return
        want = _FEATURE_WP_ASYNC | _FEATURE_WP_UNPOPULATED
        api = (ctypes.c_uint64 * 3)(_UFFD_API, want, 0)
        if libc.ioctl(fd, _UFFDIO_API, ctypes.addressof(api)) < 0 or (api[1] & want) != want:
            os.close(fd)
            self.reason = "the kernel has no asynchronous write-protect (needs Linux 6.7+)"
            return
        try:
            pagemap = _above_standard(os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC))
        except OSError as exc:
            os.close(fd)
            self.reason = f"cannot open /proc/self/pagemap: {exc}"
            return
        self._libc, self._uffd, self._pagemap = libc, fd, pagemap
        if not self._probe():
            self._close()
            return
        self.mode = "uffd-wp"

    def _probe(self) -> bool:
        """Track a scratch mapping for real: a kernel that accepts the calls but reports
        writes wrongly must not be trusted with checkpoints."""
        import mmap
        size = 16 * PAGE
        area = mmap.mmap(-1, size)
        try:
            buf = (ctypes.c_char * size).from_buffer(area)
            addr = ctypes.addressof(buf)
            try:
                if not self.start(addr, size):
                    return False
                buf[3 * PAGE] = b"x"
                got = self.take(addr, size)
                self.stop(addr, size)
            finally:
                del buf
            if got != [(3 * PAGE, PAGE)]:
                self.reason = f"PAGEMAP_SCAN reported {got} for one written page"
                return False
            return True
        finally:
            area.close()

    def _after_fork(self) -> None:
        """In a forked child: the descriptors are the parent's (its pagemap, its userfaultfd
        context) and the child's mappings are not registered with them: start over."""
        self._lock = threading.RLock()
        self._close()
        self._libc = None
        self.mode, self.reason = "off", ""
        self._setup()

    def _close(self) -> None:
        for fd in (self._uffd, self._pagemap):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._uffd = self._pagemap = -1

    # ---- ranges ---------------------------------------------------------------------------
    def start(self, addr: int, size: int) -> bool:
        """Watch ``[addr, addr+size)`` from now on (registering it and protecting every
        page); False (with ``reason`` set) when the kernel refuses."""
        if self._libc is None or size <= 0:
            return False
        reg = (ctypes.c_uint64 * 4)(addr, size, _REGISTER_MODE_WP, 0)
        with self._lock:
            if self._libc.ioctl(self._uffd, _UFFDIO_REGISTER, ctypes.addressof(reg)) < 0:
                self.reason = f"UFFDIO_REGISTER: {os.strerror(ctypes.get_errno())}"
                return False
            return self._scan(addr, size, _PM_SCAN_WP_MATCHING | _PM_SCAN_CHECK_WPASYNC,
                              _PAGE_IS_WRITTEN, 0) is not None

    def take(self, addr: int, size: int) -> Runs | None:
        """The pages written in ``[addr, addr+size)`` since ``start`` or the last ``take``,
        protected again; None when the range is not (or no longer) watched, e.g. after a
        mapping replaced it."""
        return self._scan(addr, size, _PM_SCAN_WP_MATCHING | _PM_SCAN_CHECK_WPASYNC,
                          _PAGE_IS_WRITTEN, 0)

    def resident(self, addr: int, size: int) -> Runs | None:
        """Pages in the range that hold anything (present or swapped): the rest read as
        zero. For memory that is not watched (a part the guest just grew)."""
        return self._scan(addr, size, 0, 0, _PAGE_IS_PRESENT | _PAGE_IS_SWAPPED)

    def private(self, addr: int, size: int) -> Runs | None:
        """Pages in the range that are the process's own (present or swapped, and not a
        file's): in a private mapping of an image file, the pages written since it was
        mapped (a read leaves the file's page mapped)."""
        return self._scan(addr, size, 0, 0, _PAGE_IS_PRESENT | _PAGE_IS_SWAPPED,
                          inverted=_PAGE_IS_FILE, required=_PAGE_IS_FILE)

    def stop(self, addr: int, size: int) -> None:
        if self._libc is None:
            return
        rng = (ctypes.c_uint64 * 2)(addr, size)
        with self._lock:
            self._libc.ioctl(self._uffd, _UFFDIO_UNREGISTER, ctypes.addressof(rng))

    def _scan(self, addr: int, size: int, flags: int, mask: int, anyof: int, *,
              inverted: int = 0, required: int = 0) -> Runs | None:
        if self._libc is None:
            return None
        end = addr + size
        runs: Runs = []
        arg = _ScanArg(size=ctypes.sizeof(_ScanArg), flags=flags, start=addr, end=end,
                       vec=ctypes.addressof(self._vec), vec_len=_VEC,
                       category_inverted=inverted, category_mask=mask | required,
                       category_anyof_mask=anyof, return_mask=mask | anyof | required)
        with self._lock:
            while True:
                n = self._libc.ioctl(self._pagemap, _PAGEMAP_SCAN, ctypes.byref(arg))
                if n < 0:
                    return None
                for k in range(n):
                    r = self._vec[k]
                    lo, hi = r.start - addr, r.end - addr
                    if runs and runs[-1][0] + runs[-1][1] == lo:
                        runs[-1] = (runs[-1][0], hi - runs[-1][0])
                    else:
                        runs.append((lo, hi - lo))
                if arg.walk_end >= end or n == 0:
                    return runs
                arg.start = arg.walk_end


TRACKER = DirtyTracker()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=TRACKER._after_fork)


def dirty_tracking() -> str:
    """How this host finds what a turn changed: ``"uffd-wp"`` (checkpoints cost what the
    turn wrote) or ``"off: <why>"`` (every checkpoint copies the whole memory)."""
    return TRACKER.mode if TRACKER.mode != "off" else f"off: {TRACKER.reason}"


class MemoryWatch:
    """The written pages of one instance's memory since the image it last matched. The
    memory may grow between looks: the grown part is not watched yet, so its resident pages
    count as written and it is watched from then on."""

    __slots__ = ("_addr", "_mapped", "_size", "_tracker")

    def __init__(self, tracker: DirtyTracker, addr: int, size: int, *,
                 mapped: int | None = None) -> None:
        self._tracker = tracker
        self._addr = addr
        # ``mapped``: the memory was just made by mapping an image file privately over its
        # first ``mapped`` bytes (and writing the rest): the pages written since are then
        # the process's own pages, which one scan finds at the first look, so the watch
        # proper (registering and protecting the whole range, which costs with its size)
        # starts only then, and a sandbox closed before its second turn never pays for it.
        self._mapped = mapped if mapped is not None and tracker.mode != "off" else None
        if self._mapped is not None:
            self._size = size
        else:
            self._size = size if tracker.start(addr, size) else -1

    @property
    def active(self) -> bool:
        return self._size >= 0

    def take(self, addr: int, size: int, *, last: bool = False) -> Runs | None:
        """Written runs since the last look, for a memory now at ``addr``, ``size`` bytes
        long; None when watching failed or the memory moved (the caller then copies
        everything and starts a new watch). ``last``: the memory is let go right after (a
        sandbox put to sleep or closed), so a watch not started yet is never started."""
        if self._size < 0 or addr != self._addr:
            self._size = -1
            return None
        if self._mapped is not None:
            return self._first(size, last)
        runs = self._tracker.take(self._addr, self._size)
        if runs is None:
            self._size = -1
            return None
        if size > self._size:
            grown = self._tracker.resident(self._addr + self._size, size - self._size)
            if grown is None or not self._tracker.start(self._addr + self._size,
                                                        size - self._size):
                self._size = -1
                return None
            runs += [(off + self._size, n) for off, n in grown]
            self._size = size
        return runs

    def _first(self, size: int, last: bool) -> Runs | None:
        """(a watch of a fresh mapping) The written pages so far, and the watch started
        (unless this is the ``last`` look: registering costs with the memory's size)."""
        mapped, self._mapped = self._mapped, None
        assert mapped is not None
        t, addr = self._tracker, self._addr
        cut = min(mapped, size)
        own = t.private(addr, cut)
        rest = t.resident(addr + cut, size - cut) if size > cut else []
        if own is None or rest is None or (not last and not t.start(addr, size)):
            self._size = -1
            return None
        self._size = -1 if last else size
        return joined(own + [(off + cut, n) for off, n in rest])


def joined(runs: Runs) -> Runs:
    """Sorted (offset, bytes) runs, joined where one ends where the next begins."""
    out: Runs = []
    for off, n in runs:
        if out and out[-1][0] + out[-1][1] == off:
            out[-1] = (out[-1][0], out[-1][1] + n)
        else:
            out.append((off, n))
    return out
