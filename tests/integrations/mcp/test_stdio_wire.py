"""``memex mcp``'s own stdio wire (memex/integrations/mcp/_stdio.py): lines read in the event
loop, whatever the chunks the pipe hands over, bounded; and the server over it, against a raw
pipe, a regular file as stdout (the SDK's transport then), and a handler that prints."""

from __future__ import annotations

import asyncio
import itertools
import json
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memex.integrations.mcp._stdio import OVERLONG, Lines

LIMIT = 64
MEMEX = shutil.which("memex", path=str(Path(sys.executable).parent)) or "memex"


def read_all(chunks: list[bytes], limit: int = LIMIT) -> list[str]:
    async def go() -> list[str]:
        reader = asyncio.StreamReader()
        for c in chunks:
            reader.feed_data(c)
        reader.feed_eof()
        return [line async for line in Lines(reader, limit)]
    return asyncio.run(go())


def expected(lines: list[bytes], last_newline: bool, limit: int = LIMIT) -> list[str]:
    out = []
    for i, line in enumerate(lines):
        if i == len(lines) - 1 and not last_newline and not line:
            break  # no bytes after the last newline: no line
        out.append(OVERLONG if len(line) > limit else line.decode("utf-8", "replace"))
    return out


line_bytes = st.binary(max_size=3 * LIMIT).filter(lambda b: b"\n" not in b) | \
    st.text(max_size=40).map(lambda t: t.replace("\n", " ").encode())


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(line_bytes, min_size=1, max_size=8), last_newline=st.booleans(),
       cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=12))
def test_lines_come_out_whole_whatever_the_chunks(lines: list[bytes], last_newline: bool,
                                                  cuts: list[int]) -> None:
    data = b"\n".join(lines) + (b"\n" if last_newline else b"")
    points = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    chunks = [data[a:b] for a, b in itertools.pairwise(points) if b > a]
    assert read_all(chunks) == expected(lines, last_newline)


def test_a_line_far_over_the_bound_is_dropped_as_it_comes_and_reads_as_overlong() -> None:
    big = b"x" * (1 << 20)
    chunks = [b'{"a": 1}\n'] + [big[i:i + 4096] for i in range(0, len(big), 4096)] + \
        [b'\n{"b": 2}\n']
    assert read_all(chunks, limit=10_000) == ['{"a": 1}', OVERLONG, '{"b": 2}']
    # positive control: under a bound that holds it, the same line comes out whole
    assert read_all(chunks, limit=2 << 20)[1] == big.decode()


def test_undecodable_bytes_are_replaced_as_the_sdk_reads_them() -> None:
    assert read_all([b"caf\xc3", b"\xa9 \xff\n"]) == ["caf\u00e9 \ufffd"]


# ---- the server over it ---------------------------------------------------------------------
def _init(rid: int = 1) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": rid, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"}}})


def _cell(rid: int, code: str) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {
        "name": "run_python", "arguments": {"code": code}}})


INITIALIZED = json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"})


@pytest.mark.slow
def test_over_a_pipe_a_long_line_is_refused_and_stray_output_misses_the_wire(
        tmp_path: Path) -> None:
    (tmp_path / "noisy.py").write_text(textwrap.dedent('''
        import os, sys

        def shout(word: str) -> str:
            """Print to the process's stdout three ways, then answer."""
            print("stray print", word)
            sys.stdout.flush()
            os.write(1, b"stray write\\n")
            return word.upper()
    '''))
    (tmp_path / "memex-mcp.toml").write_text(
        'tools = ["noisy:shout"]\n\n[http]\nmax_request_bytes = 4096\n')
    p = subprocess.Popen([MEMEX, "mcp", "--config", str(tmp_path / "memex-mcp.toml")],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stdin is not None and p.stdout is not None
    try:
        def send(line: str) -> dict[str, Any]:
            assert p.stdin is not None and p.stdout is not None
            p.stdin.write(line + "\n")
            p.stdin.flush()
            answer: dict[str, Any] = json.loads(p.stdout.readline())  # each line is JSON
            return answer

        assert send(_init())["id"] == 1
        p.stdin.write(INITIALIZED + "\n")
        long_cell = _cell(2, "x = '" + "a" * 5000 + "'")
        assert send(long_cell)["error"]["code"] == -32700  # over 4096 bytes: not read
        # positive control: a cell just under the bound runs
        ok = send(_cell(3, "x = '" + "a" * 3900 + "'\nlen(x)"))
        assert ok["result"]["structuredContent"]["value"] == "3900"
        r = send(_cell(4, "shout('hi')"))
        assert r["id"] == 4 and r["result"]["structuredContent"]["value"] == "'HI'"
    finally:
        p.stdin.close()
        assert p.wait(30) == 0
        rest = p.stdout.read()
        err = p.stderr.read() if p.stderr else ""
    assert rest == ""  # nothing after the last answer: the stray output went to stderr
    assert "stray print hi" in err and "stray write" in err


@pytest.mark.slow
def test_with_a_file_for_stdout_the_sdk_transport_serves(tmp_path: Path) -> None:
    answers_file = tmp_path / "answers.jsonl"
    with answers_file.open("wb") as stdout:
        p = subprocess.Popen([MEMEX, "mcp"], stdin=subprocess.PIPE, stdout=stdout,
                             stderr=subprocess.DEVNULL)
        assert p.stdin is not None
        try:
            p.stdin.write("\n".join([_init(), INITIALIZED, _cell(2, "6 * 7")]).encode() + b"\n")
            p.stdin.flush()
            deadline = time.monotonic() + 120
            while answers_file.read_text().count("\n") < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            p.stdin.close()
            assert p.wait(30) == 0
    answers = [json.loads(line) for line in answers_file.read_text().splitlines()]
    assert [a["id"] for a in answers] == [1, 2]
    assert answers[1]["result"]["structuredContent"]["value"] == "42"


def test_the_wire_is_only_taken_for_pipes_and_sockets(tmp_path: Path) -> None:
    code = textwrap.dedent('''
        import asyncio, sys
        from memex.integrations.mcp._stdio import wire

        async def main():
            async with wire(100) as (lines, out):
                print(lines is not None, out is not None, file=sys.stderr)

        asyncio.run(main())
    ''')
    f = tmp_path / "in.txt"
    f.write_text("")
    with f.open("rb") as stdin:
        from_file = subprocess.run([sys.executable, "-c", code], stdin=stdin,
                                   capture_output=True, text=True, timeout=60)
    piped = subprocess.run([sys.executable, "-c", code], input="", capture_output=True,
                           text=True, timeout=60)
    assert from_file.stderr.strip() == "False False", from_file.stderr
    assert piped.stderr.strip() == "True True", piped.stderr
