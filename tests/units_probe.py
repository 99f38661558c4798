"""Not collected on its own (its name is not ``test_*.py``): tests/test_times.py runs it on
two workers to see which worker each test ran on. Its first three tests are marked ``ray``
(they use nothing of Ray: only the scheduler's grouping is under test) unless
``MEMEX_PROBE_UNMARKED`` is set: the control, in which they are marked ``slow``, a marker
that groups nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

MARK = pytest.mark.slow if os.environ.get("MEMEX_PROBE_UNMARKED") else pytest.mark.ray


def _record(name: str) -> None:
    Path(os.environ["MEMEX_PROBE_OUT"], name).write_text(os.environ["PYTEST_XDIST_WORKER"])


@MARK
def test_ray_1() -> None:
    _record("ray_1")


@MARK
def test_ray_2() -> None:
    _record("ray_2")


@MARK
def test_ray_3() -> None:
    _record("ray_3")


def test_other_1() -> None:
    _record("other_1")


def test_other_2() -> None:
    _record("other_2")


def test_other_3() -> None:
    _record("other_3")
