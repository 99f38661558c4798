"""The defenses, each through a real guest and a real server on 127.0.0.1: the SSRF corpus,
redirects re-checked, DNS resolved once with every address checked, caps, header rules,
host-held secrets, and TLS to a pinned address with the right name."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from typing import Any

import pytest
import test_egress_support as support
from test_egress_support import Names, _Server, guest, local_policy

from memex import Sandbox
from memex.host_tools import Egress

# the support module's fixtures, used here by name
attach = support.attach
client_tls = support.client_tls
egress_sandbox = support.egress_sandbox
loopback_only = support.loopback_only
server = support.server
tls_files = support.tls_files
tls_server = support.tls_server

# Spellings of the loopback test server (port added): all must be seen as 127.0.0.1 / ::1.
LOOPBACK_SPELLINGS = [
    "127.0.0.1", "2130706433", "0x7f000001", "0x7f.1", "0177.0.0.1", "0177.0.0.01", "127.1",
    "127.0.1", "0x7F.0.0.1", "127.0.0.1.", "[::ffff:127.0.0.1]", "[::ffff:7f00:1]",
    "%31%32%37.0.0.1", "１２７．０．０．１", "LOCALHOST",
]


def fetch_cell(url: str, **kw: Any) -> str:
    args = "".join(f", {k}={v!r}" for k, v in kw.items())
    return f"attempt(lambda: (lambda r: (r.status, r.body))(net.fetch({url!r}{args})))"


@pytest.mark.parametrize("host", LOOPBACK_SPELLINGS)
def test_loopback_spellings_are_denied_without_an_ip_rule(
        attach: Callable[..., Egress], egress_sandbox: Sandbox, server: _Server,
        loopback_only: list[str], host: str) -> None:
    # "*" allows every public destination but never a special address.
    names = Names({"localhost": ["127.0.0.1"]})
    eg = attach({"rules": [{"action": "allow", "host": "*"}]}, resolver=names)
    mark = eg.mark()
    out = guest(egress_sandbox, fetch_cell(f"http://{host}:{server.port}/"))
    assert out[:3] == ("error", "EgressDenied", "denied"), out
    assert "loopback" in out[4], out
    (rec,) = eg.since(mark)
    assert rec.decision == "deny" and rec.addresses == ("127.0.0.1",)
    assert loopback_only == []


@pytest.mark.parametrize("host", LOOPBACK_SPELLINGS[:-1])
def test_loopback_spellings_reach_the_server_under_an_ip_rule(
        attach: Callable[..., Egress], egress_sandbox: Sandbox, server: _Server,
        host: str) -> None:
    attach(local_policy(server.port))
    out = guest(egress_sandbox, fetch_cell(f"http://{host}:{server.port}/json"))
    assert out == ("ok", (200, b'{"hello": "world"}')), out


SSRF_CORPUS = [
    ("http://169.254.169.254/latest/meta-data/", "cloud metadata"),
    ("http://[fd00:ec2::254]/", "cloud metadata"),
    ("http://metadata.google.internal/computeMetadata/v1/", "metadata host name"),
    ("http://100.100.100.200/", "cloud metadata"),
    ("http://0.0.0.0:{port}/", "unspecified"),
    ("http://0:{port}/", "unspecified"),
    ("http://[::]:{port}/", "unspecified"),
    ("http://[::1]:{port}/", "loopback"),
    ("http://10.0.0.1/", "private"),
    ("http://172.16.5.4/", "private"),
    ("http://192.168.1.1/", "private"),
    ("http://100.64.0.1/", "private"),
    ("http://[fc00::1]/", "private"),
    ("http://169.254.1.1/", "link-local"),
    ("http://[fe80::1]/", "link-local"),
    ("http://224.0.0.1/", "multicast"),
    ("http://[ff02::1]/", "multicast"),
    ("http://255.255.255.255/", "reserved"),
    ("http://[64:ff9b::7f00:1]/", "loopback (embedded 127.0.0.1)"),
    ("http://[2002:a00:1::]/", "private (embedded 10.0.0.1)"),
    ("http://user:pw@127.0.0.1:{port}/", "credentials in the URL"),
    ("http://127.0.0.1:{port}\\@example.com/", "loopback"),
    ("http://1.2.3.4.5/", "not an IPv4 address"),
    ("http://[::1%25lo]/", "zone identifiers"),
    ("file:///etc/passwd", "scheme 'file' is not supported"),
    ("gopher://127.0.0.1:{port}/", "scheme 'gopher' is not supported"),
    ("http://exa mple.com/", "spaces or control characters"),
]


@pytest.mark.parametrize(("url", "why"), SSRF_CORPUS)
def test_ssrf_corpus_is_denied(attach: Callable[..., Egress], egress_sandbox: Sandbox,
                               server: _Server, loopback_only: list[str], url: str,
                               why: str) -> None:
    eg = attach({"rules": [{"action": "allow", "host": "*"},
                           {"action": "allow", "ip": ["0.0.0.0/0", "::/0"]}]})
    before = len(server.seen)
    out = guest(egress_sandbox, fetch_cell(url.format(port=server.port)))
    assert out[1] == "EgressDenied", out
    assert why in out[4], out
    assert eg.records[-1].decision == "deny"
    assert len(server.seen) == before and loopback_only == []


def test_explicit_rules_unlock_only_what_they_name(server: _Server) -> None:
    from memex.host_tools import EgressPolicy

    p = EgressPolicy.from_dict({"rules": [
        {"action": "allow", "ip": "169.254.0.0/16"},
        {"action": "allow", "ip": "127.0.0.0/8"},
        {"action": "allow", "host": "10.1.2.3"}]})
    assert not p.check("http://169.254.169.254/").allowed  # metadata needs its own /32
    assert p.check("http://169.254.1.1/").allowed
    assert p.check(server.url()).allowed and p.check("http://127.9.9.9/").allowed
    assert p.check("http://10.1.2.3/").allowed and not p.check("http://10.1.2.4/").allowed
    meta = EgressPolicy.from_dict({"rules": [{"action": "allow", "ip": "169.254.169.254"}]})
    assert meta.check("http://169.254.169.254/").allowed


# ---- redirects ----------------------------------------------------------------------------------
@pytest.mark.parametrize("target", ["http://169.254.169.254/latest/", "http://10.0.0.1/",
                                    "http://internal.test/", "ftp://127.0.0.1/"])
def test_redirect_from_allowed_to_denied_is_refused(
        attach: Callable[..., Egress], egress_sandbox: Sandbox, server: _Server,
        loopback_only: list[str], target: str) -> None:
    names = Names({"internal.test": ["10.9.9.9"]})
    eg = attach({"rules": [{"name": "local", "action": "allow", "ip": "127.0.0.1",
                            "port": server.port},
                           {"name": "web", "action": "allow", "host": "*"}]}, resolver=names)
    mark = eg.mark()
    src = server.url(f"/redirect?to={target}")
    out = guest(egress_sandbox, fetch_cell(src))
    assert out[1] == "EgressDenied", out
    recs = eg.since(mark)
    assert [(r.hop, r.decision, r.status) for r in recs] == [(0, "allow", 302),
                                                             (1, "deny", None)]
    assert recs[1].redirect_from == src
    # urllib follows redirects itself: each hop is its own request, checked the same way
    out = guest(egress_sandbox, f"attempt(lambda: urllib.request.urlopen({src!r}).read())")
    assert out[1] == "EgressDenied", out
    assert all(a == "127.0.0.1" for a in loopback_only)


def test_redirects_are_followed_with_method_rules_and_a_cap(
        attach: Callable[..., Egress], egress_sandbox: Sandbox, server: _Server) -> None:
    eg = attach(local_policy(server.port, max_redirects=2))
    hop2 = server.url("/echo")
    hop1 = server.url(f"/redirect?code=303&to={hop2}")
    out = guest(egress_sandbox, f"""
