"""``memex prepare``: the one-time precompile of the guest (``./build.sh`` runs it)."""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["add_parser"]


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


@contextlib.contextmanager
def _progress(flavour: str) -> Iterator[None]:
    stop = threading.Event()
    t = threading.Thread(target=_spinner, args=(f"compiling {flavour}", stop), daemon=True)
    t.start()
    start = time.monotonic()
    try:
        yield
    finally:
        stop.set()
        t.join()
        _step(f"{flavour} compiled in {time.monotonic() - start:.0f}s")


def _step(label: str) -> None:
    print(f"memex prepare: {label}", file=sys.stderr, flush=True)


def cmd_prepare(args: argparse.Namespace) -> int:
    from ..runtime_wasm import prepare

    prepare(("plain", "metered") if args.flavour == "all" else (args.flavour,), step=_step,
            compiling=_progress)
    _step("done")
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("prepare", help="verify artifacts and precompile the guest (once)")
    p.add_argument("--flavour", choices=("plain", "metered", "all"), default="all")
    p.set_defaults(func=cmd_prepare)
