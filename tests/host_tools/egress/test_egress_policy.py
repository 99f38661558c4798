"""Egress policies as data: decisions (default deny, deny overrides allow, selectors, special
addresses), the same policy from TOML, YAML, a mapping and Python objects, and every bad
policy reported with its file, line and reason."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lanes import examples

from memex.errors import ConfigError, PolicyError
from memex.host_tools import EgressLimits, EgressPolicy, EgressRule, EgressSecret
from memex.host_tools.egress import parse_url
from memex.host_tools.egress._addr import parse_address
from memex.host_tools.egress._rules import SecretUnavailable


def policy(*rules: dict[str, Any], **extra: Any) -> EgressPolicy:
    return EgressPolicy.from_dict({"rules": list(rules), **extra})


# ---- decisions ----------------------------------------------------------------------------------
def test_default_deny_and_empty_policy() -> None:
    d = EgressPolicy().check("https://example.com/")
    assert not d.allowed and d.code == "no_match" and "default deny" in d.reason
    assert d.rule is None and d.url == "https://example.com/"


def test_deny_overrides_allow_whatever_the_order() -> None:
    allow = {"name": "all", "action": "allow", "host": "*.example.com"}
    deny = {"name": "admin", "action": "deny", "host": "*.example.com", "path": "/admin"}
    for p in (policy(allow, deny), policy(deny, allow)):
        assert p.check("https://www.example.com/x").rule == "all"
        d = p.check("https://www.example.com/admin/users")
        assert not d.allowed and d.code == "deny_rule" and d.rule == "admin"


def test_first_matching_allow_rule_decides() -> None:
    p = policy({"name": "get", "action": "allow", "host": "api.example.com", "method": "GET"},
               {"name": "any", "action": "allow", "host": "api.example.com"})
    assert p.check("https://api.example.com/").rule == "get"
    assert p.check("https://api.example.com/", "post").rule == "any"


@pytest.mark.parametrize(("rule", "url", "method", "allowed"), [
    ({"host": "example.com"}, "https://example.com/", "GET", True),
    ({"host": "example.com"}, "https://www.example.com/", "GET", False),
    ({"host": "*.example.com"}, "https://a.b.example.com/", "GET", True),
    ({"host": "*.example.com"}, "https://example.com/", "GET", False),
    ({"host": "*.example.com"}, "https://badexample.com/", "GET", False),
    ({"host": "EXAMPLE.com."}, "https://example.com/", "GET", True),
    ({"host": "bücher.example"}, "https://xn--bcher-kva.example/", "GET", True),
    ({"host": "*"}, "https://anything.test/", "GET", True),
    ({"scheme": "https"}, "http://example.com/", "GET", False),
    ({"port": [443, "8000-8100"]}, "https://example.com:8080/", "GET", True),
    ({"port": [443, "8000-8100"]}, "https://example.com:8101/", "GET", False),
    ({"port": 443}, "https://example.com/", "GET", True),
    ({"method": ["GET", "head"]}, "https://example.com/", "HEAD", True),
    ({"method": "GET"}, "https://example.com/", "POST", False),
    ({"path": "/api"}, "https://example.com/api", "GET", True),
    ({"path": "/api"}, "https://example.com/api/v1?x", "GET", True),
    ({"path": "/api"}, "https://example.com/apiv2", "GET", False),
    ({"path": "/api/"}, "https://example.com/api", "GET", True),
    ({"path": "/api"}, "https://example.com/api/../admin", "GET", False),
    ({"path": "/api"}, "https://example.com/%61pi/x", "GET", True),
    ({"host": "93.184.216.34"}, "http://1572395042/", "GET", True),
    ({"host": "93.184.216.0/24"}, "http://93.184.216.99/", "GET", True),
    ({"host": "[2606:4700::1111]"}, "http://[2606:4700:0::1111]/", "GET", True),
    ({"ip": "93.184.216.0/24"}, "http://93.184.216.99/", "GET", True),
    ({"ip": "93.184.216.0/24"}, "http://93.184.217.1/", "GET", False),
])
def test_selectors(rule: dict[str, Any], url: str, method: str, allowed: bool) -> None:
    assert policy({"action": "allow", **rule}).check(url, method).allowed is allowed


def test_names_are_decided_before_dns_then_with_their_addresses() -> None:
    p = policy({"name": "pinned", "action": "allow", "host": "api.example.com",
                "ip": "93.184.216.0/24"},
               {"name": "no-internal", "action": "deny", "ip": "10.0.0.0/8"},
               {"name": "web", "action": "allow", "host": "*"})
    d = p.check("https://api.example.com/")
    assert d.allowed and not d.resolved and "before DNS" in d.reason and d.rule == "web"
    d = policy({"name": "pinned", "action": "allow", "host": "api.example.com",
                "ip": "93.184.216.0/24"}).check("https://api.example.com/")
    assert not d.allowed and d.code == "pending_dns" and d.rule == "pinned"
    assert "if api.example.com resolves inside 93.184.216.0/24" in d.reason
    d = p.check("https://api.example.com/", addresses=["93.184.216.34"])
    assert d.allowed and d.resolved and d.rule == "pinned" and "before DNS" not in d.reason
    d = p.check("https://api.example.com/", addresses=["8.8.8.8"])
    assert d.allowed and d.rule == "web"  # the pin did not hold; the next rule decides
    d = p.check("https://other.example/", addresses=["8.8.8.8", "10.1.1.1"])
    assert not d.allowed and d.rule == "no-internal"  # a deny rule's ip: any address
    assert p.check("https://x.example/", addresses=[]).code == "invalid"
    assert p.check("https://x.example/", addresses=["nope"]).code == "invalid"


@pytest.mark.parametrize(("rule", "url", "addresses", "allowed"), [
    ({"host": "*"}, "http://127.0.0.1/", None, False),
    ({"ip": "0.0.0.0/0"}, "http://127.0.0.1/", None, False),
    ({"ip": "::/0"}, "http://[::1]/", None, False),
    ({"ip": "127.0.0.0/8"}, "http://127.0.0.1/", None, True),
    ({"ip": "127.0.0.1"}, "http://127.0.0.2/", None, False),
    ({"host": "127.0.0.1"}, "http://2130706433/", None, True),
    ({"host": "localhost"}, "http://localhost/", ["127.0.0.1"], False),
    ({"host": "localhost", "ip": "127.0.0.1"}, "http://localhost/", ["127.0.0.1"], True),
    ({"host": "localhost", "ip": "127.0.0.1"}, "http://localhost/", ["127.0.0.1", "::1"],
     False),
    ({"ip": "10.0.0.0/8"}, "http://10.2.3.4/", None, True),
    ({"ip": "10.0.0.0/7"}, "http://10.2.3.4/", None, False),
    ({"ip": "169.254.0.0/16"}, "http://169.254.169.254/", None, False),
    ({"ip": "169.254.169.254"}, "http://169.254.169.254/", None, True),
    ({"ip": "::ffff:10.0.0.0/104"}, "http://10.9.9.9/", None, True),
    ({"host": "*"}, "http://metadata.google.internal/", None, False),
])
def test_special_addresses_need_a_rule_naming_them(rule: dict[str, Any], url: str,
                                                   addresses: list[str] | None,
                                                   allowed: bool) -> None:
    d = policy({"action": "allow", **rule}).check(url, addresses=addresses)
    assert d.allowed is allowed, d
    if not allowed:
        assert d.code in ("special", "metadata")


@pytest.mark.parametrize(("url", "method", "code"), [
    ("ftp://example.com/", "GET", "scheme"), ("http://u:p@example.com/", "GET", "invalid"),
    ("https://example.com/", "CONNECT", "invalid"), ("https://example.com/", "G ET", "invalid"),
    ("https://example.com/", "", "invalid"), (b"https://example.com/", "GET", "invalid"),
])
def test_unusable_requests(url: Any, method: str, code: str) -> None:
    d = policy({"action": "allow", "host": "*"}).check(url, method)
    assert not d.allowed and d.code == code


def test_decision_as_dict_and_secret_names(monkeypatch: pytest.MonkeyPatch) -> None:
    p = policy({"name": "gh", "action": "allow", "host": "api.github.com"},
               secrets=[{"name": "gh-token", "host": "api.github.com", "header":
                         "Authorization", "format": "Bearer {value}", "env": "GH"},
                        {"name": "shadowed", "host": "*.github.com", "header": "authorization",
                         "env": "GH2"}])
    d = p.check("https://api.github.com/repos", addresses=["140.82.112.5"])
    assert d.secrets == ("gh-token",)
    dd = d.to_dict()
    assert dd["decision"] == "allow" and dd["rule"] == "gh" and dd["secrets"] == ["gh-token"]
    assert dd["addresses"] == ["140.82.112.5"] and dd["resolved"] is True
    assert p.check("http://api.github.com/").secrets == ()  # https only by default


rule_st = st.fixed_dictionaries({
    "action": st.sampled_from(["allow", "deny"]),
    "host": st.sampled_from([[], "*", "a.test", "*.test", "b.a.test", "127.0.0.1", "10.0.0.0/8"]),
    "ip": st.sampled_from([[], "10.0.0.0/8", ["127.0.0.1", "10.2.0.0/16"]]),
    "method": st.sampled_from([[], ["GET"], ["POST"]]),
    "path": st.sampled_from([[], ["/x"], ["/"]]),
})
url_st = st.sampled_from(["http://a.test/x", "http://b.a.test/y", "http://c.test/x/1",
                          "http://127.0.0.1/x", "http://10.1.1.1/", "http://other.example/"])


@given(st.lists(rule_st, max_size=8), url_st, st.sampled_from(["GET", "POST"]),
       st.randoms(use_true_random=False))
@settings(max_examples=examples(300), deadline=None)
def test_rule_order_never_changes_whether_a_request_is_allowed(
        rules: list[dict[str, Any]], url: str, method: str, rnd: random.Random) -> None:
    p = policy(*rules)
    shuffled = list(rules)
    rnd.shuffle(shuffled)
    assert p.check(url, method).allowed == policy(*shuffled).check(url, method).allowed


@given(st.lists(rule_st, min_size=1, max_size=12), url_st, st.sampled_from(["GET", "POST"]),
       st.sampled_from([None, ["10.1.1.1"], ["127.0.0.1", "10.2.2.2"], ["93.184.216.34"]]))
@settings(max_examples=examples(300), deadline=None)
def test_the_index_finds_every_rule_that_can_decide(
        rules: list[dict[str, Any]], url: str, method: str, addresses: list[str] | None) -> None:
    p = policy(*rules)
    t = parse_url(url)
    addrs = [t.ip] if t.ip is not None else (
        None if addresses is None else [parse_address(a) for a in addresses])
    found = set(p._index.candidates(t, addrs))
    for i, r in enumerate(p.rules):
        if not r._request_match(t, method):
            continue
        if not r._nets:
            assert i in found, (r, url)
        elif addrs is not None and any(any(a in n for n in r._nets if a.version == n.version)
                                       for a in addrs):
            assert i in found, (r, url, addrs)


# ---- the same policy, four ways ------------------------------------------------------------------
TOML = """\
version = 1

