"""``memex eval``: run a suite in both action spaces on your model, report, audit, export.

    memex eval run warehouse --model M [--base-url URL] --spaces code,tools --seeds 2 \\
        --concurrency 2 --out runs/wh
    memex eval report runs/wh [--format md|json|csv] [--plot pareto.png]
    memex eval audit runs/wh --model M
    memex eval export runs/wh --format chat-jsonl [--correct] > data.jsonl

Without ``--base-url`` (or ``$OPENAI_BASE_URL``), ``--local-model qwen-1.5b`` serves the local
model on 127.0.0.1 for the run (needs ``memex[local]``)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from typing import Any

from ..errors import ConfigError
from ._common import add_model_options, limits, llm_from_args, seconds

__all__ = ["add_parser"]


def _aids(specs: list[str]) -> tuple[Any, str]:
    """``--aid name=value`` switches -> (Aids, variant name)."""
    from dataclasses import fields

    from ..executor import Aids

    known = {f.name: f.type for f in fields(Aids)}
    kw: dict[str, Any] = {}
    for spec in specs:
        name, eq, value = spec.partition("=")
        if not eq or name not in known:
            raise ConfigError(f"--aid takes NAME=VALUE with NAME one of {', '.join(known)}; "
                              f"got {spec!r}")
        kind = str(known[name])
        if kind == "bool":
            if value.lower() not in ("true", "false", "on", "off", "1", "0"):
                raise ConfigError(f"--aid {name} takes on|off, got {value!r}")
            kw[name] = value.lower() in ("true", "on", "1")
        else:
            try:
                kw[name] = float(value) if kind == "float" else int(value)
            except ValueError as exc:
                raise ConfigError(f"--aid {name} takes a number, got {value!r}") from exc
    variant = ",".join(f"{k}={'on' if v is True else 'off' if v is False else v}"
                       for k, v in sorted(kw.items())) or "default"
    return Aids(**kw), variant.replace(",", "_")


def _llm(args: argparse.Namespace, stack: contextlib.ExitStack) -> Any:
    return llm_from_args(args, stack, "eval")


def _judge(args: argparse.Namespace, llm: Any) -> Any:
    """The judge: ``--judge-model`` at the run's endpoint (or ``--judge-base-url``)."""
    from ..executor.llm import LLMClient

    return LLMClient(model=args.judge_model, base_url=args.judge_base_url or llm.base_url,
                     api_key=args.api_key, max_reply_tokens=16, timeout=args.llm_timeout)


def _seeds(text: str) -> list[int]:
    try:
        if "," in text or "-" in text[1:]:
            out: list[int] = []
            for part in text.split(","):
                a, dash, b = part.partition("-")
                out += list(range(int(a), int(b) + 1)) if dash else [int(a)]
            return out
        return list(range(int(text)))
    except ValueError as exc:
        raise ConfigError(f"--seeds takes N (seeds 0..N-1), or a list like 0,3-5; got "
                          f"{text!r}") from exc


