"""A tenant's egress policy is served by the service itself: its guests reach what the policy
allows, are denied the rest, cannot route around it with a client-side ``net.fetch``, and
every decision is in the audit log. A tenant without a policy has no network on the server.
A real HTTP target and a real `memex serve` on 127.0.0.1."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from served import start_server

from memex import ConfigError, Door
from memex.backends import get_backend
from memex.service import load_config

POLICY = """\
[[rules]]
name = "local"
action = "allow"
ip = "127.0.0.1"
path = "/ok"
"""


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def target() -> Iterator[int]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.01},
                     daemon=True)
    t.start()
    yield int(srv.server_address[1])
    srv.shutdown()
    srv.server_close()


FETCH = ("import json, urllib.request, urllib.error\n"
         "def get(u):\n"
         "    try:\n        return json.load(urllib.request.urlopen(u))['path']\n"
         "    except urllib.error.URLError as e:\n        return type(e).__name__\n")


@pytest.mark.slow
def test_the_tenants_policy_decides_and_is_audited(tmp_path: Path, target: int) -> None:
    (tmp_path / "policy.toml").write_text(POLICY)
    served = start_server(tmp_path, {"net": 'egress = "policy.toml"', "none": ""})
    try:
        ok, denied = f"http://127.0.0.1:{target}/ok", f"http://127.0.0.1:{target}/secret"
        with get_backend("remote", url=served.url, api_key=served.keys["net"]) as b:
            sb = b.open()
            sb.run(FETCH)
            assert sb.run(f"get({ok!r}), get({denied!r})").value == "('/ok', 'EgressDenied')"
            # a client-side net.fetch cannot stand in for the operator's policy
            door = Door()
            door.register("net.fetch", lambda *a, **k: {"status": 200, "body": b"forged"})
            sb2 = b.open(door=door)
            sb2.run(FETCH)
            assert sb2.run(f"get({denied!r})").value == "'EgressDenied'"
            child = sb.fork()  # a fork shares its parent's door, hence its policy
            assert child.run(f"get({ok!r})").value == "'/ok'"
        with get_backend("remote", url=served.url, api_key=served.keys["none"]) as b:
            sb = b.open()
            sb.run(FETCH)
            assert sb.run(f"get({ok!r})").value == "'EgressDenied'"  # no policy: no network
        log = [json.loads(x) for x in served.log.read_text().splitlines() if x.startswith("{")]
        egress = [x for x in log if x.get("event") == "egress"]
        assert [(x["decision"], x["url"].rsplit("/", 1)[1]) for x in egress] == [
            ("allow", "ok"), ("deny", "secret"), ("deny", "secret"), ("allow", "ok")]
        assert all(x["tenant"] == "net" for x in egress)
    finally:
        served.stop()


def test_a_bad_policy_is_a_config_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text("[[rules]]\naction = 'maybe'\n")
    (tmp_path / "serve.toml").write_text("[tenants.t]\nkeys = []\negress = 'bad.toml'\n")
    with pytest.raises(ConfigError, match=r"\[tenants.t\] egress"):
        load_config(tmp_path / "serve.toml")
    (tmp_path / "serve.toml").write_text("[tenants.t]\nkeys = []\negress = 'missing.toml'\n")
    with pytest.raises(ConfigError, match=r"missing\.toml"):
        load_config(tmp_path / "serve.toml")
