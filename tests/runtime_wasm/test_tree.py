"""Deleting folders a guest built (``remove_tree``, what closing a sandbox and the backends
use): iterative, so no tree is too deep for the host; never raising, so cleanup never stops
half way (SECURITY.md, "The runtime's own bookkeeping")."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from memex.runtime_wasm.internal import remove_tree


def _deep(root: Path, levels: int) -> None:
    """A chain of ``levels`` folders, made through descriptors (no path is ever that long),
    with a file every 500 levels."""
    fd = os.open(root, os.O_RDONLY)
    try:
        for i in range(levels):
            os.mkdir("d", dir_fd=fd)
            nfd = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = nfd
            if i % 500 == 0:
                os.close(os.open("f", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
    finally:
        os.close(fd)


def test_a_tree_deeper_than_any_path_is_removed_without_recursion(tmp_path: Path) -> None:
    top = tmp_path / "top"
    top.mkdir()
    _deep(top, 3000)
    # positive control: the recursive walk of the standard library cannot do it
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(400)
    try:
        with pytest.raises(RecursionError):
            shutil.rmtree(top)
        assert top.exists()
        assert remove_tree(str(top)) is True  # under the same low limit
    finally:
        sys.setrecursionlimit(old)
    assert not top.exists()


def test_remove_tree_is_total(tmp_path: Path) -> None:
    assert remove_tree(str(tmp_path / "missing")) is True
    f = tmp_path / "file"
    f.write_text("x")
    assert remove_tree(str(f)) is True and not f.exists()
    wide = tmp_path / "wide"
    for i in range(300):
        (wide / f"d{i}" / "sub").mkdir(parents=True)
        (wide / f"d{i}" / "sub" / "x").write_text("x")
    os.symlink("/etc", wide / "link")  # a link is removed, never followed
    assert remove_tree(str(wide)) is True
    assert not wide.exists() and Path("/etc/hostname").exists()
