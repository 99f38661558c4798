"""Keep wasmtime's trap handlers installed, so that a guest's trap never kills its host.

A guest that executes ``unreachable`` (``os.abort()`` in CPython), reads out of bounds or
divides by zero raises SIGILL, SIGSEGV or SIGFPE; wasmtime's signal handlers, installed with
the first engine, turn those into traps, and pass signals from anywhere else on to the
handlers that were there before them. A handler installed after them (``faulthandler.enable()``
in an application or a test runner, a Python ``signal.signal`` for SIGSEGV, another runtime)
displaces them, and the next guest trap kills the whole process: seen here with
faulthandler enabled after the first sandbox, where one guest's ``os.abort()`` ended the
process with "Fatal Python error: Illegal instruction".

So the handlers wasmtime installed are recorded when the first engine is made, and before
every turn :func:`ensure` puts back any that were displaced (a ``sigaction`` query per signal,
about a microsecond in all). The displacing handler then no longer sees faults of the host
either: those go, through wasmtime, to the handlers that were installed before it (a
``faulthandler`` enabled before MemEx's first engine keeps working). A warning says so once,
except for Ray's own: ``ray.init`` in a process that already made an engine installs Ray's
crash reporter for these signals (its core worker library's), which MemEx, which starts Ray
for its Ray backends, expects and puts back quietly (logged at debug); a handler Ray's
shutdown leaves (the default action) is put back as quietly once Ray's was seen.
Linux only (the layout of ``struct sigaction`` below is glibc's and musl's on 64-bit Linux).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import warnings

__all__ = ["capture", "ensure", "restored"]

_SIGNALS = tuple(int(s) for s in (signal.SIGILL, signal.SIGFPE, signal.SIGSEGV, signal.SIGBUS))
_SIGACTION_SIZE = 152  # handler, 128-byte mask, flags, restorer (64-bit Linux)
_Action = ctypes.c_char * _SIGACTION_SIZE

_LOCK = threading.Lock()
_SAVED: dict[int, bytes] = {}  # signal -> wasmtime's struct sigaction
_RESTORED = [0]
_WARNED = [False]
_RAY_SEEN = [False]  # Ray's crash reporter displaced wasmtime's handlers in this process
LOG = logging.getLogger("memex.runtime")


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


if sys.platform == "linux":
    _libc = ctypes.CDLL(None, use_errno=True)
    _sigaction = _libc.sigaction
    _sigaction.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    _sigaction.restype = ctypes.c_int
    _dladdr = _libc.dladdr
    _dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    _dladdr.restype = ctypes.c_int
else:  # pragma: no cover - MemEx's runtime is Linux-only (memfd, userfaultfd)
    _sigaction = _dladdr = None


def _library_of(address: int) -> str:
    """The file of the shared object holding ``address`` ('' when none is known)."""
    info = _DlInfo()
    if address <= 1 or _dladdr is None or not _dladdr(address, ctypes.byref(info)):
        return ""
    return (info.dli_fname or b"").decode(errors="replace")


def _rays(address: int) -> bool:
    """Whether a displacing handler is Ray's (its core worker's crash reporter), or the
    default action Ray's shutdown leaves: once Ray's was seen here, or when Ray's core worker
    was loaded in this process at all (started before MemEx's first engine, Ray's handler
    was below wasmtime's and never seen; its shutdown still puts back what it found, the
    default action, over wasmtime's)."""
    if address == 0:
        return _RAY_SEEN[0] or "ray._raylet" in sys.modules
    path = _library_of(address)
    return os.path.basename(path).startswith("_raylet") and "/ray/" in path


def _handler(action: ctypes.Array[ctypes.c_char]) -> int:
    return ctypes.c_uint64.from_buffer(action).value


def capture() -> None:
    """Record the handlers wasmtime installed (call right after making the first engine)."""
    if _sigaction is None:
        return
    with _LOCK:
        for sig in _SIGNALS:
            if sig in _SAVED:
                continue
            now = _Action()
            if _sigaction(sig, None, ctypes.addressof(now)) == 0 and _handler(now) > 1:
                _SAVED[sig] = bytes(now)  # not SIG_DFL (0) or SIG_IGN (1): wasmtime's


def ensure() -> None:
    """Put back any of wasmtime's handlers that another handler displaced."""
    if not _SAVED:
        return
    now = _Action()
    for sig, saved in _SAVED.items():
        if _sigaction(sig, None, ctypes.addressof(now)) != 0 or now.raw[:8] == saved[:8]:
            continue
        theirs = _handler(now)
        back = _Action.from_buffer_copy(saved)
        if _sigaction(sig, ctypes.addressof(back), None) == 0:
            _RESTORED[0] += 1
            if _rays(theirs):
                _RAY_SEEN[0] = True
                LOG.debug("Ray's handler for %s put back to wasmtime's", signal.Signals(sig).name)
            elif not _WARNED[0]:
                _WARNED[0] = True
                warnings.warn(
                    f"a handler for {signal.Signals(sig).name} (at {theirs:#x}) installed "
                    f"after MemEx's first engine displaced wasmtime's trap handler; MemEx put "
                    f"it back, since a guest's trap would otherwise kill this process "
                    f"(faults outside guests now reach the handlers installed before "
                    f"MemEx's engine)", RuntimeWarning, stacklevel=2)


def restored() -> int:
    """How many displaced handlers :func:`ensure` has put back in this process."""
    return _RESTORED[0]
