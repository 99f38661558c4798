"""Warm images: a guest bootstrapped and with some modules already imported, built once per
machine (``memex prepare`` builds the plain one) and kept in the cache as a raw image file
that every process maps copy-on-write: ``Sandbox(preload=[...])`` costs a mapping instead of
the imports (pandas alone takes ~1.3 s to import in the guest), and the first sandbox of a
process costs no bootstrap. Processes of one machine share the file's pages.

An image is shared by every sandbox whose key matches, so it must hold nothing of any one
sandbox: it is built in a guest whose /tmp and mounts are empty folders at the same guest
paths (what an import would read from a tenant's folder, such as a ``matplotlibrc`` under an
``MPLCONFIGDIR`` on a mount, never reaches another tenant: preloaded modules see empty
folders there), with the runtime's base environment (a sandbox sets its own values after the
image is mapped: sessions that differ in one value share one image), and its key is
everything else an import can read: the guest binary, the engine flavour, the guest paths,
that environment, the preload list and the driver.

The images live in ``<cache>/warm`` (``MEMEX_CACHE_DIR``, else ``$XDG_CACHE_HOME/memex``, else
``~/.cache/memex``), at most ``MEMEX_WARM_CACHE_BYTES`` of disk together (default 2 GiB):
building one past that removes the least recently used first. A process that has an image
mapped keeps it; a save made on top of a removed image loads again only where that image
still exists (``Sandbox.save(portable=True)`` does not depend on one).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import re
import tempfile
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import overload

from ..errors import GuestStartError, ImageError
from ._instance import Instance, InstanceSpec
from .engine._cache import cache_bytes, cache_dir, file_lock
from .engine._engine import LoadedModule
from .engine._files import (
    GUEST_BUNDLE,
    GUEST_LIB,
    GUEST_PACKAGES,
    bootstrap_source,
    bundle_dir,
    driver_sha256,
)
from .files import _tree
from .images._image import MemoryImage
from .images._imagefile import open_raw_image, write_raw_image

__all__ = ["CACHE_BYTES_ENV", "cache_bound", "precompile_bundle", "warm_image",
           "warm_image_named"]

CACHE_BYTES_ENV = "MEMEX_WARM_CACHE_BYTES"
DEFAULT_CACHE_BYTES = 2 << 30
_KEEP_OPEN = 64  # images a process keeps open for reuse (sandboxes hold their own)
_BUILD_MEMORY = 4 << 30  # a wasm32 memory's most: what a preload needs, whoever asks

_IMAGES: OrderedDict[str, MemoryImage] = OrderedDict()
_LOCK = threading.Lock()


def cache_bound() -> int:
    """Bytes of disk the warm images may take together (``MEMEX_WARM_CACHE_BYTES``)."""
    return cache_bytes(CACHE_BYTES_ENV, DEFAULT_CACHE_BYTES)


def _remember(key: str, img: MemoryImage) -> MemoryImage:
    _IMAGES[key] = img
    _IMAGES.move_to_end(key)
    while len(_IMAGES) > _KEEP_OPEN:
        _IMAGES.popitem(last=False)
    return img


def _used(path: Path) -> None:
    """Mark the image file as used now (its access time is the cache's LRU stamp; set by
    hand, so it holds on filesystems mounted noatime)."""
    with contextlib.suppress(OSError):
        st = path.stat()
        os.utime(path, ns=(time.time_ns(), st.st_mtime_ns))


def _evict(folder: Path, keep: Path) -> None:
    """Remove the least recently used images until the folder is within its bound."""
    bound = cache_bound()
    files = []
    for p in folder.glob("*.raw"):
        with contextlib.suppress(OSError):
            st = p.stat()
            files.append((st.st_atime_ns, st.st_blocks * 512, p))
    total = sum(size for _, size, _ in files)
    for _, size, p in sorted(files, key=lambda f: f[0]):
        if total <= bound:
            break
        if p == keep:
            continue
        with contextlib.suppress(OSError):
            p.unlink()
            total -= size
        with contextlib.suppress(OSError):
            p.with_suffix(".lock").unlink()


def _key(loaded: LoadedModule, spec: InstanceSpec, preload: tuple[str, ...]) -> str:
    parts = [
        loaded.flavour,
        loaded.artifacts.snapshot_sha256,
        repr(tuple(g for _, g, _ in spec.preopens)),
        repr(spec.env),
        repr(preload),
        driver_sha256(),
        str(bundle_dir()),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def _path(key: str) -> Path:
    return cache_dir() / "warm" / f"{key}.raw"


@overload
def warm_image(loaded: LoadedModule, spec: InstanceSpec, preload: tuple[str, ...]
               ) -> MemoryImage: ...


@overload
def warm_image(loaded: LoadedModule, spec: InstanceSpec, preload: tuple[str, ...], *,
               build: bool) -> MemoryImage | None: ...


def warm_image(loaded: LoadedModule, spec: InstanceSpec, preload: tuple[str, ...], *,
               build: bool = True) -> MemoryImage | None:
    """The shared (read-only) image of a bootstrapped guest that imported ``preload``; with
    ``build=False``, None when it would have to be built (not in this process, not on disk)."""
    key = _key(loaded, spec, preload)
    with _LOCK:
        img = _IMAGES.get(key)
        if img is not None:
            _IMAGES.move_to_end(key)
            return img
        path = _path(key)
        sha = loaded.artifacts.snapshot_sha256
        img = _open(path, sha)
        if img is None:
            if not build:
                return None
            with file_lock(path.with_suffix(".lock")):
                img = _open(path, sha)  # another process may have built it meanwhile
                if img is None:
                    built = _build(loaded, spec, preload)
                    try:
                        write_raw_image(path, built, sha, {"preload": list(preload)},
                                        name=key)
                    finally:
                        built.close()
                    img = open_raw_image(path, sha)
                    _evict(path.parent, keep=path)
        _used(path)
        return _remember(key, img)


def warm_image_named(name: str, sha: str) -> MemoryImage | None:
    """This machine's warm image called ``name`` (what a save on top of it recorded), or None
    when there is none or the one here has other contents."""
    key = name.split(":", 1)[0]
    if not re.fullmatch(r"[0-9a-f]{32}", key):
        return None
    with _LOCK:
        img = _IMAGES.get(key)
        if img is None:
            img = _open(_path(key), sha)
            if img is not None:
                _used(_path(key))
                _remember(key, img)
    return img if img is not None and img.origin == name else None


def _open(path: Path, sha: str) -> MemoryImage | None:
    if not path.is_file():
        return None
    try:
        return open_raw_image(path, sha)
    except ImageError:
        return None  # damaged or from another MemEx: built again


def _empty_places(spec: InstanceSpec, root: str) -> InstanceSpec:
    """``spec`` with every folder a sandbox brings (its /tmp, its mounts) replaced by an
    empty folder under ``root`` at the same guest path: what an image is built in (its
    packages stay: the image's key names their content)."""
    preopens = []
    for i, (host, guest, writable) in enumerate(spec.preopens):
        # kept: the runtime's own folders, and the packages (read-only, named by their
        # content in the image's key), so a preload may import them
        if guest not in (GUEST_LIB, GUEST_BUNDLE, GUEST_PACKAGES) and \
                not guest.startswith(GUEST_LIB + "/"):
            host = os.path.join(root, str(i))
            os.mkdir(host)
        preopens.append((host, guest, writable))
    # and under one memory limit, not the first sandbox's: the image is the same for all
    return dataclasses.replace(spec, preopens=tuple(preopens), memory_limit=_BUILD_MEMORY)


def _build(loaded: LoadedModule, spec: InstanceSpec, preload: tuple[str, ...]) -> MemoryImage:
    root = tempfile.mkdtemp(prefix="memex-warm-")
    try:
        return _build_in(loaded, _empty_places(spec, root), preload)
    finally:
        _tree.remove(root)


def _build_in(loaded: LoadedModule, spec: InstanceSpec, preload: tuple[str, ...]
              ) -> MemoryImage:
    inst = Instance(loaded, spec, lambda frame, deadline: b"")
    try:
        out = inst.run_raw(bootstrap_source(), deadline=time.monotonic() + 60, fuel=None, cell={})
        if out.trap or out.raw_rc:
            raise GuestStartError(f"guest bootstrap failed: {out.trap or inst.stderr.text()}")
        # The door's client is imported in every warm image: the first call then costs nothing.
        code = "import memex_guest.door, msgpack\n" + "".join(
            f"import {name}\n" for name in preload
        )
        out = inst.run_raw("__memex_turn__()", deadline=time.monotonic() + 300, fuel=None,
                           cell={"code": code, "filename": "<preload>"})
        rep = out.report or {}
        if out.trap or rep.get("status") != "ok":
            exc = rep.get("exception") or {}
            detail = out.trap or (exc.get("traceback") if isinstance(exc, dict) else "") or ""
            raise GuestStartError(f"preloading {', '.join(preload)} failed: {detail}")
        return MemoryImage.capture(inst)
    finally:
        inst.close()


def precompile_bundle(loaded: LoadedModule, bundle: Path, stdlib: Path) -> None:
    """Compile the guest bundle to the guest interpreter's bytecode (``__pycache__``), with the
    bundle mounted writable once; sandboxes later mount it read-only and import from .pyc."""
    spec = InstanceSpec(
        preopens=((str(stdlib), GUEST_LIB, False), (str(bundle), GUEST_BUNDLE, True)),
        env=(("HOME", "/memex"),),
        memory_limit=1 << 30,
    )
    inst = Instance(loaded, spec, lambda frame, deadline: b"")
    try:
        out = inst.run_raw(
            "import compileall\n"
            f"_ok = compileall.compile_dir({GUEST_BUNDLE + '/site'!r}, quiet=1)\n"
            "import sys\n"
            "if not _ok: sys.stderr.write('compileall failed')\n",
            deadline=time.monotonic() + 120,
            fuel=None,
            cell={},
        )
        if out.trap or out.raw_rc or inst.stderr.text():
            raise GuestStartError(
                f"precompiling the guest bundle failed: {out.trap or inst.stderr.text()}"
            )
    finally:
        inst.close()
