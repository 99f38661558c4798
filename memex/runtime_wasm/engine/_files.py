"""The files every guest sees besides its mounts, prepared once per machine in the cache:
the stdlib zip under the name the interpreter looks for, matplotlib's data extracted from the
zip, and the guest bundle (MemEx's guest-side package plus the pure-Python msgpack, assembled
from installed packages: no third-party code is kept in the repository).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from ._artifacts import Artifacts
from ._cache import cache_dir, file_lock

__all__ = [
    "GUEST_BUNDLE",
    "GUEST_LIB",
    "GUEST_PACKAGES",
    "bootstrap_source",
    "bundle_dir",
    "driver_sha256",
    "driver_source",
    "materialize",
    "mpl_data_dir",
    "stdlib_dir",
]

GUEST_LIB = "/usr/local/lib"
GUEST_BUNDLE = "/memex"
GUEST_PACKAGES = GUEST_BUNDLE + "/packages"  # a sandbox's packages (runtime_wasm._packages)
_GUEST_SRC = Path(__file__).resolve().parent.parent / "guest"


def materialize(final: Path, build: Callable[[Path], None]) -> Path:
    """Build a directory once per machine: under a lock, into a temporary sibling, renamed."""
    if final.is_dir():
        return final
    with file_lock(final.with_name(final.name + ".lock")):
        if final.is_dir():
            return final
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
        try:
            build(tmp)
            os.chmod(tmp, 0o755)
            os.replace(tmp, final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return final


@functools.lru_cache(maxsize=8)
def stdlib_dir(arts: Artifacts) -> Path:
    """A folder holding only ``python3XY.zip``, mounted read-only at /usr/local/lib."""

    def build(tmp: Path) -> None:
        dest = tmp / f"python{arts.python_tag}.zip"
        try:
            os.link(arts.stdlib_zip, dest)
        except OSError:
            shutil.copyfile(arts.stdlib_zip, dest)

    return materialize(cache_dir() / "stdlib" / arts.stdlib_sha256[:24], build)


@functools.lru_cache(maxsize=8)
def mpl_data_dir(arts: Artifacts) -> Path | None:
    """matplotlib's data, extracted from the inner ``mpl-data.zip`` of the stdlib zip."""

    def build(tmp: Path) -> None:
        import zipfile  # once per machine (memex prepare): not on every start's import path

        with zipfile.ZipFile(arts.stdlib_zip) as outer:
            try:
                inner_bytes = outer.read("matplotlib/mpl-data.zip")
            except KeyError:
                return
        inner_path = tmp / ".inner.zip"
        inner_path.write_bytes(inner_bytes)
        with zipfile.ZipFile(inner_path) as inner:
            for member in inner.infolist():
                target = (tmp / member.filename).resolve()
                if not str(target).startswith(str(tmp.resolve()) + os.sep):
                    continue  # never write outside the folder
                inner.extract(member, tmp)
        inner_path.unlink()

    d = materialize(cache_dir() / "mpl-data" / arts.stdlib_sha256[:24], build)
    return d if any(d.iterdir()) else None


def _bundle_sources() -> list[tuple[str, Path]]:
    files: list[tuple[str, Path]] = []
    for path in sorted((_GUEST_SRC / "memex_guest").rglob("*.py")):
        files.append((f"memex_guest/{path.relative_to(_GUEST_SRC / 'memex_guest')}", path))
    spec = importlib.util.find_spec("msgpack")  # found, not imported: start-up pays no import
    assert spec is not None and spec.origin is not None, "msgpack is a dependency of memex"
    mp = Path(spec.origin).resolve().parent
    for path in sorted(mp.glob("*.py")):
        files.append((f"msgpack/{path.name}", path))
    return files


@functools.lru_cache(maxsize=1)
def bundle_dir() -> Path:
    """The guest bundle: ``site/memex_guest`` and ``site/msgpack`` (pure Python), mounted
    read-only at /memex. Keyed by the content of its sources."""
    sources = _bundle_sources()
    h = hashlib.sha256()
    for name, path in sources:
        h.update(name.encode() + b"\0" + path.read_bytes() + b"\0")

    def build(tmp: Path) -> None:
        for name, path in sources:
            dest = tmp / "site" / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest)

    return materialize(cache_dir() / "bundle" / h.hexdigest()[:24], build)


@functools.lru_cache(maxsize=1)
def driver_source() -> str:
    return (_GUEST_SRC / "_driver.py").read_text()


@functools.lru_cache(maxsize=1)
def driver_sha256() -> str:
    """The driver's hash, for the warm images' keys (made once, not per new sandbox)."""
    return hashlib.sha256(driver_source().encode()).hexdigest()


def bootstrap_source() -> str:
    """The first cell of a fresh guest: puts the bundle on ``sys.path`` and starts the driver."""
    driver = driver_source()
    return (
        "import sys as _s, os as _o\n"
        f"_s.path.append({GUEST_BUNDLE + '/site'!r})\n"
        f"if _o.path.isdir({GUEST_PACKAGES!r}):\n"  # a sandbox's packages, after the bundle
        f"    _s.path.append({GUEST_PACKAGES!r})\n"
        "del _s, _o\n"
        f"exec(compile({driver!r}, '<memex-driver>', 'exec'), "
        "{'__name__': 'memex_driver', '__file__': '<memex-driver>'})\n"
    )
