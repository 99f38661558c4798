"""Limits' fields are declared once (``LIMIT_FIELDS``, on the dataclass itself): Limits checks
itself against that table, and every model of its fields (serve.toml's tables, the API's
request body, the MCP config) is made from it. So a field added to Limits reaches each
front end, and what a model admits is what Limits admits."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lanes import examples
from pydantic import BaseModel, ValidationError

from memex.errors import ConfigError
from memex.integrations.mcp import LimitsConfig
from memex.runtime_wasm import SANDBOX_LIMITS, Limits
from memex.runtime_wasm.internal import LIMIT_FIELDS, LimitField
from memex.service import ServiceConfig, create_app
from memex.serving import LimitsTable

NAMES = [f.name for f in dataclasses.fields(Limits)]
MODELS: list[type[BaseModel]] = [LimitsTable, LimitsConfig]
# the API's request body as its OpenAPI document states it (what a client validates against)
WIRE = create_app(ServiceConfig()).openapi()["components"]["schemas"]["LimitsIn"]
WIRE_CHECK = jsonschema.Draft202012Validator(WIRE)


def test_the_table_is_limits_own_fields_in_order() -> None:
    assert [f.name for f in LIMIT_FIELDS] == NAMES
    # positive control: a field's entry says what its dataclass field says
    memory = next(f for f in LIMIT_FIELDS if f.name == "memory")
    assert (memory.kind, memory.nullable, memory.low) == ("bytes", False, 48 << 20)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_every_model_has_exactly_limits_fields(model: type[BaseModel]) -> None:
    assert list(model.model_fields) == NAMES
    assert all(model.model_fields[f.name].description == f.doc for f in LIMIT_FIELDS)


def test_the_api_document_has_exactly_limits_fields() -> None:
    assert list(WIRE["properties"]) == NAMES
    assert WIRE["additionalProperties"] is False
    assert all(WIRE["properties"][f.name]["description"] == f.doc for f in LIMIT_FIELDS)


def _edges(f: LimitField) -> tuple[list[float], list[float]]:
    """(values Limits must admit, values it must refuse) at both ends of the range."""
    step = 1e-6 if f.kind == "seconds" else 1
    inside = [f.low + step if f.low_open else f.low, f.high - step if f.high_open else f.high]
    outside = [f.low if f.low_open else f.low - step, f.high if f.high_open else f.high + step]
    if f.kind != "seconds":
        inside, outside = [int(v) for v in inside], [int(v) for v in outside]
    return inside, outside


@pytest.mark.parametrize("f", LIMIT_FIELDS, ids=lambda f: f.name)
def test_limits_checks_itself_against_the_table(f: LimitField) -> None:
    inside, outside = _edges(f)
    for v in inside:
        assert getattr(Limits(**{f.name: v}), f.name) == v
    for v in outside:
        with pytest.raises(ConfigError, match=f"Limits.{f.name} must be"):
            Limits(**{f.name: v})
    if f.nullable:
        assert getattr(Limits(**{f.name: None}), f.name) is None
    else:
        with pytest.raises(ConfigError, match="must be bounded"):
            Limits(**{f.name: None})


def _wire_accepts(name: str, value: Any) -> bool:
    return WIRE_CHECK.is_valid({name: value})


def _limits_accepts(name: str, value: Any) -> bool:
    try:
        Limits(**{name: value})
    except ConfigError:
        return False
    return True


@pytest.mark.parametrize("f", LIMIT_FIELDS, ids=lambda f: f.name)
def test_the_wire_model_states_limits_range(f: LimitField) -> None:
    """At each end of each range, the API document admits a value exactly when Limits
    does: what the document allows is not refused later, and the reverse."""
    inside, outside = _edges(f)
    for v in [*inside, *outside]:
        assert _wire_accepts(f.name, v) == _limits_accepts(f.name, v), (f.name, v)
    assert any(_wire_accepts(f.name, v) for v in inside)  # positive control
    assert not any(_wire_accepts(f.name, v) for v in outside)


@settings(max_examples=examples(300), deadline=None)
@given(st.sampled_from(LIMIT_FIELDS),
       st.integers(-(1 << 63), 1 << 63) | st.floats(allow_nan=False, allow_infinity=True))
def test_wire_and_limits_agree_on_any_number(f: LimitField, value: float) -> None:
    if f.kind != "seconds" and isinstance(value, float) and not (
            math.isfinite(value) and value.is_integer()):
        assert not _wire_accepts(f.name, value)  # an integer field takes no fraction
        return
    if f.kind != "seconds" and isinstance(value, float):
        value = int(value)
    assert _wire_accepts(f.name, value) == _limits_accepts(f.name, value), (f.name, value)


def test_config_tables_take_the_one_grammar_and_limits_checks_the_range() -> None:
    t = LimitsTable.model_validate({"memory": "256M", "timeout": "2min", "disk_files": 5})
    assert t.limits() == Limits(memory=256 << 20, timeout=120.0, disk_files=5)
    with pytest.raises(ConfigError, match="at least 48 MiB"):
        LimitsTable.model_validate({"memory": "1M"}).limits()
    with pytest.raises(ValidationError, match=r"unknown key|Extra inputs"):
        LimitsTable.model_validate({"memroy": "1M"})


def test_the_mcp_table_keeps_its_own_defaults_and_gains_every_field() -> None:
    got = LimitsConfig().limits()
    assert (got.timeout, got.stdout_bytes, got.stderr_bytes) == (SANDBOX_LIMITS.timeout,
                                                                 64 << 10, 64 << 10)
    assert got.memory == SANDBOX_LIMITS.memory
    assert LimitsConfig.model_validate({"disk_bytes": "1M"}).limits().disk_bytes == 1 << 20
