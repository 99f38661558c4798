"""``memex policy check|test`` and ``memex run --policy``, run as real subprocesses; the run
reaches a real HTTP server on 127.0.0.1 (the only address any of these tests contacts)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from memex.serving import default_running_turns

POLICY = """\
[limits]
max_response_bytes = "1M"

[[rules]]
name = "local"
action = "allow"
ip = "127.0.0.1"

[[rules]]
name = "github"
action = "allow"
scheme = "https"
host = "api.github.com"
method = "GET"

[[rules]]
name = "no-admin"
action = "deny"
path = "/admin"

[[secrets]]
name = "gh-token"
host = "api.github.com"
header = "Authorization"
format = "Bearer {value}"
env = "GITHUB_TOKEN"
"""

CASES = """\
cases:
  - name: local server
    url: http://127.0.0.1:8080/data
    expect: allow
    rule: local
  - url: https://api.github.com/repos/x
    expect: allow
    rule: github
  - url: https://api.github.com/repos/x
    method: POST
    expect: deny
  - url: https://api.github.com/
    addresses: [10.0.0.8]
    expect: deny
    code: special
  - url: http://169.254.169.254/latest/meta-data/
    expect: deny
    reason: metadata
  - url: http://127.0.0.1/admin
    expect: deny
    rule: no-admin
"""


def memex(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memex", *args], capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "policy.toml").write_text(POLICY)
    (tmp_path / "cases.yaml").write_text(CASES)
    return tmp_path


@pytest.mark.slow
def test_check_prints_decision_rule_and_reason(files: Path) -> None:
    p = memex("policy", "check", str(files / "policy.toml"), "http://2130706433:8080/x")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == "allow  GET http://127.0.0.1:8080/x"
    assert lines[1] == f"rule:      local ({files / 'policy.toml'}:4)"
    assert lines[2].startswith("reason:    allowed by rule 'local'")
    p = memex("policy", "check", str(files / "policy.toml"), "https://api.github.com/x",
              "-X", "DELETE")
    assert p.returncode == 1 and p.stdout.startswith("deny  DELETE https://api.github.com/x")
    assert "by name alone; rule 'local'" in p.stdout  # only the ip rule could, after DNS
    p = memex("policy", "check", str(files / "policy.toml"), "ftp://example.com/")
    assert p.returncode == 1 and "scheme 'ftp' is not supported" in p.stdout
    p = memex("policy", "check", "--json", str(files / "policy.toml"),
              "https://api.github.com/repos", "--address", "140.82.112.5")
    d = json.loads(p.stdout)
    assert p.returncode == 0 and d["rule"] == "github" and d["resolved"] is True
    assert d["secrets"] == ["gh-token"] and d["addresses"] == ["140.82.112.5"]


def test_test_runs_a_table_and_fails_on_a_mismatch(files: Path) -> None:
    p = memex("policy", "test", str(files / "policy.toml"), str(files / "cases.yaml"))
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.splitlines()[-1] == "6 passed, 0 failed"
    assert "ok    allow local server: GET http://127.0.0.1:8080/data  [rule local]" in p.stdout
    (files / "cases.yaml").write_text(CASES.replace("expect: deny\n    rule: no-admin",
                                                    "expect: allow"))
    p = memex("policy", "test", "-q", str(files / "policy.toml"), str(files / "cases.yaml"))
    assert p.returncode == 1
    assert p.stdout.splitlines() == [
        f"FAIL  GET http://127.0.0.1/admin  ({files / 'cases.yaml'}:19)",
        "      expected allow, got deny",
        "      reason: denied by rule 'no-admin' "
        f"({files / 'policy.toml'}:16)",
        "5 passed, 1 failed"]


def test_bad_files_exit_2_with_file_line_and_reason(files: Path) -> None:
    bad = files / "bad.toml"
    bad.write_text('[[rules]]\naction = "allow"\nip = "10.0.0.0/33"\n')
    p = memex("policy", "check", str(bad), "http://x/")
    assert p.returncode == 2 and p.stdout == ""
    assert f"{bad}:3: rules[0].ip: '10.0.0.0/33' is not a valid CIDR" in p.stderr
    (files / "cases.yaml").write_text("cases:\n  - url: http://x/\n    expct: allow\n")
    p = memex("policy", "test", str(files / "policy.toml"), str(files / "cases.yaml"))
    assert p.returncode == 2
    assert f"{files / 'cases.yaml'}:3: cases[0].expct: unknown key 'expct' in a case; did " \
        "you mean 'expect'?" in p.stderr
    assert f"{files / 'cases.yaml'}:2: cases[0]: expect must be" in p.stderr
    p = memex("run", "--policy", str(bad), "-c", "print(1)")
    assert p.returncode == 2 and f"{bad}:3:" in p.stderr


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.01},
                     daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    t.join(timeout=5)


@pytest.mark.slow
def test_run_with_policy_prints_the_audit(files: Path, server: ThreadingHTTPServer) -> None:
    port = server.server_address[1]
    code = ("import json, urllib.request\n"
            f"print(json.load(urllib.request.urlopen('http://127.0.0.1:{port}/hi'))['path'])\n"
            "try:\n    urllib.request.urlopen('http://10.0.0.1/')\n"
            "except urllib.error.URLError as e:\n    print(type(e).__name__)\n")
    p = memex("run", "--policy", str(files / "policy.toml"), "-c", code)
    assert p.returncode == 0, p.stderr
    assert p.stdout == "/hi\nEgressDenied\n"
    err = p.stderr.splitlines()
    assert err[0] == "memex: egress audit: 2 requests"
    assert err[1].startswith(f"  allow ok       200 GET http://127.0.0.1:{port}/hi  ")
    assert err[1].endswith(", rule local")
    assert err[2].startswith("  deny  denied     - GET http://10.0.0.1/  ")
    assert "10.0.0.1 is a private address" in err[3]
    p = memex("run", "--json", "--policy", str(files / "policy.toml"), "-c", code)
    d = json.loads(p.stdout)
    assert d["status"] == "ok" and [e["decision"] for e in d["egress"]] == ["allow", "deny"]
    assert d["egress"][0]["status"] == 200 and d["egress"][0]["sandbox"] == "memex-run"


def test_run_without_policy_has_no_network(server: ThreadingHTTPServer) -> None:
    port = server.server_address[1]
    p = memex("run", "-c", f"import urllib.request\nurllib.request.urlopen("
                           f"'http://127.0.0.1:{port}/')")
    assert p.returncode == 1
    assert f"EgressDenied: egress denied: GET http://127.0.0.1:{port}/: network access is " \
        "disabled in this sandbox: no egress policy" in p.stderr


def test_the_shipped_example_policy_passes_its_cases() -> None:
    root = Path(__file__).resolve().parents[2] / "examples"
    p = memex("policy", "test", "-q", str(root / "egress_policy.toml"),
              str(root / "egress_cases.yaml"))
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.splitlines()[-1].endswith("passed, 0 failed")


# ---- a whole policy file: serve.toml, the MCP config ------------------------------------------
H = {c: "sha256:" + c * 64 for c in "abc"}


def _serve_toml(tmp_path: Path, extra: str = "") -> Path:
    (tmp_path / "egress.toml").write_text(POLICY)
    (tmp_path / "data").mkdir(exist_ok=True)
    f = tmp_path / "serve.toml"
    f.write_text(f"""\
