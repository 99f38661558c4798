"""Shared fixtures for the MemEx test suite.

Every test runs real guests (CPython on WASI under wasmtime) from the precompiled modules in
the cache. Tests never compile a module: a missing module stops the session with the command
that builds it, and ``compile_module`` is replaced by a tripwire for the whole session.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

import memex.runtime_wasm as rw
import memex.runtime_wasm._engine as _engine
from memex import Limits, ModuleCacheMissing, Sandbox

# Short per-turn deadline for ordinary tests: a hung guest fails a test in seconds, not 30 s.
DEFAULT_TIMEOUT = 10.0


def _no_compile(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("tests must never compile the guest module (compile_module called)")


@pytest.fixture(scope="session", autouse=True)
def _precompiled_modules_only() -> Iterator[None]:
    """Refuse to compile and require both precompiled flavours before any test runs."""
    mp = pytest.MonkeyPatch()
    mp.setattr(_engine, "compile_module", _no_compile)
    mp.setattr(rw, "compile_module", _no_compile)
    try:
        for flavour in ("plain", "metered"):
            if not _engine.module_path(flavour).is_file():
                pytest.exit(
                    f"no precompiled {flavour} guest module in the cache: run `memex prepare` "
                    "once on this machine before running the tests",
                    returncode=4,
                )
            try:
                _engine.load_module(flavour)
            except ModuleCacheMissing as exc:  # pragma: no cover - guarded above
                pytest.exit(str(exc), returncode=4)
        yield
    finally:
        mp.undo()


@pytest.fixture
def make_sandbox() -> Iterator[Callable[..., Sandbox]]:
    """Factory for sandboxes that are all closed when the test ends (default timeout 10 s)."""
    created: list[Sandbox] = []

    def make(**kwargs: Any) -> Sandbox:
        kwargs.setdefault("limits", Limits(timeout=DEFAULT_TIMEOUT))
        sb = Sandbox(**kwargs)
        created.append(sb)
        return sb

    yield make
    for sb in created:
        sb.close()


@pytest.fixture
def sandbox(make_sandbox: Callable[..., Sandbox]) -> Sandbox:
    """A fresh sandbox with a 10 s turn deadline, closed after the test."""
    return make_sandbox()


@pytest.fixture(scope="module")
def shared_sandbox() -> Iterator[Sandbox]:
    """One sandbox for a whole module, for tests that only read from a fresh-enough guest."""
    sb = Sandbox(limits=Limits(timeout=DEFAULT_TIMEOUT))
    yield sb
    sb.close()
