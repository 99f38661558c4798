"""``memex mcp``'s sessions under their bounds: a principal at its own
``max_sessions_per_token`` has its least recently used idle session put away for a new one
(saved first and brought back by its handle when the server keeps state; ended when it
does not), and a server filled by one principal makes room for another the same way. Clients
that run a cell and go quiet, or stateless clients that never name a session, therefore lock
nobody out. In use is never put away."""

from __future__ import annotations

from pathlib import Path

import pytest

from memex.integrations.mcp import SessionError, Sessions, load_config


def _sessions(tmp_path: Path | None, **bounds: object) -> Sessions:
    cfg = {"idle_timeout": 300.0, **bounds}
    if tmp_path is not None:
        cfg |= {"state_dir": str(tmp_path / "state"), "save_interval": 3600.0}
    return Sessions(load_config(sessions=cfg))


def test_a_principal_at_its_bound_gives_up_its_own_oldest_idle_session(tmp_path: Path) -> None:
    """Durable: the oldest is saved, put away, and its handle brings it back (then the
    next oldest gives way); another principal is never touched."""
    sessions = _sessions(tmp_path, total_sessions=8, max_sessions_per_token=2)
    try:
        other = sessions.resolve(None, key=None, owner="B")
        sessions.run(other, "mine = 'b'", None)
        first = sessions.resolve(None, key=None, owner="A")
        sessions.run(first, "x = 1", None)
        second = sessions.resolve(None, key=None, owner="A")
        sessions.run(second, "x = 2", None)
        third = sessions.resolve(None, key=None, owner="A")  # A is at 2: first gives way
        sessions.run(third, "x = 3", None)
        assert sessions.table.get("A", first.id) is None and first.sandbox is None
        assert {s.id for s in sessions.table.of("A")} == {second.id, third.id}
        back = sessions.resolve(first.id, key=None, owner="A")  # named: brought back
        assert back.id == first.id
        assert sessions.run(back, "x", None)[0].value == "1"  # from its save
        assert sessions.table.get("A", second.id) is None  # the oldest idle one now
        assert sessions.run(sessions.resolve(second.id, key=None, owner="A"), "x",
                            None)[0].value == "2"
        with pytest.raises(SessionError, match="no session"):  # not B's to bring back
            sessions.resolve(first.id, key=None, owner="B")
        assert sessions.run(other, "mine", None)[0].value == "'b'"  # the control
        # a principal that keeps making sessions keeps at most its bound of them put away
        # in the store (the oldest forgotten): it cannot fill the server's disk
        made = [sessions.resolve(None, key=None, owner="A") for _ in range(4)]
        for s in made:
            sessions.run(s, "1", None)
        rows = {r.id for r in sessions.keeper.store().sessions()}
        assert len([sid for sid in rows if sid != other.id]) == 4  # 2 live + 2 put away
        assert made[-1].id in rows and first.id not in rows
    finally:
        sessions.close()


def test_without_state_the_oldest_idle_session_ends_and_in_use_is_never_taken() -> None:
    sessions = _sessions(None, total_sessions=8, max_sessions_per_token=2)
    try:
        first = sessions.resolve(None, key=None, owner="A")
        busy = sessions.resolve(None, key=None, owner="A")
        sessions.run(first, "x = 1", None)
        with busy.cond:  # busy is in use: a call of it is running
            busy.running += 1
        try:
            third = sessions.resolve(None, key=None, owner="A")
            assert first.ended and sessions.table.get("A", first.id) is None
            with pytest.raises(SessionError, match="no session"):
                sessions.resolve(first.id, key=None, owner="A")
            with pytest.raises(SessionError, match="holds 2 sessions"):  # third is idle
                with third.cond:
                    third.running += 1
                try:
                    sessions.resolve(None, key=None, owner="A")
                finally:
                    with third.cond:
                        third.running -= 1
        finally:
            with busy.cond:
                busy.running -= 1
        assert not busy.ended  # the control: what was in use stayed
    finally:
        sessions.close()


def test_a_server_filled_by_one_principal_makes_room_for_another() -> None:
    """Stateless clients of one token filled the server's 3 sessions (no per-token bound):
    another token's first call takes the place of the filler's oldest idle session; the
    filler, holding no more than the newcomer, is then not asked to give way again by it
    (the newcomer at parity is refused)."""
    sessions = _sessions(None, total_sessions=3)
    try:
        fill = [sessions.resolve(None, key=None, owner="A") for _ in range(3)]
        for i, s in enumerate(fill):
            sessions.run(s, f"n = {i}", None)
        b1 = sessions.resolve(None, key=None, owner="B")
        assert fill[0].ended and not fill[1].ended and not fill[2].ended
        b2 = sessions.resolve(None, key=None, owner="B")  # A still holds 2 > B's 1
        assert fill[1].ended and b1.id != b2.id
        with pytest.raises(SessionError, match="maximum of 3"):  # A 1, B 2: B is not owed
            sessions.resolve(None, key=None, owner="B")
        assert sessions.run(fill[2], "n", None)[0].value == "2"  # the control
    finally:
        sessions.close()
