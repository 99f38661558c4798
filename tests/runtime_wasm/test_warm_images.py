"""Warm images on disk: raw files every process maps. A damaged file is refused with a clear
error and built again, never mapped (a short file would fault the host when touched)."""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections import OrderedDict
from pathlib import Path

import pytest

from memex import ConfigError, ImageError, Sandbox
from memex.runtime_wasm import _warm
from memex.runtime_wasm.images._imagefile import open_raw_image, write_raw_image
from memex.runtime_wasm.internal import load_module


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty warm-image folder (the compiled modules stay where they are, loaded)."""
    monkeypatch.setattr(_warm, "_IMAGES", OrderedDict())
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


# ---- saves on top of a warm image -------------------------------------------------------------
def _session(tmp_path: Path) -> tuple[Path, Path]:
    """One session saved both ways: on its warm image and portable."""
    with Sandbox(preload=["json"]) as sb:
        sb.run("state = {'k': list(range(1000))}\nblob = bytes(range(256)) * 4000")
        delta, whole = tmp_path / "delta.memex", tmp_path / "whole.memex"
        sb.save(delta)
        sb.save(whole, portable=True)
    return delta, whole


def _check(sb: Sandbox) -> None:
    r = sb.run("len(state['k']), sum(blob) % 1000, json.dumps(1)")
    assert r.value == "(1000, 0, '1')", r


def test_a_save_holds_what_the_session_changed(fresh_cache: Path, tmp_path: Path) -> None:
    delta, whole = _session(tmp_path)
    assert delta.stat().st_size * 3 < whole.stat().st_size
    for path in (delta, whole):
        with Sandbox.load(path) as sb:
            _check(sb)


def test_a_save_on_a_warm_image_this_machine_lacks_is_refused(
        fresh_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    delta, whole = _session(tmp_path)
    other = tmp_path / "other-machine"
    monkeypatch.setattr(_warm, "_IMAGES", OrderedDict())
    monkeypatch.setattr(_warm, "cache_dir", lambda: other)
    with pytest.raises(ImageError, match="portable=True"):
        Sandbox.load(delta)
    with Sandbox.load(whole) as sb:  # the portable one needs nothing
        _check(sb)
    # Built again here: the base only when its contents are the same (named by their hash).
    with Sandbox(preload=["json"]):
        pass
    sha = load_module("plain").artifacts.snapshot_sha256
    rebuilt = open_raw_image(_raw(other / "warm"), sha)
    recorded = json.loads(_header(delta))["base"]
    if rebuilt.origin == recorded:
        with Sandbox.load(delta) as sb:
            _check(sb)
    else:
        with pytest.raises(ImageError, match="does not have"):
            Sandbox.load(delta)
    rebuilt.close()


def _header(path: Path) -> bytes:
    blob = path.read_bytes()
    (hlen,) = struct.unpack_from("<I", blob, 12)
    return blob[16 : 16 + hlen]


def test_a_flipped_byte_in_a_saved_run_is_refused(fresh_cache: Path, tmp_path: Path) -> None:
    delta, _ = _session(tmp_path)
    blob = bytearray(delta.read_bytes())
    blob[len(blob) // 2] ^= 0x5A
    bad = tmp_path / "bad.memex"
    bad.write_bytes(bytes(blob))
    with pytest.raises(ImageError, match=r"checksum|corrupt|truncated"):
        Sandbox.load(bad)


def test_a_file_of_format_2_still_loads(tmp_path: Path) -> None:
    """Saves of earlier MemEx versions: zlib chunks of 1 MiB, all-zero ones skipped."""
    with Sandbox(rollback=False) as sb:
        sb.run("marker = 'format two' * 3")
        img = sb.checkpoint()._image
        sha = load_module("plain").artifacts.snapshot_sha256
        view = img.view()
        body = []
        count = 0
        for off in range(0, img.size, 1 << 20):
            chunk = bytes(view[off : off + (1 << 20)])
            if chunk.count(0) == len(chunk):
                continue
            data = zlib.compress(chunk, 1)
            body += [struct.pack("<QI", off, len(data)), data]
            count += 1
        del view
        header = json.dumps({"binary_sha256": sha, "memory_size": img.size, "chunk": 1 << 20,
                             "chunks": count, "meta": {}}).encode()
        path = tmp_path / "v2.memex"
        path.write_bytes(struct.pack("<8sII", b"MEMEXIMG", 2, len(header)) + header
                         + b"".join(body) + b"MEMEXEND")
    with Sandbox.load(path) as loaded:
        assert loaded.run("marker").value == repr("format two" * 3)


def test_a_first_turns_pages_are_written_before_it_runs() -> None:
    """What the first turn of a guest from a warm image wrote is remembered on that image,
    and later guests get those pages in one madvise per stretch before they run, instead
    of a copy-on-write fault each: fewer faults in their first turn, the same results."""
    import resource

    from memex.runtime_wasm.images._image import MemoryImage

    def first_turn_faults() -> tuple[int, str | None]:
        sb = Sandbox()
        try:
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            r = sb.run("sum(range(10))")
            return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, r.value
        finally:
            sb.close()

    first_turn_faults()  # teaches the warm image (if no sandbox of this process did yet)
    learned = MemoryImage.learn_hot
    try:
        with_hot = min(first_turn_faults()[0] for _ in range(3))
        MemoryImage.learn_hot = lambda self, runs: None  # type: ignore[method-assign]
        Sandbox().close()
        for img in _warm._IMAGES.values():
            img._hot = ()
        without = min(first_turn_faults()[0] for _ in range(3))
    finally:
        MemoryImage.learn_hot = learned  # type: ignore[method-assign]
    assert first_turn_faults()[1] == "45"
    assert with_hot < without * 0.8, (with_hot, without)


def test_the_cache_keeps_to_its_bound_least_recently_used_first(
        fresh_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every distinct preload leaves an image; the folder stays within
    MEMEX_WARM_CACHE_BYTES, the least recently used going first, the newest never."""
    def build(module: str) -> Path:
        before = set(fresh_cache.glob("*.raw")) if fresh_cache.exists() else set()
        with Sandbox(preload=["json", module]) as sb:
            assert sb.run(f"import sys\n'{module}' in sys.modules").value == "True"
        made = set(fresh_cache.glob("*.raw")) - before
        assert len(made) == 1
        return made.pop()

    first = build("base64")
    one = first.stat().st_blocks * 512
    monkeypatch.setenv("MEMEX_WARM_CACHE_BYTES", str(int(one * 2.5)))  # room for two
    second = build("string")
    os.utime(first, ns=(first.stat().st_atime_ns + 10**9, first.stat().st_mtime_ns))  # used
    third = build("textwrap")  # three do not fit: the least recently used (second) goes
    assert first.exists() and third.exists() and not second.exists()
    assert sum(p.stat().st_blocks * 512 for p in fresh_cache.glob("*.raw")) <= one * 2.5
    # positive control: an image removed from the cache is built again when next needed
    _warm._IMAGES.clear()
    again = build("string")
    assert again.name == second.name
    # a bound that is not a number is a configuration error, not a silent default
    monkeypatch.setenv("MEMEX_WARM_CACHE_BYTES", "2G")
    with pytest.raises(ConfigError):
        _warm.cache_bound()



