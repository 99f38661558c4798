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

    kind = args.kind or _kind_of(args.policy)
    if kind != "egress":
        if args.url is None:
            return _explain(args.policy, kind, as_json=args.json)
        try:
            policy = _front_policy(args.policy, kind, args.principal)
        except ImportError as exc:  # the front end's extra is not installed
            raise ConfigError(f"checking a {kind} config needs its extra: pip install "
                              f"'memex[{kind if kind == 'serve' else 'mcp'}]' ({exc})"
                              ) from exc
        if policy is None:
            who = f"principal {args.principal!r}" if args.principal else "the server"
            print(f"deny  {args.method.upper()} {args.url}\nreason:    {who} has no egress "
                  "policy: its guests have no network")
            return 1
    else:
        if args.principal:
            raise ConfigError("--principal names a principal of a serve.toml or an MCP "
                              "config, not of an egress policy")
        policy = _load(args.policy)
        if args.url is None:
            print(f"{args.policy}: a valid egress policy, {len(policy.rules)} rule(s); "
                  "give a URL to see its decision")
            return 0
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


# ---- a whole policy file: serve.toml, the MCP config ------------------------------------------
_SERVE_KEYS = {"server", "tenants", "cluster"}
_EGRESS_KEYS = {"rules", "version", "headers", "secrets"}


def _kind_of(path: str) -> str:
    """What a policy file is, from its top-level tables: a serve.toml (``[server]``,
    ``[tenants.*]``, ``[cluster]``), an egress policy (``[[rules]]``, ``version``...), else
    an MCP config; YAML and JSON files are egress policies."""
    from ..serving import read_toml

    if not path.endswith(".toml"):
        return "egress"
    keys = set(read_toml(path, "policy file"))
    if keys & _SERVE_KEYS:
        return "serve"
    if keys & _EGRESS_KEYS or not keys:
        return "egress"
    return "mcp"


def _front_policy(path: str, kind: str, principal: str | None) -> EgressPolicy | None:
    """The egress policy a principal's guests get under a serve.toml or an MCP config."""
    from ..errors import ConfigError

    if kind == "serve":
        from ..service import load_config

        tenants = load_config(path).tenants
        if principal is None or principal not in tenants:
            raise ConfigError(f"--principal: one of the config's tenants "
                              f"({', '.join(sorted(tenants)) or 'none'}), got {principal!r}")
        return tenants[principal].egress
    from ..host_tools import EgressPolicy
    from ..integrations.mcp import load_config as load_mcp

    cfg = load_mcp(path)
    if principal is not None and principal not in cfg.principals:
        raise ConfigError(f"--principal: one of the config's principals "
                          f"({', '.join(sorted(cfg.principals)) or 'none'}), got {principal!r}")
    return EgressPolicy.load(cfg.resolve(cfg.policy)) if cfg.policy else None


def _amount(name: str, value: Any) -> str:
    from ..runtime_wasm.internal import LIMIT_FIELDS, size_text

    if value is None:
        return "none"
    kind = next((f.kind for f in LIMIT_FIELDS if f.name == name), None)
    if kind == "bytes" or name in ("max_memory", "max_disk"):
        return size_text(value)
    if kind == "seconds":
        return f"{value:g} s"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _limits_text(limits: Any) -> dict[str, str]:
    return {k: _amount(k, v) for k, v in limits.to_mapping().items()}


