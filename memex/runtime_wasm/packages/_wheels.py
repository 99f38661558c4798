"""A wheel checked from its zip directory before a byte of it is unpacked, then unpacked.

What is refused, each as a PackageError naming the wheel: a file that is not a zip or whose
directory cannot be read; more than MAX_WHEEL_FILES entries; a path outside the package
(absolute, ``..``, a backslash, a link); native code by name; two entries of one name, or a
name that is both a file and a folder; more than MAX_UNPACKED_BYTES declared; an entry whose
bytes differ from what the directory declares (size or CRC: found while unpacking, which then
leaves nothing)."""

from __future__ import annotations

import re
import shutil
import stat
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ...errors import PackageError

__all__ = ["MAX_UNPACKED_BYTES", "MAX_WHEEL_BYTES", "MAX_WHEEL_FILES", "WheelPlan",
           "metadata_of", "plan_wheel", "unpack"]

MAX_WHEEL_BYTES = 64 << 20
MAX_WHEEL_FILES = 20_000
MAX_UNPACKED_BYTES = 256 << 20
_NATIVE = re.compile(r"\.(so|pyd|dylib|dll|a|o|wasm)(\.[0-9.]+)?$", re.IGNORECASE)
_EOCD = struct.Struct("<4s4H2LH")  # signature, disk, cd disk, entries here, entries, ...
_LOCATOR = struct.Struct("<4sLQL")  # zip64 locator: signature, disk, end record's offset
_EOCD64 = struct.Struct("<4sQ2H2L4Q")  # zip64 end record: ..., entries here, entries, ...
_ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError,
               RuntimeError, NotImplementedError, KeyError, UnicodeDecodeError)


@dataclass(frozen=True)
class WheelPlan:
    """What unpacking a wheel writes: (entry name, path in the package) and the bytes."""

    entries: tuple[tuple[str, PurePosixPath], ...]
    size: int


def _declared_entries(path: Path, what: str) -> int:
    """How many entries the zip's end record says its directory holds, read before zipfile
    parses the directory (a forged count would otherwise cost an object per entry)."""
    with path.open("rb") as f:
        size = f.seek(0, 2)
        tail_len = min(size, _EOCD.size + 0xFFFF)
        f.seek(size - tail_len)
        tail = f.read(tail_len)
        at = tail.rfind(b"PK\x05\x06")
        if at < 0 or len(tail) - at < _EOCD.size:
            raise PackageError(f"{what}: its wheel is not a readable zip (no end record)")
        total = _EOCD.unpack_from(tail, at)[4]
        if total != 0xFFFF:
            return int(total)
        loc = at - _LOCATOR.size  # zip64: the locator stands just before the end record
        if loc < 0 or tail[loc:loc + 4] != b"PK\x06\x07":
            raise PackageError(f"{what}: its wheel is not a readable zip (zip64 locator)")
        f.seek(_LOCATOR.unpack_from(tail, loc)[2])
        rec = f.read(_EOCD64.size)
        if len(rec) < _EOCD64.size or rec[:4] != b"PK\x06\x06":
            raise PackageError(f"{what}: its wheel is not a readable zip (zip64 end record)")
        return int(_EOCD64.unpack_from(rec)[7])


def _open_bounded(path: Path, what: str) -> zipfile.ZipFile:
    """The wheel as a ZipFile, once its declared entries are within MAX_WHEEL_FILES."""
    declared = _declared_entries(path, what)
    if declared > MAX_WHEEL_FILES:
        raise PackageError(f"{what}: {declared} files in its wheel, more than "
                           f"{MAX_WHEEL_FILES}")
    return zipfile.ZipFile(path)


