"""Where a cluster keeps what must outlive a node: a storage URI read and written through
``fsspec`` (a path on a shared filesystem, ``file://...``, or an object store such as
``s3://bucket/prefix`` with ``s3fs``). Keys are relative paths of safe names (never ``.`` or
``..``: a key names one object or folder under the root); every read is bounded before it
allocates.

A write is atomic for a reader: an object store's PUT is (the new object or the old one,
never a mix); on a filesystem the bytes go to a temporary name and are renamed into place.
A save of several objects is made atomic by writing its record last (``_cluster``): the
record names the objects it holds, and a reader follows the record only.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import ConfigError, ImageError
from ..runtime_wasm.internal import private_dir

__all__ = ["Storage"]

_SAFE = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")


class Storage:
    """A storage URI as get/put/delete/list of keys (picklable: it crosses to Ray actors as
    its URI and options and reopens its filesystem there)."""

    def __init__(self, uri: str, options: dict[str, Any] | None = None) -> None:
        try:
            import fsspec
        except ImportError as exc:  # pragma: no cover - installed with memex[cluster]
            raise ConfigError("a storage URI needs fsspec: pip install 'memex[cluster]'") from exc
        self.uri, self.options = uri, dict(options or {})
        try:
            fs, root = fsspec.core.url_to_fs(uri, **self.options)
        except (ImportError, ValueError) as exc:
            raise ConfigError(f"storage {uri!r}: {exc}") from exc
        self._fs, self._root = fs, root.rstrip("/")
        self._local = "file" in (fs.protocol if isinstance(fs.protocol, tuple)
                                 else (fs.protocol,))
        if self._local:  # a folder only its owner may enter: it holds sessions' state
            private_dir(Path(self._root))

    def __reduce__(self) -> tuple[Any, ...]:
        return (Storage, (self.uri, self.options))

    def __repr__(self) -> str:
        return f"<Storage {self.uri}>"

    def _path(self, key: str) -> str:
        if not _SAFE.match(key) or any(part in (".", "..") for part in key.split("/")):
            raise ConfigError(f"not a storage key: {key!r}")
        return f"{self._root}/{key}"

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        if self._local:  # 0600 in 0700 folders, whatever the umask
            parent = path.rsplit("/", 1)[0]
            private_dir(Path(parent))
            tmp = f"{parent}/.tmp-{secrets.token_hex(8)}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                with open(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise
        else:
            self._fs.pipe_file(path, bytes(data))

    def get(self, key: str, max_bytes: int) -> bytes | None:
        """The object's bytes, None when there is none; ImageError past ``max_bytes`` (its
        size is asked first, and the read is bounded too)."""
        path = self._path(key)
        try:
            size = self._fs.size(path)
        except FileNotFoundError:
            return None
        if size is not None and size > max_bytes:
            raise ImageError(f"{key}: {size} bytes, more than {max_bytes}")
        try:
            with self._fs.open(path, "rb") as f:
                data: bytes = f.read(max_bytes + 1)
        except FileNotFoundError:
            return None
        if len(data) > max_bytes:
            raise ImageError(f"{key}: more than {max_bytes} bytes")
        return data

    def delete(self, key: str) -> None:
        """The object, or every object under the key as a folder; nothing if absent."""
        path = self._path(key)
        with contextlib.suppress(FileNotFoundError):
            self._fs.rm(path, recursive=True)
        self._fs.invalidate_cache()

    def children(self, key: str = "") -> Iterator[str]:
        """The names one level under ``key`` (folders and objects), sorted."""
        path = self._path(key) if key else self._root
        self._fs.invalidate_cache()
        try:
            found = self._fs.ls(path, detail=False)
        except FileNotFoundError:
            return
        for p in sorted(found):
            name = str(p).rstrip("/").rsplit("/", 1)[-1]
            if _SAFE.match(name) and not name.startswith(".tmp-"):
                yield name