def cmd_run(args: argparse.Namespace) -> int:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from ..eval import SUITES, load_suite, run_eval
    from ..executor import Budget
    from ..runtime_wasm import AGENT_LIMITS

    suite = load_suite(args.suite, SUITES)
    aids, variant = _aids(args.aid)
    spaces = [s.strip() for s in args.spaces.split(",") if s.strip()]
    seeds = _seeds(args.seeds)
    tally = {"correct": 0}
    with contextlib.ExitStack() as stack:
        llm = _llm(args, stack)
        progress = stack.enter_context(Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[correct]} correct"), TimeElapsedColumn(),
            TextColumn("ETA"), TimeRemainingColumn(), transient=False,
            disable=args.quiet or not sys.stderr.isatty(), console=None))
        bar = progress.add_task(f"{suite.name} · {llm.model}", total=None, correct=0)

        def on_result(r: Any, done: int, total: int) -> None:
            tally["correct"] += r.correct
            progress.update(bar, completed=done, total=total, correct=tally["correct"])
            if args.quiet or not sys.stderr.isatty():
                print(f"[{done}/{total}] {r.space:5} seed {r.seed} {r.task}: "
                      f"{'correct' if r.correct else 'wrong'} ({r.end_reason}, {r.turns} turns, "
                      f"{r.tokens} tokens, {r.seconds:.0f}s)", file=sys.stderr, flush=True)

        t0 = time.monotonic()
        try:
            run = run_eval(
                suite, llm=llm, out=args.out, spaces=spaces, seeds=seeds,
                concurrency=args.concurrency, order=args.order.replace("-", "_"),
                tasks=args.task or None, limit=args.limit, variant=variant, aids=aids,
                budget=Budget(max_turns=args.max_turns, max_seconds=args.max_seconds),
                limits=limits(args, AGENT_LIMITS),
                backend=args.backend, progress=on_result,
                judge=_judge(args, llm) if args.judge_model else None)
        except KeyboardInterrupt:
            print(f"\nmemex eval: stopped; finished rollouts are in {args.out}. Run the same "
                  "command again to resume.", file=sys.stderr, flush=True)
            os._exit(130)  # rollouts still running in threads are dropped, not waited for
    print(f"memex eval: {run.ran} rollouts run, {run.skipped} already done, in "
          f"{time.monotonic() - t0:.0f}s; results in {run.out}", file=sys.stderr)
    from ..eval import format_summaries, summarise

    sys.stdout.write(format_summaries(summarise(run.results)))
    return 0


def _prices(specs: list[str]) -> dict[str, tuple[float, float]]:
    out = {}
    for spec in specs:
        model, eq, pair = spec.rpartition("=")
        try:
            pin, pout = (float(x) for x in pair.split(","))
        except ValueError:
            eq = ""
        if not eq or not model:
            raise ConfigError(f"--price takes MODEL=IN,OUT (USD per 1M tokens), got {spec!r}")
        out[model] = (pin, pout)
    return out


def cmd_report(args: argparse.Namespace) -> int:
    from ..eval import (
        FAILURE_KINDS,
        by_task,
        format_by_task,
        format_summaries,
        load_audit,
        load_results,
        pareto_plot,
        summarise,
    )

    prices = _prices(args.price)
    results = load_results(args.dir)
    if not results:
        raise ConfigError(f"{args.dir} holds no results yet")
    rows = summarise(results, prices)
    sys.stdout.write(format_summaries(rows, args.format))
    if args.by_task:
        sys.stdout.write(("\n" if args.format == "md" else "")
                         + format_by_task(by_task(results), args.format))
    audit_file = os.path.join(args.dir, "audit.jsonl")
    if args.format == "md" and os.path.exists(audit_file):
        verdicts = load_audit(audit_file)
        counts = {k: sum(v.kind == k for v in verdicts) for k in (*FAILURE_KINDS, None)}
        print("\nfailures by kind (memex eval audit): " + ", ".join(
            f"{k or 'unclassified'} {n}" for k, n in counts.items() if n))
    if args.plot != "none":
        path = pareto_plot(rows, args.plot or os.path.join(args.dir, "pareto.png"))
        print(f"memex eval: Pareto plot in {path}", file=sys.stderr)
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    from ..eval import audit

    with contextlib.ExitStack() as stack:
        llm = _llm(args, stack)

        def on_verdict(v: Any, done: int, total: int) -> None:
            print(f"[{done}/{total}] {v.space:5} seed {v.seed} {v.task}: {v.kind or '?'} "
                  f"- {v.evidence[:100]}", file=sys.stderr, flush=True)

        verdicts = audit(args.dir, llm=llm, limit=args.limit, max_turns=args.max_turns,
                         progress=on_verdict)
    print(f"memex eval: {len(verdicts)} failures audited; verdicts in "
          f"{os.path.join(args.dir, 'audit.jsonl')}", file=sys.stderr)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from ..eval import export_rollouts

    correct = True if args.correct else False if args.wrong else None
    n = 0
    for record in export_rollouts(args.dir, fmt=args.format, suite=args.suite,
                                  model=args.model, space=args.space, correct=correct):
        sys.stdout.write(json.dumps(record, ensure_ascii=False, default=repr) + "\n")
        n += 1
    print(f"memex eval: {n} rollouts exported", file=sys.stderr)
    return 0