r = net.fetch({hop1!r}, method='POST', body=b'data', headers={{'Content-Type': 'text/plain'}})
(r.status, r.url, r.redirects, r.json()['method'], r.json()['body'])
""")
    assert out == (200, hop2, (hop2,), "GET", "")
    keep = server.url(f"/redirect?code=307&to={hop2}")
    out = guest(egress_sandbox, f"(lambda r: (r.json()['method'], r.json()['body']))("
                                f"net.fetch({keep!r}, method='POST', body=b'data'))")
    assert out == ("POST", "data")
    loop = server.url(f"/redirect?to={server.url('/redirect?to=/redirect%3Fto%3D/echo')}")
    out = guest(egress_sandbox, fetch_cell(loop))
    assert out[1:3] == ("EgressDenied", "cap") and "more than 2 redirects" in out[4], out
    out = guest(egress_sandbox, f"net.fetch({hop1!r}, follow_redirects=False).status")
    assert out == 303
    assert eg.records[-1].hop == 0


# ---- DNS ----------------------------------------------------------------------------------------
def test_name_resolving_to_loopback_is_denied_unless_named(
        attach: Callable[..., Egress], egress_sandbox: Sandbox, server: _Server,
        loopback_only: list[str]) -> None:
    names = Names({"api.test": ["127.0.0.1"]})
    eg = attach({"rules": [{"name": "api", "action": "allow", "host": "api.test"}]},
                resolver=names)
    out = guest(egress_sandbox, fetch_cell(f"http://api.test:{server.port}/"))
    assert out[1] == "EgressDenied" and "127.0.0.1 is a loopback address" in out[4], out
    assert names.calls == ["api.test"] and loopback_only == []
    assert eg.records[-1].addresses == ("127.0.0.1",)
    # pinned: the same name is allowed when the rule also names the address
    attach({"rules": [{"name": "api", "action": "allow", "host": "api.test",
                       "ip": "127.0.0.1"}]}, resolver=names)
    out = guest(egress_sandbox, f"net.fetch('http://API.test.:{server.port}/echo').json()"
                                "['headers']['host']")
    assert out == f"api.test:{server.port}"  # the name in Host, the checked address dialled
    assert loopback_only == ["127.0.0.1"]


def test_dns_is_resolved_once_and_every_address_checked(
        attach: Callable[..., Egress], egress_sandbox: Sandbox, server: _Server,
        loopback_only: list[str]) -> None:
    class Rebinding:
        """Answers 127.0.0.1 first, then a private address (a rebinding attack)."""

        def __init__(self) -> None:
            self.calls = 0

        def __call__(self, host: str, port: int) -> list[str]:
            self.calls += 1
            return ["127.0.0.1"] if self.calls == 1 else ["10.0.0.1"]

    rb = Rebinding()
    attach({"rules": [{"action": "allow", "host": "rebind.test", "ip": "127.0.0.1"}]},
           resolver=rb)
    assert guest(egress_sandbox, f"net.fetch('http://rebind.test:{server.port}/').status") \
        == 200
    assert rb.calls == 1 and loopback_only == ["127.0.0.1"]
    mixed = Names({"mixed.test": ["8.8.8.8", "127.0.0.1"], "none.test": []})
    eg = attach({"rules": [{"action": "allow", "host": "*"}]}, resolver=mixed)
    out = guest(egress_sandbox, fetch_cell(f"http://mixed.test:{server.port}/"))
    assert out[1] == "EgressDenied" and "loopback" in out[4], out
    assert eg.records[-1].addresses == ("8.8.8.8", "127.0.0.1")
    out = guest(egress_sandbox, fetch_cell("http://none.test/"))
    assert out[1] == "EgressDenied" and "resolved to no address" in out[4], out
    out = guest(egress_sandbox, fetch_cell("http://unknown.test/"))
    assert out[1:3] == ("EgressConnectionError", "dns"), out
    assert loopback_only == ["127.0.0.1"]


def test_denied_names_are_never_resolved(attach: Callable[..., Egress],
                                         egress_sandbox: Sandbox) -> None:
    names = Names({"evil.test": ["127.0.0.1"]})
    attach({"rules": [{"action": "allow", "host": "good.test"},
                      {"action": "deny", "host": "*.bad.test"}]}, resolver=names)
    for url in ("http://evil.test/", "http://x.bad.test/"):
        out = guest(egress_sandbox, fetch_cell(url))
        assert out[1] == "EgressDenied", out
    assert names.calls == []


# ---- caps ---------------------------------------------------------------------------------------
def test_request_and_response_byte_caps(attach: Callable[..., Egress], egress_sandbox: Sandbox,
                                        server: _Server) -> None:
    eg = attach(local_policy(server.port, max_request_bytes=100, max_response_bytes=1000))
    before = len(server.seen)
    out = guest(egress_sandbox, fetch_cell(server.url("/echo"), method="POST", body=b"x" * 101))
    assert out[1:3] == ("EgressDenied", "cap") and "101 bytes exceeds" in out[4], out
    assert len(server.seen) == before  # never sent
    assert guest(egress_sandbox, fetch_cell(server.url("/bytes?n=1000")))[0] == "ok"
    for path in ("/bytes?n=1001", "/bytes?n=5000&chunked=1"):
        out = guest(egress_sandbox, fetch_cell(server.url(path)))
        assert out[1:3] == ("EgressDenied", "cap") and "1000-byte cap" in out[4], out
    assert eg.records[-1].outcome == "cap"
    out = guest(egress_sandbox, f"attempt(lambda: urllib.request.urlopen("
                                f"{server.url('/bytes?n=4000')!r}).read())")
    assert out[1:3] == ("EgressDenied", "cap"), out


def test_rule_caps_override_the_policy(attach: Callable[..., Egress], egress_sandbox: Sandbox,
                                       server: _Server) -> None:
    attach({"rules": [{"action": "allow", "ip": "127.0.0.1", "path": "/bytes",
                       "max_response_bytes": "2k"},
                      {"action": "allow", "ip": "127.0.0.1"}],
            "limits": {"max_response_bytes": 10}})
    assert guest(egress_sandbox, fetch_cell(server.url("/bytes?n=2048")))[0] == "ok"
    assert guest(egress_sandbox, fetch_cell(server.url("/echo")))[1] == "EgressDenied"


def test_requests_per_turn_and_per_sandbox(attach: Callable[..., Egress],
                                           egress_sandbox: Sandbox, server: _Server) -> None:
    attach(local_policy(server.port, requests_per_turn=2, requests_per_sandbox=3))
    cell = f"[attempt(lambda: net.fetch({server.url()!r}).status)[0] for _ in range(3)]"
    assert guest(egress_sandbox, cell) == ["ok", "ok", "error"]
    out = guest(egress_sandbox, fetch_cell(server.url()))  # a new turn: per-turn count reset
    assert out[0] == "ok"
    out = guest(egress_sandbox, fetch_cell(server.url()))
    assert out[1:3] == ("EgressDenied", "cap") and "3 requests for this sandbox" in out[4], out


def test_rate_limit(attach: Callable[..., Egress], egress_sandbox: Sandbox,
                    server: _Server) -> None:
    eg = attach(local_policy(server.port, rate="1/h", burst=2))
    cell = f"[attempt(lambda: net.fetch({server.url()!r}).status)[0] for _ in range(3)]"
    assert guest(egress_sandbox, cell) == ["ok", "ok", "error"]
    assert "rate limit" in eg.records[-1].reason


def test_time_cap(attach: Callable[..., Egress], egress_sandbox: Sandbox,
                  server: _Server) -> None:
    eg = attach(local_policy(server.port, timeout="200ms"))
    out = guest(egress_sandbox, fetch_cell(server.url("/slow?s=1")))
    assert out[1:3] == ("EgressTimeout", "timeout"), out
    assert eg.records[-1].outcome == "timeout"
    out = guest(egress_sandbox, f"""
