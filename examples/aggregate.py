"""Example 3, an aggregator: N trajectories of the same task in scope, one answer chosen.

Each trajectory arrives as a typed object (answers, the code that produced them, what that
code printed), so the aggregator can check the work instead of trusting a summary.

    for s in 0 1 2; do python examples/funnel.py --seed 0; done
    python examples/aggregate.py funnel-trajectories.jsonl --seed 0
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _llm_choice import add_arguments, open_llm
from funnel_data import FunnelAnswer, build_warehouse, reference_answer, score
from rich.console import Console

from memex.executor import Budget, Hooks, MemexAgent, load_trajectories, render_step

TASK = ("`runs` holds trajectories of several agents that answered the same funnel question "
        "(per-segment signup-to-activation conversion and the worst segment). Each has "
        "`submitted` and `answer` (a dict with 'conversion' and 'worst_segment') and steps "
        "with the code they ran. Choose the most trustworthy answer: prefer answers that several "
        "runs agree on (round rates to 2 decimals to compare) and whose code queried the data. "
        "Submit that answer.")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_arguments(p)
    p.add_argument("trajectories", nargs="?", default="funnel-trajectories.jsonl")
    p.add_argument("--seed", type=int, default=0, help="warehouse seed the runs answered")
    p.add_argument("--max-turns", type=int, default=6)
    args = p.parse_args(argv)
    if not Path(args.trajectories).is_file():
        print(f"{args.trajectories} not found: run examples/funnel.py first", file=sys.stderr)
        return 2
    runs = load_trajectories(args.trajectories)
    console = Console()
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        agent = MemexAgent(model=open_llm(args, stack), submit=FunnelAnswer,
                           budget=Budget(max_turns=args.max_turns),
                           hooks=Hooks(on_step=lambda s: render_step(s, console)))
        rollout = agent.run(TASK, inputs={"runs": runs})
        ref = reference_answer(build_warehouse(Path(tmp) / "w.db", seed=args.seed))
    single = sum(score(FunnelAnswer.model_validate(t.answer), ref) for t in runs
                 if t.submitted and isinstance(t.answer, dict))
    console.print(f"runs correct on their own: {single}/{len(runs)}")
    console.print(f"aggregated answer: {rollout.answer!r} -> "
                  f"{'correct' if score(rollout.answer, ref) else 'not correct'}",
                  highlight=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
