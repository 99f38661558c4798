"""`memex mcp`: a cell's PEP 723 block (`# /// script` with `dependencies`) gets its packages,
fetched by the server from the index pip is configured with (a package index on 127.0.0.1
here); a session that has run cells starts over to gain them, and says so."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp_types import CallToolResult
from package_index import PackageIndex, build_wheel, hostile_wheel, package_index


def block(*deps: str) -> str:
    inner = ", ".join(f'"{d}"' for d in deps)
    return f"# /// script\n# dependencies = [{inner}]\n# ///\n"


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PackageIndex]:
    w = tmp_path_factory.mktemp("wheels")
    build_wheel(w, "memexmcp-hello", "1.0", {"memexmcp_hello.py": "WORD = 'hello'\n"})
    build_wheel(w, "memexmcp-other", "2.0", {"memexmcp_other.py": "WORD = 'other'\n"})
    build_wheel(w, "memexmcp-native", "1.0", {"memexmcp_native.py": ""},
                tag="cp315-cp315-linux_x86_64")
    hostile_wheel(w, "memexmcp-evil", MARKER)
    with package_index(w) as idx:
        yield idx


MARKER = Path("/tmp") / f"memex-mcp-evil-{os.getpid()}"


@asynccontextmanager
async def server(index: PackageIndex, *args: str) -> AsyncIterator[Client]:
    import shutil
    import sys

    memex = shutil.which("memex", path=str(Path(sys.executable).parent)) or "memex"
    params = StdioServerParameters(command=memex, args=["mcp", *args],
                                   env={**os.environ, "PIP_INDEX_URL": index.url})
    async with Client(params) as client:
        yield client


async def call(c: Client, code: str) -> tuple[CallToolResult, str, dict[str, Any]]:
    r: CallToolResult = await c.call_tool("run_python", {"code": code})
    text = "\n".join(x.text for x in r.content if hasattr(x, "text"))
    return r, text, r.structured_content or {}


@pytest.mark.slow
def test_a_cells_dependencies_are_fetched_and_a_used_session_starts_over(
        index: PackageIndex) -> None:
    async def go() -> None:
        async with server(index) as c:
            r, text, out = await call(c, block("memexmcp-hello") +
                                      "import memexmcp_hello\nkept = memexmcp_hello.WORD\nkept")
            assert out["value"] == "'hello'" and "started over" not in text, text
            r, text, out = await call(c, block("memexmcp-hello") + "kept")  # has it: kept
            assert out["value"] == "'hello'" and "started over" not in text
            r, text, out = await call(c, block("memexmcp-other==2.0") +
                                      "import memexmcp_other, memexmcp_hello\n"
                                      "memexmcp_other.WORD, 'kept' in globals()")
            assert "started over to add memexmcp-other==2.0" in text, text
            assert out["value"] == "('other', False)"  # both packages; the old state gone
            r, text, out = await call(c, block("memexmcp-native") + "1")
            assert r.is_error and "no wheel of memexmcp-native runs in the guest" in text
            r, text, out = await call(c, block("memexmcp-evil") + "1")  # a path dependency
            assert r.is_error and "memexmcp-evil 1.0 depends on memexevil @ file://" in text
            assert not MARKER.exists()  # its build code never ran
            r, text, out = await call(c, "# /// script\n# dependencies = 3\n# ///\n1")
            assert r.is_error and "must be a list of strings" in text
    anyio.run(go)


@pytest.mark.slow
def test_an_operator_can_allow_no_packages(index: PackageIndex, tmp_path: Path) -> None:
    cfg = tmp_path / "mcp.toml"
    cfg.write_text("packages = []\n")

    async def go() -> None:
        async with server(index, "--config", str(cfg)) as c:
            r, text, _ = await call(c, block("memexmcp-hello") + "1")
            assert r.is_error and "does not allow" in text, text
            r, text, out = await call(c, "1 + 1")  # the positive control: cells still run
            assert out["value"] == "2"
    anyio.run(go)


@pytest.mark.slow
def test_sigterm_stops_a_cells_resolution_in_flight(tmp_path: Path) -> None:
    """A cell whose dependency comes from an index that trickles it: SIGTERM of `memex mcp`
    stops the download at once (the index had not sent the whole wheel) and the server
    exits, instead of waiting out the resolution."""
    import json
    import signal
    import subprocess
    import sys

    w = tmp_path / "wheels"
    w.mkdir()
    big = build_wheel(w, "memexmcp-slow", "1.0", {"memexmcp_slow/blob.bin": os.urandom(24 << 20)})
    with package_index(w) as idx:
        idx.slow.add(big.name)
        proc = subprocess.Popen([sys.executable, "-m", "memex", "mcp"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env={**os.environ, "PIP_INDEX_URL": idx.url})
        assert proc.stdin is not None and proc.stdout is not None
        msgs = [{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                    "protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": {"name": "t", "version": "1"}}},
                {"jsonrpc": "2.0", "method": "notifications/initialized"},
                {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
                    "name": "run_python",
                    "arguments": {"code": block("memexmcp-slow") + "import memexmcp_slow"}}}]
        try:
            proc.stdin.write(json.dumps(msgs[0]).encode() + b"\n")
            proc.stdin.flush()
            assert json.loads(proc.stdout.readline())["id"] == 1
            for m in msgs[1:]:
                proc.stdin.write(json.dumps(m).encode() + b"\n")
            proc.stdin.flush()
            while idx.sent.get(big.name, 0) == 0 and proc.poll() is None:
                anyio.run(anyio.sleep, 0.01)  # the download has started
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert idx.sent[big.name] < big.stat().st_size, idx.sent
