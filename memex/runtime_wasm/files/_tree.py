"""Host-side walks of folders a guest built: iterative, on descriptors, never following a
link, bounded, and safe to call on anything (they do not raise for what they find).

A guest decides the shape of its ``/tmp`` and its writable mounts. A recursive walk of such a
tree runs the host out of stack (``shutil.rmtree`` and ``copytree`` recurse on Python 3.11), a
walk by path runs out of ``PATH_MAX``, and a walk that keeps one descriptor per level runs out
of descriptors. These walks keep at most :data:`MAX_OPEN_LEVELS` descriptors open: deeper
folders are counted but not entered (:func:`scan`, :func:`clone`) or, when the tree is being
deleted, moved up to the top first (:func:`remove`).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass

__all__ = ["MAX_OPEN_LEVELS", "Entry", "clone", "remove", "scan"]

MAX_OPEN_LEVELS = 128
"""Descriptors a walk holds at most (one per level it is in). Writable places are bounded
far below this (``_disk.MAX_DEPTH``); only a tree made some other way can be deeper."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_moved = itertools.count()  # names of folders moved up (next() on a count is thread-safe)


@dataclass(frozen=True, slots=True)
class Entry:
    """One thing in a tree: its ``lstat``, its depth below the top (1 for the top's own
    entries) and the length in bytes of its path below the top."""

    st: os.stat_result
    depth: int
    path_len: int
    name: str
    parent: int  # a descriptor of the folder holding it, valid only while it is yielded


def _open_dir(name: str, parent: int | None) -> int | None:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError:
        return None


def _entries(fd: int) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(fd) as it:
            return list(it)
    except OSError:
        return []


def scan(top: str | int, *, limit: int) -> Iterator[Entry]:
    """Every entry below ``top`` (a path or a folder descriptor), parents before children,
    at most ``limit`` of them; folders deeper than :data:`MAX_OPEN_LEVELS` are yielded but
    not entered. Links are yielded, never followed."""
    root = _open_dir(top, None) if isinstance(top, str) else os.dup(top)
    if root is None:
        return
    seen = 0
    # one frame per open level: (descriptor, entries left, its depth, its path length)
    stack: list[tuple[int, list[os.DirEntry[str]], int, int]] = [(root, _entries(root), 0, 0)]
    try:
        while stack:
            fd, todo, depth, plen = stack[-1]
            if not todo:
                os.close(fd)
                stack.pop()
                continue
            entry = todo.pop()
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            seen += 1
            if seen > limit:
                return
            name = entry.name
            child_len = plen + len(os.fsencode(name)) + (1 if plen else 0)
            yield Entry(st=st, depth=depth + 1, path_len=child_len, name=name, parent=fd)
            if stat.S_ISDIR(st.st_mode) and len(stack) < MAX_OPEN_LEVELS:
                sub = _open_dir(name, fd)
                if sub is not None:
                    stack.append((sub, _entries(sub), depth + 1, child_len))
    finally:
        for fd, *_ in stack:
            os.close(fd)


def remove(path: str) -> bool:
    """Delete the folder ``path`` and everything below it, iteratively, without following a
    link; True once it is gone. Never raises: what cannot be deleted stays (False)."""
    try:
        top = os.open(path, _DIR_FLAGS)
    except FileNotFoundError:
        return True
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(path)  # not a folder (or a link to one): the name alone
        return not os.path.lexists(path)
    try:
        for _ in range(64):  # each pass empties the tree; a folder moved up needs another
            if _empty(top):
                break
    finally:
        os.close(top)
    with contextlib.suppress(OSError):
        os.rmdir(path)
    return not os.path.lexists(path)


