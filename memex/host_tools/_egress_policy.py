"""The egress policy as data, and the decision for one request (docs/egress.md).

Default deny. A request is refused if any deny rule matches it (deny overrides allow, so rule
order cannot open a hole); otherwise the first allow rule that matches it decides, and that
rule's header allowances and caps apply. Addresses that are not ordinary public ones
(loopback, private, link-local, multicast, unspecified, reserved, cloud metadata) pass only
under an allow rule that names them: an ``ip`` (or an IP ``host``) inside the special range
itself, so ``ip = "0.0.0.0/0"`` or ``host = "*"`` never reach them.

A policy is built from Python objects (these classes), a mapping (``from_dict``) or a TOML or
YAML file (``load``; see ``_egress_load``). Matching is indexed by host so a 1,000-rule policy
decides in microseconds.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..errors import PolicyError
from ._egress_addr import (
    METADATA_NAMES,
    BadURL,
    IPAddress,
    IPNetwork,
    Special,
    Target,
    UnsupportedScheme,
    classify,
    normalise_host,
    parse_address,
    parse_url,
)

__all__ = [
    "DEFAULT_STRIP_HEADERS",
    "EgressDecision",
    "EgressLimits",
    "EgressPolicy",
    "EgressRule",
    "EgressSecret",
    "SecretUnavailable",
]

SCHEMES = ("http", "https")
DEFAULT_STRIP_HEADERS = ("authorization", "cookie", "proxy-authorization")
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")


def _fail(path: str, reason: str, source: str | None) -> PolicyError:
    return PolicyError(reason, source=source, path=path)


def _as_tuple(value: Any, path: str, source: str | None) -> tuple[Any, ...]:
    if value is None:
        return ()
    if isinstance(value, (str, int)):
        return (value,)
    if isinstance(value, (list, tuple)):
        return tuple(value)
    raise _fail(path, f"expected a value or a list, got {type(value).__name__}", source)


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
            return t.ip is not None and self.network is not None and _in(t.ip, self.network)
        if t.ip is not None:
            return False
        if self.kind == "exact":
            return t.host == self.value
        return t.host.endswith("." + self.value)


def _in(addr: IPAddress, net: IPNetwork) -> bool:
    return addr.version == net.version and addr in net


def _network(text: str) -> IPNetwork:
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


def _host_pattern(text: Any) -> _HostPattern:
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
        return _HostPattern("ip", t, _network(t.strip("[]")))
    try:
        name, ip = normalise_host(t)
    except BadURL as exc:
        raise ValueError(f"invalid host {text!r}: {exc}") from None
    if ip is not None:
        return _HostPattern("ip", str(ip), ipaddress.ip_network(ip))
    return _HostPattern("exact", name)


def _port_range(value: Any) -> tuple[int, int]:
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


def _path_prefix(value: Any) -> str:
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


class _Matcher:
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
                    raise _fail(f"{where}.{name}{suffix}", str(exc), source) from None
            return out

        def scheme_of(v: Any) -> str:
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


# ---- rules, limits, secrets ---------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class EgressRule:
    """One allow or deny rule. Every selector left empty matches anything; a list matches any
    of its entries. ``host``: exact names, ``*.example.com`` (any subdomain, not the apex),
    ``*``, or IP / CIDR literals (matching a URL that names the address). ``ip``: IPs or CIDRs
    every resolved address must lie in (for a deny rule: any address). ``path``: prefixes,
    segment-wise. ``allow_headers``: request headers of the policy's strip list this rule lets
    through. The caps, when set, replace the policy's for requests this rule allows."""

    action: Literal["allow", "deny"]
    name: str | None = None
    scheme: tuple[str, ...] = ()
    host: tuple[str, ...] = ()
    ip: tuple[str, ...] = ()
    port: tuple[int | str, ...] = ()
    method: tuple[str, ...] = ()
    path: tuple[str, ...] = ()
    allow_headers: tuple[str, ...] = ()
    max_request_bytes: int | None = None
    max_response_bytes: int | None = None
    timeout: float | None = None
    source: str | None = None  # "file:line" when loaded from a file
    _m: _Matcher = field(init=False, repr=False, compare=False)
    _nets: tuple[IPNetwork, ...] = field(init=False, repr=False, compare=False)
    _methods: frozenset[str] = field(init=False, repr=False, compare=False)
    _headers: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        where, src = self.name or "rule", self.source
        if self.action not in ("allow", "deny"):
            raise _fail(f"{where}.action", f"must be 'allow' or 'deny', got {self.action!r}", src)
        if self.name is not None and (not isinstance(self.name, str) or not self.name.strip()):
            raise _fail(f"{where}.name", "a rule name must be a non-empty string", src)
        norm: dict[str, tuple[Any, ...]] = {}
        for f in ("scheme", "host", "ip", "port", "method", "path", "allow_headers"):
            norm[f] = _as_tuple(getattr(self, f), f"{where}.{f}", src)
            object.__setattr__(self, f, norm[f])
        object.__setattr__(self, "_m", _Matcher(where, src, scheme=norm["scheme"],
                                                host=norm["host"], port=norm["port"],
                                                path=norm["path"]))
        nets = []
        for i, v in enumerate(norm["ip"]):
            try:
                nets.append(_network(v))
            except ValueError as exc:
                suffix = f"[{i}]" if len(norm["ip"]) > 1 else ""
                raise _fail(f"{where}.ip{suffix}", str(exc), src) from None
        object.__setattr__(self, "_nets", tuple(nets))
        methods = set()
        for v in norm["method"]:
            if not isinstance(v, str) or not _TOKEN.match(v):
                raise _fail(f"{where}.method", f"invalid HTTP method {v!r}", src)
            methods.add(v.upper())
        object.__setattr__(self, "_methods", frozenset(methods))
        headers = set()
        for v in norm["allow_headers"]:
            if not isinstance(v, str) or not _TOKEN.match(v):
                raise _fail(f"{where}.allow_headers", f"invalid header name {v!r}", src)
            headers.add(v.lower())
        object.__setattr__(self, "_headers", frozenset(headers))
        for f in ("max_request_bytes", "max_response_bytes"):
            v = getattr(self, f)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise _fail(f"{where}.{f}", f"must be a byte count >= 0, got {v!r}", src)
        if self.timeout is not None and (isinstance(self.timeout, bool) or not isinstance(
                self.timeout, (int, float)) or not 0 < self.timeout < math.inf):
            raise _fail(f"{where}.timeout", f"must be seconds > 0, got {self.timeout!r}", src)

    @classmethod
    def allow(cls, **kwargs: Any) -> EgressRule:
        return cls(action="allow", **kwargs)

    @classmethod
    def deny(cls, **kwargs: Any) -> EgressRule:
        return cls(action="deny", **kwargs)

    @property
    def label(self) -> str:
        return self.name or self.action

    def describe(self) -> str:
        return f"{self.label!r}" + (f" ({self.source})" if self.source else "")

    def allows_header(self, name: str) -> bool:
        return name.lower() in self._headers

    def _request_match(self, t: Target, method: str) -> bool:
        return (not self._methods or method in self._methods) and self._m.matches(t)

    def _unlocks(self, sp: Special) -> bool:
        nets = self._nets + tuple(h.network for h in self._m.hosts if h.network is not None)
        return any(_in(sp.address, n) and n.version == sp.network.version
                   and n.subnet_of(sp.network) for n in nets)  # type: ignore[arg-type]


