"""The keeper's eviction of an idle session is one step to whoever looks: from the moment
the session is no longer live, it says why (a flake of the full run: a GET between the
sandbox's going and its notice saw ``live`` false and ``restored`` empty)."""

from __future__ import annotations

from typing import Any

from memex.runtime_wasm import SANDBOX_LIMITS, Door
from memex.serving import DurableSession, Keeper, SessionTable


class _Slow:
    """A sandbox whose close looks at the session as a concurrent reader would."""

    def __init__(self) -> None:
        self.seen: list[tuple[bool, Any]] = []
        self.session: DurableSession | None = None

    def close(self) -> None:
        s = self.session
        assert s is not None
        self.seen.append((s.sandbox is not None, s.notice))


def test_an_evicted_session_says_why_before_its_sandbox_is_closed() -> None:
    table: SessionTable[DurableSession] = SessionTable(capacity=4)
    keeper: Keeper[DurableSession] = Keeper(
        table, lambda: None,  # type: ignore[arg-type,return-value]
        make=lambda meta: None,  # type: ignore[arg-type,return-value]
        state_dir=None, save_interval=30.0, idle_evict=0.5)
    sb = _Slow()
    s = DurableSession(id="s1", owner="a", limits=SANDBOX_LIMITS, door=Door(),
                       sandbox=sb)  # type: ignore[arg-type]
    sb.session = s
    s.gen = s.saved_gen = 1  # nothing unsaved: eviction needs no save
    keeper._evict(s)
    assert s.sandbox is None
    [(live, notice)] = sb.seen  # what a reader saw while the sandbox was being closed
    assert not live and notice is not None and notice["reason"].startswith("evicted")
    # control: a session in use is not evicted, and keeps its sandbox and no notice
    other = _Slow()
    t = DurableSession(id="s2", owner="a", limits=SANDBOX_LIMITS, door=Door(),
                       sandbox=other, running=1)  # type: ignore[arg-type]
    other.session = t
    t.gen = t.saved_gen = 1
    keeper._evict(t)
    assert t.sandbox is other and t.notice is None and other.seen == []
