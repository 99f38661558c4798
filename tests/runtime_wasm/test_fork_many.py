"""``Sandbox.fork_many``: n children from one image of the parent, all or none."""

from __future__ import annotations

import threading

import pytest

from memex import Limits, Sandbox, SandboxClosed, SandboxError, TurnStatus
from memex.runtime_wasm import dirty_tracking
from memex.runtime_wasm._sandbox import _LIVE


def test_children_share_one_image_and_diverge_from_their_first_write() -> None:
    with Sandbox(limits=Limits(timeout=30)) as sb:
        sb.run("state = {'n': 0}")
        kids = sb.fork_many(8)
        try:
            images = {id(k._base) for k in kids}
            assert len(images) == 1  # one image of the parent, mapped by every child
            for k, kid in enumerate(kids):
                assert kid.run(f"state['n'] += {k}\nstate['n']").value == str(k)
            assert [kid.run("state['n']").value for kid in kids] == [str(k) for k in range(8)]
            assert sb.run("state['n']").value == "0"
        finally:
            for kid in kids:
                kid.close()


def test_a_trap_in_one_child_rolls_back_that_child_only() -> None:
    with Sandbox(limits=Limits(timeout=30)) as sb:
        sb.run("v = 1")
        a, b = sb.fork_many(2)
        try:
            a.run("v = 2")
            r = a.run("v = 3\nimport os\nos.abort()")
            assert r.status is TurnStatus.KILLED and r.rolled_back, r
            assert a.run("v").value == "2"
            assert b.run("v").value == "1"
        finally:
            a.close()
            b.close()


def test_children_outlive_a_parent_closed_first() -> None:
    sb = Sandbox(limits=Limits(timeout=30))
    sb.run("v = 'kept'")
    sb.write_file("/tmp/f", b"file")
    kids = sb.fork_many(3)
    sb.close()
    try:
        for kid in kids:
            assert kid.run("v").value == "'kept'"
            assert kid.read_file("/tmp/f") == b"file"
            assert kid.fork_many(2)[0].run("v").value == "'kept'"  # and fork further
    finally:
        for kid in kids:
            kid.close()
    with pytest.raises(SandboxClosed):
        sb.fork_many(2)


def test_all_or_none_when_the_family_quota_runs_out() -> None:
    before = len(_LIVE)
    # A child's /tmp shares the parent's files but has folders of its own, which count
    # against the family's one disk_files quota: 10 each, so 4 children do not fit in 40.
    with Sandbox(limits=Limits(timeout=30, disk_files=40)) as sb:
        sb.run("import os\nfor i in range(10):\n    os.makedirs(f'/tmp/d{i}')")
        assert sb._disk.ledger.entries == 10
        with pytest.raises(SandboxError, match="disk quota"):
            sb.fork_many(4)
        assert len(_LIVE) == before + 1  # none of the children was kept
        kids = sb.fork_many(2)  # positive control: two fit
        assert len(_LIVE) == before + 3
        for kid in kids:
            kid.close()


@pytest.mark.skipif(dirty_tracking() != "uffd-wp", reason="needs the written-page tracking")
def test_a_fork_records_its_first_turns_writes_without_a_watch_until_then() -> None:
    """A child starts on a private mapping of the image: what its first turn wrote is found
    by one scan at its first record (the watch proper starts then), and a trap in its second
    turn goes back to exactly that state."""
    with Sandbox(limits=Limits(timeout=30)) as sb:
        sb.run("base = bytes(range(256)) * 4096")
        kid = sb.fork_many(1)[0]
        try:
            watch = kid._watch
            assert watch is not None and watch._mapped is not None  # no watch started yet
            kid.run("mine = bytearray(b'k' * 3_000_000)\nbase2 = base[::-1]")
            r = kid.run("mine[:] = b'z' * len(mine)\nimport os\nos.abort()")
            assert r.status is TurnStatus.KILLED and r.rolled_back, r
            assert kid.run("(bytes(set(mine)), len(mine), base2 == base[::-1])").value == \
                "(b'k', 3000000, True)"
            kid.run("mine[1] = 0")  # on the instance the trap left: a fresh mapping again
            kid.run("1")  # this turn began with a record: the watch proper runs from it
            assert kid._watch is not None and kid._watch._mapped is None
            r = kid.run("mine[1] = 5\nimport os\nos.abort()")
            assert r.rolled_back and kid.run("(mine[0], mine[1])").value == f"({ord('k')}, 0)"
        finally:
            kid.close()


@pytest.mark.parametrize("parent_files", [False, True])
def test_a_close_during_fork_many_is_all_or_none_and_no_child_sees_another_sandbox(
        monkeypatch: pytest.MonkeyPatch, parent_files: bool) -> None:
    """The parent is closed (from another thread) while fork_many is cloning its /tmp for
    the second child, and a new sandbox opens and writes at once: fork_many then gives no
    child (SandboxClosed, the first child closed), and the new sandbox's /tmp is never the
    parent's folder (a closed sandbox's folder goes back to the shelf for reuse only when no
    fork_many reads it). The interleaving is forced at the clone, not timed. Without files
    in the parent's /tmp its folder is one the shelf would hand out at once (the case the
    review found: children then saw the newcomer's files); with files, it would be deleted."""
    from memex.runtime_wasm import _sandbox

    real_clone = _sandbox._tree.clone
    reached, go = threading.Event(), threading.Event()
    calls: list[str] = []

    def clone(src: str, dst: str, **kw: object) -> object:
        calls.append(src)
        if len(calls) == 2:
            reached.set()
            assert go.wait(60)
        return real_clone(src, dst, **kw)  # type: ignore[arg-type]

    parent = Sandbox(limits=Limits(timeout=30))
    if parent_files:
        parent.run("open('/tmp/mine', 'w').write('p')")
    folder = str(parent._scratch)
    live = len(_LIVE)
    monkeypatch.setattr(_sandbox._tree, "clone", clone)
    out: list[object] = []
    t = threading.Thread(target=lambda: out.append(_forks(parent, 3)))
    t.start()
    assert reached.wait(60)
    parent.close()  # returns at once: the folder is left to fork_many
    monkeypatch.setattr(_sandbox._tree, "clone", real_clone)
    newcomer = Sandbox(limits=Limits(timeout=30))
    try:
        assert str(newcomer._scratch) != folder
        newcomer.run("open('/tmp/theirs', 'w').write('n')")
        go.set()
        t.join(60)
        assert isinstance(out[0], SandboxClosed), out
        assert len(_LIVE) == live  # the parent gone, the newcomer here, no child kept
    finally:
        go.set()
        newcomer.close()
    # the control: without a close, fork_many gives every child the parent's files only
    with Sandbox(limits=Limits(timeout=30)) as sb:
        sb.run("open('/tmp/mine', 'w').write('p')")
        kids = sb.fork_many(3)
        try:
            for kid in kids:
                assert kid.run("import os; sorted(os.listdir('/tmp'))").value == "['mine']"
        finally:
            for kid in kids:
                kid.close()


def _forks(sb: Sandbox, n: int) -> object:
    try:
        return sb.fork_many(n)
    except Exception as exc:  # the test reads which one
        return exc
