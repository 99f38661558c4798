"""Network egress through the host under a policy (docs/egress.md), end to end on one machine.

Starts a small HTTP server on 127.0.0.1 (the only address this example contacts), gives a
sandbox a policy that allows it, runs ordinary ``urllib`` / ``fetch`` code in the guest, and
prints the host's audit. The made-up name ``api.internal.test`` is resolved by an injected
resolver, as a test would; the host adds a credential the guest never sees.

    python examples/egress_demo.py
"""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from memex import Limits, Sandbox
from memex.host_tools import Egress, EgressPolicy


class Api(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"path": self.path,
                           "authorized": self.headers.get("Authorization") is not None}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


GUEST = """
import json, urllib.request, urllib.error
from memex_guest.net import fetch, EgressDenied

print("urlopen:", json.load(urllib.request.urlopen("http://127.0.0.1:{port}/items?limit=2")))
r = fetch("http://api.internal.test:{port}/me")
print("fetch:  ", r.status, r.json())

for url in ("http://169.254.169.254/latest/meta-data/",   # cloud metadata
            "http://2130706433:22/",                        # loopback, another port
            "https://example.com/"):                        # not in the policy
    try:
        urllib.request.urlopen(url)
    except urllib.error.URLError as e:                      # EgressDenied is a URLError
        print("denied: ", type(e).__name__, "-", e.details.get("reason"))
"""


def main() -> None:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    port = srv.server_address[1]
    os.environ.setdefault("DEMO_API_TOKEN", "demo-token-123")
    policy = EgressPolicy.from_dict({
        "limits": {"timeout": "5s", "requests_per_turn": 20},
        "rules": [{"name": "local-api", "action": "allow", "ip": "127.0.0.1", "port": port,
                   "host": ["127.0.0.1", "api.internal.test"]}],
        "secrets": [{"name": "api-token", "host": "api.internal.test", "scheme": "http",
                     "header": "Authorization", "format": "Bearer {value}",
                     "env": "DEMO_API_TOKEN"}],
    })
    names = {"api.internal.test": ["127.0.0.1"]}
    egress = Egress(policy, resolver=lambda host, port: names[host], label="demo")
    with Sandbox(limits=Limits(timeout=10)) as sb:
        egress.attach(sb)
        mark = egress.mark()
        r = sb.run(GUEST.replace("{port}", str(port)))
        print(r.stdout, end="")
        if r.exception:
            print(r.exception.traceback)
    print("\naudit of the turn:")
    for rec in egress.since(mark):
        print(f"  {rec.decision:5} {rec.outcome:7} {rec.method} {rec.url}  rule={rec.rule} "
              f"secrets={list(rec.secrets)} {rec.response_bytes} B in")
    srv.shutdown()


if __name__ == "__main__":
    main()