try:
    urllib.request.urlopen({server.url('/slow?s=1')!r})
except TimeoutError as e:
    res = type(e).__name__
res
""")
    assert out == "EgressTimeout"


# ---- headers and secrets ----------------------------------------------------------------------
def test_cookies_and_authorization_are_stripped_unless_allowed(
        attach: Callable[..., Egress], egress_sandbox: Sandbox, server: _Server) -> None:
    cell = (f"net.fetch({server.url('/echo')!r}, headers={{'Cookie': 'c=1', "
            "'Authorization': 'Basic x', 'Host': 'evil.example', 'X-Ok': '1'}).json()"
            "['headers']")
    eg = attach(local_policy(server.port))
    seen = guest(egress_sandbox, cell)
    assert "cookie" not in seen and "authorization" not in seen and seen["x-ok"] == "1"
    assert seen["host"] == f"127.0.0.1:{server.port}"
    assert set(eg.records[-1].stripped_headers) == {"cookie", "authorization", "host"}
    attach({"rules": [{"action": "allow", "ip": "127.0.0.1", "allow_headers": ["Cookie"]}]})
    seen = guest(egress_sandbox, cell)
    assert seen["cookie"] == "c=1" and "authorization" not in seen


def test_secrets_reach_the_server_but_never_the_guest(
        attach: Callable[..., Egress], egress_sandbox: Sandbox, server: _Server,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMEX_TEST_API_TOKEN", "s3cr3t-token-value")
    names = Names({"api.test": ["127.0.0.1"], "other.test": ["127.0.0.1"]})
    eg = attach({
        "rules": [{"name": "api", "action": "allow", "host": ["api.test", "other.test"],
                   "ip": "127.0.0.1"}],
        "secrets": [
            {"name": "api-token", "host": "api.test", "scheme": "http", "path": "/echo",
             "header": "Authorization", "format": "Bearer {value}",
             "env": "MEMEX_TEST_API_TOKEN"},
            {"name": "api-key", "host": "api.test", "scheme": "http", "path": ["/json", "/slow"],
             "query": "key", "env": "MEMEX_TEST_API_TOKEN"}]}, resolver=names)
    mark = eg.mark()
    out = guest(egress_sandbox, f"""