def _size(value: Any, where: str, source: str | None, *, optional: bool = False) -> int | None:
    units = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20,
             "mb": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}
    if value is None and optional:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", value)
        if m and m.group(2).lower() in units:
            return int(float(m.group(1)) * units[m.group(2).lower()])
    raise _fail(where, f"expected a byte count like 1048576 or '10M', got {value!r}", source)


def _seconds(value: Any, where: str, source: str | None) -> float:
    units = {"": 1.0, "s": 1.0, "ms": 0.001, "min": 60.0, "m": 60.0}
    v: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        v = float(value)
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*", value)
        if m and m.group(2) in units:
            v = float(m.group(1)) * units[m.group(2)]
    if v is None or not 0 < v < math.inf:
        raise _fail(where, f"expected seconds > 0 like 30 or '500ms', got {value!r}", source)
    return v


def _rate(value: Any, where: str, source: str | None) -> float | None:
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
    raise _fail(where, f"expected a rate like 10, '10/s' or '600/min', got {value!r}", source)


@dataclass(frozen=True, kw_only=True)
class EgressLimits:
    """Caps for every request (an allow rule may lower or raise the byte and time caps for
    what it allows). Counts and rate cover requests the policy allowed, each redirect hop
    included; None means unlimited. ``rate`` is requests per second with a bucket of
    ``burst`` (default: one second's worth, at least 1). Sizes accept ``'10M'``, times
    ``'500ms'``, rates ``'600/min'``."""

    max_request_bytes: int = 10 << 20
    max_response_bytes: int = 10 << 20
    timeout: float = 30.0
    requests_per_turn: int | None = None
    requests_per_sandbox: int | None = None
    rate: float | None = None
    burst: int | None = None
    max_redirects: int = 5
    source: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        src = self.source
        for f in ("max_request_bytes", "max_response_bytes"):
            object.__setattr__(self, f, _size(getattr(self, f), f"limits.{f}", src))
        object.__setattr__(self, "timeout", _seconds(self.timeout, "limits.timeout", src))
        for f in ("requests_per_turn", "requests_per_sandbox", "burst"):
            v = getattr(self, f)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise _fail(f"limits.{f}", f"must be a count >= 0 or unset, got {v!r}", src)
        v = self.max_redirects
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise _fail("limits.max_redirects", f"must be a count >= 0, got {v!r}", src)
        object.__setattr__(self, "rate", _rate(self.rate, "limits.rate", src))
        if self.burst is not None and self.rate is None:
            raise _fail("limits.burst", "burst needs a rate", src)


