"""``memex run``: run a file, ``-`` (stdin), ``-c CODE`` or ``-m MODULE`` in a fresh sandbox,
with the script's arguments in its ``sys.argv`` as ``python`` and ``uv run`` take them,
optionally with network egress under a policy (its audit printed after the run)."""

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

__all__ = ["add_parser", "split_script"]


def split_script(argv: list[str]) -> tuple[list[str], list[str]]:
    """``memex run``'s arguments split as ``python`` splits its command line: memex's own
    options, up to and including what to run (a FILE, ``-``, or ``-c CODE`` / ``-m
    MODULE``), and the script's arguments after it, which may look like options
    (``memex run -m json.tool --help`` is json.tool's help)."""
    takes_value: set[str] = set()
    probe = argparse.ArgumentParser(add_help=False)
    _add_options(probe)
    for action in probe._actions:
        if action.nargs != 0:
            takes_value.update(action.option_strings)
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-c", "-m", "--"):
            return argv[:i + 2], argv[i + 2:]
        if a.startswith(("-c", "-m")) or a == "-" or not a.startswith("-"):
            return argv[:i + 1], argv[i + 1:]  # -cCODE, -mMODULE, stdin, FILE
        i += 2 if a in takes_value else 1
    return argv, []


def _script(args: argparse.Namespace) -> tuple[str, str, list[str]] | str:
    """What to run: its code, its filename and its ``sys.argv``; or why not (misuse)."""
    rest = list(getattr(args, "argv", []))
    if (args.code is not None) + (args.module is not None) + (args.file is not None) != 1:
        return "give one of FILE, - (stdin), -c CODE or -m MODULE"
    if args.code is not None:
        return args.code, "<string>", ["-c", *rest]
    if args.module is not None:  # runpy puts the module's own path in sys.argv[0]
        return (f"import runpy\nrunpy.run_module({args.module!r}, run_name='__main__', "
                "alter_sys=True)", "<run_module>", ["-m", *rest])
    if args.file == "-":
        return sys.stdin.read(), "<stdin>", ["-", *rest]
    try:
        with open(args.file, encoding="utf-8") as f:
            return f.read(), args.file, [args.file, *rest]
    except OSError as exc:
        return f"cannot read {args.file}: {exc.strerror}"


def cmd_run(args: argparse.Namespace) -> int:
    from ..runtime_wasm import Sandbox

    what = _script(args)
    if isinstance(what, str):
        print(f"memex run: {what}", file=sys.stderr)
        return 2
    code, filename, argv = what
    from ..runtime_wasm.internal import script_dependencies

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
        sb.run(f"import sys as _s\n_s.argv = {argv!r}\ndel _s")
        r = sb.run(code, filename=filename)
    if args.json:
        print(json.dumps(r.to_dict() | ({"egress": audit_dicts(egress)} if egress else {})))
    else:
        print_result(r, echo=False)
        if egress is not None:
            print_audit(egress)
    return exit_code(r)


def _add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", dest="code", default=None, metavar="CODE",
                   help="run CODE (a string); the arguments after it are its sys.argv[1:]")
    p.add_argument("-m", dest="module", default=None, metavar="MODULE",
                   help="run a module the guest can import (the standard library, --with "
                        "packages, a mount on its path) as __main__, as python -m does")
    p.add_argument("--json", action="store_true", help="print the turn result as JSON")
    p.add_argument("--policy", default=None, metavar="POLICY",
                   help="egress policy file (TOML/YAML): network access under it, audit after")
    add_sandbox_options(p)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("run", help="run a file, - (stdin), -c CODE or -m MODULE in a fresh "
                       "sandbox, as python does (a script's PEP 723 '# /// script' "
                       "dependencies are fetched for it)",
                       usage="memex run [options] (FILE | - | -c CODE | -m MODULE) [ARGS...]")
    p.add_argument("file", nargs="?", metavar="FILE",
                   help="the script to run; - reads it from stdin")
    p.add_argument("argv", nargs="*", metavar="ARGS",
                   help="the script's arguments: its sys.argv[1:] (they may look like options: "
                        "everything after the script is the script's)")
    _add_options(p)
    p.set_defaults(func=cmd_run)
