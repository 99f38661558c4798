"""Sandboxes' /tmp folders on the host: made, and kept for the next sandbox when left empty.

Making a folder and deleting it are journal writes on a disk filesystem (~0.1 ms each on
this machine's ext4), a tenth of what creating, running and closing a sandbox costs. Most
sandboxes of a busy process (a rollout pipeline, a service) leave their /tmp empty, so a
closed sandbox's folder that is provably as good as new goes back to a small shelf, and the
next sandbox takes it instead of making one. "As good as new": still a real folder (not a
link) owned by this user with mode 0700, no entries, no more than one block of directory
(a folder that once held many names keeps their space and would be slow to list); taken,
its times are set to now (a guest sees nothing of who had it before). Anything else is
deleted as before (:func:`._tree.remove`). A child process (``os.fork``) starts with an
empty shelf, so two processes never share one folder.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import stat
import tempfile
import threading

from . import _tree

__all__ = ["SHELF_SIZE", "give_back", "shelved", "take"]

SHELF_SIZE = 16
"""Empty folders kept at most: one inode on disk each, no descriptor (a process killed
without its exit handlers leaves these behind, as it leaves its live sandboxes' folders)."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_DIR_BYTES = 4096  # one block: a folder that never held many names
_lock = threading.Lock()
_shelf: list[tuple[str, str]] = []  # (folder, its real path), both under _shelf_parent
_shelf_parent: list[str] = [""]  # the temporary folder the shelved ones were made in


def take() -> tuple[str, str]:
    """An empty private folder for a sandbox's /tmp and its real path (no links in it)."""
    parent = tempfile.gettempdir()
    while True:
        with _lock:
            if not _shelf or _shelf_parent[0] != parent:
                break
            path, real = _shelf.pop()
        try:
            os.utime(path)  # the times of a folder made now
        except OSError:  # gone from under the shelf (a cleaner of the temporary folder)
            continue
        return path, real
    path = tempfile.mkdtemp(prefix="memex-tmp-")
    return path, os.path.realpath(path)


def give_back(path: str, real: str) -> None:
    """The folder of a closed sandbox (nothing can write in it any more): onto the shelf if
    it is as good as new and there is room, else deleted with whatever it holds."""
    parent = os.path.dirname(path)
    with _lock:  # a full shelf of the same folder: no need to look (a bulk close)
        room = len(_shelf) < SHELF_SIZE or _shelf_parent[0] != parent
    if room and _as_good_as_new(path):
        with _lock:
            if _shelf_parent[0] != parent:
                stale, _shelf[:] = list(_shelf), []
                _shelf_parent[0] = parent
            else:
                stale = []
            if len(_shelf) < SHELF_SIZE:
                _shelf.append((path, real))
                path = ""
        for old, _ in stale:
            _tree.remove(old)
        if not path:
            return
    _tree.remove(path)


def shelved() -> int:
    """Folders on the shelf now (for tests and benchmarks)."""
    with _lock:
        return len(_shelf)


def _as_good_as_new(path: str) -> bool:
    try:
        fd = os.open(path, _DIR_FLAGS)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if (not stat.S_ISDIR(st.st_mode) or stat.S_IMODE(st.st_mode) != 0o700
                or st.st_uid != os.geteuid() or st.st_nlink != 2
                or st.st_size > _MAX_DIR_BYTES):
            return False
        with os.scandir(fd) as it:
            return next(it, None) is None
    except OSError:
        return False
    finally:
        os.close(fd)


def _forget_in_child() -> None:
    """(a forked child) The shelf belongs to the parent process; the child starts empty."""
    global _lock
    _lock = threading.Lock()
    _shelf.clear()


def _clear() -> None:
    with _lock:
        gone, _shelf[:] = list(_shelf), []
    for path, _ in gone:
        with contextlib.suppress(OSError):
            os.rmdir(path)


os.register_at_fork(after_in_child=_forget_in_child)
atexit.register(_clear)
