"""``memex run``: run a file or ``-c CODE`` in a fresh sandbox, optionally with network
egress under a policy (its audit printed after the run)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ._common import (
    add_sandbox_options,
    exit_code,
    limits,
    mounts,
    preload,
    print_result,
    resolved,
)

__all__ = ["add_parser"]


def cmd_run(args: argparse.Namespace) -> int:
    from ..runtime_wasm import Sandbox

    if args.code is not None:
        code, filename = args.code, "<string>"
    elif args.file is not None:
        try:
            with open(args.file, encoding="utf-8") as f:
                code = f.read()
        except OSError as exc:
            print(f"memex run: cannot read {args.file}: {exc.strerror}", file=sys.stderr)
            return 2
        filename = args.file
    else:
        print("memex run: give -c CODE or a FILE", file=sys.stderr)
        return 2
    from ..runtime_wasm import script_dependencies

    packages = [*args.packages, *(script_dependencies(code) or [])]  # --with, and PEP 723
    lim = limits(args)
    found = resolved(packages, lim.disk_bytes)
    egress = None
    if args.policy is not None:  # network egress under a policy; the audit after the run
        from ._policy import audit_dicts, print_audit, run_egress

        egress = run_egress(args.policy)
    with Sandbox(limits=lim, mounts=mounts(args.mount), preload=preload(args),
                 packages=found, rollback=False) as sb:
        if egress is not None:
            egress.attach(sb, install=False)
        r = sb.run(code, filename=filename)
    if args.json:
        print(json.dumps(r.to_dict() | ({"egress": audit_dicts(egress)} if egress else {})))
    else:
        print_result(r, echo=False)
        if egress is not None:
            print_audit(egress)
    return exit_code(r)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("run", help="run a file or -c CODE in a fresh sandbox (a script's "
                       "PEP 723 '# /// script' dependencies are fetched for it)")
    p.add_argument("file", nargs="?")
    p.add_argument("-c", dest="code", default=None)
    p.add_argument("--json", action="store_true", help="print the turn result as JSON")
    p.add_argument("--policy", default=None, metavar="POLICY",
                   help="egress policy file (TOML/YAML): network access under it, audit after")
    add_sandbox_options(p)
    p.set_defaults(func=cmd_run)