class SecretUnavailable(Exception):
    """A secret the policy injects has no value on this host (the request is refused)."""


@dataclass(frozen=True, kw_only=True)
class EgressSecret:
    """A credential the host adds to requests for one destination; the guest never sees it.
    Exactly one of ``env`` (an environment variable of the host process), ``file`` (a file
    on the host, trailing newline dropped) or ``value`` (a string, or a callable the host calls
    per request) provides it; it goes into ``header`` (e.g. ``Authorization`` with
    ``format = "Bearer {value}"``) or the ``query`` parameter. The selectors are those of a
    rule; ``scheme`` defaults to https only, so a secret never crosses the network in clear
    unless the policy says so."""

    name: str
    host: tuple[str, ...]
    scheme: tuple[str, ...] = ("https",)
    port: tuple[int | str, ...] = ()
    path: tuple[str, ...] = ()
    header: str | None = None
    query: str | None = None
    format: str = "{value}"
    env: str | None = None
    file: str | None = None
    value: str | Callable[[], str] | None = field(default=None, repr=False)
    source: str | None = None
    _m: _Matcher = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        src = self.source
        where = f"secret {self.name!r}" if isinstance(self.name, str) else "secret"
        if not isinstance(self.name, str) or not self.name.strip():
            raise _fail(f"{where}.name", "a secret needs a non-empty name", src)
        norm = {f: _as_tuple(getattr(self, f), f"{where}.{f}", src)
                for f in ("scheme", "host", "port", "path")}
        for f, v in norm.items():
            object.__setattr__(self, f, v)
        if not norm["host"]:
            raise _fail(f"{where}.host", "a secret must name the host(s) it is sent to", src)
        object.__setattr__(self, "_m", _Matcher(where, src, scheme=norm["scheme"],
                                                host=norm["host"], port=norm["port"],
                                                path=norm["path"]))
        if (self.header is None) == (self.query is None):
            raise _fail(where, "give exactly one of 'header' or 'query'", src)
        target = self.header if self.header is not None else self.query
        if not isinstance(target, str) or not _TOKEN.match(target):
            raise _fail(where, f"invalid header or query parameter name {target!r}", src)
        if not isinstance(self.format, str) or "{value}" not in self.format:
            raise _fail(f"{where}.format", "the format must contain '{value}'", src)
        given = [k for k in ("env", "file", "value") if getattr(self, k) is not None]
        if len(given) != 1:
            raise _fail(where, "give exactly one of 'env', 'file' or 'value'", src)
        if self.value is not None and not (isinstance(self.value, str) or callable(self.value)):
            raise _fail(f"{where}.value", "must be a string or a callable", src)

    def matches(self, t: Target) -> bool:
        return self._m.matches(t)

    def resolve(self) -> str:
        """The credential's value now (raises SecretUnavailable with the reason)."""
        raw: Any
        if self.env is not None:
            raw = os.environ.get(self.env)
            if not raw:
                raise SecretUnavailable(f"secret {self.name!r} is not available on the host "
                                        f"(environment variable {self.env} is not set)")
        elif self.file is not None:
            try:
                raw = Path(self.file).read_text(encoding="utf-8").rstrip("\r\n")
            except OSError as exc:
                raise SecretUnavailable(f"secret {self.name!r} is not available on the host "
                                        f"(cannot read {self.file}: {exc.strerror})") from None
        else:
            try:
                raw = self.value() if callable(self.value) else self.value
            except Exception as exc:
                raise SecretUnavailable(f"secret {self.name!r} is not available on the host "
                                        f"(its provider raised {type(exc).__name__})") from None
        if not isinstance(raw, str) or not raw or any(c in raw for c in "\r\n\0"):
            raise SecretUnavailable(f"secret {self.name!r} has no usable value (empty, not "
                                    "text, or containing line breaks)")
        return raw

    def render(self, raw: str) -> str:
        return self.format.replace("{value}", raw)


