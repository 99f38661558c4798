"""Writes the committed seed corpus of tests/security/test_fuzz.py (``seeds/``; run from
anywhere: ``python tests/security/make_seeds.py``). The harnesses replay every seed and mutate
them; a crash found by a long run (``./build.sh fuzz``) is added here as a new seed."""

from __future__ import annotations

import datetime
import decimal
import sys
from pathlib import Path

import msgpack
import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from memex import Limits, TurnResult, TurnStatus  # noqa: E402
from memex.backends.internal import (  # noqa: E402
    encode_frame,
    limits_to_wire,
    mounts_to_wire,
    result_to_wire,
)
from memex.host_tools import encode  # noqa: E402

ROOT = Path(__file__).resolve().parent / "seeds"


def put(kind: str, name: str, data: bytes) -> None:
    (ROOT / kind).mkdir(parents=True, exist_ok=True)
    (ROOT / kind / name).write_bytes(data)


def pack(value: object) -> bytes:
    out: bytes = msgpack.packb(value, use_bin_type=True)
    return out


def main() -> None:
    put("door", "call.bin", pack({"v": 1, "id": 1, "op": "echo", "args": [1, "two", b"3"],
                                  "kwargs": {"k": [4]}}))
    put("door", "tool_call.bin", pack({"v": 1, "id": 2, "op": "tools.call",
                                       "args": ["add", {"a": 1, "b": 2}]}))
    put("door", "tool_batch.bin", pack({"v": 1, "id": 3, "op": "tools.batch", "args": [[
        [1, "add", {"a": 1, "b": 2}], [2, "add", {"a": msgpack.ExtType(7, pack([1, 2]))}]]]}))
    put("door", "tool_list.bin", pack({"v": 1, "id": 4, "op": "tools.list", "args": []}))
    put("door", "nested.bin", b"\x81\xa1v\x01" + b"\x91" * 64 + b"\xc0")
    values: dict[str, object] = {
        "scalars": [1, -2, 3.5, True, None, "s", b"b"],
        "ndarray": np.arange(12, dtype=np.int32).reshape(3, 4),
        "dataframe": pd.DataFrame({"a": [1, 2, 3], "b": ["x", "y", None],
                                   "t": pd.to_datetime(["2026-01-01", None, "2026-03-01"])}),
        "series": pd.Series([1.5, None, 3.0], name="s"),
        "datetime": datetime.datetime(2026, 12, 1, 14, 9, tzinfo=datetime.UTC),
        "decimal": decimal.Decimal("3.1415"),
        "tuple_set": ((1, 2), frozenset({3, 4})),
    }
    for name, value in values.items():
        put("codec", f"{name}.bin", pack(encode(value)))
    result = TurnResult(status=TurnStatus.OK, stdout="hi\n", value="42", disk_bytes=10,
                        disk_files=1)
    put("wire", "result.bin", encode_frame(["reply", 7, [result_to_wire(result)]]))
    put("wire", "open.bin", encode_frame(["open", 1, limits_to_wire(Limits()),
                                          mounts_to_wire([]), [], {}, None]))
    put("wire", "fds.bin", encode_frame(["checkpoint", 3], nfds=1))
    put("wire", "two.bin", encode_frame(["run", 2, "x = 1", 5.0, None, 0])
        + encode_frame(["close", 2]))
    put("policy", "example.toml", (REPO / "examples" / "egress_policy.toml").read_bytes())
    put("policy", "small.yaml", b"""rules:
  - action: allow
    name: api
    scheme: https
    host: "api.example.com"
    method: [GET, POST]
    path: "/v1/*"
  - action: deny
    ip: 10.0.0.0/8
limits:
  max_response_bytes: 100000
""")
    put("policy", "secrets.toml", b'''[[rules]]
action = "allow"
host = "*.example.org"
port = 443

[[secrets]]
name = "token"
env = "MEMEX_TEST_TOKEN"
header = "Authorization"
format = "Bearer {value}"
host = "api.example.org"
''')


if __name__ == "__main__":
    main()
