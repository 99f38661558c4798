"""Guest packages under hostile content: an index on 127.0.0.1 serving what an attacker would
(direct references deep in the tree, source-only projects, malformed wheels, other bytes
under a name another index serves). No third-party code runs on the host, nothing is fetched
before the whole set is known and granted, sizes are checked before anything is unpacked,
and the cache never mixes bytes from two places. Each refusal beside a benign package from
the same index that installs (the positive control)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from package_index import PackageIndex, build_wheel, package_index

import memex.runtime_wasm._packages as packages
from memex.errors import NotGranted, PackageError
from memex.runtime_wasm import Limits, Sandbox, resolve_packages
from memex.runtime_wasm.engine._engine import load_module
from memex.runtime_wasm.internal import Artifacts
from memex.runtime_wasm.packages._index import cancel_all

SETUP = """import pathlib
pathlib.Path({marker!r}).write_text("the host ran this package's build code")
from setuptools import setup
setup(name="memexevil", version="1.0", py_modules=[])
"""


def build_sdist(folder: Path, name: str, version: str, marker: Path) -> Path:
    """A source distribution whose build code (setup.py) leaves ``marker`` when run."""
    out = folder / f"{name}-{version}.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        data = SETUP.format(marker=str(marker)).encode()
        info = tarfile.TarInfo(f"{name}-{version}/setup.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return out


@pytest.fixture(scope="module")
def arts() -> Artifacts:
    return load_module("plain").artifacts


@pytest.fixture(scope="module")
def marker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("marker") / "ran"


@pytest.fixture(scope="module")
def evil_tree(tmp_path_factory: pytest.TempPathFactory, marker: Path) -> Path:
    """A source tree on this machine whose build code leaves the marker."""
    tree = tmp_path_factory.mktemp("evilsrc")
    (tree / "setup.py").write_text(SETUP.format(marker=str(marker)))
    return tree


def hostile_index(folder: Path, evil_tree: Path, marker: Path, metadata: bool
                  ) -> Iterator[PackageIndex]:
    build_wheel(folder, "memexdep", "1.2", {"memexdep.py": "VALUE = '1.2'\n"})
    build_sdist(folder, "memexevil", "1.0", marker)
    build_sdist(folder, "memexsrc", "1.0", marker)  # a project with an sdist and no wheel
    with package_index(folder, metadata=metadata) as idx:
        refs = {"file": f"memexevil @ file://{evil_tree}",
                "http": f"memexevil @ {idx.url[:-len('/simple')]}/files/memexevil-1.0.tar.gz",
                "vcs": "memexevil @ git+http://127.0.0.1:9/memexevil.git"}
        for kind, ref in refs.items():
            build_wheel(folder, f"memexleaf-{kind}", "1.0",
                        {f"memexleaf_{kind}.py": ""}, requires=(ref,))
            build_wheel(folder, f"memexmid-{kind}", "1.0", {f"memexmid_{kind}.py": ""},
                        requires=("memexdep", f"memexleaf-{kind}"))
        yield idx


@pytest.fixture(scope="module", params=[True, False], ids=["pep658", "no-metadata"])
def index(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
          evil_tree: Path, marker: Path) -> Iterator[PackageIndex]:
    yield from hostile_index(tmp_path_factory.mktemp("hostile"), evil_tree, marker,
                             request.param)


def nothing_kept(cache: Path) -> bool:
    """No wheel, set or download in the cache (an empty lock file of a build that was
    refused part way aside: other processes may be waiting on it)."""
    root = cache / "packages"
    kept = [p for d in ("wheels", "sets", "downloads") if (root / d).exists()
            for p in (root / d).iterdir()
            if not (p.name.endswith(".lock") and p.stat().st_size == 0)]
    return not kept


@pytest.mark.parametrize("kind", ["file", "http", "vcs"])
def test_a_direct_reference_deep_in_the_tree_is_refused_before_it_is_fetched(
        index: PackageIndex, arts: Artifacts, tmp_path: Path, marker: Path,
        kind: str) -> None:
    """memexmid needs memexleaf, whose metadata names ``memexevil @ <a URL, a path, git>``:
    refused by name as soon as memexleaf's metadata is read. The build code never runs, the
    referenced source is never fetched, and with metadata files (PEP 658, as PyPI) no wheel
    at all is downloaded; nothing stays in the cache. memexdep from the same index installs."""
    before = len(index.requests)
    with pytest.raises(PackageError) as err:
        resolve_packages([f"memexmid-{kind}"], arts, index_url=index.url, cache=tmp_path)
    assert f"memexleaf-{kind} 1.0 depends on memexevil @" in str(err.value), err.value
    assert "direct reference" in str(err.value)
    assert not marker.exists()
    fetched = [p.rsplit("/", 1)[1] for p in index.requests[before:]
               if p.startswith("/files/") and not p.endswith(".metadata")]
    assert not any(f.endswith(".tar.gz") for f in fetched), fetched
    if index.metadata:
        assert fetched == [], fetched
    assert nothing_kept(tmp_path)
    got = resolve_packages(["memexdep"], arts, index_url=index.url, cache=tmp_path)
    assert got.pins == ("memexdep==1.2",)


def test_a_source_only_project_is_refused_by_name_and_never_fetched(
        index: PackageIndex, arts: Artifacts, tmp_path: Path, marker: Path) -> None:
    before = len(index.requests)
    with pytest.raises(PackageError, match="memexsrc publishes only source distributions"):
        resolve_packages(["memexsrc"], arts, index_url=index.url, cache=tmp_path)
    assert not [p for p in index.requests[before:] if p.startswith("/files/")]
    assert not marker.exists() and nothing_kept(tmp_path)


@pytest.mark.slow
def test_the_hostile_tree_does_run_code_when_built(evil_tree: Path, tmp_path: Path) -> None:
    """The control for the test above: the source tree is live, a builder that touches it
    runs its code (pip, asked to download it without isolation), so its marker's absence
    there means something."""
    marker = tmp_path / "ran"
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "setup.py").write_text(SETUP.format(marker=str(marker)))
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-index",
                    "--no-build-isolation", "-d", str(tmp_path / "d"),
                    f"memexevil @ file://{tmp_path / 'tree'}"], capture_output=True,
                   timeout=300, env={**os.environ, "PIP_CONFIG_FILE": os.devnull})
    assert marker.exists()


def test_grants_see_every_wheel_before_any_is_fetched(
        tmp_path: Path, arts: Artifacts) -> None:
    """The caller's grant check is given the whole resolved set (dependencies too) before a
    wheel is downloaded; a refusal leaves nothing. Granting both is the control."""
    w = tmp_path / "w"
    w.mkdir()
    build_wheel(w, "memexapp", "1.0", {"memexapp.py": "import memexlib\n"},
                requires=("memexlib>=1",))
    build_wheel(w, "memexlib", "1.1", {"memexlib.py": ""})
    seen: list[list[tuple[str, str]]] = []

    def only_app(wheels: Any) -> None:
        seen.append(list(wheels))
        if any(n != "memexapp" for n, _ in wheels):
            raise NotGranted("memexlib is not granted")

    with package_index(w) as idx:
        with pytest.raises(NotGranted):
            resolve_packages(["memexapp"], arts, index_url=idx.url, cache=tmp_path / "c",
                             allow=only_app)
        assert idx.fetched() == [] and nothing_kept(tmp_path / "c")
        assert sorted(seen[0]) == [("memexapp", "1.0"), ("memexlib", "1.1")]
        got = resolve_packages(["memexapp"], arts, index_url=idx.url, cache=tmp_path / "c",
                               allow=seen.append)
        assert sorted(got.pins) == ["memexapp==1.0", "memexlib==1.1"]
        assert sorted(idx.fetched()) == ["memexapp-1.0-py3-none-any.whl",
                                         "memexlib-1.1-py3-none-any.whl"]


def test_the_set_size_is_checked_before_anything_is_unpacked(
        tmp_path: Path, arts: Artifacts, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two wheels whose unpacked sizes (from their zips' directories) pass the sandbox's disk
    cap, or MemEx's per-set bound: refused, nothing unpacked into the cache; under both,
    the same set installs (the control)."""
    w = tmp_path / "w"
    w.mkdir()
    build_wheel(w, "memexbulk", "1.0", {"memexbulk/a.bin": b"\0" * (3 << 20)},
                requires=("memexbulk2",))
    build_wheel(w, "memexbulk2", "1.0", {"memexbulk2/b.bin": b"\0" * (3 << 20)})
    with package_index(w) as idx:
        with pytest.raises(PackageError, match="more than the 4194304 this set may take"):
            resolve_packages(["memexbulk"], arts, index_url=idx.url, cache=tmp_path / "c",
                             max_bytes=4 << 20)
        assert nothing_kept(tmp_path / "c")
        monkeypatch.setattr(packages, "MAX_SET_BYTES", 5 << 20)
        with pytest.raises(PackageError, match="more than the 5242880"):
            resolve_packages(["memexbulk"], arts, index_url=idx.url, cache=tmp_path / "c")
        assert nothing_kept(tmp_path / "c")
        monkeypatch.setenv("PIP_INDEX_URL", idx.url)
        monkeypatch.setattr(packages, "cache_dir", lambda: tmp_path / "c")
        with pytest.raises(PackageError, match="more than the 4194304"):  # a sandbox's cap
            Sandbox(packages=["memexbulk"], limits=Limits(disk_bytes=4 << 20))
        assert nothing_kept(tmp_path / "c")
        monkeypatch.setattr(packages, "MAX_SET_BYTES", 512 << 20)
        got = resolve_packages(["memexbulk"], arts, index_url=idx.url, cache=tmp_path / "c",
                               max_bytes=8 << 20)
        assert 6 << 20 <= got.size < 7 << 20  # the two blobs and their metadata


