"""The host end of the typed-value codec (docs/abi.md, Layer 2): Python values to trees of
plain msgpack values and ``msgpack.ExtType`` leaves (which the door's ``msgpack.packb`` carries
as they are), and back.

numpy and pandas are imported only when such a value appears. Decoding never trusts the
peer: every payload is checked (types, sizes, nesting) and any defect is a
:class:`DecodeError` naming where it sits, never another exception.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import math
import pathlib
import sys
import uuid
from collections.abc import Mapping
from typing import Any

import msgpack

from ..errors import MemexError
from ..runtime_wasm.internal import DecodeCost, unpack_bounded

__all__ = [
    "EXT_DATAFRAME", "EXT_DATETIME", "EXT_DECIMAL", "EXT_NDARRAY", "EXT_RECORD", "EXT_SERIES",
    "EXT_SET", "EXT_TUPLE", "DecodeError", "EncodeError", "RecordFields", "TooDeep", "decode",
    "encode", "packb", "unpackb",
]

EXT_NDARRAY, EXT_DATAFRAME, EXT_SERIES, EXT_DATETIME = 1, 2, 3, 4
EXT_RECORD, EXT_DECIMAL, EXT_TUPLE, EXT_SET = 5, 6, 7, 8
_INT_MIN, _INT_MAX = -(1 << 63), (1 << 64) - 1
_NAT = -(1 << 63)
_UNITS = ("ns", "us", "ms", "s")
_PLAIN = (str, int, float, bool, bytes, type(None))


class EncodeError(MemexError):
    """A value that the ABI cannot carry."""


class DecodeError(MemexError):
    """A malformed typed value; ``path`` says where in the decoded tree."""

    def __init__(self, message: str, path: tuple[Any, ...] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.path = path


class TooDeep(DecodeError):
    """Nesting beyond the bound."""


class RecordFields(dict[str, Any]):
    """A decoded record (ext 5): its fields as a dict, plus the guest's ``type_name``.
    Validation turns it into the declared model/dataclass; sent back, it stays a record."""

    __slots__ = ("type_name",)

    def __init__(self, type_name: str, fields: Mapping[str, Any]) -> None:
        super().__init__(fields)
        self.type_name = type_name

    def __repr__(self) -> str:
        return f"{self.type_name}({', '.join(f'{k}={v!r}' for k, v in self.items())})"


def _pack(obj: object) -> bytes:
    data: bytes = msgpack.packb(obj, use_bin_type=True)
    return data


# ---- encode ---------------------------------------------------------------------------------
def encode(value: object, *, names: Mapping[type, str] | None = None, max_depth: int = 256) -> Any:
    """``value`` as plain msgpack values and ExtType leaves. ``names`` maps record classes
    (pydantic models, dataclasses) to the guest's class names (default: ``__name__``)."""
    return _Encoder(names or {}, max_depth).enc(value, 0)


def packb(value: object, **kwargs: Any) -> bytes:
    return _pack(encode(value, **kwargs))


