# Runs inside the guest. Imports nothing from the host packages.
"""A fast msgpack subset for door frames (the pure-Python msgpack costs ~150 us per call in
the guest). Byte-identical to msgpack.packb(obj, use_bin_type=True) for dict/list/tuple/str/
bytes/int/float/bool/None; anything else (ext types, big containers) falls back to msgpack."""

# types; the decoder returns what msgpack.unpackb(data, raw=False, strict_map_key=False) does.
import struct as _struct

_pack_d = _struct.Struct(">Bd").pack
_u16 = _struct.Struct(">BH").pack
_u32 = _struct.Struct(">BI").pack
_u64 = _struct.Struct(">BQ").pack
_i64 = _struct.Struct(">Bq").pack


class _Fallback(Exception):
    pass


def _enc(obj, out):
    t = type(obj)
    if t is str:
        b = obj.encode("utf-8")
        n = len(b)
        if n < 32:
            out.append(bytes((0xA0 | n,)))
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
        if 0 <= obj < 128:
            out.append(bytes((obj,)))
        elif -32 <= obj < 0:
            out.append(bytes((obj & 0xFF,)))
        elif 0 <= obj < 2**64:
            if obj < 256:
                out.append(bytes((0xCC, obj)))
            elif obj < 65536:
                out.append(_u16(0xCD, obj))
            elif obj < 2**32:
                out.append(_u32(0xCE, obj))
            else:
                out.append(_u64(0xCF, obj))
        else:
            raise _Fallback  # msgpack's own rules for other negatives/big ints
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
            out.append(bytes((0x80 | n,)))
        elif n < 65536:
            out.append(_u16(0xDE, n))
        else:
            out.append(_u32(0xDF, n))
        for k, v in obj.items():
            _enc(k, out)
            _enc(v, out)
    elif t is list or t is tuple:
        n = len(obj)
        if n < 16:
            out.append(bytes((0x90 | n,)))
        elif n < 65536:
            out.append(_u16(0xDC, n))
        else:
            out.append(_u32(0xDD, n))
        for v in obj:
            _enc(v, out)
    elif t is bytes or t is bytearray:
        n = len(obj)
        if n < 256:
            out.append(bytes((0xC4, n)))
        elif n < 65536:
            out.append(_u16(0xC5, n))
        else:
            out.append(_u32(0xC6, n))
        out.append(bytes(obj))
    else:
        raise _Fallback


def packb(obj):
    out = []
    try:
        _enc(obj, out)
    except (_Fallback, RecursionError):
        import msgpack
        return msgpack.packb(obj, use_bin_type=True)
    return b"".join(out)


_unpack_from = _struct.unpack_from


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
        d = {}
        i += 1
        for _ in range(c & 0x0F):
            k, i = _dec(b, i)
            v, i = _dec(b, i)
            d[k] = v
        return d, i
    if 0x90 <= c < 0xA0:
        items = []
        i += 1
        for _ in range(c & 0x0F):
            v, i = _dec(b, i)
            items.append(v)
        return items, i
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
    raise _Fallback  # ext types, float32, big maps/arrays: the package decides


def unpackb(b):
    try:
        v, i = _dec(b, 0)
        if i == len(b):
            return v
    except (_Fallback, IndexError, UnicodeDecodeError, RecursionError, _struct.error):
        pass
    import msgpack
    return msgpack.unpackb(b, raw=False, strict_map_key=False)