@pytest.fixture()
def two_indexes(tmp_path: Path) -> Iterator[tuple[PackageIndex, PackageIndex]]:
    """Two indexes serving memexdep 1.2 with other bytes each ('A' and 'B')."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    build_wheel(a, "memexdep", "1.2", {"memexdep.py": "VALUE = 'A'\n"})
    build_wheel(b, "memexdep", "1.2", {"memexdep.py": "VALUE = 'B'\n"})
    with package_index(a) as ia, package_index(b) as ib:
        yield ia, ib


def test_two_indexes_serving_other_bytes_never_share_an_entry(
        two_indexes: tuple[PackageIndex, PackageIndex], arts: Artifacts,
        tmp_path: Path) -> None:
    a, b = two_indexes
    cache = tmp_path / "c"
    from_a = resolve_packages(["memexdep==1.2"], arts, index_url=a.url, cache=cache)
    from_b = resolve_packages(["memexdep==1.2"], arts, index_url=b.url, cache=cache)
    assert from_a.wheels[0].sha256 != from_b.wheels[0].sha256
    assert from_a.root != from_b.root
    assert (from_a.root / "memexdep.py").read_text() == "VALUE = 'A'\n"
    assert (from_b.root / "memexdep.py").read_text() == "VALUE = 'B'\n"
    assert from_a.wheels[0].origin == a.url and from_b.wheels[0].origin == b.url
    # an unpinned resolution from B does not repoint A's pin
    resolve_packages(["memexdep>=1"], arts, index_url=b.url, cache=cache)
    again = resolve_packages(["memexdep==1.2"], arts, index_url=a.url, cache=cache)
    assert (again.root / "memexdep.py").read_text() == "VALUE = 'A'\n"
    # A's locked pins name A's bytes: from the cache, whatever index is configured ...
    assert resolve_packages(list(from_a.locked), arts, index_url=b.url,
                            cache=cache).id == from_a.id
    # ... and on a machine without them, an index serving other bytes is refused
    with pytest.raises(PackageError, match="no wheel of memexdep with the hash asked for"):
        resolve_packages(list(from_a.locked), arts, index_url=b.url, cache=tmp_path / "new")
    got = resolve_packages(list(from_a.locked), arts, index_url=a.url, cache=tmp_path / "new")
    assert got.id == from_a.id  # the control: the index that has them


def test_a_saved_session_reopens_exactly_its_wheels_or_refuses(
        two_indexes: tuple[PackageIndex, PackageIndex], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = two_indexes
    monkeypatch.setattr(packages, "cache_dir", lambda: tmp_path / "one")
    monkeypatch.setenv("PIP_INDEX_URL", a.url)
    with Sandbox(packages=["memexdep==1.2"], limits=Limits(timeout=30)) as sb:
        assert sb.run("import memexdep; memexdep.VALUE").value == "'A'"
        sb.save(tmp_path / "s.img")
    # another machine (an empty package cache) whose index serves other bytes: refused
    monkeypatch.setattr(packages, "cache_dir", lambda: tmp_path / "two")
    monkeypatch.setenv("PIP_INDEX_URL", b.url)
    with pytest.raises(PackageError, match="hash asked for"):
        Sandbox.load(tmp_path / "s.img", limits=Limits(timeout=30))
    monkeypatch.setenv("PIP_INDEX_URL", a.url)  # the control: its index has them
    with Sandbox.load(tmp_path / "s.img", limits=Limits(timeout=30)) as back:
        assert back.run("memexdep.VALUE").value == "'A'"


def _zip(path: Path, entries: list[tuple[str, bytes]]) -> None:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in entries:
            z.writestr(name, data)


def malformed(folder: Path, kind: str) -> None:
    info = "memexbad-1.0.dist-info"
    meta = b"Metadata-Version: 2.1\nName: memexbad\nVersion: 1.0\n"
    whl = folder / "memexbad-1.0-py3-none-any.whl"
    base = [(f"{info}/METADATA", meta), (f"{info}/WHEEL", b"Wheel-Version: 1.0\n"),
            (f"{info}/RECORD", b"")]
    if kind == "not-a-zip":
        whl.write_bytes(b"PK\3\4 but not really a zip")
    elif kind == "file-and-folder":
        _zip(whl, [*base, ("memexbad", b"x"), ("memexbad/__init__.py", b"")])
    elif kind == "twice":
        with pytest.warns(UserWarning):
            _zip(whl, [*base, ("memexbad.py", b"a"), ("memexbad.py", b"b")])
    elif kind == "bad-crc":
        _zip(whl, [*base, ("memexbad.py", b"VALUE = 1\n" * 100)])
        raw = bytearray(whl.read_bytes())
        at = raw.find(b"VALUE = 1\n")
        raw[at] ^= 0xFF
        whl.write_bytes(bytes(raw))
    elif kind == "link":
        with zipfile.ZipFile(whl, "w") as z:
            for name, data in base:
                z.writestr(name, data)
            li = zipfile.ZipInfo("memexbad.py")
            li.external_attr = (0o120777 << 16)
            z.writestr(li, "/etc/passwd")
    elif kind == "other-name":
        _zip(whl, [(f"{info}/METADATA", b"Metadata-Version: 2.1\nName: other\nVersion: 9\n"),
                   ("memexbad.py", b"")])
    elif kind == "forged-count":  # the end record claims 60,000 entries for 4
        _zip(whl, [*base, ("memexbad.py", b"")])
        raw = bytearray(whl.read_bytes())
        at = raw.rfind(b"PK\5\6")
        raw[at + 8:at + 12] = (60000).to_bytes(2, "little") * 2
        whl.write_bytes(bytes(raw))
    elif kind == "bad-requirement":
        _zip(whl, [(f"{info}/METADATA", meta + b"Requires-Dist: not a requirement!!\n"),
                   ("memexbad.py", b"")])


@pytest.mark.parametrize("kind, says", [
    ("not-a-zip", "not a readable zip"),
    ("file-and-folder", "as a file and a folder"),
    ("twice", "twice"),
    ("bad-crc", "cannot be unpacked"),
    ("link", "a path outside the package"),
    ("other-name", "its metadata names 'other'"),
    ("bad-requirement", "not a requirement"),
    ("forged-count", "60000 files in its wheel"),
])
def test_a_malformed_wheel_is_a_package_error(arts: Artifacts, tmp_path: Path, kind: str,
                                              says: str) -> None:
    w = tmp_path / "w"
    w.mkdir()
    malformed(w, kind)
    build_wheel(w, "memexgood", "1.0", {"memexgood.py": ""})
    for metadata in (True, False):
        with package_index(w, metadata=metadata) as idx:
            with pytest.raises(PackageError, match=says):
                resolve_packages(["memexbad"], arts, index_url=idx.url, cache=tmp_path / "c")
            assert nothing_kept(tmp_path / "c")
            assert resolve_packages(["memexgood"], arts, index_url=idx.url,
                                    cache=tmp_path / "g").pins == ("memexgood==1.0",)


def test_a_name_the_index_does_not_have_says_so(arts: Artifacts, tmp_path: Path) -> None:
    w = tmp_path / "w"
    w.mkdir()
    build_wheel(w, "memexgood", "1.0", {"memexgood.py": ""})
    with package_index(w) as idx:
        with pytest.raises(PackageError, match="no package named memexnothere is on the "
                                               "index"):
            resolve_packages(["memexnothere"], arts, index_url=idx.url, cache=tmp_path)
        with pytest.raises(PackageError, match="no version of memexgood that runs in the "
                                               "guest satisfies: asked for memexgood>=2"):
            resolve_packages(["memexgood>=2"], arts, index_url=idx.url, cache=tmp_path)


def test_bytes_other_than_the_index_s_hash_are_refused(arts: Artifacts, tmp_path: Path
                                                       ) -> None:
    """The page says sha256 X, the file's bytes hash to Y (a tampered mirror): refused."""
    w = tmp_path / "w"
    w.mkdir()
    whl = build_wheel(w, "memexswap", "1.0", {"memexswap.py": "x = 1\n"})
    with package_index(w, metadata=False) as idx:
        idx.swap[whl.name] = whl.read_bytes().replace(b"PK", b"PK", 1) + b"\0"
        with pytest.raises(PackageError, match="do not match the sha256 the index gave"):
            resolve_packages(["memexswap"], arts, index_url=idx.url, cache=tmp_path)
        assert nothing_kept(tmp_path)
        del idx.swap[whl.name]
        assert resolve_packages(["memexswap"], arts, index_url=idx.url,
                                cache=tmp_path).pins == ("memexswap==1.0",)


