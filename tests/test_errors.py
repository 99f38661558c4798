"""Every MemEx exception pickles whole: its type, message and attributes come back, whatever
its ``__init__`` takes. They cross processes (the subprocess and pool workers) and Ray: an
actor's ``BackendBusy(reason, message)`` reached the caller as Ray's
``UnserializableException`` (issue 47: the cluster's storage away was a 500, not a 503)."""

from __future__ import annotations

import inspect
import pickle

import pytest

import memex.errors as errors

SAMPLES: dict[type[BaseException], BaseException] = {
    errors.PolicyError: errors.PolicyError("no such action", source="p.toml", line=3,
                                           path="rules[0].action"),
    errors.SandboxClosed: errors.SandboxClosed("closed by its owner"),
    errors.SandboxLost: errors.SandboxLost("its node died"),
    errors.BackendBusy: errors.BackendBusy("unavailable", "the storage did not answer"),
    errors.ServiceError: errors.ServiceError("refused", status=503, code="unavailable"),
    errors.LLMError: errors.LLMError("no answer", attempts=3),
    errors.LLMResponseError: errors.LLMResponseError("bad body", status=502, attempts=2),
}
"""An instance of each class whose ``__init__`` is not ``(message)``; the others are made
with a message. A new class with arguments of its own needs an entry (the test says so)."""


def _classes() -> list[type[BaseException]]:
    found = [obj for _, obj in inspect.getmembers(errors, inspect.isclass)
             if issubclass(obj, errors.MemexError) and obj.__module__ == errors.__name__]
    assert len(found) > 20  # the control: the walk finds the tree
    return found


@pytest.mark.parametrize("cls", _classes(), ids=lambda c: c.__name__)
def test_every_memex_error_pickles_whole(cls: type[BaseException]) -> None:
    if cls in SAMPLES:
        exc = SAMPLES[cls]
    else:
        try:
            exc = cls("a message")
        except TypeError:
            pytest.fail(f"{cls.__name__} takes other arguments: add an instance to SAMPLES")
    exc.retry_after = 2.0  # type: ignore[attr-defined]  # set on a service's 429/503
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is cls
    assert str(back) == str(exc) and back.args == exc.args
    own = {k: v for k, v in vars(exc).items() if k != "issues"}
    assert {k: v for k, v in vars(back).items() if k != "issues"} == own
    if isinstance(exc, errors.PolicyError):  # it names itself among its issues
        assert back.issues == (back,)  # type: ignore[attr-defined]


def test_a_plain_subclass_with_arguments_would_not_have_pickled() -> None:
    """The positive control: what Python does for an exception whose ``__init__`` takes
    other arguments than its ``args`` (BackendBusy before it pickled whole)."""
    class Busy(Exception):
        def __init__(self, reason: str, message: str) -> None:
            super().__init__(message)
            self.reason = reason

    globals()["Busy"] = Busy  # findable by pickle
    Busy.__qualname__ = "Busy"
    try:
        with pytest.raises(TypeError):
            pickle.loads(pickle.dumps(Busy("unavailable", "the storage did not answer")))
    finally:
        del globals()["Busy"]
