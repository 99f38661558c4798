"""Sandboxes' /tmp folders on the host: made, and kept for the next sandbox when left empty.

Making a folder and deleting it are journal writes on a disk filesystem (together 0.11-0.13
ms of CPU on this machine's ext4, about a twentieth of creating, running and closing a
sandbox). Most sandboxes of a busy process (a rollout pipeline, a service) leave their /tmp
empty, so a closed sandbox's folder that is provably as good as new goes back to a small
shelf, and the next sandbox takes it instead of making one. "As good as new": still a real
folder (not a link) owned by this user with mode 0700, no entries, no more than one block of
directory (a folder that once held many names keeps their space and would be slow to list);
taken, its times are set to now (a guest sees nothing of who had it before). Anything else
is deleted as before (:func:`._tree.remove`). A child process (``os.fork``) starts with an
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

_MAX_DIR_BYTES = 4096  # one block: a folder that never held many names


class _Shelf:
    """The kept folders, all made in ``parent`` (the temporary folder of their time)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.parent = ""
        self.folders: list[tuple[str, str]] = []  # (folder, its real path)


_SHELF = _Shelf()


def take() -> tuple[str, str]:
    """An empty private folder for a sandbox's /tmp and its real path (no links in it)."""
    parent = tempfile.gettempdir()
    shelf = _SHELF
    while True:
        with shelf.lock:
            if not shelf.folders or shelf.parent != parent:
                break
            path, real = shelf.folders.pop()
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
    shelf = _SHELF
    with shelf.lock:  # a full shelf of the same folder: no need to look (a bulk close)
        room = len(shelf.folders) < SHELF_SIZE or shelf.parent != parent
    stale: list[tuple[str, str]] = []
    if room and _as_good_as_new(path):
        with shelf.lock:
            if shelf.parent != parent:  # the temporary folder changed: the old ones go
                stale, shelf.folders, shelf.parent = shelf.folders, [], parent
            if len(shelf.folders) < SHELF_SIZE:
                shelf.folders.append((path, real))
                path = ""
    for old, _ in stale:
        _tree.remove(old)
    if path:
        _tree.remove(path)


def shelved() -> int:
    """Folders on the shelf now (for tests and benchmarks)."""
    with _SHELF.lock:
        return len(_SHELF.folders)


def _as_good_as_new(path: str) -> bool:
    fd = _tree._open_dir(path, None)
    if fd is None:
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
    global _SHELF
    _SHELF = _Shelf()


def _clear() -> None:
    with _SHELF.lock:
        gone, _SHELF.folders = _SHELF.folders, []
    for path, _ in gone:
        with contextlib.suppress(OSError):
            os.rmdir(path)


os.register_at_fork(after_in_child=_forget_in_child)
atexit.register(_clear)
