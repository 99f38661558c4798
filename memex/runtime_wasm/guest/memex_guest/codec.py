# Runs inside the guest. Imports nothing from the host packages.
"""Typed values across the door: the msgpack ext types of docs/abi.md, Layer 2.

| code | value                       | payload                                   |
|------|-----------------------------|-------------------------------------------|
| 1    | numpy.ndarray               | [dtype.str, shape, C-order bytes]         |
| 2    | pandas.DataFrame            | {"columns": [col], "index": col, "names"} |
| 3    | pandas.Series               | {"name", "values": col, "index": col}     |
| 4    | datetime/date/time/timedelta| [kind, isoformat (timedelta: seconds)]    |
| 5    | record                      | [type_name, {field: value}]               |
| 6    | decimal.Decimal             | str                                       |
| 7    | tuple                       | array                                     |
| 8    | set / frozenset             | [kind, array]                             |

numpy and pandas are imported only when such a value is seen (pandas costs ~1.3 s).

``encode(value)`` / ``decode(data)`` are the typed codec. The conversions live in ``_typed``
(which imports only ``_records``) and the wire format in ``_codec``, which loads ``_typed`` on
need: no import cycle. ``msgpack_default`` / ``ext_hook`` are the same hooks in the shape
the msgpack package wants.
"""

from . import _codec
from ._codec import ext_hook, msgpack_default
from ._typed import DecodeError, convert, from_ext

__all__ = ["DecodeError", "convert", "decode", "encode", "ext_hook", "from_ext",
           "msgpack_default"]


def encode(value):
    """The typed msgpack encoding of ``value`` (what a tool argument becomes)."""
    return _codec.packb(value, True)


def decode(data):
    """Decode a msgpack document, building typed values from ext types 1-8."""
    return _codec.unpackb(data)
