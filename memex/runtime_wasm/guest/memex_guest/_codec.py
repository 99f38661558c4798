# Runs inside the guest. Imports nothing from the host packages.
"""A fast msgpack codec for door frames (the pure-Python msgpack costs ~150 us per call in
the guest), with the typed values of docs/abi.md Layer 2 (msgpack ext types 1-8).

Encoding is byte-identical to ``msgpack.packb(obj, use_bin_type=True)`` for
dict/list/tuple/str/bytes/int/float/bool/None. Values of other types go through
``memex_guest.codec`` (imported on first use): numpy arrays, DataFrames, datetimes... become
ext types; a ``typed`` encoding also sends tuples as ext 7 (a plain door frame keeps sending
them as arrays, as it always did). Anything this module does not handle falls back to the
msgpack package with the same hooks (``default=`` / ``ext_hook=``).

Decoding returns what ``msgpack.unpackb(data, raw=False, strict_map_key=False,
ext_hook=...)`` does, with ext types 1-8 built into typed values.
"""

import struct as _struct

_pack_d = _struct.Struct(">Bd").pack
_u8 = _struct.Struct(">BB").pack
_u16 = _struct.Struct(">BH").pack
_u32 = _struct.Struct(">BI").pack
_u64 = _struct.Struct(">BQ").pack
_i8 = _struct.Struct(">Bb").pack
_i16 = _struct.Struct(">Bh").pack
_i32 = _struct.Struct(">Bi").pack
_i64 = _struct.Struct(">Bq").pack
_ext_hdr8 = _struct.Struct(">BBb").pack
_ext_hdr16 = _struct.Struct(">BHb").pack
_ext_hdr32 = _struct.Struct(">BIb").pack
_FIXEXT = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}
_BYTE = [bytes((i,)) for i in range(256)]  # one-byte values: fixints and fix headers


class _Fallback(Exception):
    pass


class Raw:
    """Bytes that are already one encoded msgpack value (spliced into a frame verbatim)."""

    __slots__ = ("data",)

    def __init__(self, data):
        self.data = data


_typed_mod = []  # [memex_guest._typed] once loaded (numpy/pandas-aware, imported on need)


def _typed():
    if not _typed_mod:
        from . import _typed as typed

        _typed_mod.append(typed)
    return _typed_mod[0]


def msgpack_default(typed):
    """A ``default=`` hook for msgpack.packb, consistent with the fast encoder."""
    import msgpack

    def default(obj):
        if isinstance(obj, Raw):
            return unpackb(obj.data)
        code, payload = _typed().convert(obj, typed)
        if code is None:
            return payload
        return msgpack.ExtType(code, packb(payload, True))

    return default


def ext_hook(code, data):
    """An ``ext_hook=`` for msgpack.unpackb: ext types 1-8 become typed values."""
    if 1 <= code <= 8:
        return _typed().from_ext(code, unpackb(data))
    import msgpack

    return msgpack.ExtType(code, data)


def ext_bytes(code, data):
    """The msgpack encoding of ExtType(code, data) (same bytes as the msgpack package)."""
    n = len(data)
    head = _FIXEXT.get(n)
    if head is not None:
        return bytes((head, code & 0xFF)) + data
    if n < 256:
        return _ext_hdr8(0xC7, n, code) + data
    if n < 65536:
        return _ext_hdr16(0xC8, n, code) + data
    return _ext_hdr32(0xC9, n, code) + data


def _enc(obj, out, typed):
    t = type(obj)
    if t is str:
        b = obj.encode("utf-8")
        n = len(b)
        if n < 32:
            out.append(_BYTE[0xA0 | n])
        elif n < 256:
            out.append(bytes((0xD9, n)))
        elif n < 65536:
            out.append(_u16(0xDA, n))
        elif n < 2**32:
            out.append(_u32(0xDB, n))
        else:
            raise _Fallback
        out.append(b)
    elif t is int:
        if obj >= 0:
            if obj < 128:
                out.append(_BYTE[obj])
            elif obj < 256:
                out.append(bytes((0xCC, obj)))
            elif obj < 65536:
                out.append(_u16(0xCD, obj))
            elif obj < 2**32:
                out.append(_u32(0xCE, obj))
            elif obj < 2**64:
                out.append(_u64(0xCF, obj))
            else:
                raise _Fallback  # msgpack decides (OverflowError)
        elif obj >= -32:
            out.append(_BYTE[obj & 0xFF])
        elif obj >= -0x80:
            out.append(_i8(0xD0, obj))
        elif obj >= -0x8000:
            out.append(_i16(0xD1, obj))
        elif obj >= -0x80000000:
            out.append(_i32(0xD2, obj))
        elif obj >= -0x8000000000000000:
            out.append(_i64(0xD3, obj))
        else:
            raise _Fallback
    elif obj is None:
        out.append(b"\xc0")
    elif obj is True:
        out.append(b"\xc3")
    elif obj is False:
        out.append(b"\xc2")
    elif t is float:
        out.append(_pack_d(0xCB, obj))
    elif t is dict:
        n = len(obj)
        if n < 16:
            out.append(_BYTE[0x80 | n])
        elif n < 65536:
            out.append(_u16(0xDE, n))
        else:
            out.append(_u32(0xDF, n))
        for k, v in obj.items():
            _enc(k, out, typed)
            _enc(v, out, typed)
    elif t is list or (t is tuple and not typed):
        n = len(obj)
        if n < 16:
            out.append(_BYTE[0x90 | n])
        elif n < 65536:
            out.append(_u16(0xDC, n))
        else:
            out.append(_u32(0xDD, n))
        for v in obj:
            _enc(v, out, typed)
    elif t is bytes or t is bytearray:
        n = len(obj)
        if n < 256:
            out.append(bytes((0xC4, n)))
        elif n < 65536:
            out.append(_u16(0xC5, n))
        elif n < 2**32:
            out.append(_u32(0xC6, n))
        else:
            raise _Fallback
        out.append(bytes(obj))
    elif t is Raw:
        out.append(obj.data)
    else:
        code, payload = _typed().convert(obj, typed)
        if code is None:  # a plain stand-in (a Record's dict, an enum's value, ...)
            _enc(payload, out, typed)
        else:
            inner = []
            _enc(payload, inner, True)
            out.append(ext_bytes(code, b"".join(inner)))