def plan_wheel(path: Path, what: str) -> WheelPlan:
    """The checked plan of the wheel at ``path`` (``what``: "name version" for messages),
    from its zip directory alone."""
    try:
        with _open_bounded(path, what) as z:
            infos = z.infolist()
    except _ZIP_ERRORS as exc:
        raise PackageError(f"{what}: its wheel is not a readable zip ({exc})") from None
    if len(infos) > MAX_WHEEL_FILES:
        raise PackageError(f"{what}: {len(infos)} files in its wheel, more than "
                           f"{MAX_WHEEL_FILES}")
    total = 0
    plan: list[tuple[str, PurePosixPath]] = []
    files: set[PurePosixPath] = set()
    folders: set[PurePosixPath] = set()
    for info in infos:
        name = info.filename
        p = PurePosixPath(name)
        if p.is_absolute() or ".." in p.parts or "\\" in name or "\0" in name or \
                stat.S_ISLNK(info.external_attr >> 16) or not p.parts:
            raise PackageError(f"{what}: its wheel holds {name!r}, a path outside the "
                               "package")
        if info.is_dir():
            continue
        if _NATIVE.search(p.name):
            raise PackageError(f"{what}: its wheel holds native code ({name}), which does "
                               "not run in the guest")
        parts = p.parts
        if parts[0].endswith(".data"):  # purelib/platlib go in the root; scripts do not
            if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                continue
            p = PurePosixPath(*parts[2:])
        if p in files or p in folders:
            raise PackageError(f"{what}: its wheel holds {str(p)!r} twice (or as a file and "
                               "a folder)")
        files.add(p)
        for parent in p.parents:
            if parent in files:
                raise PackageError(f"{what}: its wheel holds {str(parent)!r} as a file and "
                                   "a folder")
            if parent == PurePosixPath("."):
                break
            folders.add(parent)
        total += info.file_size
        plan.append((name, p))
    if total > MAX_UNPACKED_BYTES:
        raise PackageError(f"{what}: {total} bytes unpacked, more than {MAX_UNPACKED_BYTES}")
    return WheelPlan(tuple(plan), total)


def metadata_of(path: Path, name: str, what: str, cap: int) -> bytes:
    """The ``METADATA`` of the wheel at ``path`` for project ``name`` (canonical), at most
    ``cap`` bytes: for an index that serves no metadata files (PEP 658)."""
    from packaging.utils import canonicalize_name

    try:
        with _open_bounded(path, what) as z:
            for info in z.infolist():
                parts = info.filename.split("/")
                if len(parts) == 2 and parts[1] == "METADATA" and \
                        parts[0].endswith(".dist-info") and \
                        canonicalize_name(parts[0][:-len(".dist-info")].rsplit("-", 1)[0]) \
                        == name:
                    if info.file_size > cap:
                        raise PackageError(f"{what}: its METADATA is more than {cap} bytes")
                    with z.open(info) as f:
                        return f.read(cap + 1)[:cap]
    except _ZIP_ERRORS as exc:
        raise PackageError(f"{what}: its wheel is not a readable zip ({exc})") from None
    raise PackageError(f"{what}: its wheel has no METADATA")


def unpack(path: Path, plan: WheelPlan, dest: Path, what: str) -> None:
    """The plan's files written under ``dest`` (a fresh folder), read-only; each entry's
    bytes must be what the directory declared (zipfile reads no more than that, and checks
    the CRC at the end)."""
    try:
        with zipfile.ZipFile(path) as z:
            for name, p in plan.entries:
                info = z.getinfo(name)
                out_path = dest.joinpath(*p.parts)
                out_path.parent.mkdir(parents=True, exist_ok=True)
                with z.open(info) as src, out_path.open("wb") as out:
                    shutil.copyfileobj(src, out, 1 << 20)
                    if out.tell() != info.file_size:
                        raise PackageError(f"{what}: {name} is not the size its wheel says")
                out_path.chmod(0o444)
    except PackageError:
        raise
    except _ZIP_ERRORS as exc:
        raise PackageError(f"{what}: its wheel cannot be unpacked ({exc})") from None
