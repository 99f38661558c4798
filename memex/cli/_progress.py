"""How the long commands show progress (``memex prepare``'s compiles, ``memex model fetch``'s
download): rich on a terminal (a spinner with the time, or a bar of bytes); in a log (not a
terminal) a plain line every 15 s, so CI output shows life without redraws."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator

__all__ = ["activity", "byte_bar", "steps"]

STEPS_AFTER = 1.0
"""Seconds a step of ``steps`` runs before it is shown (a cached package set says nothing)."""


@contextlib.contextmanager
def steps(prefix: str) -> Iterator[Callable[[str], None]]:
    """A ``say(what)`` callback for a job of a few named steps (a package resolution): quiet
    for its first second; past it the step under way is printed, then each later one, with
    the seconds spent."""
    lock = threading.Lock()
    latest: list[str] = []
    shown = threading.Event()
    stop = threading.Event()
    start = time.monotonic()

    def show(what: str) -> None:
        print(f"{prefix}: {what} ... {time.monotonic() - start:.1f}s", file=sys.stderr,
              flush=True)

    def say(what: str) -> None:
        with lock:
            latest[:] = [what]
            if shown.is_set():
                show(what)

    def wait() -> None:
        if not stop.wait(STEPS_AFTER):
            with lock:
                shown.set()
                if latest:
                    show(latest[0])

    t = threading.Thread(target=wait, daemon=True)
    t.start()
    try:
        yield say
    finally:
        stop.set()
        t.join()


@contextlib.contextmanager
def activity(label: str) -> Iterator[None]:
    """A spinner and the seconds spent while the block runs."""
    if sys.stderr.isatty():
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                      console=Console(stderr=True), transient=True) as bar:
            bar.add_task(label, total=None)
            yield
        return
    stop = threading.Event()
    start = time.monotonic()

    def beat() -> None:
        while not stop.wait(15.0):
            print(f"  {label} ... {time.monotonic() - start:.0f}s", file=sys.stderr,
                  flush=True)

    t = threading.Thread(target=beat, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()


@contextlib.contextmanager
def byte_bar(label: str) -> Iterator[Callable[[int, int], None]]:
    """A ``progress(done, total)`` callback drawing a download bar (bytes, speed, time
    left); off a terminal, a line at each further tenth."""
    if sys.stderr.isatty():
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                      TransferSpeedColumn(), TimeRemainingColumn(),
                      console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task(label, total=None)
            yield lambda done, total: bar.update(task, completed=done, total=total)
        return
    shown = [-1]

    def line(done: int, total: int) -> None:
        tenth = 10 * done // max(total, 1)
        if tenth > shown[0]:
            shown[0] = tenth
            print(f"  {label}: {done / 1e6:,.0f} of {total / 1e6:,.0f} MB", file=sys.stderr,
                  flush=True)

    yield line
