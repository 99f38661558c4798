"""The main job: one short task in both action spaces, side by side.

The task comes from the bundled ``big-outputs`` suite: its tool returns 5,000 transactions.
The code agent keeps them in a variable and prints one number; the tool-calling agent (same
loop, same prompt core, same tool, same budget) gets them back as text, cut to the
observation bound. The code agent's trajectory is rendered, then one table compares the two.

    python examples/compare.py                  # local model (see _llm_choice.py)
    python examples/compare.py --seed 3 --task top_merchant

Measure it over many tasks and seeds with ``memex eval run big-outputs`` (docs/eval.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _llm_choice import add_arguments, open_llm
from rich.console import Console
from rich.table import Table

from memex import Limits
from memex.eval import SUITES, grade
from memex.executor import Budget, Hooks, MemexAgent, Rollout, SandboxSpec, render_step


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_arguments(p)
    p.add_argument("--seed", type=int, default=0, help="the suite's seed (its data and answers)")
    p.add_argument("--task", default="refund_total", help="a big-outputs task id")
    p.add_argument("--max-turns", type=int, default=6)
    p.add_argument("--max-seconds", type=float, default=150.0, help="per rollout, both spaces")
    args = p.parse_args(argv)
    # a log (CI, a pipe) gets the table whole rather than folded to 80 columns
    console = Console(width=None if sys.stdout.isatty() else 120)
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        ws = SUITES["big-outputs"].build(args.seed, Path(tmp))
        task = next((t for t in ws.tasks if t.id == args.task), None)
        if task is None:
            console.print(f"no task {args.task!r}; tasks: {', '.join(t.id for t in ws.tasks)}")
            return 2
        llm = open_llm(args, stack)
        console.print(f"[bold]task:[/bold] {task.question}\n", highlight=False)
        rollouts: dict[str, Rollout] = {}
        for space in ("code", "tools"):
            if space == "tools":
                console.print("\n[bold]the same task with tool calling[/bold] (steps not "
                              "shown)...", highlight=False)
            agent = MemexAgent(
                model=llm, tools=ws.tools, submit=task.answer, action_space=space,
                sandbox=SandboxSpec(limits=Limits(timeout=60), preload=ws.preload),
                budget=Budget(max_turns=args.max_turns, max_seconds=args.max_seconds),
                hooks=Hooks(on_step=(lambda s: render_step(s, console)) if space == "code"
                            else None))
            rollouts[space] = agent.run(task.question)
    table = Table(title=f"big-outputs · {task.id} · seed {args.seed} · {llm.model}")
    for col in ("action space", "correct", "answer", "context tokens", "completion tokens",
                "LLM calls", "tool calls", "wall s", "ended by"):
        table.add_column(col, justify="left" if col in ("action space", "answer", "ended by")
                         else "right")
    for space, r in rollouts.items():
        t = r.trajectory
        ok = t.submitted and grade(t.answer, task.reference, task.grader,
                                   tolerance=task.tolerance)
        calls = sum(1 for c in t.tool_calls if c.name not in ("submit", "python_exec"))
        table.add_row(space, "[green]yes[/green]" if ok else "[red]no[/red]",
                      json.dumps(t.answer) if t.submitted else "-", f"{t.prompt_tokens:,}",
                      f"{t.completion_tokens:,}", str(t.llm_calls), str(calls),
                      f"{t.duration:.1f}", r.end_reason)
    console.print()
    console.print(table)
    console.print(f"reference answer: {task.reference}", highlight=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
