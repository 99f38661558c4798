"""Sub-agents (spawn_agent): fan-out wall time, and what one spawn costs.

    python bench/spawn.py            # full run (a few minutes on 2 busy cores)
    python bench/spawn.py --quick    # fewer repetitions

Everything runs through the real agent loop, real sandboxes and a scripted chat-completions
server on 127.0.0.1 (so no model time is counted unless a row says so). Asserts nothing.

Part 1, fan-out: a root agent's block starts 8 sub-agents doing equal work and waits for all
of them (``wait_all``), against the same 8 started and waited for one after another. The work
is one of: a tool call that takes 0.5 s on the host (I/O: a query, an API), a CPU-bound block
in the guest, or two model turns of 0.5 s each (the scripted server sleeps before answering).
The time is the root block's own wall time (its ``exec_seconds``).

Part 2, spawn overhead: from the ``spawn_agent`` call in the parent's block to the child's
first model request arriving at the server (its sandbox opened, tools installed, inputs in
place, prompt built), for a fresh sandbox, one preloaded with pandas, a fork of the parent's
(pandas imported, a DataFrame in scope), and a preloaded one given a 100k-row DataFrame as
an input. Both ends read the wall clock (the guest's ``time.time()`` is the host's). Beside
them: how long the ``spawn_agent`` call itself blocks the parent, and a bare ``Sandbox()``.
"""

from __future__ import annotations

import argparse
import ast
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "bench"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from _fmt import fmt  # noqa: E402

from memex import Limits, Sandbox  # noqa: E402
from memex.executor import Budget, MemexAgent, Rollout, SandboxSpec, TreeBudget  # noqa: E402
from memex.executor.llm import LLMClient, ScriptedLLM, ScriptedReply  # noqa: E402
from memex.host_tools import tool  # noqa: E402

N = 8


def py(code: str) -> str:
    return f"Next.\n```python\n{code}\n```"


@tool
def lookup(i: int) -> int:
    """A slow lookup (0.5 s on the host).

    Args:
        i: which row.
    """
    time.sleep(0.5)
    return i * 2


CHILD = {
    "tool": [py("submit(lookup(i))")],
    "cpu": [py("s = 0\nfor k in range(1_500_000):\n    s += k % 7\nsubmit(s + i)")],
    "model": [ScriptedReply(content=py("x = i * 2"), delay=0.5),
              ScriptedReply(content=py("submit(x)"), delay=0.5)],
}
PARALLEL = (f"hs = [spawn_agent('work', inputs={{'i': i}}, submit=int) for i in range({N})]\n"
            "vals = wait_all(hs)")
SEQUENTIAL = ("vals = [spawn_agent('work', inputs={'i': i}, submit=int).result() "
              f"for i in range({N})]")


class Router:
    """Answers each agent from the script of its task; notes when each agent first asks."""

    def __init__(self, scripts: dict[str, Any]) -> None:
        self.scripts = scripts
        self.first: list[float] = []
        self.lock = threading.Lock()

    def __call__(self, req: dict[str, Any]) -> Any:
        now = time.time()
        msgs = req["messages"]
        task = str(msgs[1]["content"]).removeprefix("Task: ")
        turn = sum(1 for m in msgs if m["role"] == "assistant")
        if task != "root" and turn == 0:
            with self.lock:
                self.first.append(now)
        script = self.scripts[task]
        return script[min(turn, len(script) - 1)]


def run_root(scripts: dict[str, Any], **kw: Any) -> tuple[Rollout, Router]:
    router = Router(scripts)
    with ScriptedLLM(router) as srv:
        llm = LLMClient("scripted", base_url=srv.base_url, max_retries=0, timeout=120)
        agent = MemexAgent(model=llm, tools=[lookup],
                           sandbox=SandboxSpec(limits=Limits(timeout=120)),
                           spawn=TreeBudget(max_live=N, max_children=200),
                           budget=Budget(max_turns=30), **kw)
        r = agent.run("root")
    if not r.submitted:
        raise RuntimeError(f"the root did not finish: {r.end_reason} {r.error} "
                           f"{r.trajectory.steps[-1].observation if r.trajectory.steps else ''}")
    return r, router


