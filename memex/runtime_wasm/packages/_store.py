"""The package cache's bound: least recently used sets go first, never one a live sandbox of
any process has mounted.

A sandbox holds its set with a shared ``flock`` on ``sets/<id>.held`` for as long as it is
open (:func:`hold`); eviction takes an exclusive one without waiting and passes over a set it
cannot get. Eviction also takes the cache-wide lock ``packages/.lock`` exclusively (again
without waiting: a busy cache is pruned by the next resolution), which :func:`hold` takes
shared while it checks the set is whole, so a set cannot vanish between a lookup and its
hold. Disk is counted by the wheels (a set is hard links into them); a wheel goes when no
set that is kept names it. ``MEMEX_PACKAGE_CACHE_BYTES`` is the bound (default 2 GiB).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from ..engine._cache import cache_bytes

__all__ = ["CACHE_BYTES_ENV", "Held", "building", "cache_bound", "evict", "hold",
           "record_set", "stamp", "wheel_sizes"]

CACHE_BYTES_ENV = "MEMEX_PACKAGE_CACHE_BYTES"
DEFAULT_CACHE_BYTES = 2 << 30


def cache_bound() -> int:
    """Bytes the unpacked wheels may take together (``MEMEX_PACKAGE_CACHE_BYTES``)."""
    return cache_bytes(CACHE_BYTES_ENV, DEFAULT_CACHE_BYTES)


@contextlib.contextmanager
def _flock(path: Path, how: int) -> Iterator[bool]:
    """``flock(how)`` on ``path`` (made if missing) for the block; yields whether it was had
    (a non-blocking ask may not be)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, how)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # closing drops the lock


@contextlib.contextmanager
def building(root: Path) -> Iterator[None]:
    """While wheels are unpacked and a set is linked and recorded: no eviction runs (it
    would take wheels no recorded set names yet)."""
    with _flock(root / ".lock", fcntl.LOCK_SH):
        yield


class Held:
    """A live sandbox's hold on its set: the set is never evicted while one is open
    (any process). ``release`` is idempotent."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __del__(self) -> None:
        self.release()


def hold(root: Path, set_id: str, whole: Iterable[str]) -> Held | None:
    """Hold set ``set_id`` under the cache ``root`` (``<cache>/packages``) for a sandbox;
    None when it is no longer whole (evicted since it was looked up: its folder or one of
    the wheels ``whole`` names is gone), and the caller makes it again."""
    with _flock(root / ".lock", fcntl.LOCK_SH):
        if not (root / "sets" / set_id).is_dir() or \
                not all((root / "wheels" / sha).is_dir() for sha in whole):
            return None
        path = root / "sets" / f"{set_id}.held"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_SH)
        return Held(fd)


def stamp(folder: Path) -> None:
    """Mark a set as used now (the folder's access time is the LRU stamp, set by hand so it
    holds on filesystems mounted noatime)."""
    with contextlib.suppress(OSError):
        st = folder.stat()
        os.utime(folder, ns=(time.time_ns(), st.st_mtime_ns))


def record_set(root: Path, set_id: str, wheels: Iterable[str]) -> None:
    """Which wheels set ``set_id`` links (what eviction keeps while the set is kept)."""
    from ..engine._cache import atomic_write

    atomic_write(root / "sets" / f"{set_id}.json", json.dumps(sorted(wheels)).encode())


def wheel_sizes(root: Path) -> dict[str, int]:
    """Bytes each unpacked wheel takes (by its sha256), from the records beside them."""
    out: dict[str, int] = {}
    folder = root / "wheels"
    if not folder.is_dir():
        return out
    for p in folder.iterdir():
        if p.suffix == ".json":
            try:
                out[p.stem] = int(json.loads(p.read_bytes())["size"])
            except (OSError, ValueError, KeyError, TypeError):
                out[p.stem] = 0
    for p in folder.iterdir():
        if p.is_dir() and p.name not in out:
            out[p.name] = 0  # unpacked without a record: counted by its files below
            with contextlib.suppress(OSError):
                out[p.name] = sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
    return out


def evict(root: Path, bound: int, keep: str | None = None) -> int:
    """Remove the least recently used sets no live sandbox holds, then the wheels no kept
    set names, until the wheels take at most ``bound`` bytes (``bound`` 0: every set not
    held). Never waits: a cache another process is pruning or resolving into is left for
    the next call. The bytes freed."""
    freed = 0
    with _flock(root / ".lock", fcntl.LOCK_EX | fcntl.LOCK_NB) as mine:
        if not mine:
            return 0
        sizes = wheel_sizes(root)
        total = sum(sizes.values())
        if total <= bound and bound > 0:
            return 0
        sets_dir = root / "sets"
        sets: list[tuple[int, str, list[str]]] = []
        if sets_dir.is_dir():
            for p in sets_dir.iterdir():
                if not p.is_dir() or p.name.startswith("."):
                    continue
                try:
                    names = json.loads((sets_dir / f"{p.name}.json").read_bytes())
                    names = [str(n) for n in names]
                except (OSError, ValueError, TypeError):
                    names = []
                with contextlib.suppress(OSError):
                    sets.append((p.stat().st_atime_ns, p.name, names))
        kept = {s for _, s, _ in sets}

        def drop_unneeded() -> None:
            nonlocal total, freed
            needed = {n for _, s, names in sets if s in kept for n in names}
            for sha, size in list(sizes.items()):
                if sha in needed:
                    continue
                shutil.rmtree(root / "wheels" / sha, ignore_errors=True)
                for suffix in (".json", ".lock"):
                    with contextlib.suppress(OSError):
                        (root / "wheels" / f"{sha}{suffix}").unlink()
                del sizes[sha]
                total -= size
                freed += size

        drop_unneeded()  # wheels no set names (a set's record lost, or never made)
        for _, sid, _ in sorted(sets):
            if total <= bound and bound > 0:
                break
            if sid == keep:
                continue
            with _flock(sets_dir / f"{sid}.held", fcntl.LOCK_EX | fcntl.LOCK_NB) as free:
                if not free:
                    continue  # mounted by a live sandbox somewhere
                shutil.rmtree(sets_dir / sid, ignore_errors=True)
                for suffix in (".json", ".lock", ".held"):  # no hold can start: .lock is ours
                    with contextlib.suppress(OSError):
                        (sets_dir / f"{sid}{suffix}").unlink()
                kept.discard(sid)
            drop_unneeded()
        if freed:
            _forget_records(root, set(sizes))
    return freed


def _forget_records(root: Path, present: set[str]) -> None:
    """Resolution records naming a wheel no longer kept go too (they would only send the
    next resolution to the index: cheaper to know it now)."""
    folder = root / "resolved"
    if not folder.is_dir():
        return
    for p in folder.glob("*.json"):
        try:
            wheels = json.loads(p.read_bytes())["wheels"]
            gone = any(str(w["sha256"]) not in present for w in wheels)
        except (OSError, ValueError, KeyError, TypeError):
            gone = True
        if gone:
            with contextlib.suppress(OSError):
                p.unlink()