def packb(obj, typed=False):
    """Encode ``obj``. ``typed=True`` is the tool-call encoding (tuples as ext 7)."""
    out = []
    try:
        _enc(obj, out, typed)
    except (_Fallback, RecursionError):
        import msgpack

        return msgpack.packb(obj, use_bin_type=True, strict_types=typed,
                             default=msgpack_default(typed))
    return b"".join(out)


def pack_request(rid, op, args, kwargs, typed=False):
    """The door request frame {"v": 1, "id", "op", "args", "kwargs"}: the same bytes as
    packb() of that map, with its constant keys written once."""
    out = [b"\x85\xa1v\x01\xa2id"]
    try:
        _enc(rid, out, typed)
        out.append(b"\xa2op")
        _enc(op, out, typed)
        out.append(b"\xa4args")
        _enc(args, out, typed)
        out.append(b"\xa6kwargs")
        _enc(kwargs, out, typed)
    except (_Fallback, RecursionError):
        return packb({"v": 1, "id": rid, "op": op, "args": args, "kwargs": kwargs}, typed)
    return b"".join(out)


_STRS = {}  # str -> its encoding, for tool names and argument names (bounded)
_REQ_HEAD = b"\x85\xa1v\x01\xa2id"
_CALL_MID = b"\xa2op\xaatools.call\xa4args\x92"
_CALL_END = b"\xa6kwargs\x80"


def _str_bytes(s):
    b = _STRS.get(s)
    if b is None:
        out = []
        _enc(s, out, False)
        b = b"".join(out)
        if len(s) <= 64 and len(_STRS) < 4096:
            _STRS[s] = b
    return b


def pack_arguments(arguments, skip):
    """The typed encoding of a tool call's arguments (a dict), leaving out values that are
    ``skip``: the same bytes as ``packb({k: v ... if v is not skip}, True)``. A key that is
    not a str raises TypeError."""
    out = [b""]
    n = 0
    try:
        for k, v in arguments.items():
            if v is skip:
                continue
            if type(k) is not str:
                raise TypeError("tool argument names must be str, not %r" % (k,))
            out.append(_STRS.get(k) or _str_bytes(k))
            if type(v) is int and 0 <= v < 128:
                out.append(_BYTE[v])
            else:
                _enc(v, out, True)
            n += 1
    except (_Fallback, RecursionError):
        return packb({k: v for k, v in arguments.items() if v is not skip}, True)
    out[0] = _BYTE[0x80 | n] if n < 16 else _u16(0xDE, n) if n < 65536 else _u32(0xDF, n)
    return b"".join(out)


def pack_tool_call(rid, name, raw):
    """The ``tools.call`` request frame for the tool ``name`` with arguments already
    encoded (``raw``): the same bytes as ``pack_request(rid, "tools.call", [name,
    Raw(raw)], {}, True)``."""
    if 0 <= rid < 128:
        head = _BYTE[rid]
    elif 128 <= rid < 65536:
        head = _u8(0xCC, rid) if rid < 256 else _u16(0xCD, rid)
    else:
        parts = []
        _enc(rid, parts, False)
        head = b"".join(parts)
    return b"".join((_REQ_HEAD, head, _CALL_MID, _STRS.get(name) or _str_bytes(name), raw,
                     _CALL_END))


_unpack_from = _struct.unpack_from


def _ext(code, b, start, end):
    if 1 <= code <= 8:
        payload, j = _dec(b, start)
        if j != end:
            raise ValueError("ext %d: payload length mismatch" % code)
        return _typed().from_ext(code, payload)
    import msgpack

    data = bytes(b[start:end])
    if code == -1:
        return msgpack.Timestamp.from_bytes(data)
    return msgpack.ExtType(code, data)


