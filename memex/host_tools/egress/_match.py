"""Selectors shared by egress rules and secrets: host patterns (exact, ``*.suffix``, ``*``,
IP/CIDR), ports and ranges, segment-wise path prefixes; and the value parsers of the policy
format (sizes like ``'10M'``, times like ``'500ms'``, rates like ``'600/min'``). Problems
raise :class:`~memex.errors.PolicyError` naming the field."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ...errors import ConfigError, PolicyError
from ...runtime_wasm.internal import parse_seconds as _rt_seconds
from ...runtime_wasm.internal import parse_size as _rt_size
from ._addr import (
    BadURL,
    IPAddress,
    IPNetwork,
    Target,
    normalise_host,
    parse_address,
    parse_url,
)

__all__ = ["DEFAULT_STRIP_HEADERS", "SCHEMES", "TOKEN", "Matcher", "as_tuple", "fail",
           "ip_in", "network", "parse_rate", "parse_seconds", "parse_size"]

SCHEMES = ("http", "https")
DEFAULT_STRIP_HEADERS = ("authorization", "cookie", "proxy-authorization")
TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")


def fail(path: str, reason: str, source: str | None) -> PolicyError:
    return PolicyError(reason, source=source, path=path)


def as_tuple(value: object, path: str, source: str | None) -> tuple[Any, ...]:
    if value is None:
        return ()
    if isinstance(value, (str, int)):
        return (value,)
    if isinstance(value, (list, tuple)):
        return tuple(value)
    raise fail(path, f"expected a value or a list, got {type(value).__name__}", source)


# ---- host patterns ------------------------------------------------------------------------------
@dataclass(frozen=True)
class _HostPattern:
    kind: Literal["exact", "suffix", "any", "ip"]
    value: str
    network: IPNetwork | None = None

    def matches(self, t: Target) -> bool:
        if self.kind == "any":
            return True
        if self.kind == "ip":
            return t.ip is not None and self.network is not None and ip_in(t.ip, self.network)
        if t.ip is not None:
            return False
        if self.kind == "exact":
            return t.host == self.value
        return t.host.endswith("." + self.value)


def ip_in(addr: IPAddress, net: IPNetwork) -> bool:
    return addr.version == net.version and addr in net


def network(text: str) -> IPNetwork:
    """An IP or CIDR; IPv4-mapped IPv6 is read as IPv4. ValueError with the reason."""
    if not isinstance(text, str):
        raise ValueError(f"expected an IP address or CIDR string, got {text!r}")
    t = text.strip()
    if "/" in t:
        addr_text, _, bits = t.partition("/")
        try:
            addr = parse_address(addr_text)
        except BadURL:
            raise ValueError(f"{text!r} is not an IP address or CIDR") from None
        if not bits.isdigit():
            raise ValueError(f"{text!r}: the prefix length must be a number")
        n = int(bits)
        if isinstance(addr, ipaddress.IPv4Address) and ":" in addr_text:
            n -= 96  # ::ffff:a.b.c.d/120 -> a.b.c.d/24
        try:
            return ipaddress.ip_network(f"{addr}/{n}", strict=True)
        except ValueError as exc:
            raise ValueError(f"{text!r} is not a valid CIDR: {exc}") from None
    try:
        addr = parse_address(t)
    except BadURL:
        raise ValueError(f"{text!r} is not an IP address or CIDR") from None
    return ipaddress.ip_network(addr)


def _host_pattern(text: object) -> _HostPattern:
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"a host pattern must be a non-empty string, got {text!r}")
    t = text.strip()
    if t == "*":
        return _HostPattern("any", "*")
    if t.startswith("*."):
        try:
            name, ip = normalise_host(t[2:])
        except BadURL as exc:
            raise ValueError(f"invalid host pattern {text!r}: {exc}") from None
        if ip is not None:
            raise ValueError(f"{text!r}: a wildcard cannot stand before an IP address")
        return _HostPattern("suffix", name)
    if "*" in t:
        raise ValueError(f"{text!r}: '*' is allowed only as '*' or a leading '*.'")
    if "/" in t or ":" in t or t.startswith("["):
        return _HostPattern("ip", t, network(t.strip("[]")))
    try:
        name, ip = normalise_host(t)
    except BadURL as exc:
        raise ValueError(f"invalid host {text!r}: {exc}") from None
    if ip is not None:
        return _HostPattern("ip", str(ip), ipaddress.ip_network(ip))
    return _HostPattern("exact", name)


def _port_range(value: object) -> tuple[int, int]:
    if isinstance(value, bool):
        raise ValueError(f"invalid port {value!r}")
    if isinstance(value, int):
        lo = hi = value
    elif isinstance(value, str) and re.fullmatch(r"\s*\d+\s*(-\s*\d+\s*)?", value):
        a, _, b = value.partition("-")
        lo, hi = int(a), int(b or a)
    else:
        raise ValueError(f"invalid port {value!r} (a number or a range like '8000-8100')")
    if not 0 < lo <= hi <= 65535:
        raise ValueError(f"invalid port range {value!r} (1-65535, low before high)")
    return lo, hi


def _path_prefix(value: object) -> str:
    if not isinstance(value, str) or not value.startswith("/"):
        raise ValueError(f"a path prefix must be a string starting with '/', got {value!r}")
    try:
        return parse_url("http://x" + value).path if value != "/" else "/"
    except BadURL as exc:
        raise ValueError(f"invalid path prefix {value!r}: {exc}") from None


def _path_match(prefix: str, path: str) -> bool:
    """Segment-wise prefix: ``/api`` matches ``/api`` and ``/api/x``, not ``/apiv2``."""
    if prefix.endswith("/"):
        return path.startswith(prefix) or path == prefix[:-1]
    return path == prefix or path.startswith(prefix + "/")


class Matcher:
    """The destination selectors shared by rules and secrets, compiled."""

    def __init__(self, where: str, source: str | None, *, scheme: Sequence[Any],
                 host: Sequence[Any], port: Sequence[Any], path: Sequence[Any],
                 default_schemes: tuple[str, ...] = SCHEMES) -> None:
        def each(name: str, values: Sequence[Any], fn: Callable[[Any], Any]) -> list[Any]:
            out = []
            for i, v in enumerate(values):
                try:
                    out.append(fn(v))
                except ValueError as exc:
                    suffix = f"[{i}]" if len(values) > 1 else ""
                    raise fail(f"{where}.{name}{suffix}", str(exc), source) from None
            return out

        def scheme_of(v: object) -> str:
            if not isinstance(v, str) or v.lower() not in SCHEMES:
                raise ValueError(f"unsupported scheme {v!r} (http or https)")
            return v.lower()

        self.schemes = frozenset(each("scheme", scheme, scheme_of) or default_schemes)
        self.hosts: tuple[_HostPattern, ...] = tuple(each("host", host, _host_pattern))
        self.ports: tuple[tuple[int, int], ...] = tuple(each("port", port, _port_range))
        self.paths: tuple[str, ...] = tuple(each("path", path, _path_prefix))

    def matches(self, t: Target) -> bool:
        if t.scheme not in self.schemes:
            return False
        if self.hosts and not any(h.matches(t) for h in self.hosts):
            return False
        if self.ports and not any(lo <= t.port <= hi for lo, hi in self.ports):
            return False
        return not self.paths or any(_path_match(p, t.path) for p in self.paths)


def parse_size(value: object, where: str, source: str | None, *,
               optional: bool = False) -> int | None:
    """The runtime's one size grammar, reported the policy's way (file, key)."""
    if value is None and optional:
        return None
    try:
        return _rt_size(value, what="")
    except ConfigError as exc:
        raise fail(where, str(exc), source) from None


def parse_seconds(value: object, where: str, source: str | None) -> float:
    """The runtime's one duration grammar, reported the policy's way (file, key)."""
    try:
        return _rt_seconds(value, what="")
    except ConfigError as exc:
        raise fail(where, str(exc), source) from None


def parse_rate(value: object, where: str, source: str | None) -> float | None:
    if value is None:
        return None
    per = {"s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0,
           "h": 3600.0, "hour": 3600.0}
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*/\s*([a-z]+)\s*", value)
        if m and m.group(2) in per and float(m.group(1)) > 0:
            return float(m.group(1)) / per[m.group(2)]
    raise fail(where, f"expected a rate like 10, '10/s' or '600/min', got {value!r}", source)
