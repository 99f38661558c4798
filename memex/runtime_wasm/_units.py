"""The one grammar for sizes and durations that every entry point reads (flags, serve.toml, the
MCP config, the egress policy, request bodies): ``512M``, ``1.5GiB``, ``65536``; ``30``,
``500ms``, ``2min``. Binary units throughout (``K`` = ``KB`` = ``KiB`` = 1024), case-insensitive.
"""

from __future__ import annotations

import email.utils
import math
import re
import time
from collections.abc import Mapping

from ..errors import ConfigError

__all__ = ["parse_seconds", "parse_size", "retry_after", "size_text"]

MAX_SIZE = 1 << 62
_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20,
               "mb": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30,
               "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40}
_SECOND_UNITS = {"": 1.0, "s": 1.0, "sec": 1.0, "ms": 0.001, "m": 60.0, "min": 60.0,
                 "h": 3600.0}
_NUMBER = re.compile(r"\s*(\d{1,30}(?:\.\d{1,30})?)\s*([A-Za-z]{0,3})\s*")


def parse_size(value: object, *, what: str = "size") -> int:
    """Bytes from an int >= 0 or text such as ``512M`` (a :class:`ConfigError` naming ``what``
    otherwise). Text is at most 64 characters, so a hostile value costs nothing to refuse."""
    n: float | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        n = value
    elif isinstance(value, str) and len(value) <= 64:
        m = _NUMBER.fullmatch(value)
        if m and m.group(2).lower() in _SIZE_UNITS:
            n = float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]
    if n is None or not 0 <= n < MAX_SIZE:
        raise ConfigError(f"{what}: " * bool(what) + "expected a byte count such as 65536 "
                          f"or '512M', got {value!r:.80}")
    return int(n)


def size_text(n: int) -> str:
    """Bytes as the config takes them: ``512M``, ``8G``, ``1536K``, else the number of bytes
    (``parse_size(size_text(n)) == n`` always)."""
    for unit, shift in (("T", 40), ("G", 30), ("M", 20), ("K", 10)):
        if n and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def parse_seconds(value: object, *, what: str = "duration") -> float:
    """Seconds > 0 from a number or text such as ``30``, ``500ms``, ``2min``, ``1h``."""
    n: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        n = float(value)
    elif isinstance(value, str) and len(value) <= 64:
        m = _NUMBER.fullmatch(value)
        if m and m.group(2).lower() in _SECOND_UNITS:
            n = float(m.group(1)) * _SECOND_UNITS[m.group(2).lower()]
    if n is None or not 0 < n < 1e9 or not math.isfinite(n):
        raise ConfigError(f"{what}: " * bool(what) + "expected seconds > 0 such as 30 or "
                          f"'500ms', got {value!r:.80}")
    return n


def retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Seconds an HTTP answer asks the caller to wait: ``retry-after-ms``, else
    ``Retry-After`` (seconds or an HTTP date); None when it asks nothing or says nonsense.
    One parser for the LLM client's retries and the service client's."""
    if headers is None:
        return None
    for header, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(header)
        if value is None or len(value) > 64:
            continue
        try:
            seconds = float(value) / divisor
        except ValueError:
            if divisor == 1000.0:
                continue
            parsed = email.utils.parsedate_tz(value)
            if parsed is None:
                return None
            seconds = email.utils.mktime_tz(parsed) - time.time()
        return max(0.0, seconds) if math.isfinite(seconds) else None
    return None
