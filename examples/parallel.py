"""Example 4, parallel thinking: N sub-agents attempt the funnel task at once; an aggregator gets
their N full trajectories as objects (the code each ran, what it printed, its answer) and picks.

The root agent's code starts the attempts with ``spawn_agent`` (they run in parallel, each in a
sandbox of its own, with the ``sql`` tool), gathers them with ``wait_all``, hands the list of
``h.trajectory()`` records to an aggregator sub-agent as an input, and submits its choice. No
attempt's work passes through the root model's context: only what the root's code prints.
With ``--fork`` the root pulls the event rows once and N forked branches analyse that same
DataFrame (they start from a copy of the root's session) without querying again.

    python examples/parallel.py                   # local model (see _llm_choice.py), N=3
    python examples/parallel.py --n 5 --base-url URL --model NAME
    python examples/parallel.py --fork            # one prepared scope, N forked branches
    python examples/parallel.py --scripted        # no model: scripted replies show the mechanics
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import re
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _llm_choice import add_arguments, open_llm
from funnel_data import TASK, FunnelAnswer, build_warehouse, reference_answer, score, sql_tool
from rich.console import Console

from memex import Limits
from memex.executor import (
    Budget,
    Hooks,
    MemexAgent,
    SandboxSpec,
    Trajectory,
    TreeBudget,
    render_step,
)
from memex.executor.llm import LLMClient, ScriptedLLM

AGGREGATE = (
    "`runs` holds the trajectories of agents that answered the same question: " + TASK +
    " Each run has `submitted`, `answer` (a dict with 'conversion' and 'worst_segment') and "
    "`steps` (each with `code` and `observation`). Choose the most trustworthy answer: prefer "
    "answers that several runs agree on (round rates to 2 decimals to compare) and whose code "
    "queried the data; check their code when they disagree. Submit that answer.")
BRANCH = (
    "The DataFrame `events` in your session (columns segment, customer_id, event) holds every "
    "funnel event of the warehouse. For each segment, compute the signup-to-activation "
    "conversion (customers with an 'activated' event / customers with a 'signup' event, a "
    "fraction between 0 and 1) and say which segment has the lowest. Work from `events`.")
EVENTS_SQL = ("SELECT c.segment, e.customer_id, e.event FROM events e "
              "JOIN customers c ON c.customer_id = e.customer_id")

PLAN = """\
Do not solve the question yourself: run {n} independent attempts in parallel, then an \
aggregator. The question is in the variable QUESTION, the aggregator's task in AGGREGATE. \
{prep}Your code:
```python
{code}
```
Then submit the aggregator's answer: submit(agg.result())."""
ATTEMPTS = """\
hs = [spawn_agent(QUESTION, tools=["sql"], submit=FunnelAnswer) for _ in range({n})]
wait_all(hs)
runs = [h.trajectory() for h in hs]
agg = spawn_agent(AGGREGATE, inputs={{"runs": runs}}, submit=FunnelAnswer)
print(agg.result())"""
BRANCHES = """\
hs = [spawn_agent(QUESTION, fork=True, tools=[], submit=FunnelAnswer) for _ in range({n})]
wait_all(hs)
runs = [h.trajectory() for h in hs]
agg = spawn_agent(AGGREGATE, inputs={{"runs": runs}}, submit=FunnelAnswer)
print(agg.result())"""
PREP = f'First, in one block of its own: events = sql("{EVENTS_SQL}"). Then, in the next block, '


def py(code: str, text: str = "Next step.") -> str:
    return f"{text}\n```python\n{code}\n```"


class Scripted:
    """A stand-in for a model (``--scripted``): each agent of the tree gets replies that play
    one strategy; attempt 3 makes a mistake (it counts 'verified' as activation), so the
    aggregator has something to choose between."""

    SQL = ("SELECT c.segment, COUNT(DISTINCT CASE WHEN e.event = 'signup' THEN e.customer_id "
           "END) AS s, COUNT(DISTINCT CASE WHEN e.event = '{ev}' THEN e.customer_id END) AS a "
           "FROM events e JOIN customers c ON c.customer_id = e.customer_id GROUP BY c.segment")
    PANDAS = ("sig = events[events.event == 'signup'].groupby('segment').customer_id.nunique()\n"
              "act = events[events.event == '{ev}'].groupby('segment').customer_id.nunique()\n"
              "conv = (act / sig).fillna(0).to_dict()\nprint(conv)")
    SUBMIT = "submit(conversion=conv, worst_segment=min(conv, key=conv.get))"
    AGG = ("from collections import Counter\n"
           "ok = [t for t in runs if t.submitted and any('sql(' in c or 'events' in c "
           "for s in t.steps for c in s.code)]\n"
           "key = lambda t: tuple(sorted((k, round(v, 2)) for k, v in "
           "t.answer['conversion'].items()))\n"
           "votes = Counter(key(t) for t in ok)\nprint(votes.most_common())\n"
           "best = next(t for t in ok if key(t) == votes.most_common(1)[0][0])\n"
           "submit(best.answer)")

    def __init__(self, n: int, fork: bool) -> None:
        self.n, self.fork = n, fork
        self.count = itertools.count(1)
        self.lock = threading.Lock()

    def __call__(self, req: dict[str, Any]) -> str:
        msgs = req["messages"]
        task = str(msgs[1]["content"]).removeprefix("Task: ")
        said = [str(m.get("content") or "") for m in msgs if m["role"] == "assistant"]
        turn = len(said)
        if task in (TASK, BRANCH):
            if turn == 0:
                with self.lock:
                    i = next(self.count)
                return self.attempt(i, 0)
            found = re.search(r"# attempt (\d+)", said[0])
            return self.attempt(int(found.group(1)) if found else 1, turn)
        if task == AGGREGATE:
            return py(self.AGG, "I compare the runs' answers and their code.")
        # the root
        if self.fork and turn == 0:
            return py(f'events = sql("{EVENTS_SQL}")\nprint(events.shape)')
        if turn == (1 if self.fork else 0):
            return py((BRANCHES if self.fork else ATTEMPTS).format(n=self.n))
        return py("submit(agg.result())")

    def attempt(self, i: int, turn: int) -> str:
        ev = "verified" if i == 3 else "activated"
        if self.fork:
            steps = [f"# attempt {i}\n" + self.PANDAS.format(ev=ev), self.SUBMIT]
        elif i % 2:
            steps = [f"# attempt {i}\nagg = sql(\"{self.SQL.format(ev=ev)}\")\n"
                     "conv = dict(zip(agg.segment, agg.a / agg.s))\nprint(conv)", self.SUBMIT]
        else:
            steps = [f"# attempt {i}\nevents = sql(\"{EVENTS_SQL}\")\nprint(events.shape)",
                     self.PANDAS.format(ev=ev), self.SUBMIT]
        return py(steps[min(turn, len(steps) - 1)])


