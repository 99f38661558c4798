"""Not collected on its own (its name is not ``test_*.py``): tests/test_times.py runs it on
two workers to see which worker ran each of its tests, and when the session's Ray cluster
(here a stand-in of the same name) was started and ended. Its first three tests use that
fixture, which marks them ``ray``, unless ``MEMEX_PROBE_UNMARKED`` is set: the control, in
which they use nothing and are marked ``slow``, a marker that groups nothing. With
``MEMEX_PROBE_CRASH`` set, its last test ends its worker's process (as a hang guard's timeout
does) once that worker has finished a test."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

MARK = (pytest.mark.slow if os.environ.get("MEMEX_PROBE_UNMARKED")
        else pytest.mark.usefixtures("ray_cluster"))


def _record(what: str) -> None:
    """One line ``<worker> <what>`` appended to the run's log (one write: lines stay whole)."""
    with open(Path(os.environ["MEMEX_PROBE_OUT"], "log"), "a") as f:
        f.write(f"{os.environ['PYTEST_XDIST_WORKER']} {what}\n")


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    _record("cluster up")
    yield
    _record("cluster down")


@MARK
def test_ray_1() -> None:
    _record("ray_1")


@MARK
def test_ray_2() -> None:
    _record("ray_2")


@MARK
def test_ray_3() -> None:
    _record("ray_3")


@pytest.mark.parametrize("n", range(6))
def test_other(n: int) -> None:
    """Waits for the last Ray test to have run (not in the control), so the worker that is
    not running those holds its first two until then and the Ray worker is sent the next:
    a test that follows the last Ray test on its worker, whatever the timing."""
    if not os.environ.get("MEMEX_PROBE_UNMARKED"):
        log = Path(os.environ["MEMEX_PROBE_OUT"], "log")
        deadline = time.monotonic() + 60
        while not log.exists() or " ray_3\n" not in log.read_text():
            assert time.monotonic() < deadline, "the last Ray test never ran"
            time.sleep(0.01)
    _record(f"other_{n}")


def test_crash() -> None:
    """Under ``MEMEX_PROBE_CRASH``: ends its worker, which has finished a test by then (the
    last unit is sent to a worker as it finishes one); run again, it would say so."""
    if os.environ.get("MEMEX_PROBE_CRASH"):
        out = Path(os.environ["MEMEX_PROBE_OUT"])
        if (out / "crashed").exists():
            _record("crash run again")
            return
        me = os.environ["PYTEST_XDIST_WORKER"]
        assert any(line.startswith(f"{me} ") for line in (out / "log").read_text().splitlines())
        (out / "crashed").touch()
        os._exit(1)
    _record("crash")
