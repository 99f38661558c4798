"""Decoders for bytes from outside the host process, bounded in what they cost before they
allocate it: a guest's door frames, a worker's frames, checkpoint blobs and image files.

A byte cap alone is not a cost cap. One byte of msgpack (``0x90``) is an empty list, ~72
bytes of host memory and one more object for the cyclic collector to walk: a 16 MiB frame of
them cost ~1.2 GB and seconds of a parse that holds the GIL. A zlib stream expands ~1000-fold.
So every decoder here takes a :class:`DecodeCost` and stops as soon as the input would pass it:

* :func:`unpack_bounded` counts containers (arrays and maps, through msgpack's hooks, which its C
  unpacker calls as each one completes), the items they hold and the bytes ext payloads copy;
  msgpack itself refuses any single array, map, string or payload longer than the cost allows
  before allocating it, and nesting past its own 1,024-level stack.
* :func:`inflate` decompresses zlib into at most ``limit`` bytes.
* :func:`json_loads` bounds a JSON document by size and by an upper bound on its containers
  (its ``[`` and ``{`` bytes, counted at C speed before parsing).

One :class:`DecodeCost` may be shared by several decodes of one input (a door frame, then the ext
payloads inside it): what each spends is taken from the same budget.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

__all__ = ["DecodeCost", "DecodeLimit", "inflate", "json_loads", "unpack_bounded"]


class DecodeLimit(ValueError):
    """The input would cost more than its :class:`DecodeCost` allows (refused, nothing kept)."""


class DecodeCost:
    """What decoding one input may still allocate: ``containers`` (arrays and maps),
    ``items`` (the values they hold, keys and values counted apart) and ``ext_bytes`` (the
    bytes ext payloads copy). Each decode takes from it; :class:`DecodeLimit` past any."""

    __slots__ = ("containers", "ext_bytes", "items")

    def __init__(self, *, containers: int, items: int, ext_bytes: int) -> None:
        self.containers = containers
        self.items = items
        self.ext_bytes = ext_bytes

    @classmethod
    def for_bytes(cls, max_bytes: int) -> DecodeCost:
        """The budget of an input of at most ``max_bytes``: what a real message of that size
        holds, not what its bytes could spell. Worst case, a 16 MiB door frame decodes to
        ~40 MiB of host objects in ~20 ms (bench/runtime.py's door rows)."""
        return cls(containers=max(1024, max_bytes // 256), items=max(16384, max_bytes // 32),
                   ext_bytes=2 * max_bytes)

    def __repr__(self) -> str:
        return (f"DecodeCost(containers={self.containers}, items={self.items}, "
                f"ext_bytes={self.ext_bytes})")


def _msgpack() -> Any:
    import msgpack

    return msgpack


def unpack_bounded(data: bytes | bytearray | memoryview, cost: DecodeCost) -> Any:
    """``msgpack.unpackb(data, raw=False, strict_map_key=False)`` that spends at most
    ``cost``. Raises :class:`DecodeLimit` past it and ``ValueError`` for bytes that are not
    one msgpack value (so a caller catches one type)."""
    msgpack = _msgpack()
    n = len(data)
    # No single container can hold more than the items left or the bytes there are.
    most = max(0, min(cost.items, n))

    def on_list(v: list[Any]) -> list[Any]:
        cost.containers -= 1
        cost.items -= len(v)
        if cost.containers < 0 or cost.items < 0:
            raise DecodeLimit("too many values")
        return v

    def on_map(v: dict[Any, Any]) -> dict[Any, Any]:
        cost.containers -= 1
        cost.items -= 2 * len(v)
        if cost.containers < 0 or cost.items < 0:
            raise DecodeLimit("too many values")
        return v

    def on_ext(code: int, payload: bytes) -> Any:
        cost.ext_bytes -= len(payload)
        if cost.ext_bytes < 0:
            raise DecodeLimit("ext payloads too large")
        return msgpack.ExtType(code, payload)

    try:
        return msgpack.unpackb(
            data, raw=False, strict_map_key=False, list_hook=on_list,
            object_hook=on_map, ext_hook=on_ext, max_array_len=most,
            max_map_len=most // 2, max_str_len=n, max_bin_len=n,
            max_ext_len=min(n, max(0, cost.ext_bytes)))
    except DecodeLimit:
        raise
    except ValueError as exc:
        if "exceeds max_" in str(exc):
            raise DecodeLimit(f"a container or payload too large: {exc}") from None
        raise ValueError(f"malformed msgpack: {exc}") from None
    except (MemoryError, RecursionError) as exc:
        raise DecodeLimit(f"too costly to decode ({type(exc).__name__})") from None
    except Exception as exc:  # ExtraData, StackError, FormatError, OutOfData, TypeError...
        raise ValueError(f"malformed msgpack: {type(exc).__name__}") from None


def inflate(data: bytes | bytearray | memoryview, limit: int) -> bytes:
    """The zlib stream ``data`` decompressed, refused (:class:`DecodeLimit`) once it would
    pass ``limit`` bytes; ``ValueError`` for a stream that is cut, corrupt or followed by
    other bytes."""
    d = zlib.decompressobj()
    try:
        out = d.decompress(data, limit)
    except zlib.error as exc:
        raise ValueError(f"corrupt zlib stream: {exc}") from None
    if d.unconsumed_tail:
        raise DecodeLimit(f"a zlib stream expands past {limit} bytes")
    if not d.eof:
        raise ValueError("cut zlib stream")
    if d.unused_data:
        raise ValueError("bytes after a zlib stream")
    return out


def json_loads(data: bytes | str, *, max_bytes: int, max_containers: int) -> Any:
    """``json.loads`` for at most ``max_bytes`` and at most ``max_containers`` arrays and
    objects (bounded before parsing by counting the bytes that open one, strings included);
    :class:`DecodeLimit` past either, ``ValueError`` for what is not JSON."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if len(raw) > max_bytes:
        raise DecodeLimit(f"a JSON document of {len(raw)} bytes (at most {max_bytes})")
    if raw.count(b"[") + raw.count(b"{") > max_containers:
        raise DecodeLimit(f"a JSON document with more than {max_containers} containers")
    try:
        return json.loads(raw)
    except RecursionError:
        raise DecodeLimit("a JSON document nested too deep") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
