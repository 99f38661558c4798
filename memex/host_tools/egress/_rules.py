"""The parts of an egress policy as data: rules, caps, host-held secrets, and the decision for
one request (``EgressDecision``). ``EgressPolicy`` (``_policy``) puts them together and
decides; ``_load`` builds them from TOML, YAML or a mapping."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ._addr import (
    IPNetwork,
    Special,
    Target,
)
from ._match import (
    DEFAULT_STRIP_HEADERS,
    TOKEN,
    Matcher,
    as_tuple,
    fail,
    ip_in,
    network,
    parse_rate,
    parse_seconds,
    parse_size,
)

__all__ = [
    "DEFAULT_STRIP_HEADERS",
    "EgressDecision",
    "EgressLimits",
    "EgressRule",
    "EgressSecret",
    "SecretUnavailable",
]


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
    _m: Matcher = field(init=False, repr=False, compare=False)
    _nets: tuple[IPNetwork, ...] = field(init=False, repr=False, compare=False)
    _methods: frozenset[str] = field(init=False, repr=False, compare=False)
    _headers: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        where, src = self.name or "rule", self.source
        if self.action not in ("allow", "deny"):
            raise fail(f"{where}.action", f"must be 'allow' or 'deny', got {self.action!r}", src)
        if self.name is not None and (not isinstance(self.name, str) or not self.name.strip()):
            raise fail(f"{where}.name", "a rule name must be a non-empty string", src)
        norm: dict[str, tuple[Any, ...]] = {}
        for f in ("scheme", "host", "ip", "port", "method", "path", "allow_headers"):
            norm[f] = as_tuple(getattr(self, f), f"{where}.{f}", src)
            object.__setattr__(self, f, norm[f])
        object.__setattr__(self, "_m", Matcher(where, src, scheme=norm["scheme"],
                                                host=norm["host"], port=norm["port"],
                                                path=norm["path"]))
        nets = []
        for i, v in enumerate(norm["ip"]):
            try:
                nets.append(network(v))
            except ValueError as exc:
                suffix = f"[{i}]" if len(norm["ip"]) > 1 else ""
                raise fail(f"{where}.ip{suffix}", str(exc), src) from None
        object.__setattr__(self, "_nets", tuple(nets))
        methods = set()
        for v in norm["method"]:
            if not isinstance(v, str) or not TOKEN.match(v):
                raise fail(f"{where}.method", f"invalid HTTP method {v!r}", src)
            methods.add(v.upper())
        object.__setattr__(self, "_methods", frozenset(methods))
        headers = set()
        for v in norm["allow_headers"]:
            if not isinstance(v, str) or not TOKEN.match(v):
                raise fail(f"{where}.allow_headers", f"invalid header name {v!r}", src)
            headers.add(v.lower())
        object.__setattr__(self, "_headers", frozenset(headers))
        for f in ("max_request_bytes", "max_response_bytes"):
            v = getattr(self, f)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise fail(f"{where}.{f}", f"must be a byte count >= 0, got {v!r}", src)
        if self.timeout is not None and (isinstance(self.timeout, bool) or not isinstance(
                self.timeout, (int, float)) or not 0 < self.timeout < math.inf):
            raise fail(f"{where}.timeout", f"must be seconds > 0, got {self.timeout!r}", src)

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
        return any(ip_in(sp.address, n) and n.version == sp.network.version
                   and n.subnet_of(sp.network) for n in nets)  # type: ignore[arg-type]


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
            object.__setattr__(self, f, parse_size(getattr(self, f), f"limits.{f}", src))
        object.__setattr__(self, "timeout", parse_seconds(self.timeout, "limits.timeout", src))
        for f in ("requests_per_turn", "requests_per_sandbox", "burst"):
            v = getattr(self, f)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise fail(f"limits.{f}", f"must be a count >= 0 or unset, got {v!r}", src)
        v = self.max_redirects
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise fail("limits.max_redirects", f"must be a count >= 0, got {v!r}", src)
        object.__setattr__(self, "rate", parse_rate(self.rate, "limits.rate", src))
        if self.burst is not None and self.rate is None:
            raise fail("limits.burst", "burst needs a rate", src)


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
    _m: Matcher = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        src = self.source
        where = f"secret {self.name!r}" if isinstance(self.name, str) else "secret"
        if not isinstance(self.name, str) or not self.name.strip():
            raise fail(f"{where}.name", "a secret needs a non-empty name", src)
        norm = {f: as_tuple(getattr(self, f), f"{where}.{f}", src)
                for f in ("scheme", "host", "port", "path")}
        for f, v in norm.items():
            object.__setattr__(self, f, v)
        if not norm["host"]:
            raise fail(f"{where}.host", "a secret must name the host(s) it is sent to", src)
        object.__setattr__(self, "_m", Matcher(where, src, scheme=norm["scheme"],
                                                host=norm["host"], port=norm["port"],
                                                path=norm["path"]))
        if (self.header is None) == (self.query is None):
            raise fail(where, "give exactly one of 'header' or 'query'", src)
        target = self.header if self.header is not None else self.query
        if not isinstance(target, str) or not TOKEN.match(target):
            raise fail(where, f"invalid header or query parameter name {target!r}", src)
        if not isinstance(self.format, str) or "{value}" not in self.format:
            raise fail(f"{where}.format", "the format must contain '{value}'", src)
        given = [k for k in ("env", "file", "value") if getattr(self, k) is not None]
        if len(given) != 1:
            raise fail(where, "give exactly one of 'env', 'file' or 'value'", src)
        if self.value is not None and not (isinstance(self.value, str) or callable(self.value)):
            raise fail(f"{where}.value", "must be a string or a callable", src)

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
    method), ``scheme``, ``pending_dns`` (only a rule with ``ip`` could allow the name: its
    addresses decide)."""

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