class _Encoder:
    def __init__(self, names: Mapping[type, str], max_depth: int) -> None:
        self.names = names
        self.max_depth = max_depth

    def enc(self, v: Any, depth: int) -> Any:
        t = type(v)
        if t in _PLAIN:
            if t is int and not _INT_MIN <= v <= _INT_MAX:
                raise EncodeError(f"integer {v} does not fit in 64 bits")
            return v
        if depth >= self.max_depth:
            raise EncodeError(f"value nested deeper than {self.max_depth} levels")
        d = depth + 1
        if t is list:
            return [self.enc(x, d) for x in v]
        if t is dict:
            return {self.enc(k, d): self.enc(x, d) for k, x in v.items()}
        if t is tuple:
            return msgpack.ExtType(EXT_TUPLE, _pack([self.enc(x, d) for x in v]))
        mod = t.__module__.partition(".")[0]
        if mod == "numpy":
            return self._numpy(v, d)
        if mod == "pandas":
            return self._pandas(v, d)
        if isinstance(v, enum.Enum):
            return self.enc(v.value, d)
        if isinstance(v, bool):
            return bool(v)
        if isinstance(v, int):
            return self.enc(int(v), d)
        if isinstance(v, float):
            return float(v)
        if isinstance(v, str):
            return str(v)
        if isinstance(v, bytes | bytearray | memoryview):
            return bytes(v)
        if isinstance(v, datetime.date | datetime.time | datetime.timedelta):
            return _datetime(v)
        if isinstance(v, decimal.Decimal):
            return msgpack.ExtType(EXT_DECIMAL, _pack(str(v)))
        if isinstance(v, set | frozenset):
            kind = "frozenset" if isinstance(v, frozenset) else "set"
            return msgpack.ExtType(EXT_SET, _pack([kind, [self.enc(x, d) for x in v]]))
        if isinstance(v, RecordFields):
            return self._record(v.type_name, v.items(), d)
        if isinstance(v, Mapping):
            return {self.enc(k, d): self.enc(x, d) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return self.enc(list(v) if isinstance(v, list) else tuple(v), depth)
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return self._record(self._name(t),
                                ((f.name, getattr(v, f.name)) for f in dataclasses.fields(v)), d)
        pyd = sys.modules.get("pydantic")
        if pyd is not None and isinstance(v, pyd.BaseModel):
            items = [(k, getattr(v, k)) for k in type(v).model_fields]
            items += list((v.model_extra or {}).items())
            return self._record(self._name(t), items, d)
        if isinstance(v, uuid.UUID | pathlib.PurePath):
            return str(v)
        raise EncodeError(f"a {t.__module__}.{t.__qualname__} value cannot be sent")

    def _name(self, cls: type) -> str:
        return self.names.get(cls) or cls.__name__

    def _record(self, name: str, items: Any, d: int) -> msgpack.ExtType:
        fields = {str(k): self.enc(x, d) for k, x in items}
        return msgpack.ExtType(EXT_RECORD, _pack([name, fields]))

    def _numpy(self, v: object, d: int) -> Any:
        import numpy as np

        if isinstance(v, np.ndarray):
            dt = v.dtype
            if dt.hasobject or dt.fields is not None or dt.kind == "V":
                return self.enc(v.tolist(), d - 1)
            a = v if v.flags.c_contiguous else v.copy(order="C")  # (keeps 0-d arrays 0-d)
            flat: Any = a.reshape(-1).view(np.uint8)
            data = memoryview(flat) if a.size else b""
            return msgpack.ExtType(EXT_NDARRAY, _pack([dt.str, list(a.shape), data]))
        if isinstance(v, np.generic):
            if isinstance(v, np.datetime64 | np.timedelta64):
                return self.enc(np.asarray(v), d - 1)
            return self.enc(v.item(), d - 1)
        raise EncodeError(f"a numpy {type(v).__qualname__} value cannot be sent")

    def _pandas(self, v: object, d: int) -> Any:
        import pandas as pd

        if isinstance(v, pd.DataFrame):
            return msgpack.ExtType(EXT_DATAFRAME, _pack({
                "columns": [self._column(v.iloc[:, i], d) for i in range(v.shape[1])],
                "index": self._index(v.index, d),
                "names": [self.enc(c, d) for c in v.columns],
            }))
        if isinstance(v, pd.Series):
            return msgpack.ExtType(EXT_SERIES, _pack({
                "name": self.enc(v.name, d), "values": self._column(v, d),
                "index": self._index(v.index, d)}))
        if isinstance(v, pd.Index):
            return self.enc(v.tolist(), d - 1)
        if v is pd.NaT or v is pd.NA:
            return None
        if isinstance(v, pd.Timestamp):
            return _datetime(v.to_pydatetime(warn=False))
        if isinstance(v, pd.Timedelta):
            return _datetime(v.to_pytimedelta())
        return self.enc(v.tolist() if hasattr(v, "tolist") else str(v), d - 1)

    def _index(self, idx: Any, d: int) -> dict[str, Any]:
        import pandas as pd

        name = self.enc(idx.name, d) if not isinstance(idx, pd.MultiIndex) else None
        if isinstance(idx, pd.RangeIndex):
            return {"kind": "range", "start": idx.start, "stop": idx.stop, "step": idx.step,
                    "name": name}
        return {**self._column(idx, d), "name": name}

    def _column(self, s: Any, d: int) -> dict[str, Any]:
        """A Series or Index as a column encoding (docs/abi.md)."""
        import numpy as np
        import pandas as pd

        dt = s.dtype
        if isinstance(dt, np.dtype):
            if dt.kind in "Mm":
                unit = np.datetime_data(dt)[0]
                if unit in _UNITS:
                    data = np.ascontiguousarray(s.to_numpy().view("<i8")).tobytes()
                    if dt.kind == "M":
                        return {"kind": "datetime", "unit": unit, "tz": None, "data": data}
                    return {"kind": "timedelta", "unit": unit, "data": data}
            elif dt.kind in "biufc":
                return {"kind": "numpy", "dtype": dt.str,
                        "data": np.ascontiguousarray(s.to_numpy()).tobytes()}
        elif isinstance(dt, pd.DatetimeTZDtype) and dt.unit in _UNITS:
            data = np.asarray(s.array.view("i8"), dtype="<i8").tobytes()
            return {"kind": "datetime", "unit": dt.unit, "tz": _tzname(dt.tz), "data": data}
        elif isinstance(dt, pd.CategoricalDtype):
            cat = s.array
            return {"kind": "category", "categories": self._column(cat.categories, d),
                    "codes": np.asarray(cat.codes, dtype="<i4").tobytes(),
                    "ordered": bool(dt.ordered)}
        elif isinstance(dt, pd.StringDtype):
            values = s.to_numpy(dtype=object, na_value=None).tolist()
            return {"kind": "string", "values": values, "storage": dt.storage,
                    "na": "NA" if dt.na_value is pd.NA else "nan"}
        elif isinstance(s.array, pd.arrays.IntegerArray | pd.arrays.FloatingArray
                        | pd.arrays.BooleanArray):
            arr = s.array
            zero = False if dt.kind == "b" else 0
            raw = np.ascontiguousarray(arr.to_numpy(dtype=dt.numpy_dtype, na_value=zero))
            return {"kind": "masked", "dtype": dt.name, "data": raw.tobytes(),
                    "mask": np.asarray(arr.isna(), dtype=np.uint8).tobytes()}
        values = [None if _missing(x) else self.enc(x, d) for x in s.to_numpy(dtype=object)]
        return {"kind": "object", "values": values}


def _missing(x: object) -> bool:
    if x is None or (type(x) is float and math.isnan(x)):
        return True
    pd = sys.modules.get("pandas")
    return pd is not None and (x is pd.NA or x is pd.NaT)


def _tzname(tz: object) -> str:
    for attr in ("key", "zone"):  # zoneinfo, pytz
        name = getattr(tz, attr, None)
        if isinstance(name, str):
            return name
    return str(tz)  # datetime.timezone: "UTC" or "UTC+01:00"


def _datetime(v: Any) -> msgpack.ExtType:
    if isinstance(v, datetime.datetime):
        payload = ["datetime", v.isoformat()]
    elif isinstance(v, datetime.date):
        payload = ["date", v.isoformat()]
    elif isinstance(v, datetime.time):
        payload = ["time", v.isoformat()]
    else:
        payload = ["timedelta", repr(v.total_seconds())]
    return msgpack.ExtType(EXT_DATETIME, _pack(payload))


# ---- decode ---------------------------------------------------------------------------------
DEFAULT_MAX_BYTES = 16 << 20
"""The input size whose decoding cost (``DecodeCost.for_bytes``) bounds a decode that was
given no budget of its own: the door's default request cap."""


def decode(obj: object, *, max_depth: int = 64, cost: DecodeCost | None = None) -> Any:
    """The Python value of a tree the door unpacked (ExtType leaves decoded). Containers and
    ext payloads nested deeper than ``max_depth`` raise :class:`TooDeep`. Ext payloads are
    decoded under ``cost`` (the budget of the frame they came in, from ``DoorContext.cost``;
    else one of its own): payloads inside payloads cannot multiply what a frame costs."""
    if type(obj) is dict and max_depth > 1:  # the common small call: a map of scalars
        for k, v in obj.items():
            if type(v) not in _PLAIN or type(k) not in _PLAIN:
                break
        else:
            return dict(obj)
    if cost is None:
        cost = DecodeCost.for_bytes(DEFAULT_MAX_BYTES)
    return _Decoder(max_depth, cost).dec(obj, 0, ())


def unpackb(data: bytes, **kwargs: Any) -> Any:
    cost = kwargs.pop("cost", None) or DecodeCost.for_bytes(max(len(data), DEFAULT_MAX_BYTES))
    try:
        obj = unpack_bounded(data, cost)
    except ValueError as exc:
        raise DecodeError(f"malformed msgpack: {exc}") from None
    return decode(obj, cost=cost, **kwargs)


def _need(cond: bool, what: str) -> None:
    if not cond:
        raise DecodeError(what)


class _Decoder:
    def __init__(self, max_depth: int, cost: DecodeCost) -> None:
        self.max_depth = max_depth
        self.cost = cost

    def dec(self, v: Any, depth: int, path: tuple[Any, ...]) -> Any:
        t = type(v)
        if t in _PLAIN:
            return v
        if depth >= self.max_depth:
            raise TooDeep(f"nested deeper than {self.max_depth} levels", path)
        d = depth + 1
        if t is list:
            return [self.dec(x, d, (*path, i)) for i, x in enumerate(v)]
        if t is dict:
            out = {}
            for k, x in v.items():
                key = self.dec(k, d, path)
                try:
                    out[key] = self.dec(x, d, (*path, key))
                except TypeError:
                    raise DecodeError("unhashable map key", path) from None
            return out
        if isinstance(v, msgpack.ExtType):
            try:
                return self._ext(v, d, path)
            except DecodeError as exc:
                if not exc.path:
                    exc.path = path
                raise
            except Exception as exc:  # any defect of a payload is the peer's
                raise DecodeError(f"malformed ext type {v.code}: {type(exc).__name__}: {exc}",
                                  path) from None
        raise DecodeError(f"unsupported msgpack value {t.__name__}", path)

    def _ext(self, v: msgpack.ExtType, d: int, path: tuple[Any, ...]) -> Any:
        try:
            p = unpack_bounded(v.data, self.cost)
        except ValueError as exc:
            raise DecodeError(f"malformed ext type {v.code} payload: {exc}", path) from None
        code = v.code
        if code == EXT_TUPLE:
            _need(type(p) is list, "a tuple payload is an array")
            return tuple(self.dec(x, d, (*path, i)) for i, x in enumerate(p))
        if code == EXT_SET:
            _need(type(p) is list and len(p) == 2 and p[0] in ("set", "frozenset")
                  and type(p[1]) is list, "a set payload is [kind, array]")
            items = [self.dec(x, d, path) for x in p[1]]
            try:
                return set(items) if p[0] == "set" else frozenset(items)
            except TypeError:
                raise DecodeError("unhashable set member", path) from None
        if code == EXT_DATETIME:
            return _decode_datetime(p)
        if code == EXT_DECIMAL:
            _need(type(p) is str, "a decimal payload is a string")
            return decimal.Decimal(p)
        if code == EXT_RECORD:
            _need(type(p) is list and len(p) == 2 and type(p[0]) is str and type(p[1]) is dict
                  and all(type(k) is str for k in p[1]), "a record payload is [name, map]")
            return RecordFields(p[0], {k: self.dec(x, d, (*path, k)) for k, x in p[1].items()})
        if code == EXT_NDARRAY:
            return _decode_ndarray(p)
        if code == EXT_DATAFRAME:
            return self._dataframe(p, d)
        if code == EXT_SERIES:
            return self._series(p, d)
        raise DecodeError(f"unknown ext type {code}", path)

    def _dataframe(self, p: Any, d: int) -> Any:
        import pandas as pd

        _need(type(p) is dict and type(p.get("columns")) is list
              and type(p.get("names")) is list and len(p["columns"]) == len(p["names"]),
              "a DataFrame payload is {columns, index, names} of equal lengths")
        index = self._index(p.get("index"), d)
        cols = {}
        for i, col in enumerate(p["columns"]):
            values = self._column(col, d)
            _need(len(values) == len(index), f"column {i} has {len(values)} rows, the index "
                  f"{len(index)}")
            cols[i] = pd.Series(values, dtype=object if col["kind"] == "object" else None,
                                copy=False)
        df = pd.DataFrame(cols, copy=False) if cols else pd.DataFrame(index=index)
        df.index = index
        df.columns = pd.Index([self.dec(n, d, ()) for n in p["names"]],
                              dtype=object if not p["names"] else None)
        return df

    def _series(self, p: Any, d: int) -> Any:
        import pandas as pd

        _need(type(p) is dict and "values" in p, "a Series payload is {name, values, index}")
        index = self._index(p.get("index"), d)
        values = self._column(p["values"], d)
        _need(len(values) == len(index), "Series values and index differ in length")
        obj = p["values"]["kind"] == "object"
        return pd.Series(values, index=index, name=self.dec(p.get("name"), d, ()),
                         dtype=object if obj else None, copy=False)

    def _index(self, col: Any, d: int) -> Any:
        import pandas as pd

        _need(type(col) is dict, "an index is a column encoding")
        name = self.dec(col.get("name"), d, ())
        if col.get("kind") == "range":
            args = [col.get(k) for k in ("start", "stop", "step")]
            _need(all(type(a) is int for a in args) and args[2] != 0, "bad range index")
            return pd.RangeIndex(*args, name=name)
        values = self._column(col, d)
        return pd.Index(values, name=name, dtype=object if col["kind"] == "object" else None)

    def _column(self, col: Any, d: int) -> Any:
        import numpy as np
        import pandas as pd

        _need(type(col) is dict and type(col.get("kind")) is str, "a column encoding is a map")
        kind = col["kind"]
        if kind == "numpy":
            return _from_buffer(col.get("data"), col.get("dtype"), None)
        if kind in ("datetime", "timedelta"):
            unit = col.get("unit")
            _need(unit in _UNITS, f"bad {kind} unit {unit!r}")
            ints = _from_buffer(col.get("data"), "<i8", None)
            if kind == "timedelta":
                return ints.view(f"m8[{unit}]")
            arr = pd.array(ints.view(f"M8[{unit}]"))
            tz = col.get("tz")
            _need(tz is None or type(tz) is str, "tz is a string or nil")
            return arr if tz is None else arr.tz_localize("UTC").tz_convert(tz)
        if kind == "masked":
            _need(type(col.get("dtype")) is str, "a masked column names its dtype")
            dtype = pd.api.types.pandas_dtype(col["dtype"])
            _need(isinstance(dtype, pd.api.extensions.ExtensionDtype)
                  and hasattr(dtype, "numpy_dtype"), f"not a masked dtype: {col['dtype']}")
            values = _from_buffer(col.get("data"), dtype.numpy_dtype.str, None)
            mask = _from_buffer(col.get("mask"), "|u1", None)
            _need(len(mask) == len(values), "mask and data differ in length")
            return dtype.construct_array_type()(values, mask.astype(bool))
        if kind == "category":
            cats = self._column(col.get("categories"), d)
            codes = _from_buffer(col.get("codes"), "<i4", None)
            _need(type(col.get("ordered")) is bool, "ordered is a bool")
            return pd.Categorical.from_codes(codes, categories=pd.Index(cats),
                                             ordered=col["ordered"])
        if kind == "string":
            values = col.get("values")
            _need(type(values) is list and all(v is None or type(v) is str for v in values),
                  "string values are str or nil")
            storage = col.get("storage") if col.get("storage") in ("python", "pyarrow") else None
            na = np.nan if col.get("na") == "nan" else pd.NA
            try:
                return pd.array(values, dtype=pd.StringDtype(storage, na_value=na))
            except ImportError:  # no pyarrow here
                return pd.array(values, dtype=pd.StringDtype("python", na_value=na))
        if kind == "object":
            values = col.get("values")
            _need(type(values) is list, "object values are an array")
            out = np.empty(len(values), dtype=object)
            for i, x in enumerate(values):
                out[i] = self.dec(x, d, (i,))
            return out
        raise DecodeError(f"unknown column kind {kind!r}")


def _from_buffer(data: Any, dtype: Any, shape: list[int] | None) -> Any:
    import numpy as np

    _need(type(data) is bytes and type(dtype) is str, "array data is bin with a dtype string")
    try:
        dt = np.dtype(dtype)
    except Exception:
        raise DecodeError(f"unknown dtype {dtype!r}") from None
    _need(not dt.hasobject and dt.fields is None and dt.kind != "V", f"dtype {dtype} refused")
    if shape is None:
        _need(dt.itemsize > 0 and len(data) % dt.itemsize == 0,
              f"{len(data)} bytes is no whole number of {dtype} items")
        return np.frombuffer(data, dtype=dt).copy()
    count = math.prod(shape)
    _need(count * dt.itemsize == len(data),
          f"shape {shape} of {dtype} needs {count * dt.itemsize} bytes, got {len(data)}")
    if dt.itemsize == 0:
        return np.zeros(shape, dtype=dt)
    return np.frombuffer(data, dtype=dt).reshape(shape).copy()


def _decode_ndarray(p: Any) -> Any:
    _need(type(p) is list and len(p) == 3 and type(p[1]) is list and len(p[1]) <= 64
          and all(type(n) is int and n >= 0 for n in p[1]),
          "an ndarray payload is [dtype, shape, data]")
    return _from_buffer(p[2], p[0], p[1])


def _decode_datetime(p: Any) -> Any:
    _need(type(p) is list and len(p) == 2 and type(p[1]) is str,
          "a datetime payload is [kind, iso]")
    kind, iso = p
    try:
        if kind == "datetime":
            return datetime.datetime.fromisoformat(iso)
        if kind == "date":
            return datetime.date.fromisoformat(iso)
        if kind == "time":
            return datetime.time.fromisoformat(iso)
        if kind == "timedelta":
            return datetime.timedelta(seconds=float(iso))
    except (ValueError, OverflowError) as exc:
        raise DecodeError(f"bad {kind}: {exc}") from None
    raise DecodeError(f"unknown datetime kind {kind!r}")
