"""Warm images: a guest bootstrapped and with some modules already imported, built once per
machine (``memex prepare`` builds the plain one) and kept in the cache as a raw image file
that every process maps copy-on-write: ``Sandbox(preload=[...])`` costs a mapping instead of
the imports (pandas alone takes ~1.3 s to import in the guest), and the first sandbox of a
process costs no bootstrap. Processes of one machine share the file's pages.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from pathlib import Path
from typing import overload

from ..errors import GuestStartError, ImageError
from ._cache import cache_dir, file_lock
from ._engine import LoadedModule
from ._files import GUEST_BUNDLE, GUEST_LIB, bootstrap_source, bundle_dir, driver_source
from ._image import MemoryImage
from ._imagefile import open_raw_image, write_raw_image
from ._instance import Instance, InstanceSpec

__all__ = ["precompile_bundle", "warm_image", "warm_image_named"]

_IMAGES: dict[str, MemoryImage] = {}
_LOCK = threading.Lock()


def _key(loaded: LoadedModule, spec: InstanceSpec, preload: tuple[str, ...]) -> str:
    parts = [
        loaded.flavour,
        loaded.artifacts.snapshot_sha256,
        repr(tuple(g for _, g, _ in spec.preopens)),
        repr(spec.env),
        repr(preload),
        hashlib.sha256(driver_source().encode()).hexdigest(),
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
        _IMAGES[key] = img
        return img


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
                _IMAGES[key] = img
    return img if img is not None and img.origin == name else None


def _open(path: Path, sha: str) -> MemoryImage | None:
    if not path.is_file():
        return None
    try:
        return open_raw_image(path, sha)
    except ImageError:
        return None  # damaged or from another MemEx: built again


def _build(loaded: LoadedModule, spec: InstanceSpec, preload: tuple[str, ...]) -> MemoryImage:
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
