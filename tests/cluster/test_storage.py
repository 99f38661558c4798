"""The cluster's storage (``memex.backends.internal.Storage``) on a local folder and on a real
S3-compatible server on 127.0.0.1: the same contract on both."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fsspec")

from memex.cluster.internal import Storage
from memex.errors import ConfigError, ImageError


@pytest.fixture(params=["local", "s3"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    if request.param == "local":
        return Storage(str(tmp_path / "store"))
    s3: dict[str, Any] = request.getfixturevalue("s3_server")
    return Storage(f"{s3['uri']}/{tmp_path.name}", s3["options"])


def test_put_get_delete_and_list(storage: Storage) -> None:
    assert storage.get("sessions/s_1/record", 100) is None
    storage.put("sessions/s_1/record", b"one")
    storage.put("sessions/s_1/image-1", b"x" * 1000)
    storage.put("sessions/s_2/record", b"two")
    assert storage.get("sessions/s_1/record", 100) == b"one"
    storage.put("sessions/s_1/record", b"uno")  # replaced whole
    assert storage.get("sessions/s_1/record", 100) == b"uno"
    assert list(storage.children("sessions")) == ["s_1", "s_2"]
    assert list(storage.children("sessions/s_1")) == ["image-1", "record"]
    storage.delete("sessions/s_1")  # a folder, with what it holds
    assert list(storage.children("sessions")) == ["s_2"]
    storage.delete("sessions/s_1")  # absent: nothing
    assert list(storage.children("nothing/here")) == []


def test_a_read_is_bounded_before_it_allocates(storage: Storage) -> None:
    storage.put("big", b"y" * 5000)
    assert storage.get("big", 5000) == b"y" * 5000
    with pytest.raises(ImageError, match="more than 4999"):
        storage.get("big", 4999)


@pytest.mark.parametrize("key", ["../escape", "a/../../b", "/abs", "a//b", "", "a b",
                                 "sessions/s_1/", ".", "..", "t/checkpoints/.", "a/./b"])
def test_keys_are_safe_names_only(storage: Storage, key: str) -> None:
    with pytest.raises(ConfigError, match="not a storage key"):
        storage.put(key, b"x")
    with pytest.raises(ConfigError, match="not a storage key"):
        storage.get(key, 10)
    with pytest.raises(ConfigError, match="not a storage key"):
        storage.delete(key)  # "t/checkpoints/." would have been the whole folder


def test_a_local_store_is_its_owner_s_alone(tmp_path: Path) -> None:
    """0700 folders and 0600 files whatever the umask (it holds sessions' saved state);
    the control: the same umask leaves a folder made without care open (0755)."""
    import os
    import stat

    old = os.umask(0o022)
    try:
        store = Storage(str(tmp_path / "store"))
        store.put("sessions/s_1/record", b"one")
        (tmp_path / "control").mkdir()
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "control").stat().st_mode) == 0o755
    modes = {str(p.relative_to(tmp_path)): stat.S_IMODE(p.stat().st_mode)
             for p in (tmp_path / "store").rglob("*")} | {
        "store": stat.S_IMODE((tmp_path / "store").stat().st_mode)}
    assert modes == {"store": 0o700, "store/sessions": 0o700, "store/sessions/s_1": 0o700,
                     "store/sessions/s_1/record": 0o600}


def test_it_crosses_to_another_process_as_its_uri(storage: Storage) -> None:
    storage.put("k", b"v")
    again = pickle.loads(pickle.dumps(storage))
    assert again.uri == storage.uri and again.get("k", 10) == b"v"
