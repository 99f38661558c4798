"""The progress notifications' bounds (memex/integrations/mcp/_progress.py), on the class
itself with a recorder for ``report_progress``; tests/integrations/mcp/test_server.py
checks them end to end with the MCP SDK's client."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from memex.integrations.mcp._progress import CHUNK, PENDING, Progress


class Recorder:
    def __init__(self) -> None:
        self.sent: list[tuple[float, float | None, str | None]] = []
        self.got = asyncio.Event()

    async def report_progress(self, progress: float, total: float | None = None,
                              message: str | None = None) -> None:
        self.sent.append((progress, total, message))
        self.got.set()


def test_a_flood_of_output_is_sent_in_chunks_and_the_excess_said_as_skipped() -> None:
    async def go() -> list[tuple[float, float | None, str | None]]:
        ctx: Any = Recorder()
        p = Progress(ctx)
        flood = threading.Thread(target=lambda: [p.heard("stdout", "x" * 1000)
                                                 for _ in range(1000)])  # 1 MB, from a thread
        flood.start()
        flood.join()
        assert p.size == PENDING and p.skipped == 1000 * 1000 - PENDING  # held: bounded
        task = asyncio.create_task(p.pump())
        while sum(len(m or "") for _, _, m in ctx.sent) < PENDING:
            ctx.got.clear()
            await asyncio.wait_for(ctx.got.wait(), 30)
        task.cancel()
        return list(ctx.sent)

    sent = asyncio.run(go())
    messages = [m or "" for _, _, m in sent]
    assert all(len(m) <= CHUNK + 200 for m in messages), [len(m) for m in messages]
    assert f"[{1000 * 1000 - PENDING} characters of output not sent" in messages[0]
    assert sum(m.count("x") for m in messages) == PENDING
    progress = [p for p, _, _ in sent]
    assert progress == sorted(set(progress)) and all(t is None for _, t, _ in sent)
