"""Code vs tool-calling action spaces on the funnel task, side by side in one run.

    python bench/agent.py                    # scripted strategies only (seconds)
    python bench/agent.py --local --seeds 3  # plus the local model, both action spaces
    python bench/agent.py --local --aids     # plus one run per aid switched off
    python bench/agent.py --local --aids resample_repeats,example   # only these aids off

Part 1 (scripted, deterministic): the same strategy played by a scripted model against both
action spaces through the real agent loop, real sandbox and real chat-completions server; it
reports the context each rollout consumed (prompt + completion tokens, as the scripted
server estimates them: ceil(chars / 4) per text plus 4 per message) and the largest request.
Two strategies: (A) pull the raw event rows, then compute per-segment rates; (B) aggregate in
SQL. In the tool-calling space a tool's result reaches the model as JSON text, so (A) has to
copy rows into python_exec to compute over them (as a model would have to).

Part 2 (--local): the real local model (Qwen2.5-Coder 1.5B by default) on N warehouse seeds,
both action spaces, same prompt core: accuracy against the exact answer, tokens, LLM calls,
tool calls, wall time. Slow on 2 cores (minutes per rollout). Asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "bench", ROOT / "examples"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from funnel_data import (  # noqa: E402
    TASK,
    FunnelAnswer,
    build_warehouse,
    reference_answer,
    score,
    sql_tool,
)

from memex import Limits  # noqa: E402
from memex.executor import Aids, Budget, Hooks, MemexAgent, Rollout, SandboxSpec  # noqa: E402
from memex.executor.llm import (  # noqa: E402
    LLMClient,
    ScriptedLLM,
    ScriptedReply,
    ScriptedToolCall,
)

RAW = ("SELECT c.segment, e.customer_id, e.event FROM events e "
       "JOIN customers c ON c.customer_id = e.customer_id")
AGG = ("SELECT c.segment, COUNT(DISTINCT CASE WHEN e.event = 'signup' THEN e.customer_id END) "
       "AS signups, COUNT(DISTINCT CASE WHEN e.event = 'activated' THEN e.customer_id END) AS "
       "activated FROM events e JOIN customers c ON c.customer_id = e.customer_id "
       "GROUP BY c.segment")

CODE_A = [
    f'events = sql("{RAW}")\nprint(events.shape)\nprint(events.head())',
    "sig = events[events.event == 'signup'].groupby('segment').customer_id.nunique()\n"
    "act = events[events.event == 'activated'].groupby('segment').customer_id.nunique()\n"
    "conv = (act / sig).to_dict()\nprint(conv)",
    "submit(conversion=conv, worst_segment=min(conv, key=conv.get))",
]
CODE_B = [
    f'agg = sql("{AGG}")\nprint(agg)',
    "conv = dict(zip(agg.segment, agg.activated / agg.signups))\nprint(conv)",
    "submit(conversion=conv, worst_segment=min(conv, key=conv.get))",
]


def _turn(req: dict[str, Any]) -> int:
    return sum(1 for m in req["messages"] if m["role"] == "assistant")


def code_script(steps: list[str]) -> Any:
    def reply(req: dict[str, Any]) -> str:
        return f"Next step.\n```python\n{steps[min(_turn(req), len(steps) - 1)]}\n```"
    return reply


def _last_tool_json(req: dict[str, Any]) -> Any:
    for m in reversed(req["messages"]):
        if m["role"] == "tool":
            return json.loads(m["content"])
    raise RuntimeError("no tool result in the conversation")


def tools_script(strategy: str) -> Any:
    def call(name: str, args: dict[str, Any]) -> ScriptedReply:
        return ScriptedReply(content="Next step.", tool_calls=(
            ScriptedToolCall(name=name, arguments=args),))

    def reply(req: dict[str, Any]) -> ScriptedReply:
        turn = _turn(req)
        if turn == 0:
            return call("sql", {"query": RAW if strategy == "A" else AGG})
        if turn == 1:
            rows = _last_tool_json(req)
            if strategy == "A":  # the rows are only in the context: copy them into code
                code = (f"rows = {json.dumps(rows)}\n"
                        "sig, act = {}, {}\n"
                        "for r in rows:\n"
                        "    d = sig if r['event'] == 'signup' else act if r['event'] == "
                        "'activated' else None\n"
                        "    if d is not None: d.setdefault(r['segment'], set()).add("
                        "r['customer_id'])\n"
                        "import json\nprint(json.dumps({s: len(act.get(s, ())) / len(sig[s]) "
                        "for s in sig}))")
            else:
                code = (f"rows = {json.dumps(rows)}\nimport json\n"
                        "print(json.dumps({r['segment']: r['activated'] / r['signups'] "
                        "for r in rows}))")
            return call("python_exec", {"code": code})
        for m in reversed(req["messages"]):
            if m["role"] == "tool":
                conv = json.loads(m["content"].strip().splitlines()[-1])
                break
        return call("submit", {"answer": {"conversion": conv,
                                          "worst_segment": min(conv, key=conv.get)}})
    return reply


@dataclass
class Row:
    label: str
    rollouts: list[Rollout]
    correct: int
    wall: float


def scripted(db: Path, ref: FunnelAnswer) -> None:
    print("Part 1: one scripted strategy, both action spaces (tokens estimated by the "
          "scripted server)")
    print(f"{'strategy':<28}{'action space':<14}{'prompt tok':>11}{'completion tok':>15}"
          f"{'total':>9}{'largest request':>17}{'turns':>7}{'correct':>9}")
    for strategy, code_steps in (("A: raw rows, then compute", CODE_A),
                                 ("B: aggregate in SQL", CODE_B)):
        for space in ("code", "tools"):
            script = (code_script(code_steps) if space == "code"
                      else tools_script(strategy[0]))
            with ScriptedLLM(script) as srv:
                llm = LLMClient("scripted", base_url=srv.base_url, max_reply_tokens=None)
                agent = MemexAgent(model=llm, tools=[sql_tool(db)], submit=FunnelAnswer,
                                   action_space=space,
                                   sandbox=SandboxSpec(limits=Limits(timeout=60),
                                                       observation_chars=10_000_000),
                                   budget=Budget(max_turns=5))
                r = agent.run(TASK)
                largest = max(sum(len(json.dumps(m)) for m in q.messages) // 4
                              for q in srv.requests)
            t = r.trajectory
            print(f"{strategy:<28}{space:<14}{t.prompt_tokens:>11,}{t.completion_tokens:>15,}"
                  f"{t.total_tokens:>9,}{largest:>17,}{len(t.steps):>7}"
                  f"{'yes' if score(r.answer, ref) else 'no':>9}")
    print("(observation bound lifted for this part so the counts show what each space "
          "carries; the agent's default bound is 4,000 characters per observation)\n")


def _repeats_run(t: Any) -> int:
    """Steps whose code (or calls) were exactly an earlier step's."""
    seen, n = set(), 0
    for s in t.steps:
        key = s.code or tuple((c.name, c.arguments) for c in s.tool_calls if c.kind != "code")
        if key:
            n += key in seen
            seen.add(key)
    return n


