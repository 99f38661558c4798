"""The guest's view of egress: ordinary ``urllib.request`` / ``http.client`` code and the
explicit ``fetch`` reach a real server on 127.0.0.1 through the host; without egress every
path fails with a clear ``EgressDenied``; the host keeps an audit of every attempt."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import test_egress_support as support
from test_egress_support import _Server, guest, local_policy

from memex import Sandbox
from memex.host_tools import Egress, EgressRecord

# the support module's fixtures, used here by name
attach = support.attach
egress_sandbox = support.egress_sandbox
loopback_only = support.loopback_only
server = support.server

NO_EGRESS_CELLS = {
    "urlopen": "attempt(lambda: urllib.request.urlopen({url!r}).read())",
    "fetch": "attempt(lambda: net.fetch({url!r}).status)",
    "http.client": "attempt(lambda: (lambda c: (c.request('GET', '/'), "
                   "c.getresponse().status))(http.client.HTTPConnection('127.0.0.1', {port})))",
    "https": "attempt(lambda: urllib.request.urlopen('https://example.com/').read())",
}


@pytest.mark.parametrize("case", sorted(NO_EGRESS_CELLS))
def test_without_egress_every_path_is_denied_clearly(
        egress_sandbox: Sandbox, server: _Server, case: str) -> None:
    before = len(server.seen)
    out = guest(egress_sandbox, NO_EGRESS_CELLS[case].format(url=server.url("/x"),
                                                              port=server.port))
    assert out[:3] == ("error", "EgressDenied", "no_policy"), out
    assert "no egress policy is attached" in out[4], out
    assert len(server.seen) == before


def test_denial_is_caught_by_ordinary_handlers(egress_sandbox: Sandbox, server: _Server) -> None:
    out = guest(egress_sandbox, f"""
caught = []
for kind in (urllib.error.URLError, OSError, PermissionError, net.EgressDenied, net.EgressError):
    try:
        urllib.request.urlopen({server.url()!r})
    except kind as e:
        caught.append((kind.__name__, isinstance(e.reason, str), 'disabled' in str(e)))
caught
""")
    assert [c[0] for c in out] == ["URLError", "OSError", "PermissionError", "EgressDenied",
                                   "EgressError"]
    assert all(c[1] and c[2] for c in out), out


def test_urlopen_json_and_request_objects(attach: Callable[..., Egress],
                                          egress_sandbox: Sandbox, server: _Server) -> None:
    eg = attach(local_policy(server.port))
    mark = eg.mark()
    out = guest(egress_sandbox, f"""
r1 = json.load(urllib.request.urlopen({server.url('/json')!r}))
req = urllib.request.Request({server.url('/echo?a=1')!r}, data=b'{{"k": 2}}', method='PUT',
                             headers={{'Content-Type': 'application/json', 'X-Mine': 'v'}})
with urllib.request.urlopen(req, timeout=5) as resp:
    echo = json.load(resp)
    meta = (resp.status, resp.headers['X-Echo'], resp.headers.get_content_charset(), resp.url)
(r1, echo['method'], echo['path'], echo['body'], echo['headers']['x-mine'],
 echo['headers']['content-type'], meta)
""")
    assert out[0] == {"hello": "world"}
    assert out[1:6] == ("PUT", "/echo?a=1", '{"k": 2}', "v", "application/json")
    assert out[6] == (200, "1", "utf-8", server.url("/echo?a=1"))
    recs = eg.since(mark)
    assert [(r.method, r.outcome, r.status, r.rule, r.decision) for r in recs] == [
        ("GET", "ok", 200, "local", "allow"), ("PUT", "ok", 200, "local", "allow")]
    put = recs[1]
    assert put.request_bytes == len(b'{"k": 2}') and put.response_bytes > 0
    assert put.url == server.url("/echo?a=1") and put.address == "127.0.0.1"
    assert put.via == "http.client" and put.sandbox == eg.label
    assert put.turn == egress_sandbox.turns and put.duration > 0
    assert eg.turn_records() == recs


def test_urllib_http_errors_and_headers(attach: Callable[..., Egress],
                                        egress_sandbox: Sandbox, server: _Server) -> None:
    attach(local_policy(server.port))
    out = guest(egress_sandbox, f"""
try:
    urllib.request.urlopen({server.url('/status?code=404')!r})
except urllib.error.HTTPError as e:
    res = (e.code, e.read(), e.headers['Content-Type'])
res
""")
    assert out == (404, b"status body", "text/plain")


def test_http_client_connection_reuse_head_and_chunked_body(
        attach: Callable[..., Egress], egress_sandbox: Sandbox, server: _Server) -> None:
    eg = attach(local_policy(server.port))
    mark = eg.mark()
    out = guest(egress_sandbox, f"""
c = http.client.HTTPConnection('127.0.0.1', {server.port}, timeout=5)
c.request('GET', '/json')
a = c.getresponse(); a_body = a.read()
c.request('POST', '/echo', body=iter([b'ab', b'cd']), headers={{'Transfer-Encoding': 'chunked'}},
          encode_chunked=True)
b = json.loads(c.getresponse().read())
c.request('HEAD', '/bytes?n=123')
h = c.getresponse()
head = (h.status, h.getheader('Content-Length'), h.read())
c.close()
(a.status, a_body, b['method'], b['body'], head)
""")
    assert out == (200, b'{"hello": "world"}', "POST", "abcd", (200, "123", b""))
    assert [r.method for r in eg.since(mark)] == ["GET", "POST", "HEAD"]


def test_fetch_returns_a_typed_response(attach: Callable[..., Egress],
                                        egress_sandbox: Sandbox, server: _Server) -> None:
    attach(local_policy(server.port))
    out = guest(egress_sandbox, f"""