[limits]
max_request_bytes = "64k"
max_response_bytes = "2M"
timeout = "10s"
requests_per_turn = 20
rate = "600/min"
burst = 5

[headers]
strip = ["Authorization", "Cookie"]

[[rules]]
name = "github"
action = "allow"
scheme = "https"
host = ["api.github.com", "*.githubusercontent.com"]
method = ["GET", "HEAD"]
allow_headers = ["Cookie"]

[[rules]]
name = "local"
action = "allow"
ip = "127.0.0.1"
port = "8000-8999"
timeout = 2

[[rules]]
name = "no-admin"
action = "deny"
host = "*"
path = "/admin"

[[secrets]]
name = "gh"
host = "api.github.com"
header = "Authorization"
format = "token {value}"
env = "GITHUB_TOKEN"
"""

YAML = """\
version: 1
limits:
  max_request_bytes: 64k
  max_response_bytes: 2M
  timeout: 10s
  requests_per_turn: 20
  rate: 600/min
  burst: 5
headers:
  strip: [Authorization, Cookie]
rules:
  - name: github
    action: allow
    scheme: https
    host: [api.github.com, "*.githubusercontent.com"]
    method: [GET, HEAD]
    allow_headers: [Cookie]
  - name: local
    action: allow
    ip: 127.0.0.1
    port: 8000-8999
    timeout: 2
  - {name: no-admin, action: deny, host: "*", path: /admin}