import os
r = net.fetch('http://api.test:{server.port}/echo', headers={{'Authorization': 'mine'}})
(r.json()['headers']['authorization'], 's3cr3t' in r.text,
 any('s3cr3t' in v for v in os.environ.values()))
""")
    assert out == ("Bearer [REDACTED]", False, False)
    assert server.seen[-1]["headers"]["authorization"] == "Bearer s3cr3t-token-value"
    guest(egress_sandbox, f"net.fetch('http://api.test:{server.port}/json?a=1').status")
    assert server.seen[-1]["path"] == "/json?a=1&key=s3cr3t-token-value"
    # a redirect to another host does not carry the secret
    hop = f"http://other.test:{server.port}/echo"
    out = guest(egress_sandbox, f"net.fetch('http://api.test:{server.port}/redirect?to={hop}')"
                                ".json()['headers'].get('authorization', 'absent')")
    assert out == "absent"
    # a failure message (here a timeout) names the URL without the secret
    out = guest(egress_sandbox, fetch_cell(f"http://api.test:{server.port}/slow?s=1",
                                           timeout=0.2))
    assert out[1] == "EgressTimeout" and "key=[REDACTED]" in out[4], out
    recs = eg.since(mark)
    assert [r.secrets for r in recs] == [("api-token",), ("api-key",), (), (), ("api-key",)]
    assert recs[1].url.endswith("/json?a=1&key=[REDACTED]")
    assert all("s3cr3t" not in r.to_json() for r in recs)


def test_missing_secret_refuses_the_request(attach: Callable[..., Egress],
                                            egress_sandbox: Sandbox, server: _Server,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MEMEX_TEST_ABSENT", raising=False)
    before = len(server.seen)
    attach({"rules": [{"action": "allow", "ip": "127.0.0.1"}],
            "secrets": [{"name": "gone", "host": "127.0.0.1", "scheme": "http",
                         "header": "X-Key", "env": "MEMEX_TEST_ABSENT"}]})
    out = guest(egress_sandbox, fetch_cell(server.url()))
    assert out[1] == "EgressDenied" and "MEMEX_TEST_ABSENT is not set" in out[4], out
    assert len(server.seen) == before


# ---- TLS ----------------------------------------------------------------------------------------
def test_https_connects_to_the_checked_address_with_the_name_as_sni(
        attach: Callable[..., Egress], egress_sandbox: Sandbox, tls_server: _Server,
        client_tls: ssl.SSLContext, loopback_only: list[str]) -> None:
    names = Names({"secure.test": ["127.0.0.1"]})
    attach({"rules": [{"action": "allow", "host": "secure.test", "ip": "127.0.0.1",
                       "scheme": "https"}]}, resolver=names, ssl_context=client_tls)
    url = tls_server.url("/echo", host="secure.test", scheme="https")
    out = guest(egress_sandbox, f"""
