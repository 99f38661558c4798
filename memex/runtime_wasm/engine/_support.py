"""Whether a wasmtime release is still supported, by the Wasmtime project's release policy
(docs/stability-release.md upstream, and the formula its page computes the table with):
release N came out on the 20th of the month N - 20 months after 2024-04-20 (20.0.0); a
release whose number is a multiple of 12 is LTS and supported for 24 months, any other for
2 months; security fixes are backported to supported releases only. MemEx runs strangers'
code on the release it pins, so the pin must stay inside its window (docs/dependencies.md:
the policy; ``memex prepare`` and ``memex selftest`` say where the pin stands)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

__all__ = ["EngineSupport", "engine_support", "released", "supported_until"]

_ANCHOR = (20, dt.date(2024, 4, 20))  # wasmtime 20.0.0


def _months_after(day: dt.date, months: int) -> dt.date:
    m = day.month - 1 + months
    return day.replace(year=day.year + m // 12, month=m % 12 + 1)


def released(major: int) -> dt.date:
    """The day wasmtime ``major``.0.0 was (or will be) released."""
    return _months_after(_ANCHOR[1], major - _ANCHOR[0])


def supported_until(major: int) -> dt.date:
    """The last day wasmtime ``major`` gets security fixes (24 months for an LTS release,
    a multiple of 12; 2 months for any other)."""
    return _months_after(released(major), 24 if major % 12 == 0 else 2)


@dataclass(frozen=True)
class EngineSupport:
    """The installed wasmtime and its support window (``memex prepare`` and ``memex
    selftest`` say it; a release past its window gets no security fixes)."""

    version: str
    released: dt.date
    supported_until: dt.date
    supported: bool

    def describe(self) -> str:
        if self.supported:
            return f"wasmtime {self.version}: supported until {self.supported_until}"
        return (f"wasmtime {self.version} left its support window on {self.supported_until}: "
                "it gets no security fixes (docs/dependencies.md, 'The engine')")


def engine_support(version: str | None = None, today: dt.date | None = None) -> EngineSupport:
    """The support window of wasmtime ``version`` (default: the installed one) on ``today``
    (default: today, UTC)."""
    from ._capi import wasmtime_version

    version = version or wasmtime_version()
    major = int(version.split(".")[0])
    day = today or dt.datetime.now(dt.UTC).date()
    until = supported_until(major)
    return EngineSupport(version, released(major), until, day <= until)
