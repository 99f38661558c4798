"""The egress policy as data, and the decision for one request (docs/egress.md).

Default deny. A request is refused if any deny rule matches it (deny overrides allow, so rule
order cannot open a hole); otherwise the first allow rule that matches it decides, and that
rule's header allowances and caps apply. Addresses that are not ordinary public ones
(loopback, private, link-local, multicast, unspecified, reserved, cloud metadata) pass only
under an allow rule that names them: an ``ip`` (or an IP ``host``) inside the special range
itself, so ``ip = "0.0.0.0/0"`` or ``host = "*"`` never reach them.

A policy is built from Python objects (these classes), a mapping (``from_dict``) or a TOML or
YAML file (``load``; see ``_load``). Candidate rules are looked up by host name, suffix
and network, so a 1,000-rule policy decides about as fast as a 1-rule one (bench/egress.py).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ._addr import (
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
from ._load import load_policy_file, load_policy_text, policy_from_data
from ._match import (
    DEFAULT_STRIP_HEADERS,
    TOKEN,
    as_tuple,
    fail,
    ip_in,
)
from ._rules import EgressDecision, EgressLimits, EgressRule, EgressSecret

__all__ = ["EgressPolicy"]

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
        return load_policy_file(cls, path)

    @classmethod
    def loads(cls, text: str, *, format: Literal["toml", "yaml"], source: str = "<policy>"
              ) -> EgressPolicy:
        return load_policy_text(cls, text, format=format, source=source)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "<dict>") -> EgressPolicy:
        """A policy from a mapping shaped like the file format (docs/egress.md)."""
        return policy_from_data(cls, data, source=source)

    # ---- decisions ---------------------------------------------------------------------------
    def check(self, url: str, method: str = "GET", *,
              addresses: Iterable[str | IPAddress] | None = None) -> EgressDecision:
        """The decision for ``method url``. ``addresses``: what the host name resolves to
        (an IP literal URL needs none); without them a name is decided before DNS."""
        parsed = _parse_request(url, method, addresses)
        if isinstance(parsed, EgressDecision):
            return parsed
        t, m, addrs = parsed
        common: dict[str, Any] = {"url": t.url, "addresses": tuple(str(a) for a in addrs or ()),
                                  "resolved": addrs is not None, "target": t}
        if t.ip is None and t.host in METADATA_NAMES:
            return _deny(m, "metadata", f"{t.host} is a cloud metadata host name", **common)
        candidates = [self.rules[i] for i in self._index.candidates(t, addrs)]
        for r in candidates:
            if r.action == "deny" and r._request_match(t, m) and (
                    not r._nets or (addrs is not None and any(
                        any(ip_in(a, n) for n in r._nets) for a in addrs))):
                return _deny(m, "deny_rule", f"denied by rule {r.describe()}", rule=r.label,
                             rule_source=r.source, matched=r, **common)
        return self._allow_or_default(t, m, addrs, candidates, common)

    def _allow_or_default(self, t: Target, m: str, addrs: tuple[IPAddress, ...] | None,
                          candidates: list[EgressRule], common: dict[str, Any]
                          ) -> EgressDecision:
        """The first allow rule that matches and unlocks every special address decides; else
        the most telling refusal: a rule waiting for DNS, a special address, default deny."""
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
            return _deny(m, "pending_dns", f"no rule allows {m} {t.url} by name alone; rule "
                         f"{pending.describe()} allows it if {t.host} resolves inside {nets} "
                         "(checked when the request is made)", rule=pending.label,
                         rule_source=pending.source, **common)
        if blocked is not None:
            return _deny(m, "special", f"{blocked.describe()}; only an allow rule naming it "
                         f"(an ip or host inside {blocked.network}) may reach it",
                         category=blocked.category, **common)
        if specials:
            sp = specials[0]
            return _deny(m, "special", f"no rule allows {m} {t.url}, and {sp.describe()}",
                         category=sp.category, **common)
        return _deny(m, "no_match", f"no rule allows {m} {t.url} (default deny)", **common)

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


def _deny(method: str, code: str, reason: str, **kw: Any) -> EgressDecision:
    return EgressDecision(allowed=False, code=code, reason=reason, method=method, **kw)


def _parse_request(url: str, method: str, addresses: Iterable[str | IPAddress] | None
                   ) -> EgressDecision | tuple[Target, str, tuple[IPAddress, ...] | None]:
    """(target, method, addresses) of a request, or the refusal of one that is malformed."""
    m = method.upper() if isinstance(method, str) else ""
    shown = url if isinstance(url, str) else repr(url)
    if not m or not TOKEN.match(m):
        return _deny(m or repr(method), "invalid", f"invalid HTTP method {method!r}", url=shown)
    if m == "CONNECT":
        return _deny(m, "invalid", "CONNECT (tunnelling) is never allowed", url=shown)
    try:
        t = parse_url(url)
    except UnsupportedScheme as exc:
        return _deny(m, "scheme", str(exc), url=shown)
    except BadURL as exc:
        return _deny(m, "invalid", f"invalid URL: {exc}", url=shown)
    if t.ip is not None:
        return t, m, (t.ip,)
    if addresses is None:
        return t, m, None
    try:
        addrs = tuple(a if isinstance(a, (ipaddress.IPv4Address, ipaddress.IPv6Address))
                      else parse_address(a) for a in addresses)
    except BadURL as exc:
        return _deny(m, "invalid", f"invalid resolved address: {exc}", url=t.url)
    if not addrs:
        return _deny(m, "invalid", f"{t.host} resolved to no address", url=t.url)
    return t, m, addrs
