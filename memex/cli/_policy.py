"""``memex policy check|test`` and the egress part of ``memex run --policy``.

Testing a policy is a feature: ``check`` prints the decision for one request (exit 0 allow,
1 deny) and ``test`` runs a table of expected decisions (exit 1 on any mismatch, for a
platform's CI). Neither makes a request; names are decided before DNS unless the case gives
the addresses (or ``check --resolve`` asks the system resolver). Registered by
:mod:`memex.cli`; imports stay in the commands so that other commands start fast.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from ..host_tools import Egress, EgressDecision, EgressPolicy

__all__ = ["add_parser", "audit_dicts", "print_audit", "run_egress"]

_CASE_KEYS = ("name", "url", "method", "addresses", "expect", "rule", "reason", "code")


def _load(path: str) -> EgressPolicy:
    from ..host_tools import EgressPolicy

    return EgressPolicy.load(path)


def _describe(d: EgressDecision) -> list[str]:
    lines = [f"{'allow' if d.allowed else 'deny'}  {d.method} {d.url}"]
    if d.rule:
        lines.append(f"rule:      {d.rule}" + (f" ({d.rule_source})" if d.rule_source else ""))
    lines.append(f"reason:    {d.reason}")
    if d.addresses:
        lines.append(f"addresses: {', '.join(d.addresses)}")
    if d.secrets:
        lines.append(f"secrets:   {', '.join(d.secrets)} (added by the host)")
    return lines


def cmd_check(args: argparse.Namespace) -> int:
    from ..errors import ConfigError

    policy = _load(args.policy)
    addresses: list[str] | None = list(args.address) or None
    if args.resolve and addresses is None:
        from ..host_tools.egress import BadURL, parse_url, system_resolver

        try:
            t = parse_url(args.url)
        except BadURL:
            t = None
        if t is not None and t.ip is None:
            try:
                addresses = system_resolver(t.host, t.port)
            except OSError as exc:
                raise ConfigError(f"cannot resolve {t.host}: {exc.strerror or exc}") from None
    d = policy.check(args.url, args.method, addresses=addresses)
    if args.json:
        print(json.dumps(d.to_dict()))
    else:
        print("\n".join(_describe(d)))
    return 0 if d.allowed else 1


@dataclass(frozen=True, kw_only=True)
class _Case:
    where: str
    name: str | None
    url: str
    method: str
    addresses: tuple[str, ...] | None
    expect: bool
    rule: str | None
    reason: str | None
    code: str | None


def _load_cases(path: str) -> list[_Case]:
    from ..errors import PolicyError
    from ..host_tools.egress import fmt_path, load_document

    data, locate, source = load_document(path)
    base: tuple[str | int, ...] = ()
    items = data
    if isinstance(data, dict) and set(data) == {"cases"}:
        items, base = data["cases"], ("cases",)
    issues: list[PolicyError] = []

    def bad(where: tuple[str | int, ...], reason: str) -> None:
        issues.append(PolicyError(reason, source=source, line=locate(where),
                                  path=fmt_path(where)))

    if not isinstance(items, list) or not items:
        raise PolicyError("a cases file is a non-empty list of cases (or a 'cases' key "
                          "holding one)", source=source, line=locate(()))
    cases = []
    for i, raw in enumerate(items):
        at: tuple[str | int, ...] = (*base, i)
        if not isinstance(raw, dict):
            bad(at, "a case must be a table/mapping")
            continue
        for k in raw:
            if k not in _CASE_KEYS:
                near = difflib.get_close_matches(str(k), _CASE_KEYS, n=1)
                bad((*at, str(k)), f"unknown key {k!r} in a case"
                    + (f"; did you mean {near[0]!r}?" if near else ""))
        url, expect, method = raw.get("url"), raw.get("expect"), raw.get("method", "GET")
        addresses = raw.get("addresses")
        if not isinstance(url, str):
            bad((*at, "url") if "url" in raw else at, "a case needs a url (a string)")
        if expect not in ("allow", "deny"):
            bad((*at, "expect") if "expect" in raw else at,
                f"expect must be 'allow' or 'deny', got {expect!r}")
        if not isinstance(method, str):
            bad((*at, "method"), "method must be a string")
        if isinstance(addresses, str):
            addresses = [addresses]
        if addresses is not None and (not isinstance(addresses, list) or not all(
                isinstance(a, str) for a in addresses)):
            bad((*at, "addresses"), "addresses must be a list of IP addresses")
        for k in ("name", "rule", "reason", "code"):
            if raw.get(k) is not None and not isinstance(raw[k], str):
                bad((*at, k), f"{k} must be a string")
        line = locate(at)
        cases.append(_Case(where=f"{source}:{line}" if line else f"{source} case {i}",
                           name=raw.get("name"), url=url if isinstance(url, str) else "",
                           method=method if isinstance(method, str) else "GET",
                           addresses=tuple(addresses) if isinstance(addresses, list) else None,
                           expect=expect == "allow", rule=raw.get("rule"),
                           reason=raw.get("reason"), code=raw.get("code")))
    if issues:
        if len(issues) == 1:
            raise issues[0]
        raise PolicyError(f"{len(issues)} problems in the cases file {source}",
                          issues=tuple(issues))
    return cases


def _mismatch(case: _Case, d: EgressDecision) -> str | None:
    if d.allowed != case.expect:
        return f"expected {'allow' if case.expect else 'deny'}, got " \
            f"{'allow' if d.allowed else 'deny'}"
    if case.rule is not None and d.rule != case.rule:
        return f"expected rule {case.rule!r}, got {d.rule!r}"
    if case.code is not None and d.code != case.code:
        return f"expected code {case.code!r}, got {d.code!r}"
    if case.reason is not None and case.reason.lower() not in d.reason.lower():
        return f"expected the reason to mention {case.reason!r}"
    return None


def cmd_test(args: argparse.Namespace) -> int:
    policy = _load(args.policy)
    cases = _load_cases(args.cases)
    failed = 0
    for case in cases:
        d = policy.check(case.url, case.method, addresses=case.addresses)
        problem = _mismatch(case, d)
        label = f"{case.name}: " if case.name else ""
        verdict = "allow" if d.allowed else "deny "
        if problem is None:
            if not args.quiet:
                print(f"ok    {verdict} {label}{d.method} {d.url}"
                      + (f"  [rule {d.rule}]" if d.rule else ""))
            continue
        failed += 1
        print(f"FAIL  {label}{case.method} {case.url}  ({case.where})")
        print(f"      {problem}")
        print(f"      reason: {d.reason}")
    print(f"{len(cases) - failed} passed, {failed} failed")
    return 1 if failed else 0


# ---- memex run --policy -------------------------------------------------------------------------
def run_egress(path: str) -> Egress:
    """The Egress that ``memex run --policy PATH`` attaches (PolicyError for a bad file)."""
    from ..host_tools import Egress

    return Egress(_load(path), label="memex-run")


def _bytes(n: int) -> str:
    return f"{n} B" if n < 10_000 else f"{n / 1024:.0f} KiB" if n < 10 << 20 else \
        f"{n / (1 << 20):.1f} MiB"


def print_audit(egress: Egress, stream: TextIO | None = None) -> None:
    """The egress audit of a run, one line per attempt (stderr by default)."""
    out = stream or sys.stderr
    recs = egress.records
    out.write(f"memex: egress audit: {len(recs)} request{'s' if len(recs) != 1 else ''}\n")
    for r in recs:
        status = str(r.status) if r.status is not None else "-"
        line = (f"  {r.decision:<5} {r.outcome:<8} {status:>3} {r.method} {r.url}  "
                f"{r.duration * 1000:.1f} ms, {_bytes(r.request_bytes)} out, "
                f"{_bytes(r.response_bytes)} in")
        if r.rule:
            line += f", rule {r.rule}"
        if r.outcome != "ok":
            line += f"\n        {r.reason}"
        out.write(line + "\n")
    out.flush()


def audit_dicts(egress: Egress) -> list[dict[str, Any]]:
    return [r.to_dict() for r in egress.records]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("policy", help="check and test egress policies (no request is made)")
    psub = p.add_subparsers(dest="policy_command", required=True)
    c = psub.add_parser("check", help="print the decision, the rule and the reason for a URL "
                        "(exit 0 allow, 1 deny)")
    c.add_argument("policy", help="a policy file (.toml, .yaml)")
    c.add_argument("url")
    c.add_argument("--method", "-X", default="GET")
    c.add_argument("--address", action="append", default=[], metavar="IP",
                   help="an address the host name resolves to (repeatable); without it a name "
                   "is decided before DNS")
    c.add_argument("--resolve", action="store_true",
                   help="resolve the name with this machine's resolver first")
    c.add_argument("--json", action="store_true", help="print the decision as JSON")
    c.set_defaults(func=cmd_check)
    t = psub.add_parser("test", help="check a table of expected decisions (exit 1 on any "
                        "mismatch)")
    t.add_argument("policy", help="a policy file (.toml, .yaml)")
    t.add_argument("cases", help="cases file (.yaml, .toml): url, method, addresses, expect, "
                   "rule, reason, code")
    t.add_argument("-q", "--quiet", action="store_true", help="print only failures")
    t.set_defaults(func=cmd_test)