def _explain(path: str, kind: str, *, as_json: bool) -> int:
    from ..errors import ConfigError

    try:
        report = _serve_report(path) if kind == "serve" else _mcp_report(path)
    except ImportError as exc:  # the front end's extra is not installed
        extra = "serve" if kind == "serve" else "mcp"
        raise ConfigError(f"checking a {kind} config needs its extra: pip install "
                          f"'memex[{extra}]' ({exc})") from exc
    if as_json:
        print(json.dumps(report, indent=1))
    else:
        print(f"{path}: {report['front']}")
        for p in report["principals"]:
            print(f"\n{p['kind']} {p['name']}: {p['keys']}")
            print("  limits   " + ", ".join(f"{k} {v}" for k, v in p["limits"].items())
                  + "  (a session asking for none)")
            ceiling = ", ".join(f"{k} {v}" for k, v in p["ceiling"].items())
            print(f"  ceiling  {ceiling or 'none'}" + ("  (the rest: not capped)"
                                                      if ceiling else ""))
            print("  quotas   " + ", ".join(f"{k} {v}" for k, v in p["quotas"].items()))
            print("  grants   " + "; ".join(f"{k}: {v}" for k, v in p["grants"].items()))
        if report["notes"]:
            print()
        for line in report["notes"]:
            print(f"note: {line}")
        for line in report["problems"]:
            print(f"problem: {line}")
        if not report["problems"]:
            print("\nok: every setting is enforced by this front end")
    return 1 if report["problems"] else 0


def _running(bound: int | None, slots: int, name: str) -> str:
    """A principal's running turns: its fair share of the server's, within its own bound."""
    if bound is None:
        return f"a fair share of {name} {slots} (all of them alone)"
    if bound <= 1:
        return f"at most {bound}"
    return f"at most {bound}, within a fair share of {name} {slots}"


def _serve_report(path: str) -> dict[str, Any]:
    import dataclasses

    from ..errors import ConfigError
    from ..runtime_wasm import SANDBOX_LIMITS
    from ..service import check_config, load_config
    from ..serving import default_running_turns

    config = load_config(path)
    slots = config.running_turns or default_running_turns()
    where = f"a Ray cluster ({config.cluster.address})" if config.cluster is not None \
        else f"backend {config.backend}"
    base = dataclasses.replace(SANDBOX_LIMITS, timeout=config.warm_timeout)
    principals = []
    for t in config.tenants.values():
        try:
            limits = _limits_text(t.limits({}, base))
        except ConfigError as exc:  # check_config reports it below
            limits = {"error": str(exc)}
        packages = "any" if t.packages is None else ", ".join(sorted(t.packages)) or "none"
        principals.append({
            "kind": "tenant", "name": t.name, "keys": f"{len(t.keys)} key(s)",
            "limits": limits,
            "ceiling": {k: _amount(k, v) for k, v in t.ceiling.given().items()
                        if v is not None},
            "quotas": {"max_sessions": _amount("", t.max_sessions),
                       "max_memory": _amount("max_memory", t.max_memory),
                       "max_disk": _amount("max_disk", t.max_disk),
                       "max_checkpoints": str(t.max_checkpoints),
                       "turns_per_second": _amount("", t.turns_per_second),
                       "max_running": _running(t.max_running, slots, "running_turns"),
                       "queued": str(t.queued)},
            "grants": {"mounts": ", ".join(f"{g.host} ({'rw' if g.writable else 'ro'})"
                                           for g in t.mounts) or "none",
                       "packages": packages,
                       "egress": (f"{t.egress.source or 'a policy'} "
                                  f"({len(t.egress.rules)} rule(s))") if t.egress else "none",
                       "tools": ", ".join(t.tools.names) if t.tools else "none"}})
    notes, problems = check_config(config)
    return {"file": path, "kind": "serve", "front": f"memex serve config, {where}, "
            f"{len(principals)} tenant(s)", "principals": principals, "notes": notes,
            "problems": problems}


