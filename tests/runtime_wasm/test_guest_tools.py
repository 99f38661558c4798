"""The guest side of typed tools (memex_guest.codec / tools / aio) against docs/abi.md.

Real guests; the host side is a tiny fake tool set registered here directly on a ``Door``
(``tools.call`` / ``tools.batch``) that builds and reads the msgpack ext types of the ABI
with its own small encoder (this file does not use memex.host_tools).
"""

from __future__ import annotations

import ast
import datetime as dt
import decimal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgpack
import pytest

from memex import Door, DoorError, Limits, Sandbox, TurnStatus

np = pytest.importorskip("numpy")
pd = pytest.importorskip("pandas")

# ---- a host-side encoder/decoder of the ABI's typed values (independent of the guest's) ------
MASKED = {"Int8", "Int16", "Int32", "Int64", "UInt8", "UInt16", "UInt32", "UInt64",
          "Float32", "Float64", "boolean"}


def _p(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _tz(tz: Any) -> str:
    key = getattr(tz, "key", None) or getattr(tz, "zone", None)
    return key if isinstance(key, str) else str(tz)


def h_col(s: Any) -> dict[str, Any]:
    """Column encoding of a Series or Index."""
    dtype = s.dtype
    if isinstance(dtype, pd.DatetimeTZDtype):
        i8 = s.tz_convert(None) if isinstance(s, pd.Index) else s.dt.tz_convert(None)
        return {"kind": "datetime", "unit": dtype.unit, "tz": _tz(dtype.tz),
                "data": np.asarray(i8).view("<i8").tobytes()}
    if isinstance(dtype, pd.CategoricalDtype):
        cat = s.array if isinstance(s, pd.Index) else s.cat
        return {"kind": "category", "categories": h_col(dtype.categories),
                "codes": np.asarray(cat.codes, dtype="<i4").tobytes(),
                "ordered": bool(dtype.ordered)}
    if isinstance(dtype, pd.StringDtype):
        return {"kind": "string", "values": [None if pd.isna(v) else v for v in s],
                "storage": dtype.storage, "na": "NA" if dtype.na_value is pd.NA else "nan"}
    if str(dtype) in MASKED:
        arr = s.array
        return {"kind": "masked", "dtype": str(dtype),
                "data": arr.to_numpy(dtype=dtype.numpy_dtype, na_value=0).tobytes(),
                "mask": np.asarray(arr.isna(), dtype="u1").tobytes()}
    if isinstance(dtype, np.dtype) and dtype.kind == "M":
        return {"kind": "datetime", "unit": np.datetime_data(dtype)[0], "tz": None,
                "data": np.asarray(s).view("<i8").tobytes()}
    if isinstance(dtype, np.dtype) and dtype.kind == "m":
        return {"kind": "timedelta", "unit": np.datetime_data(dtype)[0],
                "data": np.asarray(s).view("<i8").tobytes()}
    if isinstance(dtype, np.dtype) and dtype.kind != "O":
        return {"kind": "numpy", "dtype": dtype.str, "data": np.asarray(s).tobytes()}
    return {"kind": "object", "values": [h_enc(None if v is pd.NA else v) for v in s]}


def h_index(idx: Any) -> dict[str, Any]:
    if type(idx) is pd.RangeIndex:
        return {"kind": "range", "start": idx.start, "stop": idx.stop, "step": idx.step,
                "name": idx.name}
    enc = h_col(idx)
    enc["name"] = idx.name
    return enc


def h_enc(v: Any) -> Any:
    """A host value -> msgpack-ready value with the ABI's ext types (like host tools send)."""
    if isinstance(v, dict):
        return {h_enc(k): h_enc(x) for k, x in v.items()}
    if isinstance(v, list):
        return [h_enc(x) for x in v]
    if isinstance(v, tuple):
        return msgpack.ExtType(7, _p([h_enc(x) for x in v]))
    if isinstance(v, (set, frozenset)):
        kind = "frozenset" if isinstance(v, frozenset) else "set"
        return msgpack.ExtType(8, _p([kind, [h_enc(x) for x in sorted(v)]]))
    if isinstance(v, np.ndarray):
        return msgpack.ExtType(1, _p([v.dtype.str, list(v.shape), v.tobytes()]))
    if isinstance(v, pd.DataFrame):
        return msgpack.ExtType(2, _p({"columns": [h_col(v.iloc[:, i]) for i in range(v.shape[1])],
                                      "index": h_index(v.index), "names": list(v.columns)}))
    if isinstance(v, pd.Series):
        return msgpack.ExtType(3, _p({"name": v.name, "values": h_col(v),
                                      "index": h_index(v.index)}))
    if isinstance(v, dt.datetime):
        return msgpack.ExtType(4, _p(["datetime", v.isoformat()]))
    if isinstance(v, dt.date):
        return msgpack.ExtType(4, _p(["date", v.isoformat()]))
    if isinstance(v, dt.time):
        return msgpack.ExtType(4, _p(["time", v.isoformat()]))
    if isinstance(v, dt.timedelta):
        return msgpack.ExtType(4, _p(["timedelta", repr(v.total_seconds())]))
    if isinstance(v, decimal.Decimal):
        return msgpack.ExtType(6, _p(str(v)))
    if isinstance(v, HostRecord):
        return msgpack.ExtType(5, _p([v.type_name, h_enc(v.fields)]))
    return v


class HostRecord:
    def __init__(self, type_name: str, **fields: Any) -> None:
        self.type_name, self.fields = type_name, fields


def _h_colv(enc: dict[str, Any]) -> Any:
    kind = enc["kind"]
    if kind == "numpy":
        return np.frombuffer(enc["data"], enc["dtype"]).copy()
    if kind == "datetime":
        arr = np.frombuffer(enc["data"], "<i8").view(f"M8[{enc['unit']}]").copy()
        if enc["tz"] is None:
            return arr
        return pd.DatetimeIndex(arr).tz_localize("UTC").tz_convert(enc["tz"]).array
    if kind == "timedelta":
        return np.frombuffer(enc["data"], "<i8").view(f"m8[{enc['unit']}]").copy()
    if kind == "masked":
        dtype = pd.api.types.pandas_dtype(enc["dtype"])
        return dtype.construct_array_type()(
            np.frombuffer(enc["data"], dtype.numpy_dtype).copy(),
            np.frombuffer(enc["mask"], "u1").astype(bool))
    if kind == "category":
        cats = _h_colv(enc["categories"])
        cats = pd.Index(cats, dtype=object if enc["categories"]["kind"] == "object" else None)
        return pd.Categorical.from_codes(np.frombuffer(enc["codes"], "<i4"), categories=cats,
                                         ordered=enc["ordered"])
    if kind == "string":
        na = np.nan if enc.get("na") == "nan" else pd.NA
        return pd.array(enc["values"], dtype=pd.StringDtype(enc["storage"], na_value=na))
    if kind == "object":
        out = np.empty(len(enc["values"]), dtype=object)
        for i, x in enumerate(enc["values"]):
            out[i] = x
        return out
    raise AssertionError(f"unknown column kind {kind}")


def _h_index(enc: dict[str, Any]) -> Any:
    if enc["kind"] == "range":
        return pd.RangeIndex(enc["start"], enc["stop"], enc["step"], name=enc["name"])
    return pd.Index(_h_colv(enc), name=enc.get("name"),
                    dtype=object if enc["kind"] == "object" else None)


def h_ext_hook(code: int, data: bytes) -> Any:
    p = msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=h_ext_hook)
    if code == 1:
        return np.frombuffer(p[2], p[0]).reshape(p[1]).copy()
    if code == 2:
        index = _h_index(p["index"])
        cols = {i: pd.Series(_h_colv(c), index=index,
                             dtype=object if c["kind"] == "object" else None)
                for i, c in enumerate(p["columns"])}
        df = pd.DataFrame(cols, index=index) if cols else pd.DataFrame(index=index)
        if p["names"]:
            df.columns = p["names"]
        return df
    if code == 3:
        c = p["values"]
        return pd.Series(_h_colv(c), index=_h_index(p["index"]), name=p["name"],
                         dtype=object if c["kind"] == "object" else None)
    if code == 4:
        kind, iso = p
        if kind == "timedelta":
            return dt.timedelta(seconds=float(iso))
        return {"datetime": dt.datetime, "date": dt.date, "time": dt.time}[kind] \
            .fromisoformat(iso)
    if code == 5:
        return HostRecord(p[0], **p[1])
    if code == 6:
        return decimal.Decimal(p)
    if code == 7:
        return tuple(p)
    if code == 8:
        return set(p[1]) if p[0] == "set" else frozenset(p[1])
    return msgpack.ExtType(code, data)