def _empty(top: int) -> bool:
    """One pass emptying the folder ``top``; True when nothing was left behind."""
    # one frame per open level: (descriptor, entries left, its name in the level above)
    stack: list[tuple[int, list[os.DirEntry[str]], str]] = [(top, _entries(top), "")]
    clean = True
    try:
        while stack:
            fd, todo, name = stack[-1]
            if not todo:
                stack.pop()
                if stack:  # leave the folder, then remove it from its parent
                    os.close(fd)
                    try:
                        os.rmdir(name, dir_fd=stack[-1][0])
                    except OSError:
                        clean = False
                continue
            entry = todo.pop()
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                is_dir = False
            if not is_dir:
                try:
                    os.unlink(entry.name, dir_fd=fd)
                except FileNotFoundError:
                    pass
                except OSError:
                    clean = False
                continue
            if len(stack) >= MAX_OPEN_LEVELS:
                # too deep to enter: move it to the top, where a later pass finds it
                with contextlib.suppress(OSError):
                    os.rename(entry.name, f".memex-up-{os.getpid()}-{next(_moved)}",
                              src_dir_fd=fd, dst_dir_fd=top)
                clean = False
                continue
            sub = _open_dir(entry.name, fd)
            if sub is None:
                clean = False
                continue
            stack.append((sub, _entries(sub), entry.name))
    finally:
        for fd, _, _ in stack[1:]:
            os.close(fd)
    return clean


def clone(src: str, dst: str, *, share: Callable[[os.stat_result], bool], limit: int
          ) -> None:
    """Make ``dst`` (an existing empty folder) hold what ``src`` holds: folders made anew,
    links copied as links, regular files hard-linked when ``share(st)`` says so (else, or
    where a link cannot be made, copied), other kinds left out. At most ``limit`` entries;
    ``OSError`` past it or when something cannot be made (``dst`` may then hold a part)."""
    top_src = _open_dir(src, None)
    if top_src is None:
        raise OSError(errno.ENOENT, "cannot open the folder to copy", src)
    try:
        top_dst = os.open(dst, _DIR_FLAGS)
    except BaseException:
        os.close(top_src)
        raise
    stack: list[tuple[int, int, list[os.DirEntry[str]]]] = [(top_src, top_dst,
                                                               _entries(top_src))]
    seen = 0
    try:
        while stack:
            sfd, dfd, todo = stack[-1]
            if not todo:
                os.close(sfd)
                os.close(dfd)
                stack.pop()
                continue
            entry = todo.pop()
            seen += 1
            if seen > limit:
                raise OSError(errno.EDQUOT, f"more than {limit} entries to copy")
            st = entry.stat(follow_symlinks=False)
            name = entry.name
            if stat.S_ISDIR(st.st_mode):
                if len(stack) >= MAX_OPEN_LEVELS:
                    raise OSError(errno.ELOOP, "a folder nested too deep to copy", name)
                os.mkdir(name, stat.S_IMODE(st.st_mode) | 0o700, dir_fd=dfd)
                sub_s = os.open(name, _DIR_FLAGS, dir_fd=sfd)
                try:
                    sub_d = os.open(name, _DIR_FLAGS, dir_fd=dfd)
                except BaseException:
                    os.close(sub_s)
                    raise
                stack.append((sub_s, sub_d, _entries(sub_s)))
            elif stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(name, dir_fd=sfd), name, dir_fd=dfd)
            elif stat.S_ISREG(st.st_mode):
                if share(st):
                    try:
                        os.link(name, name, src_dir_fd=sfd, dst_dir_fd=dfd,
                                follow_symlinks=False)
                        continue
                    except OSError as exc:
                        if exc.errno not in (errno.EXDEV, errno.EMLINK, errno.EPERM,
                                             errno.ENOTSUP):
                            raise
                copy_file(name, sfd, name, dfd, st)
    finally:
        for sfd, dfd, _ in stack:
            os.close(sfd)
            os.close(dfd)


def copy_file(name: str, sfd: int, new: str, dfd: int, st: os.stat_result, *,
              length: int | None = None) -> None:
    """Copy the regular file ``name`` (in folder ``sfd``) to the new name ``new`` (in folder
    ``dfd``, which must not exist), in the kernel (``copy_file_range``, reflinks where the
    filesystem has them), keeping its mode; ``length`` bytes of it (default: all)."""
    src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=sfd)
    try:
        out = os.open(new, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                      stat.S_IMODE(st.st_mode) | 0o600, dir_fd=dfd)
        try:
            left = st.st_size if length is None else length
            while left > 0:
                try:
                    n = os.copy_file_range(src, out, left)
                except OSError as exc:
                    if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL):
                        raise
                    n = os.sendfile(out, src, None, left)
                if n == 0:
                    break
                left -= n
            os.fchmod(out, stat.S_IMODE(st.st_mode))
        finally:
            os.close(out)
    finally:
        os.close(src)