secrets:
  - name: gh
    host: api.github.com
    header: Authorization
    format: "token {value}"
    env: GITHUB_TOKEN
"""


def _python_policy() -> EgressPolicy:
    return EgressPolicy(
        rules=(EgressRule.allow(name="github", scheme="https",
                                host=("api.github.com", "*.githubusercontent.com"),
                                method=("GET", "HEAD"), allow_headers=("Cookie",)),
               EgressRule.allow(name="local", ip="127.0.0.1", port="8000-8999", timeout=2),
               EgressRule.deny(name="no-admin", host="*", path="/admin")),
        limits=EgressLimits(max_request_bytes="64k", max_response_bytes="2M", timeout="10s",
                            requests_per_turn=20, rate="600/min", burst=5),
        strip_headers=("Authorization", "Cookie"),
        secrets=(EgressSecret(name="gh", host="api.github.com", header="Authorization",
                              format="token {value}", env="GITHUB_TOKEN"),))


def _plain(p: EgressPolicy) -> tuple[Any, ...]:
    return (tuple(dataclasses.replace(r, source=None) for r in p.rules), p.limits,
            p.strip_headers, tuple(dataclasses.replace(s, source=None) for s in p.secrets))


def test_toml_yaml_mapping_and_objects_agree(tmp_path: Path) -> None:
    (tmp_path / "p.toml").write_text(TOML)
    (tmp_path / "p.yml").write_text(YAML)
    import tomllib

    policies = [EgressPolicy.load(tmp_path / "p.toml"), EgressPolicy.load(tmp_path / "p.yml"),
                EgressPolicy.loads(TOML, format="toml"), EgressPolicy.loads(YAML, format="yaml"),
                EgressPolicy.from_dict(tomllib.loads(TOML)), _python_policy()]
    first = _plain(policies[0])
    assert all(_plain(p) == first for p in policies[1:])
    lim = policies[0].limits
    assert (lim.max_request_bytes, lim.max_response_bytes, lim.timeout, lim.rate) == \
        (64 << 10, 2 << 20, 10.0, 10.0)
    assert policies[0].rules[1].source == f"{tmp_path / 'p.toml'}:22"
    assert policies[1].rules[2].source == f"{tmp_path / 'p.yml'}:23"
    p = policies[0]
    assert p.check("https://raw.githubusercontent.com/x").rule == "github"
    assert p.check("https://api.github.com/admin").rule == "no-admin"
    assert p.check("http://127.0.0.1:8080/").rule == "local"
    assert not p.check("http://127.0.0.1:9000/").allowed


# ---- errors with file, line and reason ----------------------------------------------------------
TOML_ERRORS = [
    ('[[rules]]\naction = "allow"\nhots = "x"\n', 3, "rules[0].hots",
     "unknown key 'hots' in a rule; did you mean 'host'?"),
    ('[[rules]]\naction = "allow"\n\n[[rules]]\naction = "deny"\nip = ["10.0.0.0/8", '
     '"10.0.0.1/33"]\n', 6, "rules[1].ip[1]", "not a valid CIDR"),
    ('[[rules]]\naction = "allow"\nip = "10.0.0.300"\n', 3, "rules[0].ip",
     "not an IP address or CIDR"),
    ('[[rules]]\naction = "allow"\nip = "10.0.0.1/8"\n', 3, "rules[0].ip", "host bits set"),
    ('[[rules]]\naction = "maybe"\n', 2, "rules[0].action", "must be 'allow' or 'deny'"),
    ('[[rules]]\nhost = "x"\n', 1, "rules[0]", "needs an action"),
    ('[[rules]]\naction = "allow"\nport = 70000\n', 3, "rules[0].port", "invalid port range"),
    ('[[rules]]\naction = "allow"\nport = "9-1"\n', 3, "rules[0].port", "low before high"),
    ('[[rules]]\naction = "allow"\nscheme = "ftp"\n', 3, "rules[0].scheme", "unsupported"),
    ('[[rules]]\naction = "allow"\nhost = "a.*.com"\n', 3, "rules[0].host", "leading '*.'"),
    ('[[rules]]\naction = "allow"\nhost = ""\n', 3, "rules[0].host", "non-empty"),
    ('[[rules]]\naction = "allow"\nmethod = "G T"\n', 3, "rules[0].method", "invalid HTTP"),
    ('[[rules]]\naction = "allow"\npath = "api"\n', 3, "rules[0].path", "starting with '/'"),
    ('[[rules]]\naction = "allow"\ntimeout = "soon"\n', 3, "rules[0].timeout", "seconds"),
    ('[[rules]]\naction = "allow"\nmax_response_bytes = "lots"\n', 3,
     "rules[0].max_response_bytes", "byte count"),
    ('[[rules]]\nname = "a"\naction = "allow"\n[[rules]]\nname = "a"\naction = "deny"\n', 5,
     "rules[1].name", "duplicate rule name"),
    ('rules = "all"\n', 1, "rules", "must be a list"),
    ('version = 2\n', 1, "version", "unsupported policy version"),
    ('colour = "blue"\n', 1, "colour", "unknown key"),
    ('[limits]\ntimeout = 0\n', 2, "limits.timeout", "seconds > 0"),
    ('[limits]\nrate = "fast"\n', 2, "limits.rate", "rate like"),
    ('[limits]\nburst = 3\n', 2, "limits.burst", "needs a rate"),
    ('[limits]\nrequests_per_turn = -1\n', 2, "limits.requests_per_turn", "count >= 0"),
    ('[limits]\nmax_redirect = 3\n', 2, "limits.max_redirect", "did you mean 'max_redirects'"),
    ('[headers]\nstrip = "cookie"\n', 2, "headers.strip", "list of header names"),
    ('[[secrets]]\nname = "s"\nhost = "a.com"\nheader = "X"\n', 1, "secrets[0]",
     "exactly one of 'env', 'file' or 'value'"),
    ('[[secrets]]\nname = "s"\nhost = "a.com"\nheader = "X"\nquery = "k"\nenv = "E"\n', 1,
     "secrets[0]", "exactly one of 'header' or 'query'"),
    ('[[secrets]]\nname = "s"\nhost = "a.com"\nheader = "X"\nenv = "E"\nformat = "Bearer"\n',
     6, "secrets[0].format", "must contain '{value}'"),
    ('[[secrets]]\nname = "s"\nheader = "X"\nenv = "E"\n', 1, "secrets[0]", "needs host"),
    ('[[rules]]\naction = "allow"\nhost = \n', 3, None, "TOML syntax error"),
]


@pytest.mark.parametrize(("text", "line", "path", "reason"), TOML_ERRORS)
def test_toml_errors_name_file_line_and_reason(tmp_path: Path, text: str, line: int,
                                               path: str | None, reason: str) -> None:
    f = tmp_path / "policy.toml"
    f.write_text(text)
    with pytest.raises(PolicyError) as info:
        EgressPolicy.load(f)
    err = info.value
    assert isinstance(err, ConfigError) and isinstance(err, ValueError)
    (issue,) = err.issues
    assert (issue.source, issue.line, issue.path) == (str(f), line, path), str(err)
    assert reason in issue.reason, issue.reason
    assert str(err).startswith(f"{f}:{line}: "), str(err)


YAML_ERRORS = [
    ("rules:\n  - action: allow\n    ip: 10.0.0.300/8\n", 3, "rules[0].ip", "not an IP"),
    ("rules:\n  - action: allow\n    ip: [1.2.3.4, 10.0.0.0/33]\n", 3, "rules[0].ip[1]",
     "CIDR"),
    ("rules:\n  - action: allow\n    host: a.com\n    host: b.com\n", 4, "rules[0].host",
     "duplicate key 'host' (first on line 3)"),
    ("rules:\n  - action: allow\n    hosts: a.com\n", 3, "rules[0].hosts", "unknown key"),
    ("rules:\n  - action: allow\n  - 7\n", 3, "rules[1]", "must be a table"),
    ("limits:\n  timeout: [1]\n", 2, "limits.timeout", "seconds"),
    ("rules: [\n", 2, None, "YAML syntax error"),
    ("- a\n- b\n", 1, None, "top level"),
    ("", None, None, "the policy is empty"),
]


@pytest.mark.parametrize(("text", "line", "path", "reason"), YAML_ERRORS)
def test_yaml_errors_name_file_line_and_reason(tmp_path: Path, text: str, line: int | None,
                                               path: str | None, reason: str) -> None:
    f = tmp_path / "policy.yaml"
    f.write_text(text)
    with pytest.raises(PolicyError) as info:
        EgressPolicy.load(f)
    (issue,) = info.value.issues
    assert (issue.source, issue.line, issue.path) == (str(f), line, path), str(info.value)
    assert reason in issue.reason, issue.reason


def test_all_problems_are_reported_at_once(tmp_path: Path) -> None:
    f = tmp_path / "policy.toml"
    f.write_text('colour = 1\n\n[[rules]]\naction = "allow"\nip = "x"\n\n[[rules]]\n'
                 'action = "deny"\nport = 0\n')
    with pytest.raises(PolicyError) as info:
        EgressPolicy.load(f)
    err = info.value
    assert [(i.line, i.path) for i in err.issues] == [(1, "colour"), (5, "rules[0].ip"),
                                                      (9, "rules[1].port")]
    assert str(err).startswith(f"3 problems in the egress policy {f}:\n")
    assert f"{f}:9: rules[1].port: " in str(err)


@pytest.mark.parametrize(("name", "data", "reason"), [
    ("policy.json", b"{}", "unknown file type"),
    ("missing.toml", None, "cannot read the file"),
    ("latin.yaml", b"rules: [\xff]\n", "not UTF-8"),
])
def test_unreadable_files(tmp_path: Path, name: str, data: bytes | None, reason: str) -> None:
    f = tmp_path / name
    if data is not None:
        f.write_bytes(data)
    with pytest.raises(PolicyError, match=reason):
        EgressPolicy.load(f)


def test_python_objects_are_validated_too() -> None:
    with pytest.raises(PolicyError, match=r"r1\.ip: '300\.1\.1\.1' is not an IP"):
        EgressRule.allow(name="r1", ip="300.1.1.1")
    with pytest.raises(PolicyError, match="must be 'allow' or 'deny'"):
        EgressRule(action="permit")  # type: ignore[arg-type]
    with pytest.raises(PolicyError, match="rules must be EgressRule objects"):
        EgressPolicy(rules=({"action": "allow"},))  # type: ignore[arg-type]
    with pytest.raises(PolicyError, match="limits must be an EgressLimits"):
        EgressPolicy(limits={})  # type: ignore[arg-type]
    with pytest.raises(PolicyError, match="must name the host"):
        EgressSecret(name="s", host=(), header="X", value="v")
    with pytest.raises(PolicyError, match="a policy must be a table"):
        EgressPolicy.from_dict([])  # type: ignore[arg-type]
    with pytest.raises(PolicyError, match="unknown policy format"):
        EgressPolicy.loads("", format="json")  # type: ignore[arg-type]
    p = EgressPolicy(rules=(EgressRule.allow(host="a.com"), EgressRule.deny(ip="10.0.0.0/8")))
    assert [r.name for r in p.rules] == ["rules[0]", "rules[1]"]
    assert p.rules[0].host == ("a.com",)


def test_secret_values(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMEX_TEST_SECRET", "from-env")
    (tmp_path / "tok").write_text("from-file\n")
    made = [EgressSecret(name="e", host="a.com", header="X", env="MEMEX_TEST_SECRET"),
            EgressSecret(name="f", host="a.com", header="X", file=str(tmp_path / "tok")),
            EgressSecret(name="v", host="a.com", query="k", value="literal"),
            EgressSecret(name="c", host="a.com", header="X", value=lambda: "called")]
    assert [s.resolve() for s in made] == ["from-env", "from-file", "literal", "called"]
    assert "literal" not in repr(made[2])
    assert made[0].render("x") == "x"
    monkeypatch.delenv("MEMEX_TEST_SECRET")
    broken = [made[0], EgressSecret(name="f", host="a.com", header="X",
                                    file=str(tmp_path / "nope")),
              EgressSecret(name="c", host="a.com", header="X", value=lambda: 1 / 0),
              EgressSecret(name="n", host="a.com", header="X", value="a\nb")]
    for s, why in zip(broken, ["is not set", "cannot read", "ZeroDivisionError",
                               "line breaks"], strict=True):
        with pytest.raises(SecretUnavailable, match=why):
            s.resolve()