r = net.fetch({url!r})
u = json.load(urllib.request.urlopen({url!r}))
c = http.client.HTTPSConnection('secure.test', {tls_server.port})
c.request('GET', '/json')
(r.status, r.json()['headers']['host'], u['path'], c.getresponse().read())
""")
    assert out == (200, f"secure.test:{tls_server.port}", "/echo", b'{"hello": "world"}')
    assert tls_server.sni[-3:] == ["secure.test"] * 3
    assert set(loopback_only) == {"127.0.0.1"}


def test_https_certificate_must_match_the_name(
        attach: Callable[..., Egress], egress_sandbox: Sandbox, tls_server: _Server,
        client_tls: ssl.SSLContext) -> None:
    names = Names({"wrong.test": ["127.0.0.1"]})
    attach({"rules": [{"action": "allow", "ip": "127.0.0.1"}]}, resolver=names,
           ssl_context=client_tls)
    for host in ("wrong.test", "127.0.0.1"):
        out = guest(egress_sandbox,
                    fetch_cell(tls_server.url("/", host=host, scheme="https")))
        assert out[1:3] == ("EgressConnectionError", "tls"), out


def test_a_failing_resolver_is_a_dns_error(attach: Callable[..., Egress],
                                           egress_sandbox: Sandbox) -> None:
    def broken(host: str, port: int) -> list[str]:
        return {"other": ["127.0.0.1"]}[host]

    eg = attach({"rules": [{"action": "allow", "host": "*"}]}, resolver=broken)
    out = guest(egress_sandbox, fetch_cell("http://nowhere.test/"))
    assert out[1:3] == ("EgressConnectionError", "dns") and "nowhere.test" in out[4], out
    assert eg.records[-1].outcome == "dns"
