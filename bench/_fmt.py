"""Shared formatting and timing for the benchmark scripts (run as `python bench/X.py`)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def fmt(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1.0:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def median_p90(samples: list[float]) -> tuple[float, float]:
    s = sorted(samples)
    return statistics.median(s), s[int(0.9 * (len(s) - 1))]


def sample(fn: Callable[[], Any], n: int, *, warm: int = 0) -> list[float]:
    """Wall times of ``n`` calls of ``fn``, after ``warm`` untimed ones."""
    for _ in range(warm):
        fn()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out