[server]
backend = "pool"
{extra}
[tenants.a]
keys = ["{H['a']}"]
max_memory = "2G"
turns_per_second = 5
max_running = 2
ceiling = {{ memory = "512M", timeout = "2min" }}
egress = "egress.toml"
packages = ["humanize"]
[[tenants.a.mounts]]
host = "data"
[tenants.b]
keys = ["{H['b']}"]
max_sessions = 4
""")
    return f


def test_check_explains_a_serve_config_per_tenant(tmp_path: Path) -> None:
    f = _serve_toml(tmp_path)
    r = memex("policy", "check", str(f), "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert report["kind"] == "serve" and report["problems"] == []
    a, b = report["principals"]
    assert (a["name"], b["name"]) == ("a", "b")
    assert a["limits"]["memory"] == "512M" and a["limits"]["timeout"] == "30 s"  # lowered
    assert b["limits"]["memory"] == "1G"  # positive control: no ceiling, the default
    assert a["ceiling"] == {"timeout": "120 s", "memory": "512M"} and b["ceiling"] == {}
    assert a["quotas"]["turns_per_second"] == "5"
    slots = default_running_turns()  # the server's running turns: [server] sets none
    assert a["quotas"]["max_running"] == f"at most 2, within a fair share of running_turns {slots}"
    assert b["quotas"]["max_running"] == f"a fair share of running_turns {slots} (all of them " \
        "alone)"
    assert b["quotas"]["max_sessions"] == "4" and b["quotas"]["turns_per_second"] == "none"
    assert a["grants"]["packages"] == "humanize" and b["grants"]["packages"] == "none"
    assert "egress.toml (3 rule(s))" in a["grants"]["egress"] and b["grants"]["egress"] == "none"
    assert a["grants"]["mounts"].endswith("data (ro)") and b["grants"]["mounts"] == "none"
    text = memex("policy", "check", str(f)).stdout
    assert "tenant a: 1 key(s)" in text and "ok: every setting is enforced" in text


def test_check_exits_1_on_a_problem_and_2_on_an_invalid_file(tmp_path: Path) -> None:
    f = _serve_toml(tmp_path, "max_sandboxes = 4")
    r = memex("policy", "check", str(f))
    assert r.returncode == 1 and "problem: tenant a: max_sessions 8 lets it hold every " \
        "sandbox of the pool (4)" in r.stdout, r.stdout
    f = _serve_toml(tmp_path, "warm = 2")  # warm sandboxes on the pool: fine
    assert memex("policy", "check", str(f)).returncode == 0
    f.write_text(f.read_text().replace('backend = "pool"', 'backend = "subprocess"'))
    r = memex("policy", "check", str(f))  # warm on a backend without warm sandboxes
    assert r.returncode == 2 and "[server] warm: backend 'subprocess' does not use it" \
        in r.stderr, r.stderr


def test_check_decides_a_url_with_a_principals_egress_policy(tmp_path: Path) -> None:
    f = _serve_toml(tmp_path)
    r = memex("policy", "check", str(f), "https://api.github.com/repos/x", "--principal", "a")
    assert r.returncode == 0 and "rule:      github" in r.stdout, r.stdout
    r = memex("policy", "check", str(f), "https://api.github.com/repos/x", "--principal", "b")
    assert r.returncode == 1 and "principal 'b' has no egress policy" in r.stdout
    r = memex("policy", "check", str(f), "https://api.github.com/", "--principal", "z")
    assert r.returncode == 2 and "one of the config's tenants (a, b)" in r.stderr


def _mcp_toml(tmp_path: Path, principal: str = "") -> Path:
    f = tmp_path / "mcp.toml"
    f.write_text(f"""\
