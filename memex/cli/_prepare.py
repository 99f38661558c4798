"""``memex prepare``: the one-time precompile of the guest (``./build.sh`` runs it)."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Iterator
from typing import Any

from ._progress import activity

__all__ = ["add_parser"]


@contextlib.contextmanager
def _progress(flavour: str) -> Iterator[None]:
    start = time.monotonic()
    with activity(f"compiling {flavour}"):
        yield
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
    p.add_argument("--flavour", choices=("plain", "metered", "all"), default="all",
                   help="which guest module to compile: plain, metered (fuel counted) or all "
                        "(default)")
    p.set_defaults(func=cmd_prepare)
