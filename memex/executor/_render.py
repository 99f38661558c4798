"""Readable rendering of trajectories and live steps (rich), for the CLI and notebooks."""

from __future__ import annotations

import json
import re
from typing import Any

from ._trajectory import Step, Trajectory

__all__ = ["render_step", "render_trajectory"]

_FENCED = re.compile(r"^[ \t]*(`{3,}|~{3,})[^\n]*\n.*?(^[ \t]*\1[ \t]*$|\Z)",
                     re.MULTILINE | re.DOTALL)


def _console(console: object) -> Any:
    if console is not None:
        return console
    from rich.console import Console

    return Console()


def render_step(step: Step, console: object = None, *, indent: int = 0) -> None:
    """One step: the model's text, each code block (highlighted), tool calls, the
    observation and the step's tokens/timings."""
    from rich.padding import Padding
    from rich.panel import Panel
    from rich.syntax import Syntax
    from rich.text import Text

    con = _console(console)
    pad = (0, 0, 0, indent)
    head = (f"step {step.index + 1} · {step.action} · {step.status} · "
            f"{step.prompt_tokens}+{step.completion_tokens} tokens · "
            f"llm {step.llm_seconds:.2f}s · exec {step.exec_seconds:.2f}s"
            + (f" · asked again {step.resampled}x (repeats)" if step.resampled else ""))
    con.print(Padding(Text(head, style="bold cyan"), pad))
    text = _FENCED.sub("", step.reply) if step.code else step.reply
    if text.strip() and step.action != "tool_calls":
        con.print(Padding(Text(text.strip()[:2000], style="dim"), pad))
    elif step.reply.strip() and step.action == "tool_calls":
        con.print(Padding(Text(step.reply.strip()[:2000], style="dim"), pad))
    for block in step.code:
        con.print(Padding(Panel(Syntax(block.rstrip("\n"), "python", theme="ansi_dark"),
                                title="code", title_align="left", expand=False), pad))
    for c in step.tool_calls:
        line = f"↳ {c.name}({c.arguments}) [{c.kind}] → {c.outcome} in {c.duration * 1000:.1f} ms"
        con.print(Padding(Text(line, style="magenta"), pad))
    if step.observation:
        con.print(Padding(Panel(Text(step.observation), title="observation",
                                title_align="left", border_style="green", expand=False), pad))
    for child in step.children:
        render_trajectory(child, con, indent=indent + 4)


def render_trajectory(t: Trajectory, console: object = None, *, indent: int = 0) -> None:
    """A whole trajectory: header, every step, the end (answer, reason, totals)."""
    from rich.padding import Padding
    from rich.text import Text

    con = _console(console)
    pad = (0, 0, 0, indent)
    con.print(Padding(Text(f"trajectory {t.id} · {t.model} · {t.action_space}",
                           style="bold"), pad))
    con.print(Padding(Text(f"task: {t.task}"), pad))
    for name, desc in t.inputs.items():
        con.print(Padding(Text(f"input {name}: {desc}", style="dim"), pad))
    for step in t.steps:
        render_step(step, con, indent=indent)
    answer = json.dumps(t.answer, ensure_ascii=False) if t.submitted else "none"
    cost = f" · ${t.cost:.4f}" if t.cost else ""
    con.print(Padding(Text(
        f"end: {t.end_reason} · answer {answer} · {len(t.steps)} steps · "
        f"{t.total_tokens} tokens{cost} · {t.duration:.1f}s"
        + (f" · error: {t.error}" if t.error else ""),
        style="bold green" if t.submitted else "bold yellow"), pad))
