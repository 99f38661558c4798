"""Packages in the guest: pure-Python wheels from a package index on 127.0.0.1 (wheels the
tests build), resolved by pip for the guest, cached once, mounted read-only on sys.path."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lanes import examples
from package_index import PackageIndex, build_wheel, package_index

from memex.errors import ConfigError, PackageError
from memex.runtime_wasm import Limits, PackageSet, Sandbox, resolve_packages
from memex.runtime_wasm.engine._engine import load_module
from memex.runtime_wasm.internal import Artifacts, checked_requirements, script_dependencies

DEMO = """from memexdep import VALUE
import numpy
def hello():
    return f"hi {VALUE} numpy {numpy.__version__}"
"""


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PackageIndex]:
    w = tmp_path_factory.mktemp("wheels")
    build_wheel(w, "memexdemo", "1.0", {"memexdemo/__init__.py": DEMO},
                requires=("memexdep>=1.1", "numpy>=2"))
    for v in ("1.0", "1.2"):
        build_wheel(w, "memexdep", v, {"memexdep.py": f"VALUE = {v!r}\n"})
    build_wheel(w, "memexnative", "1.0", {"memexnative.py": ""},
                tag="cp315-cp315-linux_x86_64")
    build_wheel(w, "memexsneaky", "1.0", {"memexsneaky/__init__.py": "",
                                          "memexsneaky/_fast.cpython-315-wasm32-wasi.so": b"\0"})
    build_wheel(w, "memexoldnp", "1.0", {"memexoldnp.py": ""}, requires=("numpy<2",))
    build_wheel(w, "memexescape", "1.0", {"../escaped.py": "x = 1\n"})
    with package_index(w) as idx:
        yield idx


@pytest.fixture(scope="module")
def arts() -> Artifacts:
    return load_module("plain").artifacts


def test_a_package_and_its_dependency_run_in_the_guest(index: PackageIndex, arts: Artifacts,
                                                       tmp_path: Path) -> None:
    """memexdemo needs memexdep>=1.1 (1.2 is taken, 1.0 passed over) and numpy>=2, which the
    guest bundles: numpy is neither fetched nor shadowed, and the guest imports both."""
    got = resolve_packages(["memexdemo"], arts, index_url=index.url,
                           cache=tmp_path)
    assert sorted(got.pins) == ["memexdemo==1.0", "memexdep==1.2"]
    assert not any("numpy" in f for f in index.fetched()), index.fetched()
    with Sandbox(packages=got, limits=Limits(timeout=30)) as sb:
        r = sb.run("import memexdemo, numpy, sys\nmemexdemo.hello(), numpy.__file__")
        assert r.ok, r
        assert "hi 1.2 numpy 2." in str(r.value)
        assert "/memex/packages" not in str(r.value)  # the bundled numpy, not a copy
        assert sb.run("sys.path[-1]").value == "'/memex/packages'"  # after the bundle
        w = sb.run("open('/memex/packages/memexdep.py', 'a').write('x')")
        assert w.exception is not None and w.exception.type in ("PermissionError", "OSError"), w
        child = sb.fork()  # a fork sees the same packages
        assert child.run("import memexdep; memexdep.VALUE").value == "'1.2'"
        child.close()
    with Sandbox(limits=Limits(timeout=30)) as plain:  # the positive control: none without
        r = plain.run("import memexdemo")
        assert r.exception is not None and r.exception.type == "ModuleNotFoundError"


def test_a_cached_set_is_used_without_the_index(index: PackageIndex, arts: Artifacts,
                                               tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Pinned requirements resolved once come from the cache: the index sees no request
    again, and the set is the same folder; a set resolved from a range is found again by its
    locked pins (with their hashes) by a process told of no index (a worker, a slab)."""
    first = resolve_packages(["memexdep==1.0"], arts, index_url=index.url,
                             cache=tmp_path)
    seen = len(index.requests)
    again = resolve_packages(["memexdep==1.0"], arts, index_url=index.url,
                             cache=tmp_path)
    assert len(index.requests) == seen
    assert again.root == first.root and again.id == first.id
    assert first.pins == ("memexdep==1.0",)
    ranged = resolve_packages(["memexdep>=1.1"], arts, index_url=index.url, cache=tmp_path)
    seen = len(index.requests)  # what opens that set again asks by its locked pins: no fetch
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    assert ranged.locked == (f"memexdep==1.2 --hash=sha256:{ranged.wheels[0].sha256}",)
    assert resolve_packages(list(ranged.locked), arts, cache=tmp_path).id == ranged.id
    assert len(index.requests) == seen
    assert not os.access(first.root / "memexdep.py", os.W_OK) or os.geteuid() == 0


