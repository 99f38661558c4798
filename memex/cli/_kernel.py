"""``memex kernel install``: a Jupyter kernel whose cells run in a MemEx sandbox (the
``jupyter`` extra). The kernelspec carries the sandbox's settings; JupyterLab, nbclient and
papermill then offer it like any kernel."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..errors import ConfigError
from ._common import seconds, size

__all__ = ["add_parser"]


def cmd_install(args: argparse.Namespace) -> int:
    try:
        from ..integrations.jupyter import install_kernelspec
    except ImportError as exc:
        raise ConfigError(f"memex kernel needs Jupyter's kernel packages: pip install "
                          f"'memex[jupyter]' ({exc})") from exc
    where = install_kernelspec(
        args.name, user=not args.sys_prefix, prefix=sys.prefix if args.sys_prefix else args.prefix,
        display_name=args.display_name, timeout=args.timeout, memory=args.memory,
        fuel=args.fuel, mounts=args.mount,
        preload=[p for p in (args.preload or "").split(",") if p], policy=args.policy)
    print(f"memex kernel: installed {args.name!r} in {where}", file=sys.stderr)
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("kernel", help="a Jupyter kernel whose cells run in a MemEx sandbox")
    ksub = p.add_subparsers(dest="kernel_command", required=True)
    q = ksub.add_parser("install", help="install the kernelspec (jupyter kernelspec list "
                        "shows it)")
    q.add_argument("--name", default="memex", help="the kernel's name (default memex)")
    q.add_argument("--display-name", default="MemEx (sandboxed Python)",
                   help="the kernel's name in Jupyter's menus")
    where = q.add_mutually_exclusive_group()
    where.add_argument("--prefix", default=None, help="install under this prefix")
    where.add_argument("--sys-prefix", action="store_true",
                       help="install into this Python's environment")
    q.add_argument("--timeout", type=seconds, default=None,
                   help="wall seconds per cell (default: KERNEL_LIMITS, 600)")
    q.add_argument("--memory", type=size, default=None, help="guest memory cap (e.g. 2G)")
    q.add_argument("--fuel", type=int, default=None, help="instruction budget per cell")
    q.add_argument("--mount", action="append", default=[], metavar="HOST:GUEST[:rw]",
                   help="grant a host folder (read-only unless :rw)")
    q.add_argument("--preload", default=None, metavar="MOD,...",
                   help="start from a warm image with these modules imported")
    q.add_argument("--policy", default=None, metavar="FILE", help="egress policy")
    q.set_defaults(func=cmd_install)