def h_dec(v: Any) -> Any:
    """What the door handed a handler (ExtType inside) -> host values."""
    if isinstance(v, msgpack.ExtType):
        return h_ext_hook(v.code, v.data)
    if isinstance(v, dict):
        return {h_dec(k): h_dec(x) for k, x in v.items()}
    if isinstance(v, list):
        return [h_dec(x) for x in v]
    return v


# ---- a fake tool set --------------------------------------------------------------------------
class FakeTools:
    """tools.call / tools.batch handlers; batches run their calls concurrently on threads."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.captured: list[Any] = []
        self.batches: list[list[Any]] = []
        self.ran: list[str] = []
        self.lock = threading.Lock()

    def run_one(self, name: str, args: dict[str, Any]) -> Any:
        with self.lock:
            self.ran.append(name)
        if name == "add":
            return args["a"] + args["b"]
        if name == "value":
            return h_enc(self.values[args["key"]])
        if name == "echo":
            return args["x"]  # ExtTypes travel back untouched
        if name == "capture":
            with self.lock:
                self.captured.append(args)
            return len(self.captured)
        if name == "sleep":
            time.sleep(args.get("s", 0.01))
            return args.get("i")
        if name == "fail":
            raise RuntimeError(args.get("message", "boom"))
        if name == "error":
            return {"__tool_error__": args["error"]}
        return {"__tool_error__": {"kind": "unknown_tool", "message": f"no tool named {name!r}"}}

    def call(self, name: str, args: dict[str, Any]) -> Any:
        # a tool that raises here makes the door answer handler_error; a tool error map
        # becomes the door's error (DoorError), the form docs/abi.md gives for tools.call
        value = self.run_one(name, args)
        if isinstance(value, dict) and "__tool_error__" in value:
            err = dict(value["__tool_error__"])
            raise DoorError(err.pop("kind"), err.pop("message"), **err)
        return value

    def batch(self, calls: list[list[Any]]) -> list[list[Any]]:
        self.batches.append(calls)
        out: list[Any] = [None] * len(calls)

        def run(k: int, call: list[Any]) -> None:
            cid, name, args = call
            try:
                value = self.run_one(name, args)
            except Exception as exc:
                out[k] = [cid, False, {"kind": "tool_failed", "message": str(exc)}]
                return
            if isinstance(value, dict) and "__tool_error__" in value:
                out[k] = [cid, False, value["__tool_error__"]]
            else:
                out[k] = [cid, True, value]

        threads = [threading.Thread(target=run, args=(k, c)) for k, c in enumerate(calls)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return out


class ToolDoor(Door):
    """A door whose tools.call can also answer with a tool error map as the door error
    (the form docs/abi.md gives for tools.call)."""

    door_errors: dict[str, dict[str, Any]]

    def dispatch(self, frame: bytes, deadline: float = float("inf")) -> bytes:
        req = msgpack.unpackb(frame, raw=False, strict_map_key=False)
        if isinstance(req, dict) and req.get("op") == "tools.call":
            name = req["args"][0]
            if name in self.door_errors:
                return _p({"v": 1, "id": req["id"], "ok": False,
                           "error": self.door_errors[name]})
        return super().dispatch(frame, deadline)


@pytest.fixture(scope="module")
def env() -> Iterator[tuple[Sandbox, FakeTools, ToolDoor]]:
    door = ToolDoor(call_timeout=2.0)
    door.door_errors = {}
    tools = FakeTools()
    door.register("tools.call", tools.call)
    door.register("tools.batch", tools.batch)
    sb = Sandbox(limits=Limits(timeout=30), door=door)
    ok(sb, "import asyncio, time, pickle\nimport memex_guest\n"
           "import memex_guest.tools as T\nfrom memex_guest.tools import Record, MISSING")
    yield sb, tools, door
    sb.close()


def ok(sb: Sandbox, code: str) -> Any:
    r = sb.run(code)
    assert r.status is TurnStatus.OK, (r.exception.traceback if r.exception else r)
    return r


def value(sb: Sandbox, code: str) -> Any:
    r = ok(sb, code)
    assert r.value is not None, r
    return ast.literal_eval(r.value)


def _ws(text: str) -> str:
    return " ".join(text.split())  # reprs wrap differently across pandas versions


def ops_since(door: Door, start: int) -> list[str | None]:
    return [c.op for c in door.calls[start:]]


# ---- typed values host -> guest ---------------------------------------------------------------
ARRAYS = {
    "f8_2d": np.arange(6.0).reshape(2, 3),
    "i8": np.array([-(2**40), 0, 7], dtype=np.int64),
    "u1": np.array([0, 255], dtype=np.uint8),
    "be_i4": np.array([1, -2, 3], dtype=">i4"),
    "bool": np.array([True, False, True]),
    "c16": np.array([1 + 2j, -3j]),
    "U5": np.array(["ab", "cdeé"]),
    "M8": np.array(["2020-01-01T00:00:00.123456789", "NaT"], dtype="M8[ns]"),
    "m8s": np.array([5, -1], dtype="m8[s]"),
    "zero_d": np.array(3.5),
    "zero_d_int": np.array(7, dtype=np.int16),
    "empty": np.zeros((0, 3)),
    "empty_1d_i4": np.zeros(0, dtype=np.int32),
    "fortran": np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4)),
    "f2_3d": np.arange(24, dtype=np.float16).reshape(2, 3, 4),
}


def test_ndarray_from_host(env: Any) -> None:
    sb, tools, _ = env
    tools.values.update({f"arr_{k}": v for k, v in ARRAYS.items()})
    got = value(sb, "import numpy as np\n"
                "out = {}\n"
                f"for k in {list(ARRAYS)!r}:\n"
                "    a = T.call('value', {'key': 'arr_' + k})\n"
                "    assert type(a) is np.ndarray, type(a)\n"
                "    out[k] = (a.dtype.str, a.shape, a.flags.writeable, a.flags.c_contiguous,"
                " a.tobytes())\n"
                "    a[...] = a  # writable\n"
                "out")
    for k, arr in ARRAYS.items():
        c = np.ascontiguousarray(arr)
        assert got[k] == (arr.dtype.str, arr.shape, True, True, c.tobytes()), k


def make_frame() -> Any:
    n = 4
    return pd.DataFrame({
        "i8": np.array([1, -2, 3, 2**40], dtype=np.int64),
        "f8": [0.5, np.nan, -1.25, 1e300],
        "f4": np.array([1.5, 2, 3, 4], dtype=np.float32),
        "b": [True, False, True, False],
        "u2": np.array([0, 1, 2, 65535], dtype=np.uint16),
        "dt_ns": pd.to_datetime(["2020-01-01 00:00:00.000000001", None, "1970-01-01",
                                 "2262-04-11"], format="ISO8601").as_unit("ns"),
        "dt_us": pd.to_datetime(["2020-01-01", "1900-06-01 12:00", None, "2500-01-01"],
                               format="ISO8601").as_unit("us"),
        "dt_paris": pd.to_datetime(["2024-03-31 01:30", "2024-03-31 03:30", None,
                                    "2024-10-27 02:30"])
                      .tz_localize("Europe/Paris", ambiguous=True),
        "dt_utc": pd.to_datetime(["2020-01-01T10:00Z"] * n, utc=True),
        "td": pd.to_timedelta(["1 day", "-2 s", None, "3 us"]),
        "Int64": pd.array([1, None, -3, 2**62], dtype="Int64"),
        "UInt8": pd.array([None, 1, 255, 0], dtype="UInt8"),
        "Float64": pd.array([1.5, None, np.nan, -0.0], dtype="Float64"),
        "boolean": pd.array([True, None, False, True], dtype="boolean"),
        "cat": pd.Categorical(["b", "a", None, "b"], categories=["b", "a", "z"]),
        "cat_ord": pd.Categorical([3, 1, 2, 1], categories=[1, 2, 3], ordered=True),
        "string": pd.array(["x", None, "é", ""], dtype="string"),
        "str": pd.array(["x", None, "y", "z"], dtype="str"),
        "obj": pd.array([1, "a", None, [1, 2]], dtype=object),
        7: [1, 2, 3, 4],
    }, index=pd.RangeIndex(10, 18, 2, name="row"))


@pytest.mark.slow
def test_dataframe_from_host(env: Any) -> None:
    sb, tools, _ = env
    df = make_frame()
    tools.values["df"] = df
    got = value(sb, "import pandas as pd\n"
                "df = T.call('value', {'key': 'df'})\n"
                "assert type(df) is pd.DataFrame\n"
                "({str(c): str(t) for c, t in df.dtypes.items()}, list(df.columns),"
                " df.isna().values.tolist(), repr(df.index), df['i8'].tolist(),"
                " [str(x) for x in df['dt_paris']], df['cat'].cat.categories.tolist(),"
                " df['cat_ord'].cat.ordered, df['Int64'].tolist()[2], df['obj'].tolist(),"
                " df['string'].tolist()[0], df['td'].tolist()[1].total_seconds())")
    dtypes, cols, isna, index, i8, paris, cats, ordered, int64_2, obj, s0, td1 = got
    assert dtypes == {str(c): str(t) for c, t in df.dtypes.items()}
    assert cols == list(df.columns)
    assert isna == df.isna().values.tolist()
    assert index == repr(df.index)
    assert i8 == df["i8"].tolist()
    assert paris == [str(x) for x in df["dt_paris"]]
    assert cats == ["b", "a", "z"] and ordered is True
    assert int64_2 == -3
    assert obj == [1, "a", None, [1, 2]]
    assert s0 == "x" and td1 == -2.0
    # and back: guest -> host gives the same frame
    n = len(tools.captured)
    ok(sb, "T.call('capture', {'x': df})")
    back = h_dec(tools.captured[n]["x"])
    pd.testing.assert_frame_equal(back, df)


def test_dataframe_indexes_and_series_from_host(env: Any) -> None:
    sb, tools, _ = env
    tools.values["df_str_index"] = pd.DataFrame(
        {"a": [1.0, 2.0]}, index=pd.Index(["x", "y"], name="key"))
    tools.values["df_dt_index"] = pd.DataFrame(
        {"a": [1, 2]}, index=pd.DatetimeIndex(["2020-01-01", "2020-01-02"], tz="UTC"))
    tools.values["df_empty"] = pd.DataFrame({"a": pd.Series([], dtype="int64")})
    tools.values["df_nocols"] = pd.DataFrame(index=pd.RangeIndex(3))
    tools.values["df_dup_index"] = pd.DataFrame({"a": ["p", "q"]}, index=[5, 5])
    tools.values["series"] = pd.Series(pd.array([1, None], dtype="Int64"), name="n",
                                       index=pd.Index(["a", "b"], dtype="object"))
    tools.values["series_cat_index"] = pd.Series(
        [1.5, 2.5], index=pd.CategoricalIndex(["u", "v"]), name=3)
    n = len(tools.captured)
    ok(sb, "for k in ['df_str_index', 'df_dt_index', 'df_empty', 'df_nocols', 'df_dup_index',"
           " 'series', 'series_cat_index']:\n"
           "    v = T.call('value', {'key': k})\n"
           "    T.call('capture', {'x': v, 'k': k, 'type': type(v).__name__,"
           " 'index': repr(v.index), 'dtypes': repr(v.dtypes)})")
    for cap in tools.captured[n:]:
        k = cap["k"]
        want = tools.values[k]
        assert cap["type"] == type(want).__name__
        assert _ws(cap["index"]) == _ws(repr(want.index)), k
        assert _ws(cap["dtypes"]) == _ws(repr(want.dtypes)), k
        back = h_dec(cap["x"])
        if isinstance(want, pd.DataFrame):
            pd.testing.assert_frame_equal(back, want)
        else:
            pd.testing.assert_series_equal(back, want)


def test_scalars_and_containers_from_host(env: Any) -> None:
    sb, tools, _ = env
    paris = dt.timezone(dt.timedelta(hours=2))
    tools.values["misc"] = {
        "naive": dt.datetime(2020, 1, 2, 3, 4, 5, 678901),
        "aware": dt.datetime(2020, 1, 2, 3, 4, 5, tzinfo=paris),
        "date": dt.date(1999, 12, 31),
        "time": dt.time(23, 59, 1, 5),
        "time_tz": dt.time(1, 2, tzinfo=dt.UTC),
        "td": dt.timedelta(days=-1, seconds=5, microseconds=7),
        "dec": decimal.Decimal("-1.2345678901234567890123456789"),
        "dec_nan": decimal.Decimal("NaN"),
        "tup": (1, (2, "x"), []),
        "set": {1, 2, 3},
        "fs": frozenset({"a", "b"}),
        (1, 2): "tuple key",
    }
    got = value(sb, "v = T.call('value', {'key': 'misc'})\n"
                "{repr(k): (type(x).__name__, x.isoformat() if hasattr(x, 'isoformat') else"
                " str(x) if type(x).__name__ in ('timedelta', 'Decimal') else"
                " sorted(x) if isinstance(x, (set, frozenset)) else x)"
                " for k, x in v.items()}")
    assert got == {
        "'naive'": ("datetime", "2020-01-02T03:04:05.678901"),
        "'aware'": ("datetime", "2020-01-02T03:04:05+02:00"),
        "'date'": ("date", "1999-12-31"),
        "'time'": ("time", "23:59:01.000005"),
        "'time_tz'": ("time", "01:02:00+00:00"),
        "'td'": ("timedelta", str(dt.timedelta(days=-1, seconds=5, microseconds=7))),
        "'dec'": ("Decimal", "-1.2345678901234567890123456789"),
        "'dec_nan'": ("Decimal", "NaN"),
        "'tup'": ("tuple", (1, (2, "x"), [])),
        "'set'": ("set", [1, 2, 3]),
        "'fs'": ("frozenset", ["a", "b"]),
        "(1, 2)": ("str", "tuple key"),
    }


def test_records_from_host(env: Any) -> None:
    sb, tools, _ = env
    tools.values["person"] = HostRecord(
        "Person", name="Ann", age=41,
        address=HostRecord("Address", street="1 Main St", city="Paris"),
        friends=[HostRecord("Person", name="Bob", age=None, address=None, friends=[])],
        scores=np.array([1, 2], dtype=np.int8), born=dt.date(1983, 5, 1))
    got = value(sb, "class Address(Record):\n"
                "    __fields__ = ('street', 'city', 'zip')\n"
                "p = T.call('value', {'key': 'person'})\n"
                "d = p.to_dict()\n"
                "(type(p) is Record, p.__record_type__, p.name, p.age,"
                " type(p.address) is Address, p.address.city, p.address.zip is MISSING,"
                " repr(p.address), p.friends[0].name, p.friends[0].__record_type__,"
                " p['age'], 'zip' in p.address,"
                " sorted(d), d['address'], d['friends'], str(d['born']), d['scores'].tolist(),"
                " pickle.loads(pickle.dumps(p)) == p, p == T.make_record('Person', dict(vars(p))),"
                " p.address == Address('1 Main St', 'Paris'), repr(Record(a=1)))")
    assert got == (
        True, "Person", "Ann", 41, True, "Paris", True,
        "Address(street='1 Main St', city='Paris', zip=...)", "Bob", "Person", 41, True,
        ["address", "age", "born", "friends", "name", "scores"],
        {"street": "1 Main St", "city": "Paris"},
        [{"name": "Bob", "age": None, "address": None, "friends": []}],
        "1983-05-01", [1, 2], True, True, True, "Record(a=1)",
    )


# ---- typed values guest -> host ---------------------------------------------------------------
def test_typed_values_to_host(env: Any) -> None:
    sb, tools, _ = env
    n = len(tools.captured)
    ok(sb, "import numpy as np, datetime as dt, decimal, dataclasses, enum\n"
           "@dataclasses.dataclass\n"
           "class P:\n"
           "    x: int\n"
           "    y: list\n"
           "class Color(enum.Enum):\n"
           "    RED = 'red'\n"
           "class Pt(Record):\n"
           "    __fields__ = 'x y'\n"
           "T.call('capture', {\n"
           "  'arr': np.arange(6, dtype='<i4').reshape(2, 3)[:, ::2],\n"
           "  'zero_d': np.array(2.5), 'empty': np.zeros((0, 2), dtype=np.uint16),\n"
           "  'obj_arr': np.array([1, 'a'], dtype=object),\n"
           "  'np_scalars': [np.int64(3), np.float32(1.5), np.bool_(True), np.str_('s')],\n"
           "  'np_dt': np.datetime64('2020-01-01T00:00:00.5'),\n"
           "  'naive': dt.datetime(2020, 1, 2, 3, 4, 5),\n"
           "  'aware': dt.datetime(2020, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc),\n"
           "  'date': dt.date(2021, 2, 3), 'time': dt.time(4, 5, 6, 7),\n"
           "  'td': dt.timedelta(hours=-1, microseconds=1),\n"
           "  'dec': decimal.Decimal('3.14159265358979323846'),\n"
           "  'tup': (1, ('a', None)), 'set': {3, 1, 2}, 'fs': frozenset(['q']),\n"
           "  'rec': Pt(1, Pt(2, [Pt(3, None)])), 'generic': Record(a=1, b=MISSING),\n"
           "  'dc': P(1, [2]), 'enum': Color.RED, 'neg': [-1, -33, -200, -70000, -2**40],\n"
           "  'skipped': MISSING,\n"
           "})")
    got = h_dec(tools.captured[n])
    arr = got.pop("arr")
    assert arr.dtype == np.dtype("<i4") and arr.tolist() == [[0, 2], [3, 5]]
    z = got.pop("zero_d")
    assert z.shape == () and z.dtype == np.float64 and float(z) == 2.5
    d64 = got.pop("np_dt")
    assert d64.shape == () and d64.dtype == np.dtype("<M8[ms]")
    assert d64[()] == np.datetime64("2020-01-01T00:00:00.500")
    e = got.pop("empty")
    assert e.shape == (0, 2) and e.dtype == np.uint16
    assert got == {
        "obj_arr": [1, "a"],
        "np_scalars": [3, 1.5, True, "s"],
        "naive": dt.datetime(2020, 1, 2, 3, 4, 5),
        "aware": dt.datetime(2020, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
        "date": dt.date(2021, 2, 3), "time": dt.time(4, 5, 6, 7),
        "td": dt.timedelta(hours=-1, microseconds=1),
        "dec": decimal.Decimal("3.14159265358979323846"),
        "tup": (1, ("a", None)), "set": {1, 2, 3}, "fs": frozenset(["q"]),
        "rec": {"x": 1, "y": {"x": 2, "y": [{"x": 3, "y": None}]}},
        "generic": {"a": 1},
        "dc": {"x": 1, "y": [2]}, "enum": "red", "neg": [-1, -33, -200, -70000, -2**40],
    }


def test_series_and_frame_to_host(env: Any) -> None:
    sb, tools, _ = env
    n = len(tools.captured)
    ok(sb, "import pandas as pd, numpy as np\n"
           "s = pd.Series(pd.to_datetime(['2020-01-01', None]).tz_localize('America/New_York'),"
           " name='when')\n"
           "df = pd.DataFrame({'a': pd.array([1, None], dtype='Int64'),"
           " 'b': pd.Categorical(['x', 'y']), 'c': ['p', None],"
           " 'd': pd.array(['s', None], dtype='string'), 'e': [{'k': (1,)}, None]},"
           " index=pd.Index([1.5, 2.5], name='f'))\n"
           "T.call('capture', {'s': s, 'df': df})")
    got = h_dec(tools.captured[n])
    want_s = pd.Series(pd.to_datetime(["2020-01-01", None]).tz_localize("America/New_York"),
                       name="when")
    pd.testing.assert_series_equal(got["s"], want_s)
    want_df = pd.DataFrame({"a": pd.array([1, None], dtype="Int64"),
                            "b": pd.Categorical(["x", "y"]), "c": ["p", None],
                            "d": pd.array(["s", None], dtype="string"),
                            "e": [{"k": (1,)}, None]}, index=pd.Index([1.5, 2.5], name="f"))
    pd.testing.assert_frame_equal(got["df"], want_df)


def test_encodings_are_byte_identical_to_the_host(env: Any) -> None:
    sb, tools, _ = env
    plain = [None, True, False, 0, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32,
             2**64 - 1, -1, -32, -33, -128, -129, -32768, -32769, -(2**31), -(2**31) - 1,
             -(2**63), 0.5, -1e300, "", "é" * 40, "x" * 300, "y" * 70000, b"", b"\x00" * 300,
             b"z" * 70000, [1, [2, (3, 4)]], list(range(20)), {"k": {1: 2}},
             {str(i): i for i in range(20)}, (1, 2)]
    n = len(tools.captured)
    ok(sb, "from memex_guest._codec import packb\n"
           f"T.call('capture', {{'x': [packb(v) for v in {plain!r}]}})")
    got = tools.captured[n]["x"]
    assert len(got) == len(plain)
    for v, b in zip(plain, got, strict=False):
        assert b == _p(v), repr(v)[:80]
    # request frames, plain (tuples stay arrays, as they always did) and typed
    n = len(tools.captured)
    ok(sb, "from memex_guest._codec import pack_request\n"
           "T.call('capture', {'x': [pack_request(7, 'op', [1, (2, 3), 'x' * 40], {'k': -5}),"
           " pack_request(2**40, 'tools.call', ['t', {'a': (1,)}], {}, True)]})")
    plain_frame, typed_frame = tools.captured[n]["x"]
    assert plain_frame == _p({"v": 1, "id": 7, "op": "op", "args": [1, [2, 3], "x" * 40],
                              "kwargs": {"k": -5}})
    assert typed_frame == _p({"v": 1, "id": 2**40, "op": "tools.call",
                              "args": ["t", {"a": h_enc((1,))}], "kwargs": {}})
    typed = [(1, 2), {3, 1, 2}, frozenset(["b", "a"]), decimal.Decimal("1.50"),
             dt.datetime(2020, 1, 2, 3, 4, 5, 6), dt.date(2020, 1, 2), dt.time(1, 2),
             dt.timedelta(days=2, microseconds=3), [(1,), {"k": (2, (3,))}]]
    got = value(sb, "import datetime, decimal\n"
                "from decimal import Decimal\n"
                "from memex_guest.codec import encode\n"
                f"[encode(v) for v in {typed!r}]")
    assert got == [_p(h_enc(v)) for v in typed]
    got = value(sb, "import numpy as np\nfrom memex_guest.codec import encode\n"
                "[encode(np.arange(6, dtype='<f8').reshape(2, 3)), encode(np.array(True))]")
    assert got == [_p(h_enc(np.arange(6, dtype="<f8").reshape(2, 3))), _p(h_enc(np.array(True)))]


def test_unencodable_argument_raises_at_the_call(env: Any) -> None:
    sb, _, _ = env
    got = value(sb, "try:\n"
                "    T.call('capture', {'x': object()})\n"
                "except TypeError as e:\n"
                "    r = str(e)\n"
                "r")
    assert "cannot send a value of type builtins.object" in got


# ---- errors -----------------------------------------------------------------------------------
GUEST_ERR = (
    "def err(name, args=None):\n"
    "    try:\n"
    "        T.call(name, args or {})\n"
    "    except T.ToolError as e:\n"
    "        return (type(e).__name__, e.kind, e.tool, str(e),"
    " e.errors, isinstance(e, T.ToolError))\n"
    "    return None\n"
)


@pytest.mark.parametrize(("kind", "cls"), [
    ("invalid_arguments", "ToolArgumentError"),
    ("tool_failed", "ToolExecutionError"),
    ("invalid_return", "ToolReturnError"),
    ("unknown_tool", "ToolNotFoundError"),
    ("denied", "ToolDeniedError"),
    ("budget_exceeded", "ToolBudgetError"),
    ("timeout", "ToolTimeoutError"),
    ("too_large", "ToolArgumentError"),
    ("too_deep", "ToolArgumentError"),
    ("something_new", "ToolError"),
])
def test_error_kinds_map_to_tool_errors(env: Any, kind: str, cls: str) -> None:
    sb, _, door = env
    ok(sb, GUEST_ERR)
    error = {"kind": kind, "message": f"it went {kind}"}
    # as the DoorError the fake's tools.call raises
    got = value(sb, f"err('error', {{'error': {error!r}}})")
    assert got == (cls, kind, "error", f"it went {kind}", [], True)
    # as the door error of tools.call
    door.door_errors["via_door"] = error
    try:
        got = value(sb, "err('via_door')")
    finally:
        door.door_errors.clear()
    assert got == (cls, kind, "via_door", f"it went {kind}", [], True)


def test_argument_error_carries_paths(env: Any) -> None:
    sb, _, door = env
    ok(sb, GUEST_ERR)
    errors = [{"path": ["limit"], "message": "Input should be a valid integer"},
              {"path": ["filters", 0, "op"], "message": "Field required"}]
    door.door_errors["search"] = {"kind": "invalid_arguments",
                                  "message": "2 validation errors for search", "errors": errors}
    try:
        got = value(sb, "err('search', {'limit': 'x'})")
        text = value(sb, "try:\n    T.call('search', {})\nexcept T.ToolArgumentError as e:\n"
                     "    r = str(e)\nr")
    finally:
        door.door_errors.clear()
    assert got[:3] == ("ToolArgumentError", "invalid_arguments", "search")
    assert got[4] == errors
    assert text == ("2 validation errors for search\n  limit: Input should be a valid integer\n"
                    "  filters.0.op: Field required")


@pytest.mark.slow
def test_door_level_failures_map_to_tool_errors(env: Any) -> None:
    sb, _, door = env
    ok(sb, GUEST_ERR)
    # the handler raised: door kind handler_error
    got = value(sb, "err('fail', {'message': 'disk on fire'})")
    assert got[0] == "ToolExecutionError" and "disk on fire" in got[3]
    # the handler outlived the door's call bound (2 s here)
    got = value(sb, "err('sleep', {'s': 2.5})")
    assert got[0] == "ToolTimeoutError" and got[1] == "timeout"
    # no tools at all in this sandbox
    handler = door._handlers.pop("tools.call")
    try:
        got = value(sb, "err('add', {'a': 1, 'b': 2})")
    finally:
        door._handlers["tools.call"] = handler
    assert got[0] == "ToolNotFoundError" and got[1] == "unknown_op"
    # uncaught: an ordinary guest exception with the tool's message, no DoorError chained
    r = sb.run("T.call('nope', {})")
    assert r.status is TurnStatus.ERROR and r.exception is not None
    assert r.exception.type == "memex_guest.tools.ToolNotFoundError"
    assert "no tool named 'nope'" in r.exception.message
    assert "DoorError" not in r.exception.traceback


# ---- the event loop and batches ---------------------------------------------------------------
def test_sync_calls_go_through_tools_call(env: Any) -> None:
    sb, _, door = env
    start = len(door.calls)
    assert value(sb, "[T.call('add', {'a': i, 'b': 1}) for i in range(3)]") == [1, 2, 3]
    assert ops_since(door, start) == ["tools.call"] * 3


def test_gather_is_one_batch(env: Any) -> None:
    sb, tools, door = env
    start, nb = len(door.calls), len(tools.batches)
    got = value(sb, "async def t(i):\n"
                "    return await T.call('add', {'a': i, 'b': 100})\n"
                "async def main():\n"
                "    return await asyncio.gather(*(t(i) for i in range(10)))\n"
                "asyncio.run(main())")
    assert got == [100 + i for i in range(10)]
    assert ops_since(door, start) == ["tools.batch"]
    assert len(tools.batches) == nb + 1 and len(tools.batches[-1]) == 10


def test_batch_runs_concurrently_on_the_host(env: Any) -> None:
    sb, _tools, door = env
    start = len(door.calls)
    got = value(sb, "async def main():\n"
                "    t = time.perf_counter()\n"
                "    r = await asyncio.gather(*(T.call('sleep', {'i': i, 's': 0.01})"
                " for i in range(100)))\n"
                "    return r, time.perf_counter() - t\n"
                "asyncio.run(main())")
    assert got[0] == list(range(100))
    assert ops_since(door, start) == ["tools.batch"]
    assert got[1] < 1.0  # 100 x 10 ms sequentially would take 1 s


def test_as_completed_task_group_wait_for(env: Any) -> None:
    sb, _tools, door = env
    start = len(door.calls)
    got = value(sb, "import memex_guest.aio as aio\n"
                "async def main():\n"
                "    out = []\n"
                "    for f in asyncio.as_completed([T.call('sleep', {'i': i, 's': 0.01 * (3 - i)})"
                " for i in range(3)]):\n"
                "        out.append(await f)\n"
                "    async with asyncio.TaskGroup() as tg:\n"
                "        ts = [tg.create_task(T.call('add', {'a': i, 'b': 0})) for i in range(4)]\n"
                "    got = await asyncio.wait_for(T.call('add', {'a': 1, 'b': 1}), 5)\n"
                "    try:\n"
                "        await asyncio.wait_for(asyncio.sleep(5), 0.05)\n"
                "        timed_out = False\n"
                "    except TimeoutError:\n"
                "        timed_out = True\n"
                "    t = time.perf_counter()\n"
                "    await asyncio.sleep(0.05)\n"
                "    slept = time.perf_counter() - t\n"
                "    return sorted(out), [x.result() for x in ts], got, timed_out, slept\n"
                "aio.run(main())")
    out, tg, got1, timed_out, slept = got
    assert out == [0, 1, 2] and tg == [0, 1, 2, 3] and got1 == 2 and timed_out
    assert 0.045 <= slept < 1.0
    assert ops_since(door, start) == ["tools.batch", "tools.batch", "tools.call"]


def test_errors_per_call_in_a_batch(env: Any) -> None:
    sb, _, door = env
    start = len(door.calls)
    got = value(sb, "async def main():\n"
                "    rs = await asyncio.gather(T.call('add', {'a': 1, 'b': 2}),"
                " T.call('fail', {'message': 'nope'}), T.call('missing', {}),"
                " T.call('error', {'error': {'kind': 'denied', 'message': 'no'}}),"
                " return_exceptions=True)\n"
                "    return [r if isinstance(r, int) else (type(r).__name__, str(r)) for r in rs]\n"
                "asyncio.run(main())")
    assert got == [3, ("ToolExecutionError", "nope"),
                   ("ToolNotFoundError", "no tool named 'missing'"), ("ToolDeniedError", "no")]
    assert ops_since(door, start) == ["tools.batch"]


def test_cancelled_before_sent_never_runs(env: Any) -> None:
    sb, tools, door = env
    tools.ran.clear()
    start = len(door.calls)
    got = value(sb, "async def main():\n"
                "    a = asyncio.ensure_future(T.call('sleep', {'i': 'cancelled', 's': 0}))\n"
                "    b = T.call('sleep', {'i': 'kept', 's': 0})\n"
                "    a.cancel()\n"
                "    return await b, a.cancelled()\n"
                "asyncio.run(main())")
    assert got == ("kept", True)
    assert ops_since(door, start) == ["tools.call"]
    assert tools.ran == ["sleep"]


def test_unawaited_calls_are_still_sent(env: Any) -> None:
    sb, tools, _ = env
    n = len(tools.captured)
    ok(sb, "async def main():\n"
           "    T.call('capture', {'x': 'fire and forget'})\n"
           "    return 1\n"
           "asyncio.run(main())")
    assert [c["x"] for c in tools.captured[n:]] == ["fire and forget"]


def test_asyncio_defaults_use_the_guest_loop(env: Any) -> None:
    sb, _, _ = env
    got = value(sb, "import memex_guest.aio as aio\n"
                "loop = asyncio.new_event_loop()\n"
                "try:\n"
                "    async def f():\n"
                "        return await T.call('add', {'a': 2, 'b': 3})\n"
                "    r = loop.run_until_complete(f())\n"
                "finally:\n"
                "    loop.close()\n"
                "with asyncio.Runner() as runner:\n"
                "    r2 = runner.run(asyncio.sleep(0, 'x'))\n"
                "async def main():\n"
                "    return await asyncio.to_thread(T.call, 'add', {'a': 1, 'b': 1})\n"
                "(type(loop).__name__, r, r2, asyncio.run(main()),"
                " asyncio.EventLoop is aio.EventLoop)")
    assert got == ("EventLoop", 5, "x", 2, True)


def test_deadlock_raises_instead_of_hanging(env: Any) -> None:
    sb, _, _ = env
    r = sb.run("async def main():\n"
               "    await asyncio.Event().wait()\n"
               "asyncio.run(main())")
    assert r.status is TurnStatus.ERROR and r.exception is not None
    assert "deadlock" in r.exception.message
    assert r.duration < 5


def test_run_cell_keeps_its_loop_across_cells(env: Any) -> None:
    sb, _tools, door = env
    start = len(door.calls)
    # what the driver will do with a top-level-await cell, called by hand here
    got = value(sb, "import memex_guest.aio as aio\n"
                "async def cell():\n"
                "    global bg\n"
                "    bg = asyncio.ensure_future(T.call('sleep', {'i': 'bg', 's': 0}))\n"
                "    xs = await asyncio.gather(*(T.call('add', {'a': i, 'b': i})"
                " for i in range(5)))\n"
                "    return xs\n"
                "aio.run_cell(cell())")
    assert got == [0, 2, 4, 6, 8]
    assert ops_since(door, start) == ["tools.batch"]
    got = value(sb, "async def cell2():\n"
                "    return await bg, asyncio.get_running_loop() is aio.cell_loop()\n"
                "aio.run_cell(cell2())")
    assert got == ("bg", True)
    r = sb.run("async def cell3():\n"
               "    await T.call('nope', {})\n"
               "aio.run_cell(cell3())")
    assert r.status is TurnStatus.ERROR and r.exception is not None
    assert r.exception.type == "memex_guest.tools.ToolNotFoundError"


def test_top_level_await_compiled_cell_via_run_cell(env: Any) -> None:
    sb, _, _ = env
    got = value(sb, "import ast, memex_guest.aio as aio\n"
                "src = 'r = await asyncio.gather(*(T.call(\"add\", {\"a\": i, \"b\": 1})"
                " for i in range(3)))'\n"
                "code = compile(src, '<cell>', 'exec', flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)\n"
                "ns = {'asyncio': asyncio, 'T': T}\n"
                "aio.run_cell(eval(code, ns))\n"
                "ns['r']")
    assert got == [1, 2, 3]


def test_tool_future_outside_await(env: Any) -> None:
    sb, _, _ = env
    got = value(sb, "async def main():\n"
                "    f = T.call('add', {'a': 20, 'b': 22})\n"
                "    return 'await it' in repr(f), f.result()\n"
                "asyncio.run(main())")
    assert got == (True, 42)


# ---- asyncio hook when memex_guest comes before asyncio -------------------------------------
def test_asyncio_imported_after_memex_guest(make_sandbox: Callable[..., Sandbox]) -> None:
    door = Door()
    door.register("tools.call", lambda name, args: args["a"] * 2)
    sb = make_sandbox(door=door)
    got = value(sb, "import sys\n"
                "assert 'asyncio' not in sys.modules\n"
                "import memex_guest.tools as T\n"
                "assert 'asyncio' not in sys.modules\n"
                "import asyncio\n"
                "async def main():\n"
                "    return await T.call('x', {'a': 21})\n"
                "asyncio.run(main())")
    assert got == 42


def test_undecodable_value_is_a_return_error(env: Any) -> None:
    sb, tools, _ = env
    bad = msgpack.ExtType(1, _p(["<f8", [3], b"\x00" * 5]))  # 5 bytes for 3 float64
    ok(sb, GUEST_ERR)
    orig = tools.run_one

    def run_one(name: str, args: dict[str, Any]) -> Any:
        return bad if name == "bad" else orig(name, args)

    tools.run_one = run_one  # type: ignore[method-assign]
    try:
        got = value(sb, "err('bad')")
        assert got[0] == "ToolReturnError" and "cannot be rebuilt" in got[3]
        got = value(sb, "async def main():\n"
                    "    rs = await asyncio.gather(T.call('bad', {}), T.call('add', {'a': 1,"
                    " 'b': 1}), return_exceptions=True)\n"
                    "    return [type(r).__name__ for r in rs]\n"
                    "asyncio.run(main())")
        # the whole batch reply could not be decoded: every call of it fails the same way
        assert got == ["ToolReturnError", "ToolReturnError"]
    finally:
        tools.run_one = orig  # type: ignore[method-assign]


def test_create_task_and_double_await(env: Any) -> None:
    sb, _, door = env
    start = len(door.calls)
    got = value(sb, "async def main():\n"
                "    t1 = asyncio.create_task(T.call('add', {'a': 1, 'b': 2}))\n"
                "    c = T.call('add', {'a': 3, 'b': 4})\n"
                "    a = await c\n"
                "    b = await c\n"
                "    return await t1, a, b\n"
                "asyncio.run(main())")
    assert got == (3, 7, 7)
    assert ops_since(door, start) == ["tools.batch"]


def test_forgotten_await_is_explained(env: Any) -> None:
    sb, _, _ = env
    got = value(sb, "async def main():\n"
                "    try:\n"
                "        await T.call('add', {'a': T.call('add', {'a': 1, 'b': 1}), 'b': 1})\n"
                "    except TypeError as e:\n"
                "        return str(e)\n"
                "asyncio.run(main())")
    assert "await it first" in got


STUB_MODULE = '''
from typing import Any, Literal, Optional, TypedDict, Union
import datetime, decimal
import memex_guest.tools as _mx

ToolError = _mx.ToolError

class Forecast(_mx.Record):
    """A day's forecast."""
    day: datetime.date
    high: float
    __fields__ = ('day', 'high')