def summarize(console: Console, t: Trajectory, ref: FunnelAnswer) -> None:
    attempts = [c for s in t.steps for c in s.children if c.task != AGGREGATE]
    for i, a in enumerate(attempts, 1):
        ans = FunnelAnswer.model_validate(a.answer) if a.submitted else None
        rates = ({k: round(v, 3) for k, v in ans.conversion.items()} if ans else a.end_reason)
        console.print(f"  attempt {i}: {rates} worst={ans.worst_segment if ans else '-'} "
                      f"({len(a.steps)} turns, {a.total_tokens} tokens) -> "
                      f"{'correct' if score(ans, ref) else 'not correct'}", highlight=False)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawTextHelpFormatter)
    add_arguments(p)
    p.add_argument("--n", type=int, default=3, help="parallel attempts")
    p.add_argument("--fork", action="store_true",
                   help="pull the events once, fork N branches of that scope")
    p.add_argument("--scripted", action="store_true", help="no model: scripted replies")
    p.add_argument("--seed", type=int, default=0, help="warehouse seed")
    p.add_argument("--max-turns", type=int, default=8, help="per agent")
    p.add_argument("--max-tokens-tree", type=int, default=400_000,
                   help="tokens for the whole tree")
    p.add_argument("--trajectory", default="parallel-trajectories.jsonl")
    args = p.parse_args(argv)
    console = Console()
    question = BRANCH if args.fork else TASK
    plan = PLAN.format(n=args.n, prep=PREP if args.fork else "",
                       code=(BRANCHES if args.fork else ATTEMPTS).format(n=args.n))
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        db = build_warehouse(Path(tmp) / "warehouse.db", seed=args.seed)
        if args.scripted:
            srv = stack.enter_context(ScriptedLLM(Scripted(args.n, args.fork)))
            llm: Any = LLMClient("scripted", base_url=srv.base_url)
        else:
            llm = open_llm(args, stack)
        agent = MemexAgent(
            model=llm, tools=[sql_tool(db)], submit=FunnelAnswer,
            sandbox=SandboxSpec(limits=Limits(timeout=900), preload=("pandas",)),
            budget=Budget(max_turns=args.max_turns),
            spawn=TreeBudget(max_depth=1, max_live=args.n + 1, max_children=args.n + 1,
                             max_tokens=args.max_tokens_tree),
            hooks=Hooks(trajectory_path=args.trajectory,
                        on_step=lambda s: render_step(s, console)))
        console.print("[bold]root task:[/bold]")
        console.print(plan + "\n", markup=False, highlight=False)
        rollout = agent.run(plan, inputs={"QUESTION": question, "AGGREGATE": AGGREGATE})
        ref = reference_answer(db)
    t = rollout.trajectory
    kids = [c for s in t.steps for c in s.children]
    console.print(f"[bold]end:[/bold] {rollout.end_reason} after {t.duration:.1f}s; "
                  f"{len(kids)} sub-agents; tokens: root {t.total_tokens}, all "
                  f"{t.total_tokens + sum(k.total_tokens for k in kids)}", highlight=False)
    summarize(console, t, ref)
    console.print(f"[bold]aggregated:[/bold] {rollout.answer!r}", highlight=False)
    console.print(f"[bold]exact:[/bold]      {ref!r}", highlight=False)
    console.print("[bold green]correct[/bold green]" if score(rollout.answer, ref) else
                  "[bold yellow]not correct[/bold yellow]")
    console.print(f"tree appended to {args.trajectory} "
                  f"(render: memex trajectory show {args.trajectory})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
