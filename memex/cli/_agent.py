"""``memex agent``: run one rollout, streaming each turn."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import sys
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ._common import add_model_options, limits, llm_from_args, seconds

__all__ = ["add_parser", "load_input"]


def _load_attr(spec: str) -> Any:
    mod, sep, attr = spec.partition(":")
    if not sep or not mod or not attr:
        raise ConfigError(f"{spec!r} is not module:attribute")
    sys.path.insert(0, str(Path.cwd()))
    try:
        obj: Any = importlib.import_module(mod)
    except ImportError as exc:
        raise ConfigError(f"cannot import {mod!r}: {exc}") from exc
    finally:
        sys.path.pop(0)
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise ConfigError(f"{mod!r} has no attribute {attr!r}") from exc
    return obj


def _optional(module: str, path: str) -> Any:
    """An optional package a kind of input file needs (ConfigError naming it when absent)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(f"reading {path!r} needs {module}, which is not installed "
                          f"(pip install {module})") from exc


def load_input(path: str) -> Any:
    """A file as a typed input: CSV/Parquet -> DataFrame, .npy -> ndarray, JSON -> data,
    trajectory JSONL -> list of Trajectory, other JSONL -> list, anything else -> str."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"input file {path!r} does not exist")
    suffix = p.suffix.lower()
    try:
        if suffix in (".csv", ".tsv", ".parquet"):
            pd = _optional("pandas", path)
            if suffix == ".parquet":
                return pd.read_parquet(p)
            return pd.read_csv(p, sep="\t" if suffix == ".tsv" else ",")
        if suffix == ".npy":
            return _optional("numpy", path).load(p, allow_pickle=False)
        if suffix == ".json":
            return json.loads(p.read_text(encoding="utf-8"))
        if suffix == ".jsonl":
            lines = [json.loads(x) for x in p.read_text(encoding="utf-8").splitlines()
                     if x.strip()]
            if lines and isinstance(lines[0], dict) and lines[0].get("event") == "start":
                from ..executor import load_trajectories

                return load_trajectories(p)
            return lines
        return p.read_text(encoding="utf-8", errors="replace")
    except (ValueError, OSError) as exc:
        raise ConfigError(f"cannot read input {path!r}: {exc}") from exc


def cmd_agent(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ..executor import Budget, Hooks, MemexAgent, SandboxSpec, render_step
    from ..runtime_wasm import AGENT_LIMITS

    tools: Any = []
    for spec in args.tools:
        obj = _load_attr(spec)
        tools.extend(obj if isinstance(obj, list | tuple) or hasattr(obj, "names") else [obj])
    inputs = {}
    for spec in args.input:
        name, sep, path = spec.partition("=")
        if not sep:
            raise ConfigError(f"--input takes NAME=FILE, got {spec!r}")
        inputs[name] = load_input(path)
    schema = _load_attr(args.schema) if args.schema else None
    console = Console()
    streamed: list[str] = []

    def on_text(delta: str) -> None:
        streamed.append(delta)
        console.print(delta, end="", style="dim", markup=False, highlight=False)

    def on_step(step: Any) -> None:
        if streamed:
            console.print()
            streamed.clear()
        render_step(step, console)

    with contextlib.ExitStack() as stack:
        agent = stack.enter_context(MemexAgent(
            model=llm_from_args(args, stack, "agent"),
            tools=tools, submit=schema, action_space=args.action_space,
            sandbox=SandboxSpec(limits=limits(args, AGENT_LIMITS), backend=args.backend),
            budget=Budget(max_turns=args.max_turns, max_tokens=args.max_tokens,
                          max_seconds=args.max_seconds, max_cost=args.max_cost),
            hooks=Hooks(trajectory_path=args.trajectory, on_step=on_step,
                        on_text=on_text if args.stream else None)))
        rollout = agent.run(args.task, inputs=inputs)
    t = rollout.trajectory
    answer = json.dumps(t.answer, ensure_ascii=False) if rollout.submitted else "none"
    console.print(f"[bold]end:[/bold] {rollout.end_reason} · answer {answer} · "
                  f"{len(t.steps)} turns · {t.total_tokens} tokens · {t.duration:.1f}s"
                  + (f" · error: {rollout.error}" if rollout.error else ""), markup=True,
                  highlight=False)
    console.print(f"trajectory: {args.trajectory}")
    return 0 if rollout.submitted else 1


def add_parser(sub: Any) -> None:
    p = sub.add_parser("agent", help="run an agent on a task, streaming each turn")
    p.add_argument("task", help="the task, in words")
    add_model_options(p, max_reply_tokens=1024)
    p.add_argument("--tools", action="append", default=[], metavar="MODULE:ATTR",
                   help="a tool, list of tools or ToolSet (repeatable)")
    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE",
                   help="a typed input placed in the guest's globals (repeatable)")
    p.add_argument("--schema", default=None, metavar="MODULE:MODEL",
                   help="the answer schema submit() validates against")
    p.add_argument("--action-space", choices=("code", "tools"), default="code",
                   help="code: Python blocks in a sandbox (default); tools: the tool-calling "
                        "baseline")
    p.add_argument("--backend", default=None, help="inprocess|subprocess|pool|ray")
    p.add_argument("--max-turns", type=int, default=12, help="model turns at most (12)")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="model tokens at most, prompt and reply (default: no bound)")
    p.add_argument("--max-seconds", type=float, default=None,
                   help="wall seconds for the whole run (default: no bound)")
    p.add_argument("--max-cost", type=float, default=None,
                   help="model cost at most, in USD from the price table (default: no bound)")
    p.add_argument("--timeout", type=seconds, default=None,
                   help="wall seconds per block (default: AGENT_LIMITS, 60)")
    p.add_argument("--trajectory", default="memex-trajectory.jsonl",
                   help="where the trajectory is written (JSONL)")
    p.add_argument("--no-stream", dest="stream", action="store_false",
                   help="do not stream the model's text")
    p.set_defaults(func=cmd_agent)
