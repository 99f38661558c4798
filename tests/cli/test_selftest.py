"""``memex selftest``: the containment checks run on this machine, as a table or one JSON
record, exit 1 when a check fails (a check that cannot even run is a failed check)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from memex import Sandbox
from memex.cli._selftest import Check, _need, run_checks
from memex.runtime_wasm import engine_support


@pytest.mark.slow
def test_selftest_passes_here_as_json() -> None:
    p = subprocess.run([sys.executable, "-m", "memex", "selftest", "--json"],
                       capture_output=True, text=True, timeout=300)
    d = json.loads(p.stdout)
    assert p.returncode == 0 and d["ok"] is True, p.stdout + p.stderr
    results = {c["check"]: c["result"] for c in d["checks"]}
    assert len(results) == 10
    warned = {"host settings", "engine support window"}
    assert {r for name, r in results.items() if name not in warned} == {"pass"}
    assert results["host settings"] == ("warn" if os.geteuid() == 0 else "pass")
    assert results["engine support window"] == ("pass" if engine_support().supported
                                                 else "warn")
    assert all(c["seconds"] >= 0 and c["detail"] for c in d["checks"])


@pytest.mark.slow
def test_selftest_prints_a_table() -> None:
    p = subprocess.run([sys.executable, "-m", "memex", "selftest"], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].split()[:3] == ["check", "result", "seconds"]
    warned = (os.geteuid() == 0) + (not engine_support().supported)
    assert lines[-1] == f"10 checks: {10 - warned} passed, {warned} warned, 0 failed"


def test_a_failing_or_broken_check_is_reported_as_failed() -> None:
    def broken(_opener: Any, _work: Path) -> str:
        raise RuntimeError("cannot start")

    def escaped(opener: Any, _work: Path) -> str:
        sb = opener()
        try:
            assert sb.run("1").ok
        finally:
            sb.close()
        _need(False, "the guest read the secret")
        return "unreachable"

    rows = run_checks(Sandbox, (Check(name="broken", run=broken),
                                Check(name="escaped", run=escaped)))
    assert [(r.check, r.result) for r in rows] == [("broken", "fail"), ("escaped", "fail")]
    assert rows[0].detail == "RuntimeError: cannot start"
    assert rows[1].detail == "the guest read the secret"
