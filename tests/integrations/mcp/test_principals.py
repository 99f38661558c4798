"""``[principals.NAME]`` in ``memex mcp``'s config: serve.toml's tenant schema, one
authentication with the tokens of ``--token-env`` (keys kept hashed), and every bound of the
table enforced for that principal alone."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult

from memex.integrations.mcp import Sessions, load_config
from memex.serving import hash_key

MEMEX = shutil.which("memex", path=str(Path(sys.executable).parent)) or "memex"
CI_KEY = "ci-key-0123456789abcdef"


def _config(tmp_path: Path) -> Path:
    f = tmp_path / "mcp.toml"
    f.write_text(f"""\
[sessions]
total_sessions = 8
max_sessions_per_token = 3
[principals.ci]
keys = ["{hash_key(CI_KEY)}"]
max_sessions = 1
ceiling = {{ memory = "256M", timeout = 10 }}
""")
    return f


def test_a_named_principal_gets_its_own_bounds_and_others_the_per_token_ones(
        tmp_path: Path) -> None:
    sessions = Sessions(load_config(_config(tmp_path)))
    try:
        ci = sessions.own("ci")
        anyone = sessions.own("token:0123")
        assert (ci.limits.memory, ci.limits.timeout) == (256 << 20, 10.0)
        assert anyone.limits.memory == 1 << 30  # positive control: the server's limits
        assert (ci.bounds.max_sessions, anyone.bounds.max_sessions) == (1, 3)
        first = sessions.resolve(None, key=None, owner="ci")
        assert first.limits.memory == 256 << 20  # a session of ci's has ci's limits
        second = sessions.resolve(None, key=None, owner="ci")  # at its bound of 1: room
        assert sessions.table.get("ci", first.id) is None  # made from ci's own session
        assert sessions.table.get("ci", second.id) is second
        others = [sessions.resolve(None, key=None, owner="token:x") for _ in range(3)]
        assert all(sessions.table.get("token:x", s.id) is s for s in others)  # 3 for them
    finally:
        sessions.close()


def _call(url: str, key: str) -> CallToolResult | int:
    async def go() -> CallToolResult:
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"},
                                      timeout=None) as h, \
                Client(streamable_http_client(url, http_client=h)) as client:
            r: CallToolResult = await client.call_tool("run_python", {"code": "6 * 7"})
            return r
    try:
        result: CallToolResult = anyio.run(go)
    except BaseException:  # the client fails its handshake on a 401 (an exception group)
        r = httpx2.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                        headers={"Authorization": f"Bearer {key}",
                                 "Accept": "application/json, text/event-stream"})
        return r.status_code
    return result


@pytest.mark.slow
def test_a_principals_key_and_a_token_both_authenticate_over_http(tmp_path: Path) -> None:
    env = {**os.environ, "MEMEX_TEST_TOKENS": "tok-a-0123456789"}
    p = subprocess.Popen([MEMEX, "mcp", "--http", "--port", "0", "--config",
                          str(_config(tmp_path)), "--token-env", "MEMEX_TEST_TOKENS"],
                         stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert p.stderr is not None
        line = p.stderr.readline()
        assert "serving http://127.0.0.1:" in line, line
        url = line.split("serving ", 1)[1].split(" ", 1)[0]
        for key in (CI_KEY, "tok-a-0123456789"):
            got: Any = _call(url, key)
            assert isinstance(got, CallToolResult) and not got.is_error, got
            assert (got.structured_content or {})["value"] == "42"
        assert _call(url, "not-a-key-0123456789") == 401
        assert _call(url, hash_key(CI_KEY)) == 401  # the stored hash is no key
    finally:
        p.terminate()
        assert p.wait(30) == 0


@pytest.mark.slow
def test_sighup_takes_a_rotated_key_and_new_bounds(tmp_path: Path) -> None:
    """SIGHUP reads the config again: a principal's rotated key works from then on and the
    old one gets 401 (the control: before the signal, the old key works)."""
    config = _config(tmp_path)
    p = subprocess.Popen([MEMEX, "mcp", "--http", "--port", "0", "--config", str(config)],
                         stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stderr is not None
        line = p.stderr.readline()
        url = line.split("serving ", 1)[1].split(" ", 1)[0].rstrip(";")
        new_key = CI_KEY[::-1]
        config.write_text(config.read_text().replace(hash_key(CI_KEY), hash_key(new_key)))
        assert isinstance(_call(url, CI_KEY), CallToolResult)  # not read yet
        p.send_signal(signal.SIGHUP)
        said = p.stderr.readline()
        assert "SIGHUP: principals and bounds read again" in said, said
        assert _call(url, CI_KEY) == 401
        got: Any = _call(url, new_key)
        assert isinstance(got, CallToolResult) and not got.is_error, got
        config.write_text("[sessions]\nmax_sessions = 3\n")  # a config that does not load
        p.send_signal(signal.SIGHUP)
        said = p.stderr.readline()
        assert "the config is not taken" in said and "total_sessions" in said, said
        assert isinstance(_call(url, new_key), CallToolResult)  # the running one kept
    finally:
        p.terminate()
        assert p.wait(30) == 0


def test_the_http_table_sets_the_connection_edge(tmp_path: Path) -> None:
    """``[http]`` takes serve's ``[server]`` edge keys (one declaration of them): what is set
    is taken, the rest keep the edge's defaults, and a bad value names its key."""
    from memex import ConfigError
    from memex.serving import EdgeLimits

    f = tmp_path / "mcp.toml"
    f.write_text('[http]\nheader_timeout = "1500ms"\nmax_pending_per_peer = 4\n')
    edge = load_config(f).http.edge
    assert (edge.header_timeout, edge.max_pending_per_peer) == (1.5, 4)
    assert edge.body_timeout == EdgeLimits().body_timeout
    f.write_text("[http]\nmax_pending = 0\n")
    with pytest.raises(ConfigError, match=r"mcp.toml: http.max_pending: "):
        load_config(f)
