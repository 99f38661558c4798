"""A closed sandbox's /tmp folder, left as good as new, is kept for the next sandbox instead
of deleted and made again (runtime_wasm/files/_scratch.py); anything else is deleted as
before. And a churned sandbox's one turn teaches its image which pages to prefault."""

from __future__ import annotations

import os
import resource
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from memex import Sandbox
from memex.runtime_wasm.files import _scratch
from memex.runtime_wasm.images._dirty import TRACKER
from memex.runtime_wasm.images._image import MemoryImage
from memex.runtime_wasm.internal import scratch_dir


@pytest.fixture
def shelf_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Sandboxes' folders made in a folder of this test's own (the shelf starts empty)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    _scratch._clear()
    yield tmp_path
    _scratch._clear()


def _closed(code: str = "") -> Path:
    sb = Sandbox()
    if code:
        assert sb.run(code).ok
    path = scratch_dir(sb)
    sb.close()
    return path


def test_an_empty_tmp_goes_to_the_next_sandbox_with_new_times(shelf_in: Path) -> None:
    # the guest wrote and deleted a file: the folder's times say when
    first = _closed("import os\nopen('/tmp/a', 'w').write('x')\nos.remove('/tmp/a')")
    assert first.is_dir() and _scratch.shelved() == 1
    time.sleep(0.05)
    before = time.time()
    sb = Sandbox()
    try:
        assert scratch_dir(sb) == first and _scratch.shelved() == 0
        r = sb.run("import os\nst = os.stat('/tmp')\n(os.listdir('/tmp'), st.st_mtime)")
        assert r.ok, r
        listing, mtime = eval(r.value)  # our own guest's repr of a list and a float
        assert listing == [] and mtime >= before - 0.01
    finally:
        sb.close()


@pytest.mark.parametrize("code", [
    "open('/tmp/left', 'w').write('x')",
    "import os\nos.mkdir('/tmp/d')",
    # a folder that once held many names keeps their space: deleted, not kept
    "import os\nfor i in range(400):\n    open(f'/tmp/{i:0>40}', 'w').close()\n"
    "for i in range(400):\n    os.remove(f'/tmp/{i:0>40}')",
])
def test_a_tmp_not_as_good_as_new_is_deleted(shelf_in: Path, code: str) -> None:
    path = _closed(code)
    assert not path.exists() and _scratch.shelved() == 0
    # positive control: the same sandbox with nothing left in /tmp is kept
    kept = _closed("1")
    assert kept.is_dir() and _scratch.shelved() == 1


def test_a_folder_made_loose_or_given_back_by_another_temp_dir_is_not_shelved(
        shelf_in: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    loose = shelf_in / "loose"
    loose.mkdir(mode=0o755)
    os.chmod(loose, 0o755)
    _scratch.give_back(str(loose), str(loose))  # mode 0755: not one of ours
    assert not loose.exists() and _scratch.shelved() == 0
    kept = _closed()
    assert _scratch.shelved() == 1
    # the temporary folder changed: what was shelved under the old one is deleted
    other = tmp_path_factory.mktemp("other")
    tempfile.tempdir = str(other)
    moved = _closed()
    assert moved.parent == other and _scratch.shelved() == 1 and not kept.exists()


def test_the_shelf_is_bounded_and_emptied(shelf_in: Path) -> None:
    sbs = [Sandbox() for _ in range(_scratch.SHELF_SIZE + 4)]
    paths = [scratch_dir(sb) for sb in sbs]
    for sb in sbs:
        sb.close()
    assert _scratch.shelved() == _scratch.SHELF_SIZE
    assert sum(p.exists() for p in paths) == _scratch.SHELF_SIZE
    _scratch._clear()  # what runs at exit
    assert _scratch.shelved() == 0 and not any(p.exists() for p in paths)


def test_a_forked_process_starts_with_an_empty_shelf(shelf_in: Path) -> None:
    _closed()
    assert _scratch.shelved() == 1  # positive control: the parent has one
    pid = os.fork()
    if pid == 0:  # the child: never reaches pytest's own code
        os._exit(0 if _scratch.shelved() == 0 else 3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert _scratch.shelved() == 1


def _first_turn_faults(preload: list[str], code: str = "1") -> int:
    sb = Sandbox(preload=preload)
    try:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        assert sb.run(code).ok
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    finally:
        sb.close()


def _base_of(preload: list[str]) -> MemoryImage:
    sb = Sandbox(preload=preload)
    image = sb._base
    sb.close()
    assert image is not None
    return image


@pytest.mark.skipif(TRACKER.mode == "off", reason="written pages are not tracked here")
def test_churned_sandboxes_teach_their_image_what_a_first_turn_writes() -> None:
    preload = ["colorsys"]  # a warm image of this test's own
    image = _base_of(preload)
    assert image.learns_hot
    # two sandboxes closed after one turn: what both wrote is prefaulted from now on
    first = _first_turn_faults(preload)
    assert image.learns_hot
    _first_turn_faults(preload)
    assert not image.learns_hot
    later = min(_first_turn_faults(preload) for _ in range(3))
    # the first turns faulted in each page they wrote (~150); later ones find most written
    assert later * 2 < first, (first, later)


@pytest.mark.skipif(TRACKER.mode == "off", reason="written pages are not tracked here")
def test_one_workload_s_first_cell_is_not_prefaulted_for_every_later_sandbox() -> None:
    preload = ["colorsys", "keyword"]
    image = _base_of(preload)
    big = "x = bytearray(1 << 20)"  # a first cell that writes 256 pages of its own
    _first_turn_faults(preload, big)
    _first_turn_faults(preload, "1")
    assert not image.learns_hot
    hot = sum(n for _, n in image._hot)
    assert 0 < hot < 1 << 20, hot  # the pages both first turns wrote, not the big cell's
    # positive control: the big cell's pages are written by it, not found prefaulted
    assert _first_turn_faults(preload, big) > 200


def test_a_fork_s_image_learns_nothing_so_closing_a_child_scans_nothing() -> None:
    with Sandbox() as parent:
        assert parent.run("x = 1").ok
        child = parent.fork()
        try:
            assert child._base is not None and not child._base.learns_hot
            assert child.run("x").value == "1"
        finally:
            child.close()
    # positive control: a warm image (flat) that no first turn has taught yet learns
    assert _base_of(["colorsys", "token"]).learns_hot
