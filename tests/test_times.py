"""tests/times.py: docs/test-times.md from a run's JUnit XML (per-lane totals, the slowest),
and the lane tests/conftest.py gives each test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings
from lanes import (
    HANG_GUARDS,
    HYPOTHESIS_PROFILES,
    LOCAL_MODEL_CALL,
    LOCAL_MODEL_ROLLOUT,
    LOCAL_MODEL_START,
    PROFILE_VARIABLE,
    examples,
    lane_of,
)
from times import read, render

XML = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.a" name="test_fast" time="0.5">
  <properties><property name="lane" value="fast"/></properties></testcase>
<testcase classname="tests.b" name="test_cluster" time="12.0">
  <properties><property name="lane" value="cluster"/></properties></testcase>
<testcase classname="tests.b" name="test_skipped" time="0.0">
  <properties><property name="lane" value="cluster"/></properties><skipped/></testcase>
<testcase classname="tests.c" name="test_failed" time="3.5">
  <properties><property name="lane" value="slow"/></properties><failure/></testcase>
</testsuite></testsuites>
"""


def test_the_table_sums_each_lane_and_lists_the_slowest(tmp_path: Path) -> None:
    (tmp_path / "junit.xml").write_text(XML)
    text = render(read(tmp_path / "junit.xml"), "junit.xml")
    assert "| cluster | 1 | 12 | 75% |" in text  # the skipped one is not a test run
    assert "| slow | 1 | 4 | 22% |" in text and "| fast | 1 | 0 | 3% |" in text
    assert "| all | 3 | 16 | 100% |" in text
    slowest = text.split("The 20 slowest:")[1]
    assert slowest.index("test_cluster") < slowest.index("test_failed") < \
        slowest.index("test_fast")


def test_this_test_is_in_the_fast_lane_and_says_so(request: pytest.FixtureRequest) -> None:
    assert lane_of(request.node) == "fast"
    assert ("lane", "fast") in request.node.user_properties
    assert request.node.get_closest_marker("timeout") is None  # the suite's guard, 600 s


def test_a_marked_soak_is_in_the_soak_lane_whatever_else_it_uses(
        request: pytest.FixtureRequest) -> None:
    request.node.add_marker(pytest.mark.slow)
    assert lane_of(request.node) == "slow"  # positive control: the marker is what moves it
    request.node.add_marker(pytest.mark.soak)
    assert lane_of(request.node) == "soak"


def test_a_property_tests_examples_follow_the_runs_hypothesis_profile() -> None:
    loaded = os.environ.get(PROFILE_VARIABLE) or "full"
    assert settings.default.max_examples == HYPOTHESIS_PROFILES[loaded]  # conftest loaded it
    try:
        settings.load_profile("full")
        assert examples(300) == 300
        settings.load_profile("quick")
        assert examples(300) == 75 and examples(2) == 1 and settings.default.derandomize
    finally:
        settings.load_profile(loaded)


@pytest.mark.local_llm
def test_the_local_model_lane_has_a_hang_guard_past_its_tests_own_bounds(
        request: pytest.FixtureRequest) -> None:
    """conftest gives the lane's tests its guard (the suite's 600 s ended a worker running a
    local-model test on a loaded machine, within that test's own bounds)."""
    assert lane_of(request.node) == "local-model"
    guard = request.node.get_closest_marker("timeout").args[0]
    assert guard == HANG_GUARDS["local-model"] > \
        LOCAL_MODEL_START + LOCAL_MODEL_ROLLOUT + LOCAL_MODEL_CALL


class _Item:
    """What lane_of reads of a collected test: its fixtures and markers."""

    def __init__(self, fixtures: set[str], markers: frozenset[str] = frozenset()) -> None:
        self.fixturenames, self.markers = sorted(fixtures), markers

    def get_closest_marker(self, name: str) -> object:
        return name if name in self.markers else None


def test_a_test_on_a_server_or_the_cluster_is_in_its_lane_unmarked() -> None:
    assert lane_of(_Item({"tmp_path"})) == "fast"  # the control
    assert lane_of(_Item({"tmp_path", "memex_server"})) == "slow"
    assert lane_of(_Item({"cluster_server"})) == "cluster"
    assert lane_of(_Item({"memex_server"}, {"soak"})) == "soak"


def _probe(tmp_path: Path, returncode: int = 0, **env: str) -> tuple[list[tuple[str, str]], str]:
    """Run tests/units_probe.py on two workers: (worker, what) of each test and of its stand-in
    Ray cluster's start and end, in the order each worker did them; and pytest's output."""
    out = tmp_path / ("-".join(sorted(env)) or "run")
    out.mkdir()
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider",
         "--timeout=120", str(Path(__file__).parent / "units_probe.py")],
        cwd=Path(__file__).parent.parent, capture_output=True, text=True, timeout=300,
        env={**os.environ, "MEMEX_PROBE_OUT": str(out), **env})
    assert run.returncode == returncode, run.stdout + run.stderr
    return [(w, what) for w, what in
            (line.split(" ", 1) for line in (out / "log").read_text().splitlines())], run.stdout


@pytest.mark.slow
def test_the_tests_that_use_ray_run_on_one_worker_which_then_ends_ray(tmp_path: Path) -> None:
    """conftest's scheduler sends every test marked ``ray`` (or on the cluster's fixtures,
    which marks it) to one worker, so one worker starts the session's Ray cluster, and that
    worker ends it after the last of them, before its next test; the control: the same tests
    without the marker go to both workers."""
    log, _ = _probe(tmp_path)
    ran = dict((what, w) for w, what in log)
    assert len(ran) == 3 + 6 + 1 + 2
    ray = {ran[f"ray_{i}"] for i in (1, 2, 3)}
    assert len(ray) == 1
    mine = [what for w, what in log if w in ray]
    assert mine[:5] == ["cluster up", "ray_1", "ray_2", "ray_3", "cluster down"], mine
    assert len(mine) > 5  # the cluster ended before a test after it, not with the session
    control = dict((what, w) for w, what in _probe(tmp_path, MEMEX_PROBE_UNMARKED="1")[0])
    assert len(control) == 3 + 6 + 1
    assert len({control[f"ray_{i}"] for i in (1, 2, 3)}) == 2


@pytest.mark.slow
def test_a_worker_that_dies_fails_its_test_and_the_rest_still_run(tmp_path: Path) -> None:
    """A worker ended mid-run (as the hang guard's timeout ends one) fails the test it was in,
    once, and every other test still runs, once: the run ends. Under xdist's own
    ``remove_node`` the finished units of the dead worker went back to the queue and the run
    never ended (the probe hit its timeout: checked)."""
    log, out = _probe(tmp_path, returncode=1, MEMEX_PROBE_UNMARKED="1", MEMEX_PROBE_CRASH="1")
    ran = [what for _, what in log]
    assert sorted(ran) == sorted([f"ray_{i}" for i in (1, 2, 3)]
                                 + [f"other_{n}" for n in range(6)]), ran
    assert "crashed while running 'tests/units_probe.py::test_crash'" in out, out
    assert "1 failed, 9 passed" in out, out


def test_each_worker_leads_a_session_of_its_own() -> None:
    """conftest puts each xdist worker in a session of its own (``_own_session``), so the
    nice steps its servers' guests run below their server count inside that session's
    scheduling group, not against the processes of the session that started pytest; the
    control: the controller that started the worker is still in another session."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        pytest.skip("a property of pytest-xdist's workers (./build.sh test and quick use two)")
    assert os.getsid(0) == os.getpid()
    assert os.getsid(os.getppid()) != os.getpid()