@pytest.mark.parametrize("req, says", [
    ("memexnative", "no wheel of memexnative runs in the guest"),
    ("memexsneaky", "holds native code (memexsneaky/_fast"),
    ("memexoldnp", "cannot be resolved for the guest alongside its bundled"),
    ("memexescape", "a path outside the package"),
    ("numpy<2", "the guest bundles numpy"),
])
def test_what_cannot_run_in_the_guest_is_refused_by_name(index: PackageIndex, arts: Artifacts,
                                                         tmp_path: Path, req: str,
                                                         says: str) -> None:
    with pytest.raises(PackageError) as err:
        resolve_packages([req], arts, index_url=index.url, cache=tmp_path)
    assert says in str(err.value), err.value
    assert not list((tmp_path / "packages" / "sets").glob("*")) if (
        tmp_path / "packages" / "sets").exists() else True


@pytest.mark.parametrize("declared", [True, False])
def test_a_download_is_stopped_once_it_passes_the_bound(
        arts: Artifacts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        declared: bool) -> None:
    """A wheel larger than one resolution may download: refused from its declared length
    before a byte is read, or (no length declared) stopped part way while the index is still
    sending; nothing is left behind. The same fetch under a bound that holds it is the
    positive control."""
    import memex.runtime_wasm._packages as packages

    w = tmp_path / "wheels"
    w.mkdir()
    big = build_wheel(w, "memexbig", "1.0", {"memexbig/__init__.py": "",
                                             "memexbig/blob.bin": os.urandom(6 << 20)})
    with package_index(w) as idx:
        idx.slow.add(big.name)
        if not declared:
            idx.undeclared.add(big.name)
        monkeypatch.setattr(packages, "MAX_DOWNLOAD_BYTES", 1 << 20)
        with pytest.raises(PackageError, match="more than 1048576"):
            resolve_packages(["memexbig==1.0"], arts, index_url=idx.url, cache=tmp_path / "c")
        assert idx.sent.get(big.name, 0) < big.stat().st_size, idx.sent
        assert list((tmp_path / "c" / "packages" / "downloads").iterdir()) == []
        assert not (tmp_path / "c" / "packages" / "wheels").exists()
        monkeypatch.setattr(packages, "MAX_DOWNLOAD_BYTES", 64 << 20)
        got = resolve_packages(["memexbig==1.0"], arts, index_url=idx.url,
                               cache=tmp_path / "c")
        assert [x.name for x in got.wheels] == ["memexbig"]


@pytest.mark.parametrize("req", [
    "memexdep @ http://127.0.0.1:9/memexdep.whl", "--index-url=http://127.0.0.1:9/",
    "-r requirements.txt", "not a requirement!", "",
])
def test_a_requirement_is_a_name_and_a_version_only(arts: Artifacts, tmp_path: Path,
                                                    req: str) -> None:
    """A URL or a pip option would make the host fetch from anywhere: refused before pip."""
    with pytest.raises(ConfigError):
        resolve_packages([req], arts, cache=tmp_path)


def test_a_bundled_package_asked_for_is_met_by_the_bundle(arts: Artifacts, tmp_path: Path
                                                          ) -> None:
    got = resolve_packages(["numpy>=2", "pandas"], arts, cache=tmp_path)
    assert got.wheels == () and set(got.bundled) == {"numpy>=2", "pandas"}
    with Sandbox(packages=["numpy>=2"], limits=Limits(timeout=30)) as sb:
        assert sb.packages is None  # nothing to mount: the same guest as without
        assert sb.run("import numpy, sys; '/memex/packages' in sys.path").value == "False"


