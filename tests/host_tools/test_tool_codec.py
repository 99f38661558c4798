"""The host codec (docs/abi.md, Layer 2): encode then decode gives back an equal value, through
real msgpack bytes as the door carries them; a decoder fed malformed payloads answers with a
DecodeError and nothing else."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import decimal
import math
from typing import Any

import msgpack
import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from lanes import examples
from pydantic import BaseModel

from memex.host_tools._codec import (
    DecodeError,
    EncodeError,
    RecordFields,
    TooDeep,
    decode,
    encode,
    packb,
    unpackb,
)

SETTINGS = settings(max_examples=examples(150), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def through_wire(value: Any, **kwargs: Any) -> Any:
    """Encode, pack as the door does, unpack as the door does, decode."""
    return unpackb(packb(value, **kwargs))


# ---- plain nested values ----------------------------------------------------------------------
_scalars = (st.none() | st.booleans() | st.integers(-(1 << 63), (1 << 64) - 1)
            | st.floats(allow_nan=False) | st.text() | st.binary()
            | st.decimals(allow_nan=False, allow_infinity=False)
            | st.datetimes() | st.dates() | st.times()
            | st.datetimes(timezones=st.just(datetime.UTC))
            | st.timedeltas(min_value=datetime.timedelta(days=-9999),
                            max_value=datetime.timedelta(days=9999)))
_keys = st.text() | st.integers(-1000, 1000)
_values = st.recursive(
    _scalars,
    lambda inner: (st.lists(inner, max_size=5)
                   | st.dictionaries(_keys, inner, max_size=5)
                   | st.lists(inner, max_size=4).map(tuple)
                   | st.frozensets(st.integers(-(1 << 63), 1 << 63) | st.text(), max_size=4)
                   | st.sets(st.integers(-(1 << 63), 1 << 63), max_size=4)),
    max_leaves=30,
)


@pytest.mark.slow
@SETTINGS
@given(_values)
def test_plain_values_round_trip(value: Any) -> None:
    got = through_wire(value)
    assert got == value
    assert type(got) is type(value)


def test_round_trip_keeps_types_and_nan() -> None:
    value = {"t": (1, (2, 3)), "s": {1, 2}, "f": frozenset({"a"}), 7: [b"\x00", None],
             "nan": math.nan, "tz": datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone(
                 datetime.timedelta(hours=-5)))}
    got = through_wire(value)
    assert math.isnan(got.pop("nan")) and math.isnan(value.pop("nan"))
    assert got == value and type(got["t"][1]) is tuple and type(got["f"]) is frozenset
    assert got["tz"].utcoffset() == datetime.timedelta(hours=-5)


def test_records_and_odd_scalars() -> None:
    class Model(BaseModel):
        a: int
        b: list[str]

    @dataclasses.dataclass
    class DC:
        m: Model
        d: decimal.Decimal

    got = through_wire(DC(Model(a=1, b=["x"]), decimal.Decimal("1.10")), names={DC: "Thing"})
    assert isinstance(got, RecordFields) and got.type_name == "Thing"
    assert got == {"m": {"a": 1, "b": ["x"]}, "d": decimal.Decimal("1.10")}
    assert got["m"].type_name == "Model"
    assert through_wire(got) == got and through_wire(got).type_name == "Thing"
    assert through_wire(np.float32(1.5)) == 1.5 and through_wire(np.bool_(True)) is True
    assert through_wire(pd.Timestamp("2024-01-02 03:04")) == datetime.datetime(2024, 1, 2, 3, 4)
    assert through_wire(pd.NA) is None
    with pytest.raises(EncodeError):
        encode(object())
    with pytest.raises(EncodeError):
        encode(1 << 64)
    deep: Any = []
    for _ in range(300):
        deep = [deep]
    with pytest.raises(EncodeError, match="nested deeper"):
        encode(deep)


# ---- ndarrays ---------------------------------------------------------------------------------
_dtypes = (hnp.boolean_dtypes() | hnp.integer_dtypes(endianness="=")
           | hnp.unsigned_integer_dtypes(endianness="=") | hnp.floating_dtypes(endianness="=")
           | hnp.complex_number_dtypes(endianness="=") | hnp.datetime64_dtypes()
           | hnp.timedelta64_dtypes() | hnp.unicode_string_dtypes() | hnp.byte_string_dtypes()
           | st.sampled_from([np.dtype(">i4"), np.dtype(">f8")]))


@SETTINGS
@given(hnp.arrays(_dtypes, hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5)),
       st.booleans())
def test_ndarrays_round_trip(arr: np.ndarray, transpose: bool) -> None:
    if transpose:
        arr = arr.T  # not C-contiguous
    got = through_wire(arr)
    assert isinstance(got, np.ndarray)
    assert got.dtype == arr.dtype and got.shape == arr.shape
    assert got.tobytes() == np.ascontiguousarray(arr).tobytes()
    assert got.flags.writeable


def test_ndarray_wire_form_and_object_arrays() -> None:
    ext = encode(np.array([[1, 2], [3, 4]], dtype="<i2"))
    assert ext.code == 1
    assert msgpack.unpackb(ext.data) == ["<i2", [2, 2], b"\x01\x00\x02\x00\x03\x00\x04\x00"]
    assert encode(np.array([1, "a", None], dtype=object)) == [1, "a", None]


# ---- DataFrames -------------------------------------------------------------------------------
N = st.shared(st.integers(0, 8), key="rows")


def _col(kind: str) -> st.SearchStrategy[Any]:
    n = N
    if kind == "int":
        return n.flatmap(lambda k: st.lists(st.integers(-(1 << 60), 1 << 60), min_size=k,
                                            max_size=k).map(lambda v: pd.Series(v, dtype="int64")))
    if kind == "float":
        return n.flatmap(lambda k: st.lists(st.floats(allow_nan=True), min_size=k, max_size=k)
                         .map(lambda v: pd.Series(v, dtype="float64")))
    if kind == "bool":
        return n.flatmap(lambda k: st.lists(st.booleans(), min_size=k, max_size=k)
                         .map(lambda v: pd.Series(v, dtype="bool")))
    if kind in ("naive", "aware"):
        tz = None if kind == "naive" else "Europe/Paris"
        stamps = st.one_of(st.none(), st.datetimes(min_value=datetime.datetime(1900, 1, 1),
                                                   max_value=datetime.datetime(2200, 1, 1)))
        # aware stamps are instants shown in Paris (UTC converted): localizing a wall-clock
        # time instead raises for one in a DST gap (2000-03-26 02:00 does not exist there)
        return st.tuples(n.flatmap(lambda k: st.lists(stamps, min_size=k, max_size=k)),
                         st.sampled_from(["ns", "us", "ms", "s"])).map(
            lambda a: pd.Series(pd.to_datetime(a[0]).as_unit(a[1])).dt.tz_localize("UTC")
            .dt.tz_convert(tz)
            if tz else pd.Series(pd.to_datetime(a[0]).as_unit(a[1])))
    if kind == "Int64":
        return n.flatmap(lambda k: st.lists(st.none() | st.integers(-1000, 1000), min_size=k,
                                            max_size=k).map(lambda v: pd.Series(v, dtype="Int64")))
    if kind == "boolean":
        return n.flatmap(lambda k: st.lists(st.none() | st.booleans(), min_size=k, max_size=k)
                         .map(lambda v: pd.Series(v, dtype="boolean")))
    if kind == "category":
        return st.tuples(n.flatmap(lambda k: st.lists(st.none() | st.sampled_from("abc"),
                                                      min_size=k, max_size=k)),
                         st.booleans()).map(lambda a: pd.Series(pd.Categorical(
                             a[0], categories=list("abc"), ordered=a[1])))
    if kind in ("string", "str"):
        dtype = "string" if kind == "string" else "str"
        return n.flatmap(lambda k: st.lists(st.none() | st.text(max_size=5), min_size=k,
                                            max_size=k).map(lambda v: pd.Series(v, dtype=dtype)))
    if kind == "object":
        cell = st.none() | st.integers(-99, 99) | st.text(max_size=4) | st.lists(st.integers(0, 9),
                                                                           max_size=2)
        return n.flatmap(lambda k: st.lists(cell, min_size=k, max_size=k).map(
            lambda v: pd.Series(_objects(v), dtype=object)))
    if kind == "timedelta":
        return n.flatmap(lambda k: st.lists(st.timedeltas(
            min_value=datetime.timedelta(days=-999), max_value=datetime.timedelta(days=999)),
            min_size=k, max_size=k).map(lambda v: pd.Series(v, dtype="timedelta64[ns]")))
    raise AssertionError(kind)


def _objects(values: list[Any]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out


KINDS = ["int", "float", "bool", "naive", "aware", "Int64", "boolean", "category", "string",
         "str", "object", "timedelta"]


@st.composite
def frames(draw: st.DrawFn) -> pd.DataFrame:
    kinds = draw(st.lists(st.sampled_from(KINDS), max_size=6))
    cols = [draw(_col(k)).reset_index(drop=True) for k in kinds]
    n = draw(N)
    names = draw(st.lists(st.text(max_size=3) | st.integers(0, 9), min_size=len(cols),
                          max_size=len(cols), unique=True))
    df = pd.DataFrame({i: c for i, c in enumerate(cols)}, index=pd.RangeIndex(n))
    df.columns = pd.Index(names, dtype=object) if names else df.columns
    index = draw(st.sampled_from(["range", "step", "ints", "strings", "dates"]))
    if index == "step":
        df.index = pd.RangeIndex(5, 5 + 3 * n, 3, name="r")
    elif index == "ints":
        df.index = pd.Index(draw(st.lists(st.integers(-(1 << 63), (1 << 63) - 1), min_size=n,
                                          max_size=n)), name="i")
    elif index == "strings":
        df.index = pd.Index(draw(st.lists(st.text(max_size=3), min_size=n, max_size=n)))
    elif index == "dates":
        df.index = pd.date_range("2024-01-01", periods=n, freq="D", tz="UTC")
    return df


@pytest.mark.slow
@SETTINGS
@given(frames())
def test_dataframes_round_trip(df: pd.DataFrame) -> None:
    got = through_wire(df)
    pd.testing.assert_frame_equal(got, df, check_column_type=False, check_index_type=False,
                                  check_freq=False)
    assert list(got.dtypes) == list(df.dtypes)
    assert got.index.dtype == df.index.dtype


@SETTINGS
@given(_col("aware") | _col("Int64") | _col("category") | _col("object"))
def test_series_round_trip(s: pd.Series) -> None:
    s = s.rename("name")
    got = through_wire(s)
    pd.testing.assert_series_equal(got, s, check_index_type=False)


def test_dataframe_wire_form() -> None:
    df = pd.DataFrame({"a": pd.array([1, None], dtype="Int64"),
                       "t": pd.to_datetime(["2024-01-01", None]).tz_localize("UTC")})
    ext = encode(df)
    payload = msgpack.unpackb(ext.data)
    assert ext.code == 2 and payload["names"] == ["a", "t"]
    assert payload["index"] == {"kind": "range", "start": 0, "stop": 2, "step": 1, "name": None}
    a, t = payload["columns"]
    assert a == {"kind": "masked", "dtype": "Int64", "data": (1).to_bytes(8, "little") * 1
                 + bytes(8), "mask": b"\x00\x01"}
    assert t["kind"] == "datetime" and t["tz"] == "UTC" and t["unit"] in ("ns", "us")
    assert t["data"][8:] == (-(1 << 63)).to_bytes(8, "little", signed=True)  # NaT


# ---- the decoder never trusts its input -------------------------------------------------------
def test_depth_bound() -> None:
    nested: Any = 1
    for _ in range(10):
        nested = [nested]
    assert decode(nested, max_depth=10) == nested
    with pytest.raises(TooDeep):
        decode(nested, max_depth=9)
    tup = encode((((1,),),))  # ext payloads count as levels too
    with pytest.raises(TooDeep):
        decode([tup], max_depth=3)


@pytest.mark.parametrize("bad", [
    msgpack.ExtType(1, msgpack.packb(["|O8", [1], b"\x00" * 8])),       # object dtype
    msgpack.ExtType(1, msgpack.packb(["<i8", [3], b"\x00" * 8])),       # short data
    msgpack.ExtType(1, msgpack.packb(["<zz", [1], b"\x00"])),           # unknown dtype
    msgpack.ExtType(1, msgpack.packb(["<i8", [-1], b""])),              # negative shape
    msgpack.ExtType(4, msgpack.packb(["datetime", "yesterday"])),
    msgpack.ExtType(4, msgpack.packb(["epoch", "1"])),
    msgpack.ExtType(5, msgpack.packb([1, {}])),
    msgpack.ExtType(6, msgpack.packb("not a number")),
    msgpack.ExtType(8, msgpack.packb(["set", [[1]]])),                  # unhashable member
    msgpack.ExtType(2, msgpack.packb({"columns": [{"kind": "numpy", "dtype": "<i8",
                                                   "data": b"\x00" * 8}],
                                      "names": ["a"], "index": {"kind": "range", "start": 0,
                                                                "stop": 5, "step": 1}})),
    msgpack.ExtType(2, msgpack.packb({"columns": [{"kind": "masked", "dtype": "int64",
                                                   "data": b"", "mask": b""}], "names": ["a"],
                                      "index": {"kind": "range", "start": 0, "stop": 0,
                                                "step": 1}})),
    msgpack.ExtType(3, b"\xc1"),                                        # not msgpack
    msgpack.ExtType(99, b"\x90"),                                       # unknown code
    msgpack.Timestamp(0, 0),                                            # msgpack ext -1
])
def test_malformed_payloads_are_decode_errors(bad: Any) -> None:
    with pytest.raises(DecodeError):
        decode({"x": [bad]})


@SETTINGS
@given(st.sampled_from([
    np.arange(6, dtype="<i4").reshape(2, 3), pd.DataFrame({"a": [1, 2], "b": ["x", None]}),
    pd.Series(pd.Categorical(["a", None])), (1, {2}), datetime.date(2024, 1, 1),
]), st.data())
def test_mutated_payloads_never_raise_anything_else(value: Any, data: st.DataObject) -> None:
    wire = bytearray(packb(value))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(wire) - 1))
        wire[i] = data.draw(st.integers(0, 255))
    with contextlib.suppress(DecodeError):
        unpackb(bytes(wire))
