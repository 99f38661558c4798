"""``memex repl``: an interactive sandboxed Python whose state persists, behaving like
``python``'s own REPL: ``>>>`` and ``...`` prompts decided by ``codeop`` as CPython's ``code``
module does (a compound statement ends at an empty line), line editing and history through
``readline`` on a terminal, Ctrl-C at a prompt discards the input, Ctrl-D exits. Ctrl-C while a
cell runs interrupts that cell (``Sandbox.interrupt``): the guest is rolled back to the end of
the previous cell and the session goes on.
"""

from __future__ import annotations

import argparse
import codeop
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._common import add_sandbox_options, limits, mounts, preload, print_result, resolved

if TYPE_CHECKING:
    from ..runtime_wasm import Sandbox, TurnResult

__all__ = ["add_parser", "needs_more"]

PS1, PS2 = ">>> ", "... "
BANNER = "MemEx sandboxed Python (CPython on WASI). Ctrl-D or exit() to quit."
HISTORY_ENV = "MEMEX_HISTFILE"  # where the history is kept ("" keeps none)


def needs_more(source: str) -> bool:
    """True while ``source`` is an incomplete statement (the ``...`` prompt), exactly as
    CPython's interactive console decides; a syntax error is complete (the guest reports it)."""
    try:
        return codeop.compile_command(source, "<stdin>", "single") is None
    except (SyntaxError, ValueError, OverflowError):
        return False


def _history_file() -> str | None:
    """``$MEMEX_HISTFILE`` (empty: none), else ``history`` in MemEx's state folder (XDG);
    a ``~/.memex_history`` an earlier version kept is still used while it is the only one."""
    path = os.environ.get(HISTORY_ENV)
    if path is not None:
        return path or None
    from ..runtime_wasm.internal import state_dir

    current = state_dir() / "history"
    legacy = Path.home() / ".memex_history"
    if legacy.is_file() and not current.exists():
        return str(legacy)
    current.parent.mkdir(parents=True, exist_ok=True)
    return str(current)


@contextlib.contextmanager
def _line_editing() -> Iterator[None]:
    """readline for ``input()`` on a terminal: editing, history across sessions, and Tab
    indenting (no completion: names live in the guest)."""
    try:
        import readline
    except ImportError:  # a Python built without it: plain input()
        yield
        return
    readline.parse_and_bind("tab: tab-insert")
    path = _history_file()
    if path is not None:
        with contextlib.suppress(OSError):
            readline.read_history_file(path)
    try:
        yield
    finally:
        if path is not None:
            with contextlib.suppress(OSError):
                readline.set_history_length(1000)
                readline.write_history_file(path)


def _read_line(prompt: str, tty: bool) -> str:
    if tty:
        return input(prompt)
    sys.stderr.write(prompt)  # like CPython: prompts never mix into stdout
    sys.stderr.flush()
    line = sys.stdin.readline()
    if not line:
        raise EOFError
    return line.rstrip("\n")


def _run_cell(sb: Sandbox, source: str) -> tuple[TurnResult, bool]:
    """Run one cell; Ctrl-C (SIGINT) meanwhile interrupts it. (result, interrupted)."""
    hit: list[bool] = []

    def on_sigint(_sig: int, _frame: object) -> None:
        hit.append(True)
        sb.interrupt()

    main = threading.current_thread() is threading.main_thread()  # signals need it
    previous = signal.signal(signal.SIGINT, on_sigint) if main else None
    try:
        r = sb.run(source, filename="<stdin>")
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)
    return r, bool(hit) and r.limit == "cancelled"


def repl(sb: Sandbox, *, tty: bool) -> int:
    """The read-eval-print loop over ``sb``; returns the exit code."""
    print(BANNER, file=sys.stderr)
    buf: list[str] = []
    while True:
        try:
            line = _read_line(PS2 if buf else PS1, tty)
        except EOFError:
            print(file=sys.stderr)
            return 0
        except KeyboardInterrupt:  # at a prompt: discard the input, as python does
            sys.stdout.write("\nKeyboardInterrupt\n")
            sys.stdout.flush()
            buf = []
            continue
        buf.append(line)
        source = "\n".join(buf)
        if needs_more(source):
            continue
        buf = []
        if not source.strip():
            continue
        r, interrupted = _run_cell(sb, source)
        if interrupted:
            if r.stdout:
                sys.stdout.write(r.stdout)
            sys.stdout.write("KeyboardInterrupt\n")
            sys.stdout.flush()
            print("memex: cell interrupted; the session is as it was before it",
                  file=sys.stderr, flush=True)
            continue
        print_result(r, echo=True)
        if r.status.value == "exit":
            return r.exit_code or 0


def cmd_repl(args: argparse.Namespace) -> int:
    from ..runtime_wasm import Sandbox

    tty = sys.stdin.isatty()
    lim = limits(args)
    with Sandbox(limits=lim, mounts=mounts(args.mount), preload=preload(args),
                 packages=resolved(list(args.packages), lim.disk_bytes)) as sb, \
            _line_editing() if tty else contextlib.nullcontext():
        return repl(sb, tty=tty)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("repl", help="an interactive sandboxed REPL with persistent state")
    add_sandbox_options(p)
    p.set_defaults(func=cmd_repl)