def fan_out(kind: str, code: str) -> float:
    r, _ = run_root({"root": [py(code), py("submit(sum(vals))")], "work": CHILD[kind]})
    step = r.trajectory.steps[0]
    if len(step.children) != N or not all(c.submitted for c in step.children):
        raise RuntimeError(f"fan-out {kind}: {step.observation}")
    return step.exec_seconds


SETUP = {
    "fresh": ("pass", "h = spawn_agent('child', submit=int)", {}),
    "preloaded (pandas)": ("pass", "h = spawn_agent('child', submit=int)",
                           {"preload": ["pandas"]}),
    "forked (pandas + a DataFrame in scope)": (
        "import pandas as pd, numpy as np\n"
        "df = pd.DataFrame({'a': np.arange(100_000), 'b': np.random.rand(100_000)})",
        "h = spawn_agent('child', submit=int, fork=True)", {}),
    "preloaded + a 100k-row DataFrame input": (
        "import pandas as pd, numpy as np\n"
        "df = pd.DataFrame({'a': np.arange(100_000), 'b': np.random.rand(100_000)})",
        "h = spawn_agent('child', submit=int, inputs={'df': df})", {"preload": ["pandas"]}),
}


def overhead(mode: str, reps: int) -> tuple[list[float], list[float]]:
    """(spawn call -> child's first model request, spawn call blocking) per spawn."""
    prep, spawn, kw = SETUP[mode]
    code = (f"import time\nstarts, calls = [], []\nfor _ in range({reps}):\n"
            f"    t = time.time()\n    {spawn}\n    calls.append(time.time() - t)\n"
            "    starts.append(t)\n    h.result()\nprint(repr((starts, calls)))")
    r, router = run_root({"root": [py(prep), py(code), py("submit(0)")],
                          "child": [py("submit(1)")]}, **kw)
    out = r.trajectory.steps[1].observation.split("Output:\n", 1)[1].splitlines()[0]
    starts, calls = ast.literal_eval(out)
    if len(router.first) != reps:
        raise RuntimeError(f"{mode}: {r.trajectory.steps[1].observation}")
    return [f - s for f, s in zip(router.first, starts, strict=True)], calls


def bare_sandbox(reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        Sandbox().close()
        out.append(time.perf_counter() - t)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = p.parse_args(argv)
    rounds = 1 if args.quick else 3
    reps = 5 if args.quick else 12

    print(f"Part 1: fan-out of {N} sub-agents doing equal work, root block wall time "
          f"(median of {rounds})")
    print(f"{'work per sub-agent':<34}{'all at once':>14}{'one by one':>14}{'speed-up':>10}")
    for kind, label in [("tool", "one 0.5 s tool call"), ("cpu", "a CPU-bound block"),
                        ("model", "two model turns of 0.5 s")]:
        par = statistics.median(fan_out(kind, PARALLEL) for _ in range(rounds))
        seq = statistics.median(fan_out(kind, SEQUENTIAL) for _ in range(rounds))
        print(f"{label:<34}{fmt(par):>14}{fmt(seq):>14}{seq / par:>9.1f}x", flush=True)

    print(f"\nPart 2: spawn overhead, medians of {reps} spawns (one at a time)")
    print(f"{'child sandbox':<42}{'call -> first turn':>20}{'call blocks':>14}")
    for mode in SETUP:
        first, calls = overhead(mode, reps)
        print(f"{mode:<42}{fmt(statistics.median(first)):>20}"
              f"{fmt(statistics.median(calls)):>14}", flush=True)
    print(f"{'(baseline: bare Sandbox() + close)':<42}"
          f"{fmt(statistics.median(bare_sandbox(reps))):>20}{'':>14}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