def get_forecast(city: str, days: int = 3, *, unit: Literal['c', 'f'] = _mx.MISSING
                 ) -> list[Forecast]:
    """Forecast."""
    return _mx.call('get-forecast', {_k: _v for _k, _v in (('city', city), ('days', days),
                    ('unit', unit), ) if _v is not _mx.MISSING})
'''


def test_a_stub_module_in_the_shape_of_layer_4(make_sandbox: Callable[..., Sandbox]) -> None:
    door = Door()
    seen: list[Any] = []

    def call(name: str, args: dict[str, Any]) -> Any:
        seen.append((name, args))
        return [h_enc(HostRecord("Forecast", day=dt.date(2024, 1, 1 + i), high=1.5 * i))
                for i in range(args["days"])]

    door.register("tools.call", call)
    sb = make_sandbox(door=door)
    ok(sb, f"import sys, types, inspect\nsrc = {STUB_MODULE!r}\n"
           "tools = types.ModuleType('tools')\nexec(src, tools.__dict__)\n"
           "sys.modules['tools'] = tools")
    got = value(sb, "fs = tools.get_forecast('Paris', 2)\n"
                "(str(inspect.signature(tools.get_forecast)), [type(f).__name__ for f in fs],"
                " [f.to_dict() for f in fs][1]['high'], str(fs[0].day), repr(fs[0]),"
                " isinstance(fs[0], tools.Forecast))")
    assert got == ("(city: str, days: int = 3, *, unit: Literal['c', 'f'] = ...)"
                   " -> list[tools.Forecast]",
                   ["Forecast", "Forecast"], 1.5, "2024-01-01",
                   "Forecast(day=datetime.date(2024, 1, 1), high=0.0)", True)
    assert seen == [("get-forecast", {"city": "Paris", "days": 2})]
