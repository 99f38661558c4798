"""Where MemEx keeps what it writes, by one rule (XDG): what it builds or fetches once per
machine (compiled modules, the guest bundle, warm images, model files) in the cache folder,
``$MEMEX_CACHE_DIR``, else ``$XDG_CACHE_HOME/memex``, else ``~/.cache/memex``; what a person's
use leaves (the REPL's history) in the state folder, ``$XDG_STATE_HOME/memex``, else
``~/.local/state/memex``."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["atomic_write", "cache_bytes", "cache_dir", "file_lock", "private_dir", "state_dir"]

CACHE_ENV = "MEMEX_CACHE_DIR"


def cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "memex"


def cache_bytes(env: str, default: int) -> int:
    """A bound of the cache folder in bytes, from the variable ``env`` (unset or empty: the
    default; anything but digits is a ConfigError naming it)."""
    from ...errors import ConfigError

    raw = os.environ.get(env)
    if raw is None or raw == "":
        return default
    if not raw.isdigit() or len(raw) > 20:
        raise ConfigError(f"{env} is a number of bytes, got {raw[:40]!r}")
    return int(raw)


def state_dir() -> Path:
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".local" / "state"
    return base / "memex"


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock shared by every process of this machine."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def private_dir(path: Path) -> Path:
    """``path`` as a folder only its owner may enter: created with any missing parents, each
    0700, and the folder itself set to 0700 if it existed, whatever the umask (a server's
    state and shared folders hold every tenant's saved values and files)."""
    missing = []
    p = path
    while not os.path.lexists(p) and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(d, 0o700)
    os.chmod(path, 0o700)
    return path


def atomic_write(path: Path, data: bytes | bytearray | memoryview, *,
                 private: bool = False) -> None:
    """Write to a temporary name in the same folder, fsync, then rename: readers see the old
    file or the whole new one, never a torn one. ``private``: the file is 0600 and its
    folder a :func:`private_dir`, whatever the umask."""
    if private:
        private_dir(path.parent)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC,
                     0o600 if private else 0o666)
        with open(fd, "wb") as f:
            if private:
                os.fchmod(fd, 0o600)  # a leftover tmp of another mode is truncated, not new
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