def _dec(b, i):
    c = b[i]
    if c < 0x80:
        return c, i + 1
    if c >= 0xE0:
        return c - 0x100, i + 1
    if 0xA0 <= c < 0xC0:
        n = c & 0x1F
        return b[i + 1 : i + 1 + n].decode("utf-8"), i + 1 + n
    if 0x80 <= c < 0x90:
        return _map(b, i + 1, c & 0x0F)
    if 0x90 <= c < 0xA0:
        return _arr(b, i + 1, c & 0x0F)
    if c == 0xC0:
        return None, i + 1
    if c == 0xC2:
        return False, i + 1
    if c == 0xC3:
        return True, i + 1
    if c == 0xCC:
        return b[i + 1], i + 2
    if c == 0xCD:
        return _unpack_from(">H", b, i + 1)[0], i + 3
    if c == 0xCE:
        return _unpack_from(">I", b, i + 1)[0], i + 5
    if c == 0xCF:
        return _unpack_from(">Q", b, i + 1)[0], i + 9
    if c == 0xD0:
        return _unpack_from(">b", b, i + 1)[0], i + 2
    if c == 0xD1:
        return _unpack_from(">h", b, i + 1)[0], i + 3
    if c == 0xD2:
        return _unpack_from(">i", b, i + 1)[0], i + 5
    if c == 0xD3:
        return _unpack_from(">q", b, i + 1)[0], i + 9
    if c == 0xCB:
        return _unpack_from(">d", b, i + 1)[0], i + 9
    if c == 0xCA:
        return _unpack_from(">f", b, i + 1)[0], i + 5
    if c == 0xD9:
        n = b[i + 1]
        return b[i + 2 : i + 2 + n].decode("utf-8"), i + 2 + n
    if c == 0xDA:
        n = _unpack_from(">H", b, i + 1)[0]
        return b[i + 3 : i + 3 + n].decode("utf-8"), i + 3 + n
    if c == 0xDB:
        n = _unpack_from(">I", b, i + 1)[0]
        return b[i + 5 : i + 5 + n].decode("utf-8"), i + 5 + n
    if c == 0xC4:
        n = b[i + 1]
        return b[i + 2 : i + 2 + n], i + 2 + n
    if c == 0xC5:
        n = _unpack_from(">H", b, i + 1)[0]
        return b[i + 3 : i + 3 + n], i + 3 + n
    if c == 0xC6:
        n = _unpack_from(">I", b, i + 1)[0]
        return b[i + 5 : i + 5 + n], i + 5 + n
    if c == 0xDC:
        return _arr(b, i + 3, _unpack_from(">H", b, i + 1)[0])
    if c == 0xDD:
        return _arr(b, i + 5, _unpack_from(">I", b, i + 1)[0])
    if c == 0xDE:
        return _map(b, i + 3, _unpack_from(">H", b, i + 1)[0])
    if c == 0xDF:
        return _map(b, i + 5, _unpack_from(">I", b, i + 1)[0])
    if 0xD4 <= c <= 0xD8:
        n = 1 << (c - 0xD4)
        start = i + 2
        return _ext(_unpack_from(">b", b, i + 1)[0], b, start, start + n), start + n
    if c == 0xC7:
        n, code = _unpack_from(">Bb", b, i + 1)
        start = i + 3
    elif c == 0xC8:
        n, code = _unpack_from(">Hb", b, i + 1)
        start = i + 4
    elif c == 0xC9:
        n, code = _unpack_from(">Ib", b, i + 1)
        start = i + 6
    else:
        raise _Fallback  # 0xC1 (never used): the package reports it
    if start + n > len(b):
        raise _Fallback
    return _ext(code, b, start, start + n), start + n


def _map(b, i, n):
    d = {}
    for _ in range(n):
        k, i = _dec(b, i)
        v, i = _dec(b, i)
        d[k] = v
    return d, i


def _arr(b, i, n):
    items = []
    for _ in range(n):
        v, i = _dec(b, i)
        items.append(v)
    return items, i


_REPLY_HEAD = b"\x84\xa1v\x01\xa2id"
_REPLY_OK = b"\xa2ok\xc3\xa5value"
_NO_VALUE = object()


def unpack_ok_value(b):
    """The value of a reply frame {"v": 1, "id", "ok": true, "value"} laid out in that order
    (as the host writes it), else _NO_VALUE (decode the whole frame instead)."""
    if not b.startswith(_REPLY_HEAD):
        return _NO_VALUE
    try:
        _, i = _dec(b, 7)
        if b[i : i + 10] != _REPLY_OK:
            return _NO_VALUE
        v, i = _dec(b, i + 10)
        if i == len(b):
            return v
    except (_Fallback, IndexError, UnicodeDecodeError, RecursionError, _struct.error):
        pass
    return _NO_VALUE


def unpackb(b):
    """Decode one msgpack document (ext types 1-8 become typed values)."""
    try:
        v, i = _dec(b, 0)
        if i == len(b):
            return v
    except (_Fallback, IndexError, UnicodeDecodeError, RecursionError, _struct.error):
        pass
    import msgpack

    return msgpack.unpackb(b, raw=False, strict_map_key=False, ext_hook=ext_hook)