# ---- decisions ----------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class EgressDecision:
    """What the policy says about one request. ``resolved`` is False when the host was a
    name whose addresses were not given: the addresses are checked when the request is made.
    ``code``: ``allowed``, ``no_match`` (default deny), ``deny_rule``, ``special`` (a special
    address no rule names), ``metadata`` (a metadata host name), ``invalid`` (the URL or
    method), ``scheme``."""

    allowed: bool
    code: str
    reason: str
    method: str
    url: str  # the normalised URL (the input when it could not be parsed)
    rule: str | None = None
    rule_source: str | None = None
    addresses: tuple[str, ...] = ()
    resolved: bool = False
    category: str | None = None
    secrets: tuple[str, ...] = ()
    target: Target | None = field(default=None, repr=False, compare=False)
    matched: EgressRule | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {"allowed": self.allowed, "decision": "allow" if self.allowed else "deny",
                "code": self.code, "reason": self.reason, "method": self.method, "url": self.url,
                "rule": self.rule, "rule_source": self.rule_source,
                "addresses": list(self.addresses), "resolved": self.resolved,
                "category": self.category, "secrets": list(self.secrets)}


class _Index:
    """Candidate rules for a host: exact names, wildcard suffixes and IP patterns are looked
    up; rules with no host pattern (or ``*``) are always candidates."""

    def __init__(self, rules: Sequence[EgressRule]) -> None:
        self.exact: dict[str, list[int]] = {}
        self.suffix: dict[str, list[int]] = {}
        self.ip: list[tuple[IPNetwork, int]] = []
        self.generic: list[int] = []
        for i, r in enumerate(rules):
            hosts = r._m.hosts
            if not hosts or any(h.kind == "any" for h in hosts):
                self.generic.append(i)
                continue
            for h in hosts:
                if h.kind == "exact":
                    self.exact.setdefault(h.value, []).append(i)
                elif h.kind == "suffix":
                    self.suffix.setdefault(h.value, []).append(i)
                elif h.network is not None:
                    self.ip.append((h.network, i))

    def candidates(self, t: Target) -> list[int]:
        found: set[int] = set(self.generic)
        if t.ip is not None:
            found.update(i for net, i in self.ip if _in(t.ip, net))
        else:
            found.update(self.exact.get(t.host, ()))
            labels = t.host.split(".")
            for k in range(1, len(labels)):
                found.update(self.suffix.get(".".join(labels[k:]), ()))
        return sorted(found)


