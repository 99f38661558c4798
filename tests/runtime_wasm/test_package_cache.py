"""The package cache's bound (``MEMEX_PACKAGE_CACHE_BYTES``): least recently used sets go
first, a set a live sandbox holds never goes (in this process or another), and a set that
went comes back by its locked pins."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from package_index import PackageIndex, build_wheel, package_index

import memex.runtime_wasm._packages as packages
from memex.runtime_wasm import Limits, Sandbox, resolve_packages
from memex.runtime_wasm.engine._engine import load_module
from memex.runtime_wasm.internal import Artifacts
from memex.runtime_wasm.packages._store import evict, wheel_sizes

MiB = 1 << 20
HOLDER = """
import sys
from pathlib import Path
from memex.runtime_wasm.packages._store import hold
held = hold(Path(sys.argv[1]), sys.argv[2], sys.argv[3:])
print("held" if held is not None else "gone", flush=True)
sys.stdin.read()  # until the test closes it
"""


@pytest.fixture(scope="module")
def arts() -> Artifacts:
    return load_module("plain").artifacts


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PackageIndex]:
    w = tmp_path_factory.mktemp("wheels")
    for name in "abcd":
        build_wheel(w, f"memexlru-{name}", "1.0",
                    {f"memexlru_{name}/__init__.py": f"NAME = {name!r}\n",
                     f"memexlru_{name}/blob.bin": b"\0" * MiB})
    with package_index(w) as idx:
        yield idx


def test_the_bound_evicts_least_recently_used_sets_but_never_a_held_one(
        index: PackageIndex, arts: Artifacts, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(packages, "cache_dir", lambda: tmp_path)
    monkeypatch.setenv("PIP_INDEX_URL", index.url)
    monkeypatch.setenv("MEMEX_PACKAGE_CACHE_BYTES", str(int(2.5 * MiB)))
    root = tmp_path / "packages"
    a = resolve_packages(["memexlru-a"], arts)
    sb = Sandbox(packages=a, limits=Limits(timeout=30))  # holds a, in this process
    b = resolve_packages(["memexlru-b"], arts)
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(root), b.id,
                              b.wheels[0].sha256], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "held"
        c = resolve_packages(["memexlru-c"], arts)  # 3 sets of 1 MiB past a 2.5 MiB bound
        assert a.root.is_dir() and b.root.is_dir() and c.root.is_dir()  # all held or new
        assert sb.run("import memexlru_a; memexlru_a.NAME").value == "'a'"
        sb.close()
        d = resolve_packages(["memexlru-d"], arts)  # a is free now, and the oldest
        assert not a.root.exists(), "the least recently used free set goes first"
        assert b.root.is_dir(), "a set another process holds stays"
        assert not c.root.exists() and d.root.is_dir()
        assert sum(wheel_sizes(root).values()) <= int(2.5 * MiB)
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(30)
    assert evict(root, 0) > 0 and not b.root.exists()  # released with its process
    # a set that went comes back by its locked pins (from the index, checked by hash)
    before = len(index.requests)
    with Sandbox(packages=list(a.locked), limits=Limits(timeout=30)) as again:
        assert again.run("import memexlru_a; memexlru_a.NAME").value == "'a'"
    assert len(index.requests) > before


def test_a_set_evicted_between_resolution_and_mount_is_made_again(
        index: PackageIndex, arts: Artifacts, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(packages, "cache_dir", lambda: tmp_path)
    monkeypatch.setenv("PIP_INDEX_URL", index.url)
    a = resolve_packages(["memexlru-a"], arts)
    evict(tmp_path / "packages", 0)  # another process prunes the cache before the mount
    assert not a.root.exists()
    with Sandbox(packages=a, limits=Limits(timeout=30)) as sb:
        assert sb.packages is not None and sb.packages.id == a.id
        assert sb.run("import memexlru_a; memexlru_a.NAME").value == "'a'"
