"""MemEx as a service: start `memex serve` on 127.0.0.1 with one tenant, then use it as a
backend. The guest's state lives on the service, the tool runs here, output streams as it is
written, and a quota refusal is a typed error.

    python examples/service.py

Needs the serve extra (pip install -e '.[serve]').
"""

from __future__ import annotations

import re
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from memex import Limits, ServiceError
from memex.client import RemoteBackend
from memex.host_tools import ToolHost
from memex.service import hash_key

PRICES = {"A-1": 12.5, "B-7": 3.0, "C-3": 7.25}


def price(sku: str) -> float:
    """The price of one product (a host tool: runs in this process, not on the service)."""
    return PRICES[sku]


def main() -> None:
    key = secrets.token_urlsafe(24)
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "serve.toml"
        config.write_text("[server]\nport = 0\nworkers = 1\naccess_log = false\n"
                          f'[tenants.demo]\nkeys = ["{hash_key(key)}"]\nmax_sessions = 2\n'
                          "[tenants.demo.ceiling]\nmemory = 536870912\n")
        log = Path(tmp) / "serve.log"
        with log.open("wb") as out:
            server = subprocess.Popen([sys.executable, "-m", "memex", "serve", "--config",
                                       str(config)], stdout=out, stderr=out)
        try:
            url = wait_for_url(log, server)
            print(f"memex serve is up at {url}")
            with RemoteBackend(url=url, api_key=key) as backend:
                sb = backend.open(limits=Limits(memory=256 << 20, timeout=20))
                with ToolHost([price]).attach(sb):
                    r = sb.run("basket = {'A-1': 2, 'C-3': 4}\n"
                               "for sku, n in basket.items():\n"
                               "    print(sku, n, 'x', price(sku), flush=True)\n"
                               "total = sum(price(s) * n for s, n in basket.items())\ntotal",
                               on_output=lambda stream, text: print(f"  streamed: {text}",
                                                                    end=""))
                print(f"total on the service: {r.value} (expected 54.0)")
                print(f"the session is still there: {sb.run('total * 2').value}")
                try:
                    backend.open(limits=Limits(memory=1 << 30))
                except Exception as exc:  # above the tenant's ceiling
                    print(f"refused as expected: {type(exc).__name__}: {exc}")
                backend.open(limits=Limits(memory=256 << 20))
                try:
                    backend.open(limits=Limits(memory=256 << 20))
                except ServiceError as exc:
                    print(f"third session: HTTP {exc.status} {exc.code}")
        finally:
            server.terminate()
            server.wait(60)


def wait_for_url(log: Path, server: subprocess.Popen[bytes]) -> str:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = re.search(r"serving (http://[\d.]+:\d+)", log.read_text())
        if found:
            return found.group(1)
        if server.poll() is not None:
            break
        time.sleep(0.05)
    raise SystemExit(f"memex serve did not start:\n{log.read_text()}")


if __name__ == "__main__":
    main()
