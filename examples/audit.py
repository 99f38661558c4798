"""Example 2, an audit agent: trajectories in scope, each failure classified.

The trajectories (from examples/funnel.py runs, or any JSONL trajectory file) are handed to
the agent as typed objects in its sandbox (``runs``: a list of Trajectory records with steps,
code, observations, tool calls), not as text: the model reads only what its code prints.

    python examples/funnel.py --seed 1; python examples/funnel.py --seed 2
    python examples/audit.py funnel-trajectories.jsonl
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Literal

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _llm_choice import add_arguments, open_llm
from pydantic import BaseModel, Field
from rich.console import Console

from memex.executor import Budget, Hooks, MemexAgent, load_trajectories, render_step

Outcome = Literal["answered", "no_submit", "code_errors", "repetition", "llm_error"]


class Verdict(BaseModel):
    id: str = Field(description="the trajectory's id")
    outcome: Outcome = Field(description="the main way the run went")
    reason: str = Field(description="one sentence of evidence from the trajectory")


class Audit(BaseModel):
    verdicts: list[Verdict]


TASK = ("`runs` is a list of trajectories of other agents (fields: id, task, end_reason, "
        "submitted, answer, steps; each step has status ('ok', 'error', 'repeated', "
        "'no_action', 'rejected', 'submitted'), code, observation, error). Classify every run: "
        "'answered' if it submitted, 'llm_error' if end_reason is 'llm_error', 'repetition' if "
        "most steps are 'repeated' or 'no_action', 'code_errors' if most steps are 'error', "
        "else 'no_submit'. Compute this with code over `runs`, then submit one verdict per run.")


def expected(t: object) -> str:
    """The classification rule of TASK, computed on the host (to check the agent)."""
    steps = getattr(t, "steps", ())
    half = len(steps) / 2
    if getattr(t, "submitted", False):
        return "answered"
    if getattr(t, "end_reason", "") == "llm_error":
        return "llm_error"
    if sum(s.status in ("repeated", "no_action") for s in steps) > half:
        return "repetition"
    if sum(s.status == "error" for s in steps) > half:
        return "code_errors"
    return "no_submit"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_arguments(p)
    p.add_argument("trajectories", nargs="?", default="funnel-trajectories.jsonl")
    p.add_argument("--max-turns", type=int, default=6)
    args = p.parse_args(argv)
    if not Path(args.trajectories).is_file():
        print(f"{args.trajectories} not found: run examples/funnel.py first", file=sys.stderr)
        return 2
    runs = load_trajectories(args.trajectories)
    console = Console()
    with contextlib.ExitStack() as stack:
        agent = MemexAgent(model=open_llm(args, stack), submit=Audit,
                           budget=Budget(max_turns=args.max_turns),
                           hooks=Hooks(on_step=lambda s: render_step(s, console)))
        rollout = agent.run(TASK, inputs={"runs": runs})
    want = {t.id: expected(t) for t in runs}
    if rollout.answer is None:
        console.print(f"no audit submitted ({rollout.end_reason})")
        return 0
    got = {v.id: v.outcome for v in rollout.answer.verdicts}
    agree = sum(got.get(k) == v for k, v in want.items())
    for v in rollout.answer.verdicts:
        console.print(f"{v.id}: {v.outcome} (rule: {want.get(v.id, '?')}) — {v.reason}",
                      highlight=False)
    console.print(f"agreement with the rule computed on the host: {agree}/{len(want)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
