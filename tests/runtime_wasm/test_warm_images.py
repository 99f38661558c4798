"""Warm images on disk: raw files every process maps. A damaged file is refused with a clear
error and built again, never mapped (a short file would fault the host when touched)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from memex import ImageError, Sandbox
from memex.runtime_wasm import _warm, load_module
from memex.runtime_wasm._image import open_raw_image, write_raw_image


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty warm-image folder (the compiled modules stay where they are, loaded)."""
    monkeypatch.setattr(_warm, "_IMAGES", {})
    monkeypatch.setattr(_warm, "cache_dir", lambda: tmp_path)
    return tmp_path / "warm"


def _raw(folder: Path) -> Path:
    files = sorted(folder.glob("*.raw"))
    assert len(files) == 1, files
    return files[0]


def _warm_value(preload: list[str]) -> str | None:
    with Sandbox(preload=preload) as sb:
        return sb.run("import json; json.dumps([1])").value


def test_a_warm_image_is_built_once_then_mapped(fresh_cache: Path) -> None:
    assert _warm_value(["json"]) == "'[1]'"
    path = _raw(fresh_cache)
    stat = path.stat()
    assert stat.st_blocks * 512 < stat.st_size  # sparse: zero megabytes are holes
    _warm._IMAGES.clear()
    assert _warm_value(["json"]) == "'[1]'"
    assert path.stat().st_mtime_ns == stat.st_mtime_ns  # opened, not rebuilt


@pytest.mark.parametrize("damage", ["truncated", "padded", "magic", "header", "binary"])
def test_a_damaged_warm_image_is_refused_and_rebuilt(fresh_cache: Path, damage: str) -> None:
    assert _warm_value(["json"]) == "'[1]'"
    path = _raw(fresh_cache)
    size = path.stat().st_size
    with open(path, "r+b") as f:
        if damage == "truncated":
            f.truncate(size - 65536)
        elif damage == "padded":
            f.truncate(size + 4096)
        elif damage == "magic":
            f.write(b"NOTANIMG")
        elif damage == "header":
            f.seek(16)
            f.write(b"{{{{")
        else:
            f.seek(16)
            head = f.read(4000)
            at = head.index(b'"binary_sha256": "') + 18
            f.seek(16 + at)
            f.write(b"0000")
    sha = load_module("plain").artifacts.snapshot_sha256
    with pytest.raises(ImageError):
        open_raw_image(path, sha)
    _warm._IMAGES.clear()
    assert _warm_value(["json"]) == "'[1]'"  # built again
    img = open_raw_image(_raw(fresh_cache), sha)
    assert img.frozen and img.size == os.path.getsize(_raw(fresh_cache)) - 4096
    img.close()


def test_a_raw_image_round_trips(tmp_path: Path) -> None:
    with Sandbox(rollback=False) as sb:
        sb.run("marker = 'x' * 100000")
        cp = sb.checkpoint()
        sha = load_module("plain").artifacts.snapshot_sha256
        write_raw_image(tmp_path / "a.raw", cp._image, sha, {})
        img = open_raw_image(tmp_path / "a.raw", sha)
        assert bytes(img.view()) == bytes(cp._image.view())
        img.close()
        img.close()  # twice: no error
