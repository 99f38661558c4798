# Runs inside the guest. Imports nothing from the host packages.
"""The conversions of typed values to the ext types of docs/abi.md, Layer 2, and back (the
table of codes is in ``codec``'s docstring). numpy and pandas are imported only when such a
value is seen (pandas costs ~1.3 s).

``convert`` and ``from_ext`` are the hooks ``_codec`` calls (lazily: this module imports
``_records`` only, so the wire codec and the typed values form no cycle); ``codec`` is the
public face over both.
"""

import datetime as _dt
import enum as _enum
import sys as _sys

from ._records import Record, make_record

__all__ = ["DecodeError", "convert", "from_ext"]

EXT_NDARRAY = 1
EXT_DATAFRAME = 2
EXT_SERIES = 3
EXT_DATETIME = 4
EXT_RECORD = 5
EXT_DECIMAL = 6
EXT_TUPLE = 7
EXT_SET = 8

_MASKED = frozenset(
    ["Int8", "Int16", "Int32", "Int64", "UInt8", "UInt16", "UInt32", "UInt64",
     "Float32", "Float64", "boolean"]
)


class DecodeError(ValueError):
    """A typed value (ext type) from the host that cannot be rebuilt in the guest."""


# ---- encoding ------------------------------------------------------------------------------
def convert(obj, typed=True):
    """How to encode ``obj``, which is not a plain msgpack value: ``(code, payload)`` for an
    ext type, or ``(None, stand_in)`` for a plain value that replaces it."""
    t = type(obj)
    mod = t.__module__
    if mod.startswith("numpy"):
        return _convert_numpy(obj)
    if mod.startswith("pandas"):
        return _convert_pandas(obj, t)
    if isinstance(obj, tuple):
        return (EXT_TUPLE, list(obj)) if typed else (None, list(obj))
    if isinstance(obj, (set, frozenset)):
        return EXT_SET, ["frozenset" if isinstance(obj, frozenset) else "set", _ordered(obj)]
    if isinstance(obj, _dt.date):  # datetime too
        if isinstance(obj, _dt.datetime):
            return EXT_DATETIME, ["datetime", obj.isoformat()]
        return EXT_DATETIME, ["date", obj.isoformat()]
    if isinstance(obj, _dt.time):
        return EXT_DATETIME, ["time", obj.isoformat()]
    if isinstance(obj, _dt.timedelta):
        return EXT_DATETIME, ["timedelta", repr(obj.total_seconds())]
    dec = _sys.modules.get("decimal")  # not imported here: ~40 ms in the guest
    if dec is not None and isinstance(obj, dec.Decimal):
        return EXT_DECIMAL, str(obj)
    if isinstance(obj, _enum.Enum):
        return None, obj.value
    if isinstance(obj, Record):
        return None, obj.to_dict()
    if hasattr(t, "__dataclass_fields__") and not isinstance(obj, type):
        import dataclasses

        return None, {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    return _generic(obj)


def _generic(obj):
    t = type(obj)
    for base, cast in _CASTS:
        if isinstance(obj, base):
            return None, cast(obj)
    hint = ""
    if t.__module__ == "memex_guest.aio" or t.__name__ == "coroutine":
        hint = " (a pending call or coroutine: await it first)"
    raise TypeError("cannot send a value of type %s.%s to the host%s"
                    % (t.__module__, t.__qualname__, hint))


_CASTS = ((bool, bool), (int, int), (float, float), (str, str),
          ((bytes, bytearray, memoryview), bytes), (dict, dict), (list, list))


def _ordered(items):
    # Sorted when the elements allow it, so that equal sets always encode the same bytes.
    try:
        return sorted(items)
    except TypeError:
        return list(items)


def _convert_numpy(obj):
    import numpy as np

    if isinstance(obj, np.ndarray):
        if obj.dtype.kind == "O" or obj.dtype.fields is not None:
            return None, obj.tolist()  # object and structured arrays travel as lists
        return EXT_NDARRAY, [obj.dtype.str, list(obj.shape), obj.tobytes()]
    if isinstance(obj, (np.datetime64, np.timedelta64)):
        return _convert_numpy(np.asarray(obj))  # a 0-d array (docs/abi.md)
    if isinstance(obj, np.generic):
        return None, obj.item()
    if isinstance(obj, np.dtype):
        return None, obj.str
    raise TypeError("cannot send a value of type numpy.%s to the host" % type(obj).__name__)


def _convert_pandas(obj, t):
    import pandas as pd

    if isinstance(obj, pd.DataFrame):
        return EXT_DATAFRAME, _enc_frame(obj)
    if isinstance(obj, pd.Series):
        return EXT_SERIES, {"name": obj.name, "values": _enc_col(obj.array, obj.dtype),
                            "index": _enc_index(obj.index)}
    if obj is pd.NA or obj is pd.NaT:
        return None, None
    if isinstance(obj, pd.Timestamp):
        return EXT_DATETIME, ["datetime", obj.to_pydatetime(warn=False).isoformat()]
    if isinstance(obj, pd.Timedelta):
        return EXT_DATETIME, ["timedelta", repr(obj.total_seconds())]
    if isinstance(obj, pd.Index):
        return None, obj.tolist()
    if hasattr(obj, "tolist"):  # extension arrays, Categorical
        return None, obj.tolist()
    return _generic(obj)


def _enc_frame(df):
    cols = []
    for i in range(df.shape[1]):
        s = df.iloc[:, i]
        cols.append(_enc_col(s.array, s.dtype))
    return {"columns": cols, "index": _enc_index(df.index), "names": list(df.columns)}


def _enc_index(idx):
    import pandas as pd

    if type(idx) is pd.RangeIndex:
        return {"kind": "range", "start": idx.start, "stop": idx.stop, "step": idx.step,
                "name": idx.name}
    if isinstance(idx, pd.MultiIndex):
        enc = {"kind": "object", "values": list(idx)}
    else:
        enc = _enc_col(idx.array, idx.dtype)
    enc["name"] = idx.name
    return enc


def _tzname(tz):
    name = getattr(tz, "key", None) or getattr(tz, "zone", None)
    return name if isinstance(name, str) else str(tz)


def _enc_col(values, dtype):
    import numpy as np
    import pandas as pd

    if isinstance(dtype, np.dtype):
        arr = np.asarray(values)
        kind = dtype.kind
        if kind == "M":
            unit = np.datetime_data(dtype)[0]
            return {"kind": "datetime", "unit": unit, "tz": None,
                    "data": arr.view("i8").astype("<i8", copy=False).tobytes()}
        if kind == "m":
            unit = np.datetime_data(dtype)[0]
            return {"kind": "timedelta", "unit": unit,
                    "data": arr.view("i8").astype("<i8", copy=False).tobytes()}
        if kind != "O" and dtype.fields is None:
            return {"kind": "numpy", "dtype": dtype.str, "data": arr.tobytes()}
    elif isinstance(dtype, pd.DatetimeTZDtype):
        naive = np.asarray(values.tz_convert(None))  # UTC wall times
        return {"kind": "datetime", "unit": dtype.unit, "tz": _tzname(dtype.tz),
                "data": naive.view("i8").astype("<i8", copy=False).tobytes()}
    elif isinstance(dtype, pd.CategoricalDtype):
        cats = dtype.categories
        return {"kind": "category", "categories": _enc_col(cats.array, cats.dtype),
                "codes": np.asarray(values.codes).astype("<i4").tobytes(),
                "ordered": bool(dtype.ordered)}
    elif isinstance(dtype, pd.StringDtype):
        return {"kind": "string",
                "values": values.to_numpy(dtype=object, na_value=None).tolist(),
                "storage": dtype.storage, "na": "NA" if dtype.na_value is pd.NA else "nan"}
    elif getattr(dtype, "name", None) in _MASKED:
        npd = dtype.numpy_dtype
        data = values.to_numpy(dtype=npd, na_value=npd.type(0))
        return {"kind": "masked", "dtype": dtype.name,
                "data": data.astype(npd.newbyteorder("<"), copy=False).tobytes(),
                "mask": np.asarray(values.isna(), dtype=np.uint8).tobytes()}
    elif getattr(dtype, "kind", None) in "biufcmM" and isinstance(
            getattr(dtype, "numpy_dtype", None), np.dtype):
        # another extension dtype over numpy values (e.g. Sparse): send the dense values
        dense = np.asarray(values)
        if dense.dtype.kind not in "OV":
            return _enc_col(dense, dense.dtype)
    vals = np.asarray(values, dtype=object).tolist()
    return {"kind": "object", "values": [_missing_to_none(v) for v in vals]}


def _missing_to_none(v):
    t = type(v)
    if t is float:
        return None if v != v else v  # NaN marks a missing value in an object column
    if t.__module__.startswith("pandas") and t.__name__ in ("NAType", "NaTType"):
        return None
    return v


# ---- decoding ------------------------------------------------------------------------------
def from_ext(code, payload):
    """The value of ext type ``code`` whose payload decoded to ``payload``."""
    try:
        return _BUILDERS[code](payload)
    except DecodeError:
        raise
    except Exception as exc:
        raise DecodeError("cannot decode ext type %d (%s): %s: %s"
                          % (code, _NAMES.get(code, "?"), type(exc).__name__, exc)) from exc


def _ndarray(p):
    import numpy as np

    dtype_str, shape, data = p
    dtype = np.dtype(dtype_str)
    shape = tuple(shape)
    count = 1
    for n in shape:
        count *= n
    if dtype.hasobject:
        raise ValueError("object arrays are not allowed")
    if dtype.itemsize == 0 or count == 0:
        if len(data):
            raise ValueError("data for an empty array")
        return np.zeros(shape, dtype)
    if len(data) != count * dtype.itemsize:
        raise ValueError("%d bytes for shape %r of %s" % (len(data), shape, dtype))
    return np.frombuffer(data, dtype).reshape(shape).copy()


def _dataframe(p):
    import pandas as pd

    index = _index(p["index"])
    names = list(p["names"])
    cols = p["columns"]
    if len(names) != len(cols):
        raise ValueError("%d names for %d columns" % (len(names), len(cols)))
    data = {}
    for i, enc in enumerate(cols):
        arr = _col(enc)
        if enc.get("kind") == "object":
            arr = pd.Series(arr, index=index, dtype=object, copy=False)
        data[i] = arr
    df = pd.DataFrame(data, index=index, copy=False) if data else pd.DataFrame(index=index)
    if names:
        df.columns = pd.Index(names, dtype=object) if _mixed(names) else pd.Index(names)
    return df


def _mixed(names):
    kinds = {type(n) for n in names}
    return len(kinds) > 1


def _series(p):
    import pandas as pd

    enc = p["values"]
    arr = _col(enc)
    return pd.Series(arr, index=_index(p["index"]), name=p.get("name"),
                     dtype=object if enc.get("kind") == "object" else None, copy=False)


def _index(enc):
    import pandas as pd

    name = enc.get("name")
    if enc.get("kind") == "range":
        return pd.RangeIndex(enc["start"], enc["stop"], enc["step"], name=name)
    arr = _col(enc)
    if enc.get("kind") == "object":
        return pd.Index(arr, name=name, dtype=object, copy=False)
    return pd.Index(arr, name=name, copy=False)


def _col(enc):
    import numpy as np

    kind = enc["kind"]
    if kind == "numpy":
        dtype = np.dtype(enc["dtype"])
        if dtype.hasobject:
            raise ValueError("object arrays are not allowed")
        return np.frombuffer(enc["data"], dtype).copy()
    if kind == "datetime":
        unit = enc["unit"]
        arr = np.frombuffer(enc["data"], "<i8").astype("i8").view("M8[%s]" % unit)
        tz = enc.get("tz")
        if tz is None:
            return arr
        import pandas as pd

        return pd.DatetimeIndex(arr).tz_localize("UTC").tz_convert(tz).array
    if kind == "timedelta":
        return np.frombuffer(enc["data"], "<i8").astype("i8").view("m8[%s]" % enc["unit"])
    if kind == "masked":
        import pandas as pd

        dtype = pd.api.types.pandas_dtype(enc["dtype"])
        npd = dtype.numpy_dtype
        values = np.frombuffer(enc["data"], npd.newbyteorder("<")).astype(npd)
        mask = np.frombuffer(enc["mask"], np.uint8).astype(bool)
        return dtype.construct_array_type()(values, mask)
    if kind == "category":
        import pandas as pd

        cenc = enc["categories"]
        cats = _col(cenc)
        cats = pd.Index(cats, dtype=object) if cenc.get("kind") == "object" else pd.Index(cats)
        codes = np.frombuffer(enc["codes"], "<i4").astype(np.int32)
        return pd.Categorical.from_codes(codes, categories=cats, ordered=bool(enc["ordered"]))
    if kind == "string":
        import pandas as pd

        storage = enc.get("storage") or "python"
        if storage != "python":
            try:
                import pyarrow  # noqa: F401
            except ImportError:
                storage = "python"
        if enc.get("na", enc.get("na_value")) == "nan":
            dtype = pd.StringDtype(storage, na_value=np.nan)
        else:
            dtype = pd.StringDtype(storage)
        return pd.array(enc["values"], dtype=dtype)
    if kind == "object":
        values = enc["values"]
        arr = np.empty(len(values), dtype=object)
        for i, v in enumerate(values):
            arr[i] = v
        return arr
    if kind == "range":
        return np.arange(enc["start"], enc["stop"], enc["step"])
    raise ValueError("unknown column kind %r" % (kind,))


def _datetime(p):
    kind, iso = p
    if kind == "datetime":
        return _dt.datetime.fromisoformat(iso)
    if kind == "date":
        return _dt.date.fromisoformat(iso)
    if kind == "time":
        return _dt.time.fromisoformat(iso)
    if kind == "timedelta":
        return _dt.timedelta(seconds=float(iso))
    raise ValueError("unknown datetime kind %r" % (kind,))


def _record(p):
    type_name, fields = p
    if not isinstance(type_name, str) or not isinstance(fields, dict):
        raise ValueError("a record is [type_name, {field: value}]")
    return make_record(type_name, fields)


def _set(p):
    kind, items = p
    if kind == "set":
        return set(items)
    if kind == "frozenset":
        return frozenset(items)
    raise ValueError("unknown set kind %r" % (kind,))


_BUILDERS = {
    EXT_NDARRAY: _ndarray,
    EXT_DATAFRAME: _dataframe,
    EXT_SERIES: _series,
    EXT_DATETIME: _datetime,
    EXT_RECORD: _record,
    EXT_DECIMAL: lambda p: __import__("decimal").Decimal(p),
    EXT_TUPLE: tuple,
    EXT_SET: _set,
}
_NAMES = {1: "ndarray", 2: "DataFrame", 3: "Series", 4: "datetime", 5: "record",
          6: "Decimal", 7: "tuple", 8: "set"}
