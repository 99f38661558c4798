"""The egress policy as data, and the decision for one request (docs/egress.md).

Default deny. A request is refused if any deny rule matches it (deny overrides allow, so rule
order cannot open a hole); otherwise the first allow rule that matches it decides, and that
rule's header allowances and caps apply. Addresses that are not ordinary public ones
(loopback, private, link-local, multicast, unspecified, reserved, cloud metadata) pass only
under an allow rule that names them: an ``ip`` (or an IP ``host``) inside the special range
itself, so ``ip = "0.0.0.0/0"`` or ``host = "*"`` never reach them.

A policy is built from Python objects (these classes), a mapping (``from_dict``) or a TOML or
YAML file (``load``; see ``_egress_load``). Candidate rules are looked up by host name, suffix
and network, so a 1,000-rule policy decides about as fast as a 1-rule one (bench/egress.py).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ._egress_addr import (
    METADATA_NAMES,
    BadURL,
    IPAddress,
    IPNetwork,
    Special,
    Target,
    UnsupportedScheme,
    classify,
    parse_address,
    parse_url,
)
from ._egress_match import (
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
    "EgressPolicy",
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


class _NetIndex:
    """Rules by the networks they name: a lookup is one dict probe per prefix length."""

    def __init__(self) -> None:
        self._by: dict[tuple[int, int], tuple[int, dict[int, list[int]]]] = {}

    def add(self, net: IPNetwork, rule: int) -> None:
        _, table = self._by.setdefault((net.version, net.prefixlen),
                                          (int(net.netmask), {}))
        table.setdefault(int(net.network_address), []).append(rule)

    def lookup(self, addr: IPAddress, into: set[int]) -> None:
        value, version = int(addr), addr.version
        for (v, _), (mask, table) in self._by.items():
            if v == version:
                into.update(table.get(value & mask, ()))


class _Index:
    """Candidate rules for a request: exact names, wildcard suffixes and networks are looked
    up; rules with no host pattern and no ip (or host ``*``) are always candidates. Rules
    with only an ``ip`` are candidates for the addresses they contain (``ip_only`` keeps
    them in order for the before-DNS report)."""

    def __init__(self, rules: Sequence[EgressRule]) -> None:
        self.exact: dict[str, list[int]] = {}
        self.suffix: dict[str, list[int]] = {}
        self.ip_host = _NetIndex()
        self.ip_nets = _NetIndex()
        self.ip_only: list[int] = []
        self.generic: list[int] = []
        for i, r in enumerate(rules):
            hosts = r._m.hosts
            if not hosts and r._nets:
                self.ip_only.append(i)
                for n in r._nets:
                    self.ip_nets.add(n, i)
                continue
            if not hosts or any(h.kind == "any" for h in hosts):
                self.generic.append(i)
                continue
            for h in hosts:
                if h.kind == "exact":
                    self.exact.setdefault(h.value, []).append(i)
                elif h.kind == "suffix":
                    self.suffix.setdefault(h.value, []).append(i)
                elif h.network is not None:
                    self.ip_host.add(h.network, i)

    def candidates(self, t: Target, addrs: Sequence[IPAddress] | None) -> list[int]:
        found: set[int] = set(self.generic)
        if t.ip is not None:
            self.ip_host.lookup(t.ip, found)
        else:
            found.update(self.exact.get(t.host, ()))
            labels = t.host.split(".")
            for k in range(1, len(labels)):
                found.update(self.suffix.get(".".join(labels[k:]), ()))
        for a in addrs or ():
            self.ip_nets.lookup(a, found)
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
        rules = as_tuple(self.rules, "rules", src) if not isinstance(self.rules, str) else None
        if rules is None or not all(isinstance(r, EgressRule) for r in rules):
            raise fail("rules", "rules must be EgressRule objects", src)
        named = []
        for i, r in enumerate(rules):
            named.append(r if r.name else dataclasses.replace(r, name=f"rules[{i}]"))
        object.__setattr__(self, "rules", tuple(named))
        if not isinstance(self.limits, EgressLimits):
            raise fail("limits", "limits must be an EgressLimits", src)
        strip = as_tuple(self.strip_headers, "headers.strip", src)
        for h in strip:
            if not isinstance(h, str) or not TOKEN.match(h):
                raise fail("headers.strip", f"invalid header name {h!r}", src)
        object.__setattr__(self, "strip_headers", tuple(h.lower() for h in strip))
        secrets = as_tuple(self.secrets, "secrets", src)
        if not all(isinstance(s, EgressSecret) for s in secrets):
            raise fail("secrets", "secrets must be EgressSecret objects", src)
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

        if not m or not TOKEN.match(m):
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
        candidates = [self.rules[i] for i in self._index.candidates(t, addrs)]
        for r in candidates:
            if r.action == "deny" and r._request_match(t, m) and (
                    not r._nets or (addrs is not None and any(
                        any(ip_in(a, n) for n in r._nets) for a in addrs))):
                return deny("deny_rule", f"denied by rule {r.describe()}", rule=r.label,
                            rule_source=r.source, matched=r, **common)
        specials = [s for s in (classify(a) for a in addrs or ()) if s is not None]
        blocked: Special | None = None
        pending: EgressRule | None = None
        for r in candidates:
            if r.action != "allow" or not r._request_match(t, m):
                continue
            if r._nets and addrs is None:
                pending = pending or r
                continue
            if r._nets and addrs is not None and not all(
                    any(ip_in(a, n) for n in r._nets) for a in addrs):
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
        if pending is None and addrs is None:  # rules with only an ip: after DNS
            pending = next((r for r in (self.rules[i] for i in self._index.ip_only)
                            if r.action == "allow" and r._request_match(t, m)), None)
        if pending is not None:
            nets = ", ".join(str(n) for n in pending._nets)
            return deny("pending_dns", f"no rule allows {m} {t.url} by name alone; rule "
                        f"{pending.describe()} allows it if {t.host} resolves inside {nets} "
                        "(checked when the request is made)", rule=pending.label,
                        rule_source=pending.source, **common)
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