def _mcp_report(path: str) -> dict[str, Any]:
    from ..integrations.mcp import load_config as load_mcp
    from ..serving import default_running_turns

    cfg = load_mcp(path)
    slots = cfg.sessions.running_cells or default_running_turns()
    shared = {"mounts": ", ".join(f"{m.host} at {m.guest} ({'rw' if m.writable else 'ro'})"
                                  for m in cfg.mounts) or "none",
              "packages": "any" if cfg.packages == ["*"] else ", ".join(cfg.packages)
              or "none",
              "egress": cfg.policy or "none",
              "tools": ", ".join(cfg.tools) or "none"}
    principals = []
    who: list[tuple[str, str | None, str]] = [
        (n, n, f"{len(t.keys)} key(s)") for n, t in cfg.principals.items()]
    who.append(("(every other)", None, "each token of $" + cfg.http.token_env
                if cfg.http.token_env else "the stdio host, or an HTTP client of --no-auth"))
    for label, name, keys in who:
        own = cfg.own(name)
        table = cfg.principals.get(name) if name is not None else None
        principals.append({
            "kind": "principal", "name": label, "keys": keys,
            "limits": _limits_text(own.limits),
            "ceiling": {k: _amount(k, v) for k, v in
                        (table.ceiling.given() if table is not None else {}).items()},
            "quotas": {"max_sessions": _amount("", own.bounds.max_sessions)
                       if own.bounds.max_sessions else f"{cfg.sessions.total_sessions} "
                       "(the server's)",
                       "max_memory": _amount("max_memory", own.bounds.max_memory),
                       "max_disk": _amount("max_disk", own.bounds.max_disk),
                       "max_checkpoints": str(own.bounds.max_checkpoints),
                       "turns_per_second": _amount("", own.rate),
                       "max_running": _running(own.running, slots, "running_cells"),
                       "queued": str(own.queued)},
            "grants": shared})
    notes = [f"the server holds at most {cfg.sessions.total_sessions} sessions in all "
             "(total_sessions); at a bound, an idle session gives way (docs/mcp.md)"]
    return {"file": path, "kind": "mcp", "front": f"memex mcp config, {cfg.transport}, "
            f"{len(cfg.principals)} named principal(s)", "principals": principals,
            "notes": notes, "problems": []}


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
    p = sub.add_parser("policy", help="check policy files: a serve.toml or MCP config per "
                       "principal, an egress policy's decisions (no request is made)")
    psub = p.add_subparsers(dest="policy_command", required=True)
    c = psub.add_parser(
        "check", help="validate a policy file and explain it; with a URL, the egress decision",
        description="FILE alone: validate a serve.toml or an MCP config and print, per "
        "principal, the limits of a session asking for none, the ceiling, the quotas and "
        "the grants, and any setting the front end would not enforce (exit 0 ok, 1 a "
        "problem, 2 an invalid file). FILE URL: the decision, the rule and the reason for a "
        "request (exit 0 allow, 1 deny) under an egress policy, or under a principal's "
        "(--principal) in a serve.toml or MCP config.")
    c.add_argument("policy", metavar="FILE",
                   help="serve.toml, an MCP config, or an egress policy (.toml, .yaml)")
    c.add_argument("url", nargs="?", default=None,
                   help="a request's URL to decide (without it: FILE is checked and explained)")
    c.add_argument("--kind", choices=["serve", "mcp", "egress"], default=None,
                   help="what FILE is (default: told by its tables)")
    c.add_argument("--principal", metavar="NAME", default=None,
                   help="with a URL and a serve.toml or MCP config: whose egress policy")
    c.add_argument("--method", "-X", default="GET", help="the request's method (GET)")
    c.add_argument("--address", action="append", default=[], metavar="IP",
                   help="an address the host name resolves to (repeatable); without it a name "
                   "is decided before DNS")
    c.add_argument("--resolve", action="store_true",
                   help="resolve the name with this machine's resolver first")
    c.add_argument("--json", action="store_true", help="print the decision (or the "
                   "explanation) as JSON")
    c.set_defaults(func=cmd_check)
    t = psub.add_parser("test", help="check a table of expected decisions (exit 1 on any "
                        "mismatch)")
    t.add_argument("policy", help="a policy file (.toml, .yaml)")
    t.add_argument("cases", help="cases file (.yaml, .toml): url, method, addresses, expect, "
                   "rule, reason, code")
    t.add_argument("-q", "--quiet", action="store_true", help="print only failures")
    t.set_defaults(func=cmd_test)

