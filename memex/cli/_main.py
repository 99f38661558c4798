"""The ``memex`` command: one module per subcommand, each adding its parser; what a command
needs is imported when it runs, so that ``memex run -c pass`` stays fast."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import (
    _agent,
    _kernel,
    _mcp,
    _model,
    _policy,
    _prepare,
    _repl,
    _run,
    _selftest,
    _trajectory,
)

__all__ = ["build_parser", "main"]

DESCRIPTION = """The memex command: persistent, capped CPython-on-WASI sandboxes.
Run `memex prepare` once per machine (./build.sh does), then `memex run`, `memex repl` or
`memex agent`; `memex selftest` checks the sandbox's containment on this machine."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memex", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    for module in (_prepare, _run, _repl, _agent, _trajectory, _model, _policy, _mcp,
                   _kernel, _selftest):
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from ..errors import MemexError

    try:
        return int(args.func(args))
    except MemexError as exc:
        print(f"memex: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