def test_sandboxes_that_differ_in_their_environment_share_one_warm_image(
        fresh_cache: Path) -> None:
    """A warm image is keyed without the sandbox's own environment (issue 46: a client
    giving each session another value made a ~100 MB image apiece, built on the server's
    CPU and kept in its cache); the values are set in the guest after the image is
    restored, and everything that starts from the live state (a fork, a checkpoint, a turn
    rolled back) keeps them."""
    seen = []
    for value in ("one", "two", "three"):
        with Sandbox(preload=["json"], env={"TENANT_VALUE": value, "HOME": "/tmp/h"}) as sb:
            seen.append(sb.run("import os; (os.environ['TENANT_VALUE'], "
                               "os.getenv('HOME'), os.environ['TMPDIR'])").value)
            child = sb.fork()  # before any turn of the child: from the live state
            assert child.run("import os; os.environ['TENANT_VALUE']").value == repr(value)
            child.close()
            cp = sb.checkpoint()
            sb.run("import os; os.environ['TENANT_VALUE'] = 'changed'")
            sb.restore(cp)
            assert sb.run("os.environ['TENANT_VALUE']").value == repr(value)
            r = sb.run("raise SystemExit(3)")  # ends the turn; the session lives on
            assert sb.run("os.environ['TENANT_VALUE']").value == repr(value), r
    assert seen == [repr((v, "/tmp/h", "/tmp")) for v in ("one", "two", "three")]
    _raw(fresh_cache)  # one image for the three (control: another preload makes another)
    with Sandbox(preload=["json", "base64"]) as sb:
        assert sb.run("import os; 'TENANT_VALUE' in os.environ").value == "False"
    assert len(list(fresh_cache.glob("*.raw"))) == 2


def test_a_fresh_sandbox_with_an_environment_forks_before_its_first_turn(
        fresh_cache: Path) -> None:
    """The environment is set on a fresh guest started from the plain warm image too."""
    with Sandbox() as warmup:
        warmup.run("1")
    with Sandbox() as warmup:  # the second plain sandbox of a kind builds the plain image
        warmup.run("1")
    with Sandbox(env={"ONLY_HERE": "yes"}) as sb:
        kids = sb.fork_many(2)
        try:
            assert [k.run("import os; os.getenv('ONLY_HERE')").value for k in kids] == \
                ["'yes'", "'yes'"]
        finally:
            for k in kids:
                k.close()
        assert sb.run("import os; os.getenv('ONLY_HERE')").value == "'yes'"
