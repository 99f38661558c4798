"""``memex trajectory show``: render trajectory files readably."""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import ConfigError

__all__ = ["add_parser"]


def cmd_show(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ..executor import load_trajectories, render_trajectory

    found = load_trajectories(args.file)
    if not found:
        raise ConfigError(f"{args.file} holds no trajectory")
    console = Console()
    for t in found:
        if args.id and not t.id.startswith(args.id):
            continue
        render_trajectory(t, console)
        console.print()
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("trajectory", help="inspect trajectory files")
    tsub = p.add_subparsers(dest="trajectory_command", required=True)
    q = tsub.add_parser("show", help="render a trajectory file readably")
    q.add_argument("file", help="a trajectory JSONL file (Trajectory.save, --trajectory)")
    q.add_argument("--id", default=None, help="only the trajectory whose id starts so")
    q.set_defaults(func=cmd_show)
