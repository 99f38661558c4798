"""Fixtures for the executor tests: ``backend`` runs a test once per backend (in-process,
subprocess, pool and, when Ray is installed, Ray), ``open_sandbox`` opens sandboxes on it that
are closed when the test ends.

Backends are made once per session (starting worker processes or a Ray cluster is the slow
part) and closed at its end; a test that needs a backend of its own (fault tests) builds one.
Every backend runs real guests; the worker backends run them in real worker processes.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from memex import Limits
from memex.backends import Backend, get_backend
from memex.runtime_wasm import SandboxAPI

DEFAULT_TIMEOUT = 10.0
HAVE_RAY = importlib.util.find_spec("ray") is not None

BACKEND_KINDS = [
    "inprocess",
    "subprocess",
    "pool",
    pytest.param("ray", marks=[pytest.mark.ray, pytest.mark.skipif(
        not HAVE_RAY, reason="Ray is not installed (pip install 'memex[ray]')")]),
]

# Small but real settings: one or two workers (the machine has two cores).
BACKEND_OPTIONS: dict[str, dict[str, Any]] = {
    "inprocess": {},
    "subprocess": {"workers": 1},
    "pool": {"workers": 2, "warm": 2, "limits": Limits(timeout=DEFAULT_TIMEOUT)},
    "ray": {"actors": 2, "init_options": {"num_cpus": 2}},
}

OpenSandbox = Callable[..., SandboxAPI[Any]]


@pytest.fixture(scope="session")
def _session_backends() -> Iterator[dict[str, Backend]]:
    made: dict[str, Backend] = {}
    yield made
    for b in made.values():
        b.close()


@pytest.fixture(params=BACKEND_KINDS)
def backend(request: pytest.FixtureRequest, _session_backends: dict[str, Backend]) -> Backend:
    """Each backend in turn (shared for the session; do not close it in a test)."""
    kind = str(request.param)
    b = _session_backends.get(kind)
    if b is None or b.closed:
        b = _session_backends[kind] = get_backend(kind, **BACKEND_OPTIONS[kind])
    return b


@pytest.fixture
def open_sandbox(backend: Backend) -> Iterator[OpenSandbox]:
    """Open sandboxes on ``backend`` (default turn deadline 10 s); all closed at the end."""
    made: list[SandboxAPI[Any]] = []

    def open_(**kwargs: Any) -> SandboxAPI[Any]:
        kwargs.setdefault("limits", Limits(timeout=DEFAULT_TIMEOUT))
        sb = backend.open(**kwargs)
        made.append(sb)
        return sb

    yield open_
    for sb in made:
        sb.close()
