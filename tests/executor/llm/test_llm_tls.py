"""HTTPS clients share one TLS context per process and keep httpx's trust: LLMClient (its
sync client and the client each async call opens), RemoteBackend's HTTP client and a package
index each used to load the machine's CA certificates again (about 20 ms of CPU a client; an
async completion paid it on every call). Run in a fresh Python process each, so that the
process's context is made under the environment the test gives it, against a real TLS
server on 127.0.0.1 with a certificate made here."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from certs import self_signed

REPLY = {"id": "c1", "object": "chat.completion", "created": 0, "model": "m",
         "choices": [{"index": 0, "finish_reason": "stop",
                      "message": {"role": "assistant", "content": "over TLS"}}],
         "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}

SCRIPT = """
import asyncio, json, sys
import httpcore2
made = []
real = httpcore2.default_ssl_context
def counted(*a, **k):
    made.append(1)
    return real(*a, **k)
httpcore2.default_ssl_context = counted  # what every httpx client with verify=True calls

from memex.backends.internal import Client
from memex.errors import LLMConnectionError
from memex.executor.llm import LLMClient

url = sys.argv[1]
out = {}
try:
    with LLMClient(model="m", base_url=url + "/v1", api_key="k", max_retries=0) as llm:
        out["sync"] = llm.complete([{"role": "user", "content": "hi"}]).content
        async def twice():
            return [(await llm.acomplete([{"role": "user", "content": "hi"}])).content
                    for _ in range(2)]
        out["async"] = asyncio.run(twice())
except LLMConnectionError as exc:
    out["error"] = str(exc)
for _ in range(3):
    Client(url, "k").close()
out["contexts_made"] = len(made)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(an https:// URL on 127.0.0.1 answering chat completions, its certificate)."""
    cert, key = self_signed(tmp_path_factory.mktemp("tls"), "/CN=127.0.0.1", "IP:127.0.0.1")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = json.dumps(REPLY).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"https://127.0.0.1:{srv.server_address[1]}", cert
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(timeout=5)


def run(url: str, **env: str) -> dict[str, Any]:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("SSL_CERT_FILE", "SSL_CERT_DIR", "OPENAI_BASE_URL")}
    r = subprocess.run([sys.executable, "-c", SCRIPT, url], capture_output=True, text=True,
                       timeout=120, env={**clean, **env})
    assert r.returncode == 0, r.stderr
    out: dict[str, Any] = json.loads(r.stdout)
    return out


def test_http_clients_share_one_tls_context_and_keep_httpx_trust(
        tls: tuple[str, Path]) -> None:
    url, cert = tls
    trusted = run(url, SSL_CERT_FILE=str(cert))  # httpx's trust reads SSL_CERT_FILE
    assert trusted.get("sync") == "over TLS" and trusted.get("async") == ["over TLS"] * 2, \
        trusted
    # one context for the sync client, two async calls and three service clients (each
    # made its own before: 6)
    assert trusted["contexts_made"] == 1, trusted
    # the positive control: the certificate is checked (the shared context verifies)
    untrusted = run(url)
    assert "error" in untrusted and "CERTIFICATE_VERIFY_FAILED" in untrusted["error"], \
        untrusted
