"""Example 1, the funnel task: a MemEx agent answers a warehouse question with SQL and Python.

The agent's tool ``sql(query) -> DataFrame`` returns real DataFrames that stay in the sandbox;
only what its code prints reaches the model. The answer is a typed ``FunnelAnswer`` checked
against the exact answer computed on the host.

    python examples/funnel.py                 # local model (see _llm_choice.py)
    python examples/funnel.py --action-space tools   # the tool-calling baseline
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _llm_choice import add_arguments, open_llm
from funnel_data import TASK, FunnelAnswer, build_warehouse, reference_answer, score, sql_tool
from rich.console import Console

from memex import Limits
from memex.executor import Budget, Hooks, MemexAgent, SandboxSpec, render_step


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_arguments(p)
    p.add_argument("--seed", type=int, default=0, help="warehouse seed")
    p.add_argument("--action-space", choices=("code", "tools"), default="code")
    p.add_argument("--max-turns", type=int, default=8)
    p.add_argument("--trajectory", default="funnel-trajectories.jsonl",
                   help="appended with this rollout's trajectory")
    args = p.parse_args(argv)
    console = Console()
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        db = build_warehouse(Path(tmp) / "warehouse.db", seed=args.seed)
        llm = open_llm(args, stack)
        agent = MemexAgent(
            model=llm, tools=[sql_tool(db)], submit=FunnelAnswer,
            action_space=args.action_space,
            sandbox=SandboxSpec(limits=Limits(timeout=60), preload=("pandas",)),
            budget=Budget(max_turns=args.max_turns),
            hooks=Hooks(trajectory_path=args.trajectory,
                        on_step=lambda s: render_step(s, console)))
        console.print(f"[bold]task:[/bold] {TASK}\n", highlight=False)
        rollout = agent.run(TASK)
        ref = reference_answer(db)
    t = rollout.trajectory
    console.print(f"\n[bold]end:[/bold] {rollout.end_reason} after {len(t.steps)} turns, "
                  f"{t.total_tokens} tokens, {t.duration:.1f}s", highlight=False)
    console.print(f"[bold]answer:[/bold] {rollout.answer!r}", highlight=False)
    console.print(f"[bold]exact:[/bold]  {ref!r}", highlight=False)
    ok = score(rollout.answer, ref)
    console.print("[bold green]correct[/bold green]" if ok else "[bold yellow]not correct "
                  "(small local models often are not; the loop, sandbox and typed answer are "
                  "what this shows)[/bold yellow]")
    console.print(f"trajectory appended to {args.trajectory} "
                  f"(render: memex trajectory show {args.trajectory})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