def _model_options(p: argparse.ArgumentParser) -> None:
    add_model_options(p)
    p.add_argument("--max-turns", type=int, default=8,
                   help="model turns at most per rollout (default 8)")


def _bundled() -> list[str]:
    """The bundled suites' names (each suite's module is imported only when it is built)."""
    from ..eval.suites import SUITES

    return sorted(SUITES)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("eval", help="code actions vs tool calling on your model: run, report, "
                       "audit, export")
    esub = p.add_subparsers(dest="eval_command", required=True)
    r = esub.add_parser("run", help="run a suite's tasks in each action space")
    r.add_argument("suite", help=f"a bundled suite ({', '.join(_bundled())}) or "
                   "path/to/suite.py[:NAME]")
    _model_options(r)
    r.add_argument("--spaces", default="code,tools", help="code,tools (default both)")
    r.add_argument("--seeds", default="1", help="N (seeds 0..N-1) or a list: 0,3-5")
    r.add_argument("--concurrency", type=int, default=1, help="rollouts at a time")
    r.add_argument("--order", choices=("interleaved", "by-space"), default="interleaved",
                   help="interleaved: each task in every action space in turn (a run stopped "
                        "early still compares them); by-space: every rollout of one space, "
                        "then the next")
    r.add_argument("--out", required=True, help="run folder (results.jsonl, trajectories)")
    r.add_argument("--task", action="append", default=[], metavar="ID",
                   help="only this task (repeatable)")
    r.add_argument("--limit", type=int, default=None, help="the first N tasks per seed")
    r.add_argument("--aid", action="append", default=[], metavar="NAME=VALUE",
                   help="an Aids switch, e.g. example_from_tools=off (names the variant)")
    r.add_argument("--backend", default="pool", help="pool (default)|subprocess|inprocess")
    r.add_argument("--timeout", type=seconds, default=None,
                   help="wall seconds per code block (default: AGENT_LIMITS, 60)")
    r.add_argument("--max-seconds", type=float, default=None,
                   help="wall seconds per rollout (the same bound for every action space)")
    r.add_argument("--quiet", action="store_true", help="a line per rollout, no progress bar")
    r.add_argument("--judge-model", default=None, help="grade tasks whose grader is 'judge' "
                   "with this model (off by default)")
    r.add_argument("--judge-base-url", default=None, help="the judge's endpoint (default: "
                   "the run's)")
    r.set_defaults(func=cmd_run)
    rep = esub.add_parser("report", help="accuracy, tokens, calls, cost per model x space")
    rep.add_argument("dir", help="a results folder that memex eval run wrote")
    rep.add_argument("--format", choices=("md", "json", "csv"), default="md",
                     help="the report's format (default md)")
    rep.add_argument("--by-task", action="store_true",
                     help="also each task's correct/rollouts per action space x variant")
    rep.add_argument("--plot", default=None, help="Pareto plot PNG path (default "
                     "DIR/pareto.png; 'none' for no plot)")
    rep.add_argument("--price", action="append", default=[], metavar="MODEL=IN,OUT",
                     help="USD per 1M input,output tokens for a model (overrides)")
    rep.set_defaults(func=cmd_report)
    a = esub.add_parser("audit", help="classify each failed rollout with a MemEx agent")
    a.add_argument("dir", help="a results folder that memex eval run wrote")
    _model_options(a)
    a.add_argument("--limit", type=int, default=None, help="audit at most N failures")
    a.set_defaults(func=cmd_audit, max_turns=6)
    e = esub.add_parser("export", help="rollouts as training data (JSONL on stdout)")
    e.add_argument("dir", help="a results folder that memex eval run wrote")
    e.add_argument("--format", default="chat-jsonl", choices=("chat-jsonl",),
                   help="the record format (chat-jsonl: one chat transcript per line)")
    e.add_argument("--suite", default=None, help="only this suite's rollouts")
    e.add_argument("--model", default=None, help="only this model's rollouts")
    e.add_argument("--space", default=None, choices=("code", "tools"),
                   help="only this action space's rollouts")
    which = e.add_mutually_exclusive_group()
    which.add_argument("--correct", action="store_true", help="only correct rollouts")
    which.add_argument("--wrong", action="store_true", help="only wrong rollouts")
    e.set_defaults(func=cmd_export)
