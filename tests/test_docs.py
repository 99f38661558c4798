"""The docs' code runs: every Python block of README.md and docs/*.md is parsed by Sybil and
run here, in order, each file's blocks sharing one namespace, or is marked in the document
as an excerpt with its reason (``<!-- skip: next "excerpt: ..." -->``, reported as a skip
with that reason). A user's first copy-paste is then one this suite ran.

The blocks run in a folder of their own holding ``data/x.csv`` (README's ``## Use`` reads it),
so what they write (``session.img``) lands there."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lanes import unit_of
from sybil import Example, Sybil
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SYBIL = Sybil(parsers=[PythonCodeBlockParser(), SkipParser()])
_PARSED: dict[Path, list[Example]] = {}


def _examples(path: Path) -> list[Example]:
    """A document's examples, parsed once, so its blocks share one namespace in order."""
    if path not in _PARSED:
        _PARSED[path] = list(SYBIL.parse(path))
    return _PARSED[path]


def _cases() -> Iterator[Any]:
    for path in DOCS:
        for ex in _examples(path):
            # the id's "<document>:" prefix keeps a document's blocks on one worker, in order
            # (tests/conftest.py's scheduler)
            yield pytest.param(path, ex, id=f"{path.relative_to(ROOT)}:{ex.line}")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    where = tmp_path_factory.mktemp("docs")
    (where / "data").mkdir()
    (where / "data" / "x.csv").write_text("a,b\n1,2\n3,4\n5,6\n")
    before = os.getcwd()
    os.chdir(where)
    try:
        yield where
    finally:
        os.chdir(before)


@pytest.mark.parametrize(("path", "example"), list(_cases()))
def test_the_docs_python_runs(path: Path, example: Example, folder: Path) -> None:
    example.evaluate()


def test_every_block_runs_or_says_why_not() -> None:
    """A skip without a reason would pass silently: each names why the block is an excerpt.
    The control: the docs do run some blocks (README's ``## Use`` among them)."""
    skips = python_blocks = 0
    for path in DOCS:
        text = path.read_text()
        python_blocks += len(re.findall(r"^ *```python *$", text, re.M))
        for m in re.finditer(r"<!--\s*skip:\s*(\w+)(.*?)-->", text):
            skips += 1
            assert m.group(1) == "next", (path.name, m.group(0))
            assert re.fullmatch(r'\s*"excerpt: [^"]{10,}"\s*', m.group(2)), (path.name, m.group(0))
    code = [ex for p in DOCS for ex in _examples(p) if not isinstance(ex.parsed, tuple)]
    assert len(code) == python_blocks  # Sybil sees every block
    assert 0 < skips < python_blocks
    assert "Sandbox.load(" in str(code[0].parsed)  # README's ## Use, its first


def test_a_documents_blocks_are_one_unit_of_work() -> None:
    """On two workers a document's blocks run in one process, in order (conftest's
    scheduler): a skip directive and its block, or a block and the one that defined its names,
    would otherwise land on different workers. The control: other tests stay units of their
    own, and two documents are two units."""
    ids = [f"tests/test_docs.py::test_the_docs_python_runs[{c.id}]" for c in _cases()]
    readme = {unit_of(i) for i in ids if "[README.md:" in i}
    assert len(readme) == 1
    assert len({unit_of(i) for i in ids}) == sum(1 for p in DOCS if _examples(p)) > 5
    other = ["tests/test_docs.py::test_every_block_runs_or_says_why_not",
             "tests/test_layering.py::test_layers_import_only_downwards"]
    assert [unit_of(i) for i in other] == other
