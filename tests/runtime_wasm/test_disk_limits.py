"""Disk quotas, the open-descriptor cap and link rules (runtime_wasm/files/_disk.py): every write,
truncate, create and link a guest makes in its writable places is counted and refused past
``Limits.disk_bytes`` / ``disk_files`` / ``open_files`` with an errno in the guest; the sandbox
stays usable and the host never loses a descriptor or a byte of disk to a guest."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from memex import ConfigError, GuestFileError, Limits, Mount, Sandbox, TurnStatus
from memex.runtime_wasm.internal import scratch_dir

MiB = 1 << 20
Make = Callable[..., Sandbox]


def _quota(**kw: Any) -> Limits:
    base: dict[str, Any] = dict(timeout=20, disk_bytes=16 * MiB, disk_files=100, open_files=64)
    base.update(kw)
    return Limits(**base)


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def test_writes_past_the_byte_quota_fail_with_edquot_and_the_turn_says_disk(
        make_sandbox: Make) -> None:
    sb = make_sandbox(limits=_quota())
    r = sb.run("import errno\nchunk = b'x' * (1 << 20)\nn = 0\ntry:\n"
               "    with open('/tmp/big', 'wb') as f:\n"
               "        for _ in range(100):\n            f.write(chunk); n += 1\n"
               "except OSError as e:\n    print(n, e.errno == errno.EDQUOT, e.strerror)\n")
    assert r.status is TurnStatus.OK, r
    assert r.stdout == "16 True Quota exceeded\n"
    assert r.limit == "disk"
    assert r.disk_bytes == 16 * MiB and r.disk_files == 1
    assert _du(scratch_dir(sb)) == 16 * MiB  # nothing beyond the cap reached the disk
    # deleting frees the space: the sandbox is usable again, and the next turn is clean
    r = sb.run("import os\nos.remove('/tmp/big')\nopen('/tmp/small', 'wb').write(b'y' * 1000)")
    assert r.ok and r.limit is None, r
    assert (r.disk_bytes, r.disk_files) == (1000, 1)


@pytest.mark.parametrize("code", [
    "f = open('/tmp/s', 'wb')\nf.seek(1 << 40)\nf.write(b'x')\nf.close()",  # sparse, 1 TiB
    "f = open('/tmp/s', 'wb')\nf.truncate(1 << 40)",
    "import os\nfd = os.open('/tmp/s', os.O_WRONLY | os.O_CREAT)\nos.pwrite(fd, b'x', 1 << 40)",
    "import os\nfd = os.open('/tmp/s', os.O_WRONLY | os.O_CREAT)\nos.ftruncate(fd, 17 << 20)",
])
def test_sparse_files_and_truncation_count_their_whole_size(make_sandbox: Make,
                                                             code: str) -> None:
    sb = make_sandbox(limits=_quota())
    r = sb.run(code)
    assert r.status is TurnStatus.ERROR and r.limit == "disk", r
    assert r.exception is not None and "Quota exceeded" in r.exception.message
    assert r.disk_bytes <= 16 * MiB
    assert sb.run("1 + 1").value == "2"


def test_overwriting_inside_a_full_quota_still_works(make_sandbox: Make) -> None:
    sb = make_sandbox(limits=_quota(disk_bytes=2 * MiB))
    r = sb.run("f = open('/tmp/a', 'wb')\nf.write(b'a' * (2 << 20))\nf.seek(0)\n"
               "f.write(b'b' * (1 << 20))\nf.close()\n"
               "g = open('/tmp/a', 'ab')\ntry:\n    g.write(b'c')\n    g.flush()\n"
               "except OSError as e:\n    print('append refused', e.errno)\n")
    assert r.ok, r
    assert r.stdout.startswith("append refused") and r.disk_bytes == 2 * MiB


def test_the_entry_quota_counts_files_folders_and_frees_on_delete(make_sandbox: Make) -> None:
    sb = make_sandbox(limits=_quota(disk_files=10))
    r = sb.run("import os\nmade = 0\ntry:\n    os.mkdir('/tmp/d'); made += 1\n"
               "    for i in range(50):\n        open(f'/tmp/d/{i}', 'w').close(); made += 1\n"
               "except OSError as e:\n    print(made, e.strerror)\n")
    assert r.stdout == "10 Quota exceeded\n" and r.limit == "disk", r
    assert r.disk_files == 10
    r = sb.run("import shutil\nshutil.rmtree('/tmp/d')\nos.makedirs('/tmp/e/f')")
    assert r.ok and r.disk_files == 2, r


def test_an_unlinked_open_file_counts_until_it_is_closed(make_sandbox: Make) -> None:
    sb = make_sandbox(limits=_quota(disk_bytes=3 * MiB))
    r = sb.run("import os\nf = open('/tmp/ghost', 'wb')\nos.remove('/tmp/ghost')\n"
               "f.write(b'g' * (2 << 20)); f.flush()\ntry:\n"
               "    open('/tmp/other', 'wb').write(b'o' * (2 << 20))\n"
               "except OSError as e:\n    print('refused', e.strerror)\n")
    assert "refused Quota exceeded" in r.stdout, r
    # entries are inodes: the unlinked file's still exists (open), /tmp/other is the second
    assert r.disk_bytes >= 2 * MiB and r.disk_files == 2, r
    r = sb.run("f.close()\nos.remove('/tmp/other') if os.path.exists('/tmp/other') else None\n"
               "open('/tmp/other', 'wb').write(b'o' * (2 << 20))")
    assert r.ok and r.disk_bytes == 2 * MiB, r


def test_rename_over_a_file_frees_the_replaced_one(make_sandbox: Make) -> None:
    sb = make_sandbox(limits=_quota())
    r = sb.run("import os\nopen('/tmp/a', 'wb').write(b'a' * 5000)\n"
               "open('/tmp/b', 'wb').write(b'b' * 7000)\nos.replace('/tmp/a', '/tmp/b')")
    assert r.ok and (r.disk_bytes, r.disk_files) == (5000, 1), r


def test_renaming_a_file_onto_itself_frees_nothing(make_sandbox: Make, tmp_path: Path) -> None:
    """rename(a, a) and rename onto a hard link of the same file do nothing (POSIX): counting
    them as a replacement would let a guest shrink its count and write past the quota."""
    sb = make_sandbox(limits=_quota(disk_bytes=MiB), mounts=[
        Mount(host_path=tmp_path, guest_path="/data", writable=True, links=True)])
    r = sb.run("import os\nopen('/data/a', 'wb').write(b'a' * (1 << 20))\n"
               "os.link('/data/a', '/data/b')\nfor _ in range(5):\n"
               "    os.rename('/data/a', '/data/a')\n    os.rename('/data/a', '/data/b')\n"
               "print(sorted(os.listdir('/data')))\ntry:\n"
               "    with open('/tmp/more', 'wb') as f:\n        f.write(b'm' * 4096)\n"
               "except OSError as e:\n    print(e.strerror)\n")
    assert r.ok and r.stdout == "['a', 'b']\nQuota exceeded\n", r
    assert (r.disk_bytes, r.disk_files) == (MiB, 3)  # a, b and the empty /tmp/more


def test_writable_mounts_share_the_quota_and_their_contents_count(
        make_sandbox: Make, tmp_path: Path) -> None:
    (tmp_path / "old.bin").write_bytes(b"o" * MiB)
    sb = make_sandbox(limits=_quota(disk_bytes=3 * MiB),
                      mounts=[Mount(host_path=tmp_path, guest_path="/data", writable=True)])
    r = sb.run("open('/tmp/t', 'wb').write(b't' * (1 << 20))\ntry:\n"
               "    open('/data/n', 'wb').write(b'n' * (2 << 20))\n"
               "except OSError as e:\n    print(e.strerror)\n")
    assert r.stdout == "Quota exceeded\n" and r.disk_bytes == 2 * MiB, r
    assert (tmp_path / "n").stat().st_size == 0


def test_host_write_file_respects_the_quota(make_sandbox: Make) -> None:
    sb = make_sandbox(limits=_quota(disk_bytes=MiB))
    sb.write_file("/tmp/in/a.bin", b"a" * 1000)
    with pytest.raises(GuestFileError, match="disk quota"):
        sb.write_file("/tmp/in/b.bin", b"b" * MiB)
    r = sb.run("import os\nsorted(os.listdir('/tmp/in'))")
    assert r.value == "['a.bin']" and (r.disk_bytes, r.disk_files) == (1000, 2)


def test_a_fork_shares_its_parents_tmp_and_one_quota_holds_the_family(make_sandbox: Make
                                                                       ) -> None:
    sb = make_sandbox(limits=_quota(disk_bytes=3 * MiB))
    assert sb.run("open('/tmp/a', 'wb').write(b'a' * (2 << 20))").ok
    fork = sb.fork()
    try:
        # the fork's /tmp/a shares the parent's bytes: the family holds 2 MiB, not 4
        r = fork.run("import os\nos.path.getsize('/tmp/a')")
        assert r.value == str(2 * MiB) and r.disk_bytes == 2 * MiB, r
        # one quota for the family: 2 MiB more does not fit beside the shared 2 MiB
        r = fork.run("try:\n    open('/tmp/b', 'wb').write(b'b' * (2 << 20))\n"
                     "except OSError as e:\n    print(e.strerror)\n")
        assert r.stdout == "Quota exceeded\n" and r.limit == "disk", r
        # writing to the shared file copies it first (copy-up): 2 MiB more, so refused here
        r = fork.run("try:\n    open('/tmp/a', 'r+b').write(b'z')\n"
                     "except OSError as e:\n    print(e.strerror)\n")
        assert r.stdout == "Quota exceeded\n" and r.limit == "disk", r
        # the parent's file is untouched by all of it; deleting the fork's name frees nothing
        # (the parent still holds the file), deleting both frees it
        assert fork.run("import os\nos.remove('/tmp/a')").disk_bytes == 2 * MiB
        assert sb.run("open('/tmp/a', 'rb').read(1)").value == "b'a'"
        assert sb.run("import os\nos.remove('/tmp/a')").disk_bytes < MiB
    finally:
        fork.close()


def test_a_forks_write_never_reaches_its_parent_and_closing_frees_its_share(
        make_sandbox: Make) -> None:
    sb = make_sandbox(limits=_quota(disk_bytes=8 * MiB))
    assert sb.run("open('/tmp/a', 'wb').write(b'a' * (1 << 20))\nkeep = open('/tmp/log', 'ab')"
                  "\nkeep.write(b'p'); keep.flush()").ok
    fork = sb.fork()
    assert fork.run("open('/tmp/a', 'r+b').write(b'F')\nopen('/tmp/log', 'ab').write(b'f')").ok
    assert sb.run("keep.write(b'q'); keep.flush()").ok  # the parent's open file, after the fork
    assert sb.run("open('/tmp/a', 'rb').read(2)").value == "b'aa'"
    assert fork.run("open('/tmp/a', 'rb').read(2)").value == "b'Fa'"
    assert sb.run("open('/tmp/log', 'rb').read()").value == "b'pq'"
    assert fork.run("open('/tmp/log', 'rb').read()").value == "b'pf'"
    # two copies of /tmp/a (the fork wrote to its own) and two logs of two bytes: the log
    # the parent held open for writing was copied at the fork, never shared
    assert sb.run("1").disk_bytes == 2 * MiB + 4
    fork.close()
    assert sb.run("1").disk_bytes == MiB + 2  # what only the fork named is gone from the count


def test_a_forks_write_in_a_subfolder_copies_that_file_not_another(make_sandbox: Make
                                                                     ) -> None:
    sb = make_sandbox(limits=_quota(disk_bytes=8 * MiB))
    assert sb.run("import os\nos.makedirs('/tmp/a/b')\nopen('/tmp/a/b/f', 'w').write('p')\n"
                  "open('/tmp/f', 'w').write('top')").ok
    fork = sb.fork()
    try:
        r = fork.run("open('/tmp/a/b/f', 'a').write('F')\n"
                     "(open('/tmp/a/b/f').read(), open('/tmp/f').read(), "
                     "sorted(os.listdir('/tmp')), sorted(os.listdir('/tmp/a/b')))")
        assert r.ok and r.value == "('pF', 'top', ['a', 'f'], ['f'])", r
        assert sb.run("(open('/tmp/a/b/f').read(), open('/tmp/f').read())").value == \
            "('p', 'top')"
    finally:
        fork.close()


@pytest.mark.slow
def test_rollback_after_a_trap_keeps_the_count_of_what_is_on_disk(make_sandbox: Make) -> None:
    sb = make_sandbox(limits=_quota(timeout=1))
    assert sb.run("open('/tmp/a', 'wb').write(b'a' * 4096)").ok
    r = sb.run("open('/tmp/b', 'wb').write(b'b' * 4096)\nwhile True: pass")
    assert r.limit == "deadline" and r.rolled_back
    r = sb.run("import os\nsorted(os.listdir('/tmp'))")
    assert r.value == "['a', 'b']" and (r.disk_bytes, r.disk_files) == (8192, 2), r


def test_open_descriptors_are_capped_with_emfile_and_the_turn_goes_on(
        make_sandbox: Make) -> None:
    sb = make_sandbox(limits=_quota(open_files=32))
    r = sb.run("import errno\nopen('/tmp/x', 'w').close()\nfs = []\ntry:\n"
               "    while True:\n        fs.append(open('/tmp/x'))\n"
               "except OSError as e:\n    print(len(fs) <= 32, e.errno == errno.EMFILE)\n"
               "for f in fs:\n    f.close()\nprint('after', open('/tmp/x').read() == '')\n")
    assert r.ok and r.stdout == "True True\nafter True\n" and r.limit == "open_files", r


def _host_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_full_pool_of_sandboxes_at_their_cap_leaves_the_host_descriptors(
        make_sandbox: Make) -> None:
    """As many sandboxes as the pool holds by default (8 per worker, 2 workers), each holding
    its open-file cap: the host process can still open files and start another sandbox."""
    start = _host_fds()
    boxes = [make_sandbox(limits=Limits(timeout=20)) for _ in range(16)]
    for sb in boxes:
        r = sb.run("open('/tmp/x', 'w').close()\nfs = []\ntry:\n"
                   "    while True:\n        fs.append(open('/tmp/x'))\nexcept OSError as e:\n"
                   "    print(e.strerror)\n")
        assert r.stdout == "No file descriptors available\n", r
    held = _host_fds() - start
    assert held <= 16 * (Limits().open_files + 8), held
    with open(os.devnull) as f:  # the host still opens files ...
        assert f.read() == ""
    extra = make_sandbox()  # ... and starts sandboxes
    assert extra.run("1 + 1").value == "2"


def test_symlinks_and_hard_links_are_refused_in_writable_places_by_default(
        make_sandbox: Make, tmp_path: Path) -> None:
    sb = make_sandbox(mounts=[Mount(host_path=tmp_path, guest_path="/data", writable=True)])
    r = sb.run("import os\nopen('/data/f', 'w').close()\nout = []\n"
               "for a, b in [('../../../../etc/hostname', '/data/l'), ('f', '/data/l2'),\n"
               "             ('/etc/passwd', '/tmp/l3'), ('x', '/tmp/l4')]:\n"
               "    try:\n        os.symlink(a, b); out.append('made')\n"
               "    except OSError as e:\n        out.append(e.strerror)\n"
               "for a, b in [('/data/f', '/data/h'), ('/data/f', '/tmp/h')]:\n"
               "    try:\n        os.link(a, b); out.append('made')\n"
               "    except OSError as e:\n        out.append(e.strerror)\n"
               "print(out)")
    assert r.stdout == str(["Operation not permitted"] * 6) + "\n", r
    assert [p.name for p in tmp_path.iterdir()] == ["f"]


def test_a_mount_that_opts_in_gets_links_that_stay_inside_it(make_sandbox: Make,
                                                            tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    sb = make_sandbox(mounts=[Mount(host_path=tmp_path, guest_path="/data", writable=True,
                                    links=True)])
    r = sb.run("import os\nopen('/data/f', 'w').write('hello')\n"
               "open('/data/sub/g', 'w').write('hello')\nout = []\n"
               "for a, b in [('f', '/data/in'), ('sub/g', '/data/down'), ('g', '/data/sub/in'),\n"
               "             ('../f', '/data/sub/up'), ('../../etc/hostname', '/data/out'),\n"
               "             ('/data/f', '/data/abs'), ('./f', '/data/dot'),\n"
               "             ('../sub/../../x', '/data/sub/out2'), ('sub//g', '/data/e')]:\n"
               "    try:\n        os.symlink(a, b); out.append('made')\n"
               "    except OSError as e:\n        out.append(e.strerror)\n"
               "os.link('/data/f', '/data/hard')\n"
               "print(out, open('/data/in').read(), open('/data/down').read(),\n"
               "      open('/data/hard').read())")
    denied = "Operation not permitted"
    # only links that descend (plain names, no '.' or '..') are made: they point inside the
    # mount wherever they are later moved
    assert r.stdout == str(["made", "made", "made"] + [denied] * 6) + " hello hello hello\n", r
    for link, to in (("in", "f"), ("down", "sub/g"), ("sub/in", "sub/g")):
        assert (tmp_path / link).resolve() == (tmp_path / to).resolve()
    # a hard link is one inode: its bytes count once (two files of 5 bytes); entries are the
    # folder, the two files, the three links and the hard link's extra name
    assert (r.disk_bytes, r.disk_files) == (10, 7), r


def test_host_helpers_never_follow_a_planted_link_out_of_a_mount(make_sandbox: Make,
                                                                tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    inner = tmp_path / "mount"
    inner.mkdir()
    (inner / "planted").symlink_to(secret)
    sb = make_sandbox(mounts=[Mount(host_path=inner, guest_path="/data", writable=True)])
    with pytest.raises(GuestFileError, match="escapes"):
        sb.read_file("/data/planted")
    with pytest.raises(GuestFileError, match="escapes"):
        sb.write_file("/data/planted", b"overwrite")
    assert [f.kind for f in sb.list_files("/data")] == ["link"]
    r = sb.run("open('/data/planted').read()")
    assert r.status is TurnStatus.ERROR and "host secret" not in r.stdout + r.stderr
    assert secret.read_text() == "host secret"


def test_limits_validate_the_new_caps() -> None:
    with pytest.raises(ConfigError, match="open_files"):
        Limits(open_files=4)
    with pytest.raises(ConfigError, match="disk_bytes"):
        Limits(disk_bytes=-1)
    with pytest.raises(ConfigError, match="disk_files"):
        Limits(disk_files=True)  # type: ignore[arg-type]
    assert Limits().disk_bytes == 512 * MiB and Limits().open_files == 128


def test_checkpoints_and_saves_hold_memory_only_and_the_count_stays_true(
        make_sandbox: Make, tmp_path: Path) -> None:
    """/tmp is not in a checkpoint or a saved image: a restore leaves the files (and their
    count) as they are on disk; a loaded sandbox starts with an empty /tmp."""
    sb = make_sandbox(limits=_quota())
    assert sb.run("open('/tmp/a', 'wb').write(b'a' * 1000)").ok
    cp = sb.checkpoint()
    assert sb.run("open('/tmp/b', 'wb').write(b'b' * 2000)").disk_bytes == 3000
    sb.restore(cp)
    r = sb.run("import os\nsorted(os.listdir('/tmp'))")
    assert r.value == "['a', 'b']" and (r.disk_bytes, r.disk_files) == (3000, 2), r
    sb.save(tmp_path / "img.memex")
    loaded = Sandbox.load(tmp_path / "img.memex", limits=_quota())
    try:
        r = loaded.run("import os\nos.listdir('/tmp')")
        assert r.value == "[]" and (r.disk_bytes, r.disk_files) == (0, 0), r
    finally:
        loaded.close()


@pytest.mark.slow
def test_a_folder_holds_at_most_max_dir_entries_names(make_sandbox: Make) -> None:
    """With an entry quota above the per-folder cap, one folder still takes at most 10,000
    names (host tools that list a folder stay bounded); another folder takes more."""
    sb = make_sandbox(limits=_quota(timeout=120, disk_files=30_000))
    r = sb.run("import os\nos.mkdir('/tmp/a')\nn = 0\ntry:\n    while True:\n"
               "        open(f'/tmp/a/{n}', 'w').close(); n += 1\n"
               "except OSError as e:\n    print(n, e.strerror)\n"
               "os.mkdir('/tmp/b')\nfor i in range(10):\n    open(f'/tmp/b/{i}', 'w').close()\n"
               "print(len(os.listdir('/tmp/b')))")
    assert r.ok and r.stdout == "10000 Quota exceeded\n10\n" and r.limit == "disk", r