AIDS = ("example", "nudge", "repeat_note", "preview_variables", "submit_reminder",
        "stop_sequences", "resample_repeats")


def local(args: argparse.Namespace) -> None:
    from memex.executor.llm import LocalModel

    variants: list[tuple[str, str, Aids]] = [] if args.no_baseline else [
        ("code", "all aids", Aids()), ("tools", "all aids", Aids())]
    for name in args.aids:
        variants.append(("code", f"no {name}", Aids(**{name: False})))
    print(f"Part 2: local model {args.model}, seeds 0..{args.seeds - 1}, "
          f"max {args.max_turns} turns, temperature 0 (re-asked repeats at 0.8, seeded)")
    with LocalModel(args.model) as lm, tempfile.TemporaryDirectory() as tmp:
        print(f"(server started in {lm.start_seconds:.1f}s)")
        rows: list[Row] = []
        for space, label, aids in variants:
            rollouts, correct, t0 = [], 0, time.monotonic()
            for seed in range(args.seeds):
                db = build_warehouse(Path(tmp) / f"w{seed}.db", seed=seed)
                agent = MemexAgent(model=lm.client(max_reply_tokens=512, timeout=900),
                                   tools=[sql_tool(db)], submit=FunnelAnswer,
                                   action_space=space,  # type: ignore[arg-type]
                                   aids=aids, sandbox=SandboxSpec(limits=Limits(timeout=60),
                                                                  preload=("pandas",)),
                                   budget=Budget(max_turns=args.max_turns),
                                   hooks=Hooks(trajectory_path=args.trajectories))
                r = agent.run(TASK)
                ok = score(r.answer, reference_answer(db))
                correct += ok
                rollouts.append(r)
                t = r.trajectory
                print(f"  {space}/{label} seed {seed}: {r.end_reason}, "
                      f"{'correct' if ok else 'wrong'}, {t.total_tokens} tokens, "
                      f"{len(t.steps)} turns, {t.llm_calls} LLM calls, "
                      f"{_repeats_run(t)} repeats run, "
                      f"{t.duration:.0f}s", flush=True)
            rows.append(Row(f"{space} / {label}", rollouts, correct, time.monotonic() - t0))
    print(f"\n{'variant':<30}{'accuracy':>9}{'submitted':>10}{'tokens/rollout':>15}"
          f"{'LLM calls':>10}{'tool calls':>11}{'wall/rollout':>13}")
    for row in rows:
        n = len(row.rollouts)
        tok = statistics.mean(r.trajectory.total_tokens for r in row.rollouts)
        calls = statistics.mean(r.trajectory.llm_calls for r in row.rollouts)
        tcalls = statistics.mean(len(r.trajectory.tool_calls) for r in row.rollouts)
        sub = sum(r.submitted for r in row.rollouts)
        print(f"{row.label:<30}{f'{row.correct}/{n}':>9}{f'{sub}/{n}':>10}{tok:>15,.0f}"
              f"{calls:>10.1f}{tcalls:>11.1f}{row.wall / n:>12.0f}s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--local", action="store_true", help="also run the local model")
    p.add_argument("--model", default="qwen-1.5b")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--max-turns", type=int, default=8)
    p.add_argument("--aids", nargs="?", const=",".join(AIDS), default="",
                   type=lambda v: [a for a in v.split(",") if a],
                   help="one extra code variant per aid switched off (all, or a comma list "
                        f"of: {', '.join(AIDS)})")
    p.add_argument("--no-baseline", action="store_true",
                   help="skip the code/tools variants with all aids (only the --aids ones)")
    p.add_argument("--trajectories", default=None, help="append every rollout's trajectory")
    args = p.parse_args()
    unknown = sorted(set(args.aids) - set(AIDS))
    if unknown:
        p.error(f"unknown aid(s): {', '.join(unknown)}")
    if args.no_baseline and not args.aids:
        p.error("--no-baseline needs --aids")
    with tempfile.TemporaryDirectory() as tmp, contextlib.suppress(KeyboardInterrupt):
        db = build_warehouse(Path(tmp) / "w.db", seed=0)
        scripted(db, reference_answer(db))
        if args.local:
            local(args)


if __name__ == "__main__":
    main()
