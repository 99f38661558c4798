"""One lifecycle for the four sandbox handles (SandboxHandle): close once, the context
manager, closing a forgotten handle on collection only where the handle owns the guest."""

from __future__ import annotations

import gc

import pytest

from memex.backends.internal import ProcessSandbox, RaySandbox, RemoteSandbox
from memex.runtime_wasm import Sandbox
from memex.runtime_wasm.internal import SandboxHandle


class _Counting(SandboxHandle):
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def _shutdown(self, reason: str) -> None:
        if self._closed_reason is not None:
            return
        self._closed_reason = reason
        self.log.append(reason)


class _Remote(_Counting):
    close_on_collect = False


def test_close_runs_once_and_the_context_manager_closes() -> None:
    log: list[str] = []
    with _Counting(log) as h:
        assert not h.closed
    assert h.closed and log == ["closed"]
    h.close()
    h.close()
    assert log == ["closed"]


@pytest.mark.slow
def test_a_forgotten_handle_is_closed_on_collection_where_it_owns_the_guest() -> None:
    log: list[str] = []
    _Counting(log)
    gc.collect()
    assert log == ["garbage collected"]
    _Remote(log)
    gc.collect()
    assert log == ["garbage collected"]  # not for a handle whose sandbox lives elsewhere


def test_every_handle_takes_its_lifecycle_from_the_base() -> None:
    for cls in (Sandbox, ProcessSandbox, RaySandbox, RemoteSandbox):
        assert issubclass(cls, SandboxHandle)
        own = {"close", "closed", "__enter__", "__exit__", "__del__"} & set(vars(cls))
        assert own == set(), f"{cls.__name__} writes its own {sorted(own)}"
        assert "_shutdown" in vars(cls)
    assert (Sandbox.close_on_collect, ProcessSandbox.close_on_collect,
            RaySandbox.close_on_collect, RemoteSandbox.close_on_collect) == (
        True, True, False, False)


def test_a_real_sandbox_closes_once_through_the_base() -> None:
    with Sandbox() as sb:
        assert sb.run("1 + 1").value == "2"
    assert sb.closed
    sb.close()
    assert "closed" in repr(sb)
