"""``Sandbox.interrupt()``: the running turn stops (``killed``/``cancelled``) and is rolled
back; the sandbox stays open; an interrupt with no turn running, or one that arrives as a
turn ends, never reaches a later turn."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from memex import Limits, Sandbox, TurnStatus


def _later(seconds: float, fn: Callable[[], object]) -> threading.Thread:
    t = threading.Thread(target=lambda: (time.sleep(seconds), fn()), daemon=True)
    t.start()
    return t


def test_interrupt_stops_a_busy_turn_and_rolls_it_back(make_sandbox: Callable[..., Sandbox]
                                                       ) -> None:
    sb = make_sandbox(limits=Limits(timeout=30))
    assert sb.run("x = 41").ok
    answered: list[bool] = []
    t = _later(0.5, lambda: answered.append(sb.interrupt()))
    start = time.monotonic()
    r = sb.run("while True:\n    x += 1")
    took = time.monotonic() - start
    t.join()
    assert answered == [True]
    assert r.status is TurnStatus.KILLED and r.limit == "cancelled" and r.rolled_back
    assert "interrupted" in (r.trap or "")
    assert took < 10, took  # not the 30 s deadline
    assert sb.run("x").value == "41"
    assert not sb.closed


def test_interrupt_wakes_a_sleeping_guest(make_sandbox: Callable[..., Sandbox]) -> None:
    sb = make_sandbox(limits=Limits(timeout=30))
    t = _later(0.3, sb.interrupt)
    r = sb.run("import time\ntime.sleep(20)")
    t.join()
    assert r.limit == "cancelled" and r.rolled_back
    assert sb.run("1 + 1").value == "2"


def test_interrupt_without_a_turn_does_nothing(sandbox: Sandbox) -> None:
    assert sandbox.interrupt() is False
    assert sandbox.run("2 * 21").value == "42"
    sandbox.close()
    assert sandbox.interrupt() is False


@pytest.mark.slow
def test_an_interrupt_as_the_turn_ends_never_reaches_the_next_turn(sandbox: Sandbox) -> None:
    # Hammer interrupt() while short turns run: each turn either finishes or is cancelled
    # (and rolled back); once the hammering stops, no interrupt is left pending.
    stop = threading.Event()

    def hammer() -> None:
        while not stop.is_set():
            sandbox.interrupt()

    t = threading.Thread(target=hammer, daemon=True)
    t.start()
    try:
        outcomes = [sandbox.run("y = sum(range(1000))").status for _ in range(200)]
    finally:
        stop.set()
        t.join()
    assert set(outcomes) <= {TurnStatus.OK, TurnStatus.KILLED}
    assert sandbox.run("y").value == "499500"  # and nothing is left pending
    assert sandbox.run("'after'").value == "'after'"


def test_close_still_cancels_a_running_turn(make_sandbox: Callable[..., Sandbox]) -> None:
    sb = make_sandbox(limits=Limits(timeout=30))
    t = _later(0.3, sb.close)
    r = sb.run("while True: pass")
    t.join()
    assert r.limit == "cancelled" and "closed" in (r.trap or "")
    assert sb.closed