@dataclass(frozen=True, kw_only=True)
class EgressPolicy:
    """An egress policy: rules, caps, the request headers stripped unless a rule allows them
    (default: Authorization, Cookie, Proxy-Authorization) and host-held secrets."""

    rules: tuple[EgressRule, ...] = ()
    limits: EgressLimits = field(default_factory=EgressLimits)
    strip_headers: tuple[str, ...] = DEFAULT_STRIP_HEADERS
    secrets: tuple[EgressSecret, ...] = ()
    source: str | None = None
    _index: _Index = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        src = self.source
        rules = _as_tuple(self.rules, "rules", src) if not isinstance(self.rules, str) else None
        if rules is None or not all(isinstance(r, EgressRule) for r in rules):
            raise _fail("rules", "rules must be EgressRule objects", src)
        named = []
        for i, r in enumerate(rules):
            named.append(r if r.name else dataclasses.replace(r, name=f"rules[{i}]"))
        object.__setattr__(self, "rules", tuple(named))
        if not isinstance(self.limits, EgressLimits):
            raise _fail("limits", "limits must be an EgressLimits", src)
        strip = _as_tuple(self.strip_headers, "headers.strip", src)
        for h in strip:
            if not isinstance(h, str) or not _TOKEN.match(h):
                raise _fail("headers.strip", f"invalid header name {h!r}", src)
        object.__setattr__(self, "strip_headers", tuple(h.lower() for h in strip))
        secrets = _as_tuple(self.secrets, "secrets", src)
        if not all(isinstance(s, EgressSecret) for s in secrets):
            raise _fail("secrets", "secrets must be EgressSecret objects", src)
        object.__setattr__(self, "secrets", secrets)
        object.__setattr__(self, "_index", _Index(self.rules))

    # ---- construction ------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> EgressPolicy:
        """Read a TOML (``.toml``) or YAML (``.yaml``/``.yml``) policy file."""
        from ._egress_load import load_policy_file

        return load_policy_file(path)

    @classmethod
    def loads(cls, text: str, *, format: Literal["toml", "yaml"], source: str = "<policy>"
              ) -> EgressPolicy:
        from ._egress_load import load_policy_text

        return load_policy_text(text, format=format, source=source)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "<dict>") -> EgressPolicy:
        """A policy from a mapping shaped like the file format (docs/egress.md)."""
        from ._egress_load import policy_from_data

        return policy_from_data(data, source=source)

    # ---- decisions ---------------------------------------------------------------------------
    def check(self, url: str, method: str = "GET", *,
              addresses: Iterable[str | IPAddress] | None = None) -> EgressDecision:
        """The decision for ``method url``. ``addresses``: what the host name resolves to
        (an IP literal URL needs none); without them a name is decided before DNS."""
        m = method.upper() if isinstance(method, str) else ""

        def deny(code: str, reason: str, **kw: Any) -> EgressDecision:
            kw.setdefault("url", url if isinstance(url, str) else repr(url))
            return EgressDecision(allowed=False, code=code, reason=reason,
                                  method=m or repr(method), **kw)

        if not m or not _TOKEN.match(m):
            return deny("invalid", f"invalid HTTP method {method!r}")
        if m == "CONNECT":
            return deny("invalid", "CONNECT (tunnelling) is never allowed")
        try:
            t = parse_url(url)
        except UnsupportedScheme as exc:
            return deny("scheme", str(exc))
        except BadURL as exc:
            return deny("invalid", f"invalid URL: {exc}")
        addrs: tuple[IPAddress, ...] | None
        if t.ip is not None:
            addrs = (t.ip,)
        elif addresses is None:
            addrs = None
        else:
            try:
                addrs = tuple(a if isinstance(a, (ipaddress.IPv4Address, ipaddress.IPv6Address))
                              else parse_address(a) for a in addresses)
            except BadURL as exc:
                return deny("invalid", f"invalid resolved address: {exc}", url=t.url)
            if not addrs:
                return deny("invalid", f"{t.host} resolved to no address", url=t.url)
        shown = tuple(str(a) for a in addrs) if addrs else ()
        common: dict[str, Any] = {"url": t.url, "addresses": shown,
                                  "resolved": addrs is not None, "target": t}
        if t.ip is None and t.host in METADATA_NAMES:
            return deny("metadata", f"{t.host} is a cloud metadata host name", **common)
        candidates = [self.rules[i] for i in self._index.candidates(t)]
        for r in candidates:
            if r.action == "deny" and r._request_match(t, m) and (
                    not r._nets or (addrs is not None and any(
                        any(_in(a, n) for n in r._nets) for a in addrs))):
                return deny("deny_rule", f"denied by rule {r.describe()}", rule=r.label,
                            rule_source=r.source, matched=r, **common)
        specials = [s for s in (classify(a) for a in addrs or ()) if s is not None]
        blocked: Special | None = None
        for r in candidates:
            if r.action != "allow" or not r._request_match(t, m):
                continue
            if r._nets and addrs is not None and not all(
                    any(_in(a, n) for n in r._nets) for a in addrs):
                continue
            miss = next((s for s in specials if not r._unlocks(s)), None)
            if miss is not None:
                blocked = blocked or miss
                continue
            note = "" if addrs is not None else " (before DNS: the addresses the name " \
                "resolves to are checked when the request is made)"
            return EgressDecision(
                allowed=True, code="allowed", reason=f"allowed by rule {r.describe()}{note}",
                method=m, rule=r.label, rule_source=r.source, matched=r,
                secrets=tuple(s.name for s in self.secrets_for(t)), **common)
        if blocked is not None:
            return deny("special", f"{blocked.describe()}; only an allow rule naming it "
                        f"(an ip or host inside {blocked.network}) may reach it",
                        category=blocked.category, **common)
        if specials:
            sp = specials[0]
            return deny("special", f"no rule allows {m} {t.url}, and {sp.describe()}",
                        category=sp.category, **common)
        return deny("no_match", f"no rule allows {m} {t.url} (default deny)", **common)

    def secrets_for(self, t: Target) -> list[EgressSecret]:
        """The secrets injected into a request to ``t`` (first one per header/parameter)."""
        seen: set[str] = set()
        out = []
        for s in self.secrets:
            key = f"h:{s.header.lower()}" if s.header else f"q:{s.query}"
            if key not in seen and s.matches(t):
                seen.add(key)
                out.append(s)
        return out
