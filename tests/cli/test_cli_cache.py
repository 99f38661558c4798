"""`memex cache`: the cache folder's parts with their sizes, and cleaning them as `pip cache`
and `uv cache` do; a package set a live sandbox holds survives a clean."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from package_index import build_wheel, package_index

from memex.runtime_wasm import Limits, Sandbox, resolve_packages
from memex.runtime_wasm.internal import load_module


def memex(cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memex", "cache", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "MEMEX_CACHE_DIR": str(cache),
                                                       "MEMEX_MODEL_DIR": str(cache / "m")})


def test_cache_info_dir_and_clean(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    w = tmp_path / "w"
    w.mkdir()
    build_wheel(w, "memexcc-kept", "1.0", {"memexcc_kept.py": "x = 1\n" * 1000})
    build_wheel(w, "memexcc-gone", "1.0", {"memexcc_gone.py": "y = 2\n" * 1000})
    arts = load_module("plain").artifacts
    with package_index(w) as idx:
        kept = resolve_packages(["memexcc-kept"], arts, index_url=idx.url, cache=cache)
        gone = resolve_packages(["memexcc-gone"], arts, index_url=idx.url, cache=cache)
    (cache / "warm").mkdir()
    (cache / "warm" / "x.raw").write_bytes(b"\1" * 65536)
    (cache / "m").mkdir()
    (cache / "m" / "model.gguf").write_bytes(b"\2" * 8192)

    assert memex(cache, "dir").stdout.strip() == str(cache)
    info = json.loads(memex(cache, "info", "--json").stdout)
    parts = {p["name"]: p for p in info["parts"]}
    assert set(parts) == {"interpreter", "packages", "warm", "modules", "stdlib", "bundle",
                          "models"}
    assert parts["packages"]["bytes"] > 0 and parts["warm"]["bytes"] >= 65536
    assert parts["models"]["files"] == 1
    text = memex(cache, "info").stdout
    assert "packages" in text and "total" in text

    held = Sandbox(packages=kept, limits=Limits(timeout=30))  # a live sandbox holds it
    try:
        out = memex(cache, "clean")  # the default: packages and warm images
        assert out.returncode == 0, out.stderr
        assert "removed" in out.stderr
        assert kept.root.is_dir() and not gone.root.exists()
        assert not (cache / "warm" / "x.raw").exists()
        assert (cache / "m" / "model.gguf").exists()  # models only when named
        assert held.run("import memexcc_kept; memexcc_kept.x").value == "1"
    finally:
        held.close()
    assert memex(cache, "clean", "packages", "models").returncode == 0
    assert not kept.root.exists() and not (cache / "m" / "model.gguf").exists()
    bad = memex(cache, "clean", "nothing")
    assert bad.returncode == 2 and "no cache part named nothing" in bad.stderr