transport = "http"
[sessions]
total_sessions = 8
max_sessions_per_token = 2
[http]
token_env = "SOME_TOKENS"
[principals.ci]
keys = ["{H['c']}"]
max_sessions = 3
max_running = 1
turns_per_second = 2
ceiling = {{ memory = "256M" }}
{principal}
""")
    return f


def test_check_explains_an_mcp_config_per_principal(tmp_path: Path) -> None:
    r = memex("policy", "check", str(_mcp_toml(tmp_path)), "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    ci, rest = report["principals"]
    assert report["kind"] == "mcp" and ci["name"] == "ci" and "$SOME_TOKENS" in rest["keys"]
    assert ci["limits"]["memory"] == "256M" and rest["limits"]["memory"] == "1G"
    assert (ci["quotas"]["max_sessions"], rest["quotas"]["max_sessions"]) == ("3", "2")
    assert (ci["quotas"]["max_running"], ci["quotas"]["turns_per_second"]) == ("at most 1", "2")
    assert rest["quotas"]["turns_per_second"] == "none"


def test_an_mcp_principal_table_that_sets_a_grant_is_refused(tmp_path: Path) -> None:
    r = memex("policy", "check", str(_mcp_toml(tmp_path, 'egress = "egress.toml"')))
    assert r.returncode == 2 and "principals.ci: egress: memex mcp grants mounts, packages, " \
        "egress and tools to every principal alike" in r.stderr, r.stderr
    f = _mcp_toml(tmp_path)
    f.write_text(f.read_text().replace("total_sessions", "max_sessions"))
    r = memex("policy", "check", str(f))
    assert r.returncode == 2 and "max_sessions is now total_sessions" in r.stderr, r.stderr


def test_mcp_refuses_the_old_flag_rather_than_take_it_for_another() -> None:
    """argparse would read ``--max-sessions`` as an abbreviation of
    ``--max-sessions-per-token``: it is named, and refused with its new name."""
    r = memex("mcp", "--max-sessions", "3")
    assert r.returncode == 2 and "--max-sessions is now --total-sessions" in r.stderr, r.stderr