r = net.fetch({server.url('/echo')!r}, method='post', headers={{'X-A': '1'}}, json={{'n': [1, 2]}})
e = r.json()
miss = net.fetch({server.url('/status?code=500')!r})
try:
    miss.raise_for_status()
    raised = None
except urllib.error.HTTPError as exc:
    raised = exc.code
(type(r).__name__, r.status, r.reason, r.ok, r.url, r.redirects, r.headers['x-echo'],
 'X-Echo' in r.headers, r.encoding, e['method'], e['body'], e['headers']['content-type'],
 r.text == r.body.decode(), miss.status, miss.ok, miss.text, raised)
""")
    assert out == ("Response", 200, "OK", True, server.url("/echo"), (), "1", True, "utf-8",
                   "POST", '{"n": [1, 2]}', "application/json", True, 500, False,
                   "status body", 500)


def test_fetch_argument_errors_are_raised_in_the_guest(
        attach: Callable[..., Egress], egress_sandbox: Sandbox, server: _Server) -> None:
    attach(local_policy(server.port))
    out = guest(egress_sandbox, f"""
u = {server.url()!r}
[attempt(lambda: net.fetch(b'http://x/'))[1], attempt(lambda: net.fetch(u, body=1))[1],
 attempt(lambda: net.fetch(u, body=b'x', json=1))[1],
 attempt(lambda: net.fetch(u, headers={{1: 'x'}}))[1]]
""")
    assert out == ["TypeError"] * 4


def test_invalid_request_maps_are_refused_and_audited(
        attach: Callable[..., Egress], egress_sandbox: Sandbox) -> None:
    eg = attach(None)
    mark = eg.mark()
    out = guest(egress_sandbox, """
from memex_guest import door
res = []
for bad in ("not a map", {"url": 1}, {"url": "http://x/", "headers": [["a b", "c"]]},
            {"url": "http://x/", "headers": [["a", "c\\r\\nX: y"]]},
            {"url": "http://x/", "body": "text"}, {"url": "http://x/", "timeout": -1}):
    try:
        door.call('net.fetch', bad)
    except door.DoorError as e:
        res.append((e.kind, e.error.get('egress')))
res
""")
    assert out == [("invalid_request", True)] * 6
    assert [r.outcome for r in eg.since(mark)] == ["invalid_request"] * 6


def test_audit_records_export_as_jsonl(attach: Callable[..., Egress], egress_sandbox: Sandbox,
                                       server: _Server, tmp_path: Path) -> None:
    seen: list[EgressRecord] = []
    eg = attach(local_policy(server.port), label="rollout-7", on_record=seen.append)
    guest(egress_sandbox, f"attempt(lambda: net.fetch({server.url('/json')!r}).status)")
    guest(egress_sandbox, "attempt(lambda: net.fetch('http://10.0.0.1/'))")
    path = tmp_path / "audit.jsonl"
    assert eg.export_jsonl(path) == 2
    assert eg.export_jsonl(path, eg.records[:1]) == 1  # appends
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["decision"] for r in rows] == ["allow", "deny", "allow"]
    first, denied = rows[0], rows[1]
    assert set(first) >= {"time", "sandbox", "turn", "method", "url", "decision", "rule",
                          "reason", "request_bytes", "response_bytes", "duration", "status"}
    assert first["sandbox"] == "rollout-7" and first["time"].endswith("Z")
    assert denied["outcome"] == "denied" and "private" in denied["reason"]
    assert seen == list(eg.records)
    buf = io.StringIO()
    eg.export_jsonl(buf)
    assert buf.getvalue().count("\n") == 2


def test_detach_is_idempotent_and_restores_the_no_egress_error(
        attach: Callable[..., Egress], egress_sandbox: Sandbox, server: _Server) -> None:
    eg = attach(local_policy(server.port))
    assert guest(egress_sandbox, f"net.fetch({server.url()!r}).status") == 200
    eg.detach()
    eg.detach()
    out = guest(egress_sandbox, f"attempt(lambda: net.fetch({server.url()!r}))")
    assert out[:3] == ("error", "EgressDenied", "no_policy")
    assert len(eg.records) == 1


def test_egress_takes_a_policy_file_or_mapping(tmp_path: Path, server: _Server) -> None:
    p = tmp_path / "p.toml"
    p.write_text('[[rules]]\nname = "local"\naction = "allow"\nip = "127.0.0.1"\n')
    for policy in (p, str(p), local_policy()):
        eg = Egress(policy)
        assert eg.check(server.url()).allowed
    assert not Egress().check(server.url()).allowed
    with pytest.raises(ValueError):
        Egress(42)  # type: ignore[arg-type]


def test_response_caps_must_fit_the_door(server: _Server) -> None:
    from memex import Door

    small = Door(max_reply_bytes=4 << 20)
    Egress(local_policy(max_response_bytes="2M")).register(small)
    with pytest.raises(ValueError, match="capped at 4194304 bytes"):
        Egress(local_policy(max_response_bytes="8M")).register(small)
    with pytest.raises(ValueError, match="responses of 67108864 bytes"):
        Egress({"rules": [{"action": "allow", "ip": "127.0.0.1",
                           "max_response_bytes": "64M"}]}).register(Door())
    eg = Egress(local_policy(max_response_bytes="1M")).register(small)
    with pytest.raises(ValueError, match="another door"):
        eg.register(Door())
