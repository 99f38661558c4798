"""Files: mounts (read-only / writable), the private /tmp, escapes, host-side file access,
no network, and mount validation."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from memex import ConfigError, GuestFileError, Mount, Sandbox, SandboxError, TurnStatus

MakeSandbox = Callable[..., Sandbox]


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    """ro/ and rw/ to mount, outside/ next to them holding a secret, plus escaping symlinks
    placed by the host inside the mounted folders."""
    ro, rw, outside = tmp_path / "ro", tmp_path / "rw", tmp_path / "outside"
    for d in (ro, rw, outside):
        d.mkdir()
    (ro / "hello.txt").write_text("hello from host")
    (ro / "sub").mkdir()
    (ro / "sub" / "deep.txt").write_text("deep")
    (outside / "secret.txt").write_text("TOP SECRET")
    os.symlink(outside / "secret.txt", ro / "link_to_secret")
    os.symlink(outside, ro / "link_to_outside")
    os.symlink(outside, rw / "link_to_outside")
    os.symlink("../outside/secret.txt", rw / "rel_link_to_secret")
    return {"ro": ro, "rw": rw, "outside": outside, "root": tmp_path}


@pytest.fixture
def mounted(make_sandbox: MakeSandbox, tree: dict[str, Path]) -> Sandbox:
    return make_sandbox(mounts=[
        Mount(host_path=tree["ro"], guest_path="/data"),
        Mount(host_path=tree["rw"], guest_path="/out", writable=True),
    ])


def error_type(r) -> str | None:  # type: ignore[no-untyped-def]
    return r.exception.type if r.exception is not None else None


# ---- read-only mount ----------------------------------------------------------------------
def test_read_only_mount_is_readable(mounted: Sandbox) -> None:
    r = mounted.run("open('/data/hello.txt').read(), open('/data/sub/deep.txt').read()")
    assert r.status is TurnStatus.OK, r
    assert r.value == "('hello from host', 'deep')"
    r = mounted.run("import os\nsorted(os.listdir('/data'))")
    assert "hello.txt" in (r.value or "")


@pytest.mark.parametrize(
    "code",
    [
        "open('/data/new.txt', 'w').write('x')",
        "open('/data/hello.txt', 'a').write('x')",
        "open('/data/hello.txt', 'w')",
        "import os\nos.remove('/data/hello.txt')",
        "import os\nos.mkdir('/data/newdir')",
        "import os\nos.rename('/data/hello.txt', '/data/moved.txt')",
    ],
    ids=["create", "append", "truncate", "remove", "mkdir", "rename"],
)
def test_read_only_mount_refuses_writes(mounted: Sandbox, tree: dict[str, Path], code: str) -> None:
    before = sorted(p.name for p in tree["ro"].iterdir())
    r = mounted.run(code)
    assert r.status is TurnStatus.ERROR, r
    assert error_type(r) in ("PermissionError", "OSError", "FileNotFoundError"), r.exception
    assert (tree["ro"] / "hello.txt").read_text() == "hello from host"
    assert sorted(p.name for p in tree["ro"].iterdir()) == before


# ---- writable mount -----------------------------------------------------------------------
def test_writable_mount_host_sees_files(mounted: Sandbox, tree: dict[str, Path]) -> None:
    r = mounted.run(
        "import os\nos.makedirs('/out/a/b', exist_ok=True)\n"
        "with open('/out/a/b/result.txt', 'w') as f:\n    f.write('from guest')\n"
        "open('/out/a/b/result.txt').read()"
    )
    assert r.status is TurnStatus.OK, r
    assert r.value == "'from guest'"
    assert (tree["rw"] / "a" / "b" / "result.txt").read_text() == "from guest"


def test_writable_mount_sees_host_changes(mounted: Sandbox, tree: dict[str, Path]) -> None:
    (tree["rw"] / "late.txt").write_text("written after start")
    assert mounted.run("open('/out/late.txt').read()").value == "'written after start'"


# ---- private /tmp -------------------------------------------------------------------------
def test_tmp_is_writable_and_private_per_sandbox(make_sandbox: MakeSandbox) -> None:
    a, b = make_sandbox(), make_sandbox()
    assert a.run("open('/tmp/only_a.txt', 'w').write('a')").status is TurnStatus.OK
    r = b.run("import os\nos.path.exists('/tmp/only_a.txt'), os.listdir('/tmp')")
    assert r.status is TurnStatus.OK, r
    assert r.value == "(False, [])"
    assert a.run("open('/tmp/only_a.txt').read()").value == "'a'"


def test_tmp_is_removed_on_close(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Make the sandbox's host-side scratch folder land in a folder this test watches.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    sb = Sandbox()
    try:
        sb.run("open('/tmp/marker.bin', 'wb').write(b'M' * 100)")
        hits = [p for p in tmp_path.rglob("marker.bin")]
        assert len(hits) == 1, list(tmp_path.rglob("*"))
        scratch = hits[0].parent
        assert scratch.is_dir()
    finally:
        sb.close()
    assert not scratch.exists()
    assert list(tmp_path.rglob("marker.bin")) == []


# ---- escapes ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "path",
    [
        "/data/../outside/secret.txt",
        "/data/../../outside/secret.txt",
        "/data/sub/../../outside/secret.txt",
        "/out/../outside/secret.txt",
        "/tmp/../outside/secret.txt",
        "/etc/passwd",
        "/data/../../../../../../etc/passwd",
    ],
)
def test_dotdot_escapes_fail(mounted: Sandbox, path: str) -> None:
    r = mounted.run(f"open({path!r}).read()")
    assert r.status is TurnStatus.ERROR, r
    assert "TOP SECRET" not in r.stdout + r.stderr + (r.exception.message if r.exception else "")
    assert error_type(r) in ("PermissionError", "FileNotFoundError", "OSError")


def test_dotdot_escape_via_chdir_fails(mounted: Sandbox) -> None:
    r = mounted.run("import os\nos.chdir('/data')\nopen('../outside/secret.txt').read()")
    assert r.status is TurnStatus.ERROR, r
    assert "TOP SECRET" not in (r.value or "")


@pytest.mark.parametrize(
    "code",
    [
        "open('/data/link_to_secret').read()",
        "open('/data/link_to_outside/secret.txt').read()",
        "open('/out/link_to_outside/secret.txt').read()",
        "open('/out/rel_link_to_secret').read()",
        "import os\nos.listdir('/data/link_to_outside')",
    ],
    ids=["file-link", "dir-link-ro", "dir-link-rw", "relative-link", "listdir"],
)
def test_symlink_escapes_fail(mounted: Sandbox, code: str) -> None:
    r = mounted.run(code)
    assert r.status is TurnStatus.ERROR, r
    assert "TOP SECRET" not in (r.value or "")
    assert "secret.txt" not in (r.value or "")


def test_write_through_symlink_escape_fails(mounted: Sandbox, tree: dict[str, Path]) -> None:
    r = mounted.run("open('/out/link_to_outside/planted.txt', 'w').write('pwned')")
    assert r.status is TurnStatus.ERROR, r
    assert not (tree["outside"] / "planted.txt").exists()
    r = mounted.run("open('/out/rel_link_to_secret', 'w').write('pwned')")
    assert r.status is TurnStatus.ERROR, r
    assert (tree["outside"] / "secret.txt").read_text() == "TOP SECRET"


def test_guest_made_symlinks_do_not_escape(mounted: Sandbox, tree: dict[str, Path]) -> None:
    # Writable places refuse links outright (runtime_wasm/files/_disk.py; Mount(links=True) admits
    # links inside the mount only): nothing a guest links can lead out, in the guest or in the
    # host-side read_file/write_file.
    r = mounted.run(
        "import os\nout = []\n"
        "for target, name in [('../outside/secret.txt', 'g1'), ('../outside', 'g2'),\n"
        "                     ('../outside/new.txt', 'g3'), ('/etc/passwd', 'g4')]:\n"
        "    try:\n        os.symlink(target, '/out/' + name)\n        out.append('made')\n"
        "    except OSError as e:\n        out.append(e.strerror)\nout"
    )
    assert r.value == str(["Operation not permitted"] * 4), r
    for code in ("open('/out/g1').read()", "open('/out/g2/secret.txt').read()",
                 "open('/out/g4').read()"):
        r = mounted.run(code)
        assert r.status is TurnStatus.ERROR, (code, r)
    assert mounted.run("open('/out/g3', 'w').write('x')").ok  # a plain file, in the mount
    assert not (tree["rw"] / "g3").is_symlink()
    for guest_path in ("/out/g1", "/out/g2/secret.txt"):
        with pytest.raises(GuestFileError):
            mounted.read_file(guest_path)
    assert sorted(p.name for p in tree["outside"].iterdir()) == ["secret.txt"]
    assert (tree["outside"] / "secret.txt").read_text() == "TOP SECRET"


# ---- host-side read_file / write_file -----------------------------------------------------
def test_read_file_of_guest_written_tmp_file(sandbox: Sandbox) -> None:
    sandbox.run("open('/tmp/report.bin', 'wb').write(bytes(range(256)))")
    assert sandbox.read_file("/tmp/report.bin") == bytes(range(256))


def test_write_file_then_guest_reads_it(sandbox: Sandbox) -> None:
    sandbox.write_file("/tmp/in/nested/data.bin", b"\x00\x01payload")
    r = sandbox.run("open('/tmp/in/nested/data.bin', 'rb').read()")
    assert r.value == repr(b"\x00\x01payload")


def test_read_and_write_file_on_mounts(mounted: Sandbox, tree: dict[str, Path]) -> None:
    assert mounted.read_file("/data/hello.txt") == b"hello from host"
    mounted.write_file("/out/from_host.txt", b"host bytes")
    assert (tree["rw"] / "from_host.txt").read_bytes() == b"host bytes"
    assert mounted.run("open('/out/from_host.txt').read()").value == "'host bytes'"


def test_write_file_refuses_read_only_mount(mounted: Sandbox, tree: dict[str, Path]) -> None:
    with pytest.raises(GuestFileError):
        mounted.write_file("/data/new.txt", b"x")
    assert not (tree["ro"] / "new.txt").exists()


@pytest.mark.parametrize(
    "path",
    [
        "/etc/passwd",
        "/",
        "relative/path.txt",
        "/tmp/../etc/passwd",
        "/data/../outside/secret.txt",
        "/data/link_to_secret",
        "/data/link_to_outside/secret.txt",
        "/usr/local/lib/python315.zip",
        "/memex/site/memex_guest/door.py",
    ],
)
def test_read_file_outside_mounts_raises(mounted: Sandbox, path: str) -> None:
    with pytest.raises(GuestFileError):
        mounted.read_file(path)


def test_read_file_missing_raises_guest_file_error(sandbox: Sandbox) -> None:
    with pytest.raises(GuestFileError):
        sandbox.read_file("/tmp/does-not-exist")


@pytest.mark.parametrize("path", ["/etc/evil", "/tmp/../evil", "/tmp/../../evil", "evil"])
def test_write_file_outside_raises(sandbox: Sandbox, path: str) -> None:
    with pytest.raises(GuestFileError):
        sandbox.write_file(path, b"x")


def test_guest_file_error_is_a_sandbox_error(sandbox: Sandbox) -> None:
    with pytest.raises(SandboxError):
        sandbox.read_file("/nowhere")


# ---- network ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "code",
    [
        "import socket\nsocket.socket()",
        "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_DGRAM)",
        "import socket\nsocket.create_connection(('127.0.0.1', 80), timeout=1)",
        "import socket\nsocket.getaddrinfo('example.com', 80)",
        "import urllib.request\nurllib.request.urlopen('http://127.0.0.1:9/', timeout=1)",
    ],
    ids=["socket", "udp", "connect", "getaddrinfo", "urlopen"],
)
def test_network_is_refused_with_clear_error(sandbox: Sandbox, code: str) -> None:
    r = sandbox.run(code)
    assert r.status is TurnStatus.ERROR, r
    assert r.exception is not None
    text = r.exception.message + r.exception.traceback
    assert "network" in text.lower(), text
    # One answer (SECURITY.md): sockets, DNS and urllib (which goes through the host's egress
    # door, docs/egress.md) are all refused with EgressDenied (a URLError, a PermissionError).
    assert r.exception.type == "memex_guest.net.EgressDenied", r.exception


def test_socket_error_is_permission_error(sandbox: Sandbox) -> None:
    r = sandbox.run(
        "import socket\ntry:\n    socket.socket()\nexcept PermissionError as e:\n"
        "    out = ('PermissionError', 'network' in str(e))\nout"
    )
    assert r.value == "('PermissionError', True)"


# ---- mount validation ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "guest_path",
    ["data", "./data", "", "/", "/tmp", "/tmp/x", "/memex", "/usr/local/lib", "/usr",
     "/a/../b", "/a/./b"],
)
def test_bad_mount_target_raises_config_error(tmp_path: Path, guest_path: str) -> None:
    with pytest.raises(ConfigError):
        Mount(host_path=tmp_path, guest_path=guest_path)


def test_missing_host_dir_raises_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        Mount(host_path=tmp_path / "missing", guest_path="/data")


def test_host_file_instead_of_dir_raises_config_error(tmp_path: Path) -> None:
    f = tmp_path / "file.txt"
    f.write_text("x")
    with pytest.raises(ConfigError):
        Mount(host_path=f, guest_path="/data")


def test_duplicate_mount_target_raises_config_error(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with pytest.raises(ConfigError):
        Sandbox(mounts=[Mount(host_path=tmp_path / "a", guest_path="/data"),
                        Mount(host_path=tmp_path / "b", guest_path="/data")])


def test_non_mount_object_raises_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        Sandbox(mounts=[(str(tmp_path), "/data")])  # type: ignore[list-item]


def test_mount_parse(tmp_path: Path) -> None:
    m = Mount.parse(f"{tmp_path}:/data:rw")
    assert (Path(m.host_path), m.guest_path, m.writable) == (tmp_path, "/data", True)
    m = Mount.parse(f"{tmp_path}:/data")
    assert m.writable is False
    with pytest.raises(ConfigError):
        Mount.parse(f"{tmp_path}:/data:rx")
    with pytest.raises(ConfigError):
        Mount.parse(str(tmp_path))


def test_list_files_lists_tmp_and_mounts_without_following_links(
        make_sandbox: Callable[..., Sandbox], tmp_path: Path) -> None:
    (tmp_path / "inner").mkdir()
    (tmp_path / "a.txt").write_text("abc")
    (tmp_path / "link").symlink_to("/etc")  # planted on the host: listed, never followed
    sb = make_sandbox(mounts=[Mount(host_path=str(tmp_path), guest_path="/data")])
    sb.run("import os\nos.makedirs('/tmp/d')\nopen('/tmp/f.bin', 'wb').write(b'1234')")
    assert [(f.name, f.kind, f.size, f.path) for f in sb.list_files("/tmp")] == [
        ("d", "dir", 0, "/tmp/d"), ("f.bin", "file", 4, "/tmp/f.bin")]
    assert [(f.name, f.kind) for f in sb.list_files("/data")] == [
        ("a.txt", "file"), ("inner", "dir"), ("link", "link")]
    with pytest.raises(GuestFileError, match="escapes its mount"):
        sb.list_files("/data/link")
    with pytest.raises(GuestFileError, match="not a folder"):
        sb.list_files("/tmp/f.bin")
    with pytest.raises(GuestFileError, match="not under /tmp or a mount"):
        sb.list_files("/usr/local/lib")
    assert len(sb.list_files("/tmp", limit=1)) == 1