def test_packages_count_against_the_disk_cap(index: PackageIndex, arts: Artifacts,
                                             tmp_path: Path) -> None:
    got = resolve_packages(["memexdep==1.2"], arts, index_url=index.url,
                           cache=tmp_path)
    with pytest.raises(ConfigError, match=r"more than Limits\.disk_bytes"):
        Sandbox(packages=got, limits=Limits(disk_bytes=got.size - 1))
    with Sandbox(packages=got, limits=Limits(disk_bytes=got.size + 4096, timeout=30)) as sb:
        small = sb.run("with open('/tmp/f', 'wb') as f: f.write(b'x' * 1024)")
        assert small.ok and small.disk_bytes >= got.size + 1024, small  # the set is counted
        r = sb.run("with open('/tmp/g', 'wb') as f: f.write(b'x' * 8192)")  # past the rest
        assert r.exception is not None and r.exception.type == "OSError", r


def test_a_saved_session_comes_back_with_its_packages(index: PackageIndex, arts: Artifacts,
                                                      tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", index.url)
    with Sandbox(packages=["memexdep==1.2"], limits=Limits(timeout=30)) as sb:
        assert isinstance(sb.packages, PackageSet)
        sb.run("import memexdep\nkept = memexdep.VALUE")
        sb.save(tmp_path / "s.img")
    with Sandbox.load(tmp_path / "s.img", limits=Limits(timeout=30)) as back:
        assert back.run("kept, memexdep.VALUE").value == "('1.2', '1.2')"
        assert back.packages is not None and back.packages.pins == ("memexdep==1.2",)


@pytest.mark.slow
def test_a_preload_imports_a_package_into_the_warm_image(index: PackageIndex, arts: Artifacts,
                                                         tmp_path: Path) -> None:
    """The warm image of a set keeps its packages (the image's key names their content), so
    ``preload`` can import one; another set gets its own image, never the first one's."""
    one = resolve_packages(["memexdep==1.0"], arts, index_url=index.url, cache=tmp_path)
    two = resolve_packages(["memexdep==1.2"], arts, index_url=index.url, cache=tmp_path)
    for _ in range(2):  # the second start maps the image the first built
        with Sandbox(packages=one, preload=["memexdep"], limits=Limits(timeout=30)) as sb:
            assert sb.run("import sys; 'memexdep' in sys.modules, memexdep.VALUE").value == \
                "(True, '1.0')"
        with Sandbox(packages=two, preload=["memexdep"], limits=Limits(timeout=30)) as sb:
            assert sb.run("memexdep.VALUE").value == "'1.2'"


# ---- the parsers: any input gives an answer or ConfigError -----------------------------------
@settings(max_examples=examples(300), deadline=None)
@given(st.text(max_size=3000) | st.builds(
    lambda a, b: f"{a}\n# /// script\n{b}\n# ///\n", st.text(max_size=200),
    st.text(max_size=500)))
def test_the_script_metadata_parser_answers_or_refuses(text: str) -> None:
    try:
        out = script_dependencies(text)
    except ConfigError:
        return
    assert out is None or all(isinstance(d, str) for d in out)


NAME = st.from_regex(r"[a-z][a-z0-9-]{0,20}[a-z0-9](==[0-9]{1,3}(\.[0-9]{1,3}){0,2})?",
                     fullmatch=True)


@pytest.mark.slow
@settings(max_examples=examples(200), deadline=None)
@given(st.lists(NAME, max_size=8), st.text(alphabet="abc xyz=()'\n", max_size=300))
def test_a_script_block_round_trips(deps: list[str], body: str) -> None:
    code = "# /// script\n# dependencies = " + json.dumps(deps) + "\n# ///\n" + body
    assert script_dependencies(code) == deps


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.text(max_size=60), max_size=4))
def test_a_requirement_is_parsed_or_refused(reqs: list[str]) -> None:
    try:
        out = checked_requirements(reqs)
    except ConfigError:
        return
    assert all(isinstance(r, str) and "@" not in r.split(";")[0] for r in out)


@pytest.mark.pypi
def test_a_package_from_the_real_index(arts: Artifacts, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The index pip is configured with on this machine (PyPI here): a pure-Python package
    runs; one with native code only (orjson) is refused by name."""
    got = resolve_packages(["humanize==4.12.3"], arts, cache=tmp_path)
    assert got.pins == ("humanize==4.12.3",)
    with Sandbox(packages=got, limits=Limits(timeout=30)) as sb:
        assert sb.run("import humanize; humanize.naturalsize(10**6)").value == "'1.0 MB'"
    with pytest.raises(PackageError, match="no wheel of orjson runs in the guest"):
        resolve_packages(["orjson"], arts, cache=tmp_path)
