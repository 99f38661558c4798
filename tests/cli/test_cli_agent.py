"""``memex agent`` and ``memex trajectory show`` against a scripted model on 127.0.0.1."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from memex.cli import main
from memex.executor import load_trajectories
from memex.executor.llm import ScriptedLLM


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "agent_defs.py").write_text(textwrap.dedent('''
        from pydantic import BaseModel
        from memex.host_tools import tool

        class Answer(BaseModel):
            mean: float

        @tool
        def scale(x: float, k: float = 2.0) -> float:
            """Multiply x by k."""
            return x * k
    '''))
    (tmp_path / "data.csv").write_text("v\n1\n2\n3\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    return tmp_path


@pytest.mark.slow
def test_agent_command_streams_turns_and_writes_the_trajectory(
        project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = ["Look first.\n```python\nm = scale(float(data.v.mean()), k=1.0)\nprint(m)\n```",
              "```python\nsubmit(mean=m)\n```"]
    with ScriptedLLM(script) as srv:
        code = main(["agent", "Mean of v", "--model", "scripted", "--base-url", srv.base_url,
                     "--tools", "agent_defs:scale", "--input", "data=data.csv",
                     "--schema", "agent_defs:Answer", "--trajectory", "out.jsonl"])
    out = capsys.readouterr().out
    assert code == 0
    assert "step 1" in out and "2.0" in out and "Look first." in out
    assert "submitted" in out and '"mean": 2.0' in out
    [t] = load_trajectories(project / "out.jsonl")
    assert t.answer == {"mean": 2.0} and len(t.steps) == 2
    assert "data: DataFrame, 3 rows" in srv.requests[0].messages[0]["content"]

    assert main(["trajectory", "show", "out.jsonl"]) == 0
    shown = capsys.readouterr().out
    assert "Mean of v" in shown and "scale(float(data.v.mean())" in shown
    assert "end: submitted" in shown


def test_agent_command_without_an_answer_exits_1(project: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    with ScriptedLLM(["no code"] * 3) as srv:
        code = main(["agent", "t", "--model", "scripted", "--base-url", srv.base_url,
                     "--max-turns", "2", "--no-stream", "--trajectory", "t.jsonl"])
    assert code == 1 and "max_turns" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["--tools", "nope_module:x"], "cannot import"),
    (["--tools", "agent_defs"], "module:attribute"),
    (["--input", "data"], "NAME=FILE"),
    (["--input", "d=missing.csv"], "does not exist"),
    (["--schema", "agent_defs:Missing"], "no attribute"),
])
def test_agent_command_bad_arguments(project: Path, capsys: pytest.CaptureFixture[str],
                                     argv: list[str], message: str) -> None:
    assert main(["agent", "t", "--model", "m", "--base-url", "http://127.0.0.1:9/v1",
                 *argv]) == 2
    assert message in capsys.readouterr().err


def test_trajectory_show_bad_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"event": "start"}\nnot json\n')
    assert main(["trajectory", "show", str(bad)]) == 2
    assert "bad.jsonl:1" in capsys.readouterr().err
    assert main(["trajectory", "show", str(tmp_path / "none.jsonl")]) == 2
