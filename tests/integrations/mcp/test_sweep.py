"""The MCP server's sweep ends a session whose sandbox closed itself (a guest that could not
be restored after a trap), not only idle ones: neither holds its token's quota."""

from __future__ import annotations

import time

from memex.integrations.mcp import Sessions, load_config


def test_a_session_whose_sandbox_closed_is_ended_by_the_sweep() -> None:
    sessions = Sessions(load_config(sessions={"idle_timeout": 2.0}))  # sweeps every 0.5 s
    try:
        dead = sessions.resolve(None, key="a", owner="t")
        alive = sessions.resolve(None, key="b", owner="t")
        sessions.run(dead, "x = 1", None)
        sessions.run(alive, "x = 1", None)
        assert dead.sandbox is not None
        dead.sandbox.close()  # what a sandbox that ended itself looks like to the server
        deadline = time.monotonic() + 1.5  # well inside the 2 s idle timeout
        while not dead.ended and time.monotonic() < deadline:
            time.sleep(0.05)
        assert dead.ended and sessions.table.get("t", dead.id) is None
        assert not alive.ended  # positive control: an open one stays
        assert sessions.run(alive, "x + 1", None)[0].value == "2"
    finally:
        sessions.close()
