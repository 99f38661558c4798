"""LZ4 block compression straight between guest-memory images and file bytes.

``lz4.block`` takes and returns Python ``bytes``: a save would copy every megabyte out of the
image before compressing it, and a load would build each megabyte as ``bytes`` and copy it
again into the image. The ``lz4`` wheel's extension exports the LZ4 C API itself, so these
functions call ``LZ4_compress_default`` on the mapped image and ``LZ4_decompress_safe`` into
it: one pass over the memory, with the GIL released, so megabytes go through in parallel on
every core. The output is the same LZ4 block format; where the symbols cannot be found (an
``lz4`` built otherwise), the ``lz4.block`` functions do the same work with the copies.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

import lz4.block
from lz4.block import _block

__all__ = ["PARALLEL_MIN", "compress_at", "decompress_into", "parallel_map"]

T = TypeVar("T")
R = TypeVar("R")

PARALLEL_MIN = 8 << 20  # below this much work, a thread costs more than it saves


def _bind() -> tuple[Callable[..., int], Callable[..., int]] | None:
    try:
        lib = ctypes.CDLL(_block.__file__)
        comp, decomp = lib.LZ4_compress_default, lib.LZ4_decompress_safe
    except (OSError, AttributeError):
        return None
    for fn in (comp, decomp):
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        fn.restype = ctypes.c_int
    return comp, decomp


_C = _bind()


def compress_at(addr: int, n: int) -> bytes:
    """The LZ4 block of the ``n`` bytes of memory at ``addr`` (as ``lz4.block.compress``
    with ``store_size=False`` makes it)."""
    if _C is None:
        packed: bytes = lz4.block.compress(ctypes.string_at(addr, n), store_size=False)
        return packed
    bound = n + n // 255 + 16
    out = ctypes.create_string_buffer(bound)
    k = _C[0](addr, out, n, bound)
    if k <= 0:
        raise ValueError(f"LZ4 could not compress {n} bytes")
    return out.raw[:k]


def decompress_into(src: bytes | memoryview, addr: int, n: int) -> None:
    """Decompress the LZ4 block ``src`` into the ``n`` bytes at ``addr``; ``ValueError``
    unless it decodes to exactly ``n`` bytes."""
    if _C is None:
        try:
            data = lz4.block.decompress(src, uncompressed_size=n)
        except lz4.block.LZ4BlockError as exc:
            raise ValueError(str(exc)) from exc
        if len(data) != n:
            raise ValueError(f"decodes to {len(data)} bytes, not {n}")
        ctypes.memmove(addr, data, n)
        return
    buf = src if isinstance(src, bytes) else bytes(src)
    got = _C[1](buf, addr, len(buf), n)
    if got != n:
        raise ValueError("not a valid LZ4 block" if got < 0 else
                         f"decodes to {got} bytes, not {n}")


def parallel_map(fn: Callable[[T], R], items: Sequence[T], work: int) -> list[R]:
    """``[fn(x) for x in items]``, on every core when ``work`` (bytes) is worth it. The items
    are dealt out in turn, so each thread gets some of every part of the memory; the first
    exception (in item order) is raised once all threads have stopped."""
    threads = min(os.cpu_count() or 1, 8, len(items))
    if threads < 2 or work < PARALLEL_MIN:
        return [fn(x) for x in items]
    out: list[R | None] = [None] * len(items)
    errors: list[tuple[int, BaseException]] = []

    def part(t: int) -> None:
        for i in range(t, len(items), threads):
            try:
                out[i] = fn(items[i])
            except BaseException as exc:  # re-raised below, first in item order
                errors.append((i, exc))
                return

    workers = [threading.Thread(target=part, args=(t,), daemon=True,
                                name="memex-lz4") for t in range(1, threads)]
    for w in workers:
        w.start()
    part(0)
    for w in workers:
        w.join()
    if errors:
        raise min(errors, key=lambda e: e[0])[1]
    return out  # type: ignore[return-value]
