"""``memex mcp``'s own stdio wire (memex/integrations/mcp/_stdio.py): lines read in the event
loop, whatever the chunks the pipe hands over, bounded; taken only for pipes and sockets. The
server over it: test_server.py."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
import textwrap
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from lanes import examples

from memex.integrations.mcp._stdio import OVERLONG, Lines

LIMIT = 64


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


@settings(max_examples=examples(300), deadline=None)
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
