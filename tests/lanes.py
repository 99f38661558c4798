"""Each test's lane and its budget (tests/conftest.py applies them; tests/times.py reports
them). A test's lane follows from what it uses, its markers and fixtures: a test on the
cluster's fixtures is in the cluster lane (and marked ``ray``, so ``-m "not ray"`` leaves it
out) even if its author forgot the marker, and a test on the session's ``memex serve`` is in
the slow lane (and marked ``slow``). Budgets are reported at the end of a run, never
failed (speed is bench/'s job): a test over its lane's is one to speed up, split or move."""

from __future__ import annotations

import os

import pytest

LANE_BUDGETS = {"fast": 5.0, "slow": 30.0, "cluster": 90.0, "package-index": 30.0,
                "local-model": 300.0, "soak": 120.0}
"""Seconds of a test's call in each lane before the end of a run names it."""
LOCAL_MODEL_START = 540.0
"""Seconds the local-model tests let llama.cpp's server take to start (LocalModel's own
default is 180 s): a loaded machine starts it late, not never."""
LOCAL_MODEL_THREADS = 1
"""llama.cpp threads for the local-model tests, which share the machine with the other
worker's tests: one answered a 630-token prompt in 11.5 s on the quiet 2-core machine (two:
11.1 s) and in 27.5 s beside two busy loops (two: 75.1 s, their barrier waiting on each
other; beside the full run and the loops one call of two threads passed 600 s)."""
LOCAL_MODEL_ROLLOUT = 600.0
"""Seconds a local-model test's rollout may start model calls for (its Budget)."""
LOCAL_MODEL_CALL = 600.0
"""Seconds one model call of a local-model test may take (its client's timeout)."""
HANG_GUARDS = {"local-model": LOCAL_MODEL_START + LOCAL_MODEL_ROLLOUT + LOCAL_MODEL_CALL + 60}
"""A lane's hang guard where the suite's (pyproject's ``timeout``, 600 s) is shorter than
what its tests' own bounds allow: a local-model test bounds its server's start, its rollout
and the call in flight when the rollout's time ends, and on a loaded machine (two busy
loops beside the suite) it ran past 600 s, when the guard ended its worker process as a
hang. A test's own ``timeout`` marker still wins."""
CLUSTER_FIXTURES = frozenset({"ray_cluster", "cluster_server", "rig"})
SERVER_FIXTURES = frozenset({"memex_server"})
"""Fixtures that run a server in processes of its own (the session's ``memex serve``): a test
on one is in the slow lane (and marked ``slow``), as the pool and remote backends are."""


def uses_cluster(item: pytest.Item) -> bool:
    """Whether the test stands on the cluster's fixtures (so it needs Ray, marked or not)."""
    return bool(set(getattr(item, "fixturenames", ())) & CLUSTER_FIXTURES)


def uses_server(item: pytest.Item) -> bool:
    """Whether the test stands on a server of its own processes (so it is slow, marked or
    not)."""
    return bool(set(getattr(item, "fixturenames", ())) & SERVER_FIXTURES)


def lane_of(item: pytest.Item) -> str:
    if item.get_closest_marker("local_llm"):
        return "local-model"
    if item.get_closest_marker("pypi"):
        return "package-index"
    if item.get_closest_marker("soak"):  # runs for a set time, whatever else it uses
        return "soak"
    if item.get_closest_marker("ray") or uses_cluster(item):
        return "cluster"
    return "slow" if item.get_closest_marker("slow") or uses_server(item) else "fast"


HYPOTHESIS_PROFILES = {"full": 100, "quick": 25}
"""Each run's Hypothesis profile (``MEMEX_HYPOTHESIS_PROFILE``: ``./build.sh quick`` loads
``quick``, every other run ``full``) and its ``max_examples``, the scale of each test's own
number of examples (:func:`examples`): a quick run tries a quarter of what the full run
does, derandomized (the fast lane finds the same examples every run); the full run tries
each test's number as written, otherwise as Hypothesis' own default (on CI its ``ci``
profile: derandomized, no database)."""
PROFILE_VARIABLE = "MEMEX_HYPOTHESIS_PROFILE"


def load_hypothesis_profile() -> str:
    """Register the profiles and load the run's (tests/conftest.py, before any test module
    makes its settings): its name."""
    from hypothesis import settings

    base = settings.default  # Hypothesis' own: its "ci" profile on CI (derandomized, no database)
    for name, most in HYPOTHESIS_PROFILES.items():
        settings.register_profile(name, parent=base, max_examples=most,
                                  derandomize=name == "quick" or base.derandomize)
    name = os.environ.get(PROFILE_VARIABLE) or "full"
    if name not in HYPOTHESIS_PROFILES:
        raise pytest.UsageError(f"{PROFILE_VARIABLE}={name!r}: one of "
                                f"{', '.join(HYPOTHESIS_PROFILES)}")
    settings.load_profile(name)
    return name


def examples(n: int) -> int:
    """A test's ``n`` examples in the loaded profile (``n`` in ``full``)."""
    from hypothesis import settings

    return max(1, n * settings.default.max_examples // HYPOTHESIS_PROFILES["full"])


DOC_BLOCKS = "tests/test_docs.py::test_the_docs_python_runs["
"""The node ids of the docs' blocks: ``...[<document>:<line>]``."""


RAY_UNIT = "tests that use Ray"
"""The unit of work every test that uses Ray goes to a worker in."""


def unit_of(nodeid: str, ray_tests: frozenset[str] = frozenset()) -> str:
    """The unit of work a test goes to a worker in: one document's blocks together (a block
    may use names an earlier one defined, and a ``skip: next`` directive is an example that
    must run just before the block it skips, in the same process); every test that uses Ray
    (``ray_tests``: marked ``ray`` or on the cluster's fixtures) together, so one worker
    starts the session's Ray cluster, its front and a Ray backend, not each worker its own
    (two Ray clusters on two cores slow every test beside them); any other test alone."""
    if nodeid.startswith(DOC_BLOCKS):
        return nodeid.rsplit(":", 1)[0]
    if nodeid in ray_tests:
        return RAY_UNIT
    return nodeid
