"""``memex mcp --state-dir``: sessions kept by the session core's keeper (the one ``memex
serve`` uses) outlive a ``kill -9`` and a SIGTERM of the server, called again by their handle,
still bound to the token that made them; the first answer after says what came back."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult

MEMEX = shutil.which("memex", path=str(Path(sys.executable).parent)) or "memex"

TOKENS = {"MEMEX_TEST_TOKENS": "tok-a,tok-b"}


def _start(state: Path, *args: str) -> tuple[subprocess.Popen[str], str]:
    p = subprocess.Popen([MEMEX, "mcp", "--http", "--port", "0", "--token-env",
                          "MEMEX_TEST_TOKENS", "--state-dir", str(state), "--timeout", "30",
                          *args], stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, **TOKENS})
    assert p.stderr is not None
    line = p.stderr.readline()
    assert "serving http://127.0.0.1:" in line, line
    return p, line.split("serving ", 1)[1].split(" ", 1)[0]


def _call(url: str, tool: str, token: str = "tok-a", **args: Any) -> CallToolResult:
    async def go() -> CallToolResult:
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                      timeout=None) as h, \
                Client(streamable_http_client(url, http_client=h)) as client:
            result: CallToolResult = await client.call_tool(tool, args)
            return result
    result: CallToolResult = anyio.run(go)
    return result


def _value(r: CallToolResult) -> Any:
    assert not r.is_error, r.content
    return (r.structured_content or {})["value"]


def _saved(state: Path, sid: str) -> bool:
    with sqlite3.connect(state / "state.db") as db:
        row = db.execute("SELECT image IS NOT NULL OR image_file IS NOT NULL FROM sessions "
                         "WHERE id = ?", (sid,)).fetchone()
    return bool(row and row[0])


@pytest.mark.slow
def test_a_session_outlives_a_kill_9_and_a_reset_is_kept_as_reset(tmp_path: Path) -> None:
    state = tmp_path / "state"
    p, url = _start(state, "--save-interval", "0")
    try:
        r = _call(url, "run_python", code="x = 41\nopen('/tmp/kept.txt', 'w').write('yes')")
        sid = (r.structured_content or {})["session"]
        deadline = time.monotonic() + 30
        while not _saved(state, sid):
            assert time.monotonic() < deadline, "never saved"
            time.sleep(0.1)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(30)
    p, url = _start(state)
    try:
        r = _call(url, "run_python", session=sid, code="x + 1, open('/tmp/kept.txt').read()")
        assert _value(r) == "(42, 'yes')"
        restored = (r.structured_content or {})["restored"]
        assert restored["lost_turns"] == 0 and restored["files_kept"] is True
        assert "brought back" in r.content[0].text  # type: ignore[union-attr]
        again = _call(url, "run_python", session=sid, code="x")
        assert _value(again) == "41" and (again.structured_content or {})["restored"] is None
        other = _call(url, "run_python", token="tok-b", session=sid, code="x")
        assert other.is_error and "no session" in other.content[0].text  # type: ignore[union-attr]
        assert not _call(url, "reset", session=sid).is_error
        assert not _saved(state, sid)  # the reset took its saved image with it
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(30)
    p, url = _start(state)
    try:  # a reset session comes back reset, not as its save before the reset
        r = _call(url, "run_python", session=sid, code="x")
        assert r.is_error and "NameError" in r.content[0].text  # type: ignore[union-attr]
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(60) == 0


@pytest.mark.slow
def test_sigterm_saves_every_session(tmp_path: Path) -> None:
    state = tmp_path / "state"
    p, url = _start(state, "--save-interval", "3600")  # only the stop saves
    try:
        a = (_call(url, "run_python", code="a = 1").structured_content or {})["session"]
        b = (_call(url, "run_python", code="b = 2").structured_content or {})["session"]
        assert not _call(url, "reset", session=b).is_error
        assert not _saved(state, a)
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(60) == 0
    assert _saved(state, a)
    p, url = _start(state)
    try:
        assert _value(_call(url, "run_python", session=a, code="a")) == "1"
        r = _call(url, "run_python", session=b, code="b")
        assert r.is_error and "NameError" in r.content[0].text  # type: ignore[union-attr]
        r = _call(url, "run_python", session=b, code="import matplotlib; 'ok'")
        assert _value(r) == "'ok'"
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(60) == 0


@pytest.mark.slow
def test_an_ended_session_is_not_brought_back(tmp_path: Path) -> None:
    state = tmp_path / "state"
    p, url = _start(state, "--save-interval", "0", "--idle-timeout", "1")
    try:
        sid = (_call(url, "run_python", code="z = 3").structured_content or {})["session"]
        deadline = time.monotonic() + 30
        while True:  # ended after 1 s idle: its row goes with it
            with sqlite3.connect(state / "state.db") as db:
                rows = db.execute("SELECT count(*) FROM sessions WHERE id = ?",
                                  (sid,)).fetchone()[0]
            if rows == 0:
                break
            assert time.monotonic() < deadline, "the ended session's row stayed"
            time.sleep(0.2)
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(60) == 0
    p, url = _start(state)
    try:
        r = _call(url, "run_python", session=sid, code="z")
        assert r.is_error and "no session" in r.content[0].text  # type: ignore[union-attr]
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(60) == 0
