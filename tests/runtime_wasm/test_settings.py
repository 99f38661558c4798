"""The one home of settings: one grammar for sizes and durations, one reader of loose input into
Limits (unknown keys refused, "only tighter" built in), and the named defaults every entry
point takes its turn deadline from."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import memex
from memex.errors import ConfigError
from memex.runtime_wasm import AGENT_LIMITS, KERNEL_LIMITS, SANDBOX_LIMITS, Limits
from memex.runtime_wasm.internal import parse_seconds, parse_size, size_text


@given(st.integers(0, 1 << 50) | st.builds(lambda k, s: k << s, st.integers(1, 4096),
                                           st.sampled_from([10, 20, 30, 40])))
def test_a_size_printed_reads_back_as_itself(n: int) -> None:
    """What --check and memex policy check print is what the config takes."""
    text = size_text(n)
    assert parse_size(text) == n
    assert text == str(n) or text[-1] in "KMGT"  # a unit only where it is exact


def test_a_size_prints_in_the_largest_exact_unit() -> None:
    assert [size_text(n) for n in (0, 1000, 1 << 10, 3 << 19, 512 << 20, 8 << 30)] == \
        ["0", "1000", "1K", "1536K", "512M", "8G"]


UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20,
         "mb": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}


@given(st.integers(0, 1 << 20), st.sampled_from(sorted(UNITS)), st.booleans(),
       st.sampled_from(["", " "]))
def test_a_size_reads_every_unit_in_either_case(n: int, unit: str, upper: bool, gap: str
                                                ) -> None:
    text = f"{n}{gap}{unit.upper() if upper else unit}"
    assert parse_size(text) == n * UNITS[unit]


@given(st.one_of(st.text(max_size=80), st.floats(), st.booleans(), st.none(),
                 st.integers(max_value=-1), st.lists(st.integers(), max_size=2)))
def test_a_size_is_an_int_or_refused_with_a_config_error(value: object) -> None:
    try:
        n = parse_size(value)
    except ConfigError as exc:
        assert "expected a byte count" in str(exc)
    else:
        assert isinstance(n, int) and 0 <= n < 1 << 62


def test_a_size_refuses_what_the_old_parsers_let_through() -> None:
    for bad in ("", "M", "1.2.3M", "-1", "10X", "1e3", True, 1.5, "9" * 70, str(1 << 63)):
        with pytest.raises(ConfigError):
            parse_size(bad)
    assert parse_size("1.5G") == 3 << 29 and parse_size(" 512 MiB ") == 512 << 20


@given(st.one_of(st.text(max_size=80), st.floats(allow_nan=True), st.integers(), st.none()))
def test_seconds_are_positive_and_finite_or_refused(value: object) -> None:
    try:
        s = parse_seconds(value)
    except ConfigError as exc:
        assert "expected seconds > 0" in str(exc)
    else:
        assert 0 < s < 1e9


def test_seconds_read_their_units() -> None:
    assert parse_seconds("500ms") == 0.5
    assert parse_seconds("2min") == parse_seconds("2m") == parse_seconds(120) == 120.0
    assert parse_seconds("1h") == 3600.0 and parse_seconds(" 30 s ") == 30.0
    for bad in (0, -1, "0s", "nan", float("inf"), True, "30 days"):
        with pytest.raises(ConfigError):
            parse_seconds(bad)


def test_from_mapping_reads_loose_input_over_a_base() -> None:
    got = Limits.from_mapping({"memory": "512M", "timeout": "2min", "fuel": None},
                              base=AGENT_LIMITS)
    assert got == Limits(memory=512 << 20, timeout=120.0, disk_bytes=AGENT_LIMITS.disk_bytes)
    assert Limits.from_mapping({}) == SANDBOX_LIMITS
    assert Limits.from_mapping({}, base=KERNEL_LIMITS).timeout == KERNEL_LIMITS.timeout
    assert Limits.from_mapping(SANDBOX_LIMITS.to_mapping()) == SANDBOX_LIMITS


def test_from_mapping_refuses_unknown_keys_and_bad_values_naming_them() -> None:
    with pytest.raises(ConfigError, match=r"cfg: unknown field\(s\) memroy; Limits has timeout"):
        Limits.from_mapping({"memroy": 1}, where="cfg")
    with pytest.raises(ConfigError, match=r"cfg.memory: expected a byte count"):
        Limits.from_mapping({"memory": "lots"}, where="cfg")
    with pytest.raises(ConfigError, match=r"cfg.open_files: expected an int"):
        Limits.from_mapping({"open_files": "8"}, where="cfg")
    with pytest.raises(ConfigError, match="at least 48 MiB"):  # Limits' own checks still run
        Limits.from_mapping({"memory": "1M"})
    with pytest.raises(ConfigError, match="expected a table"):
        Limits.from_mapping(["memory"])  # type: ignore[arg-type]


def test_only_tighter_is_built_in_and_names_every_field_above() -> None:
    ceiling = {"memory": "256M", "timeout": 20, "fuel": 10**9}
    with pytest.raises(ConfigError) as exc:
        Limits.from_mapping({"memory": 1 << 30, "timeout": 60, "fuel": None}, ceiling=ceiling)
    text = str(exc.value)
    assert "limits.timeout = 60.0 is above the ceiling of 20.0" in text
    assert "limits.memory = 1073741824 is above the ceiling of 268435456" in text
    assert "limits.fuel = None is above the ceiling of 1000000000" in text  # None: unbounded
    assert text.endswith("limits can only be tighter")
    # what is not given comes from the base, lowered to the ceiling; at the ceiling is fine
    got = Limits.from_mapping({"timeout": 20}, ceiling=ceiling)
    assert (got.memory, got.timeout, got.fuel) == (256 << 20, 20.0, 10**9)
    # a Limits as the ceiling (a parent's): its None fields cap nothing
    parent = Limits(timeout=30, memory=512 << 20)
    assert Limits.from_mapping({"fuel": 5}, ceiling=parent, base=parent).fuel == 5
    with pytest.raises(ConfigError, match="above the ceiling"):
        Limits.from_mapping({"disk_bytes": parent.disk_bytes + 1}, ceiling=parent)
    with pytest.raises(ConfigError, match="ceiling: unknown field 'memroy'"):
        Limits.from_mapping({}, ceiling={"memroy": 1})


def _literal_timeouts() -> list[str]:
    """``Limits(timeout=<number>)`` and ``--timeout`` options defaulting to a number."""
    found = []
    for path in Path(memex.__file__).parent.rglob("*.py"):
        if "guest" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "id", getattr(node.func, "attr", ""))
            kws = {k.arg: k.value for k in node.keywords}
            if name == "Limits" and isinstance(kws.get("timeout"), ast.Constant):
                found.append(f"{path.name}:{node.lineno}")
            if name == "add_argument" and node.args and getattr(node.args[0], "value",
                                                                None) == "--timeout" \
                    and isinstance(kws.get("default"), ast.Constant) \
                    and kws["default"].value is not None:  # type: ignore[attr-defined]
                found.append(f"{path.name}:{node.lineno}")
    return found


@pytest.mark.slow
def test_the_turn_deadline_is_written_once() -> None:
    """Every entry point takes its turn deadline from SANDBOX_LIMITS, AGENT_LIMITS or
    KERNEL_LIMITS, never from a number written again."""
    assert _literal_timeouts() == []
    assert (SANDBOX_LIMITS.timeout, AGENT_LIMITS.timeout, KERNEL_LIMITS.timeout) == (
        30.0, 60.0, 600.0)


@pytest.mark.parametrize("name", ["memory", "stdout_bytes", "stderr_bytes", "disk_bytes",
                                  "disk_files", "open_files"])
def test_a_bounded_limit_given_as_none_is_refused_by_name(name: str) -> None:
    """None means "no bound" only where a field allows it (fuel, lifetime...): for one that
    must be bounded it is a ConfigError naming the field, not a TypeError from a compare."""
    with pytest.raises(ConfigError, match=f"Limits.{name} must be bounded"):
        Limits.from_mapping({name: None})
    assert Limits.from_mapping({"fuel": None, "lifetime": None}).fuel is None  # allowed there