def test_a_resolution_is_stopped_at_once_by_cancel_all(arts: Artifacts, tmp_path: Path
                                                       ) -> None:
    """What a server's SIGTERM calls: an in-flight download from a slow index ends with a
    PackageError before the index has sent the file, and leaves nothing."""
    w = tmp_path / "w"
    w.mkdir()
    big = build_wheel(w, "memexslow", "1.0", {"memexslow/blob.bin": os.urandom(24 << 20)})
    with package_index(w) as idx:
        idx.slow.add(big.name)
        out: list[BaseException] = []

        def go() -> None:
            try:
                resolve_packages(["memexslow"], arts, index_url=idx.url, cache=tmp_path)
            except BaseException as exc:
                out.append(exc)

        t = threading.Thread(target=go)
        t.start()
        while idx.sent.get(big.name, 0) == 0 and t.is_alive():
            time.sleep(0.01)  # the download has started
        cancel_all("the test stops it")
        t.join(30)
        assert not t.is_alive()
        assert isinstance(out[0], PackageError) and "the test stops it" in str(out[0])
        assert idx.sent[big.name] < big.stat().st_size
        assert nothing_kept(tmp_path)


def test_pip_s_configuration_is_read_and_the_first_index_listing_a_name_wins(
        arts: Artifacts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pip.conf naming an index and an extra one (read, never run): a name both list comes
    from the first, even where the extra one offers a higher version (an extra index cannot
    shadow a name: dependency confusion); a name only the extra one lists comes from it;
    no-index is refused, since MemEx reads indexes only."""
    first, extra = tmp_path / "first", tmp_path / "extra"
    first.mkdir()
    extra.mkdir()
    build_wheel(first, "memexconf-shared", "1.0", {"memexconf_shared.py": "WHO = 'first'\n"})
    build_wheel(extra, "memexconf-shared", "9.0", {"memexconf_shared.py": "WHO = 'extra'\n"})
    build_wheel(extra, "memexconf-only", "1.0", {"memexconf_only.py": ""})
    with package_index(first) as a, package_index(extra) as b:
        conf = tmp_path / "pip.conf"
        conf.write_text(f"[global]\nindex-url = {a.url}\nextra-index-url = {b.url}\n")
        for var in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX"):
            monkeypatch.delenv(var, raising=False)
        monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
        got = resolve_packages(["memexconf-shared"], arts, cache=tmp_path / "c")
        assert got.pins == ("memexconf-shared==1.0",) and got.wheels[0].origin == a.url
        assert not [p for p in b.requests if "memexconf-shared" in p]  # never asked there
        only = resolve_packages(["memexconf-only"], arts, cache=tmp_path / "c")
        assert only.wheels[0].origin == b.url
        monkeypatch.setenv("PIP_NO_INDEX", "1")
        with pytest.raises(PackageError, match="no-index"):
            resolve_packages(["memexconf-only>=1"], arts, cache=tmp_path / "d")


def test_a_resolution_s_reads_and_downloads_are_bounded(
        arts: Artifacts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tree that names more projects than a resolution may read, and (an index without
    metadata files) candidates whose wheels must be downloaded to read their metadata: both
    stop at the resolution's bounds; the same set under bounds that hold it installs."""
    import memex.runtime_wasm.packages._index as index_mod

    w = tmp_path / "w"
    w.mkdir()
    deps = [f"memexfan-{i}" for i in range(12)]
    build_wheel(w, "memexfan", "1.0", {"memexfan.py": ""}, requires=tuple(deps))
    for d in deps:
        build_wheel(w, d, "1.0", {f"{d.replace('-', '_')}.py": "x = 1\n" * 2000})
    with package_index(w, metadata=False) as idx:
        monkeypatch.setattr(index_mod, "MAX_REQUESTS", 10)
        with pytest.raises(PackageError, match="more than 10 reads of the index"):
            resolve_packages(["memexfan"], arts, index_url=idx.url, cache=tmp_path / "c")
        monkeypatch.setattr(index_mod, "MAX_REQUESTS", 2000)
        size = (w / "memexfan_0-1.0-py3-none-any.whl").stat().st_size
        monkeypatch.setattr(packages, "MAX_DOWNLOAD_BYTES", 5 * size)  # candidates count
        with pytest.raises(PackageError, match=r"bytes, more than \d+|more than \d+ bytes"):
            resolve_packages(["memexfan"], arts, index_url=idx.url, cache=tmp_path / "c")
        assert nothing_kept(tmp_path / "c")
        monkeypatch.setattr(packages, "MAX_DOWNLOAD_BYTES", 512 << 20)
        got = resolve_packages(["memexfan"], arts, index_url=idx.url, cache=tmp_path / "c")
        assert len(got.wheels) == 13
