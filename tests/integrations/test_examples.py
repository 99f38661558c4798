"""Each framework example in examples/frameworks runs offline (its scripted model) and
reaches the expected answer through the real framework and a real sandbox."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

FOLDER = Path(__file__).resolve().parents[2] / "examples" / "frameworks"


@pytest.mark.parametrize("example", ["smolagents_executor.py", "pydantic_ai_code_mode.py",
                                     "openai_agents_code_mode.py", "fastmcp_code_mode.py",
                                     "jupyter_notebook.py"])
@pytest.mark.slow
def test_the_example_runs_and_answers(example: str) -> None:
    out = subprocess.run([sys.executable, str(FOLDER / example)], capture_output=True,
                         text=True, timeout=300, cwd=FOLDER)
    assert out.returncode == 0, out.stderr[-3000:]
    checked = [line for line in out.stdout.splitlines() if "(expected 'west 410')" in line]
    assert checked, out.stdout[-3000:]
    assert all(line.count("'west 410'") == 2 for line in checked), out.stdout[-3000:]


def test_every_example_is_tested() -> None:
    listed = {"smolagents_executor.py", "pydantic_ai_code_mode.py",
              "openai_agents_code_mode.py", "fastmcp_code_mode.py", "jupyter_notebook.py"}
    present = {p.name for p in FOLDER.glob("*.py") if not p.name.startswith("_")}
    assert present == listed
