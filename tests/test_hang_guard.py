"""The suite's hang guard (pyproject's ``timeout``, pytest-timeout): a hung test ends the run
with every thread's stack printed instead of holding CI to its limit. Checked on this suite's
own configuration, and on a real hang in C, where a signal's handler would never run."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_the_suite_runs_under_the_hang_guard(pytestconfig: pytest.Config) -> None:
    assert pytestconfig.pluginmanager.hasplugin("timeout")
    assert float(pytestconfig.getini("timeout")) == 600
    assert pytestconfig.getini("timeout_method") == "thread"


def test_a_test_hung_in_c_ends_the_run_with_its_stack(tmp_path: Path) -> None:
    """A test blocked in a C wait (a lock's acquire: no bytecode runs, so no signal handler
    could) is ended by the guard with this project's settings (its ini, a 1 s timeout
    instead of 600), its stack printed; the control: the test before it passed."""
    (tmp_path / "test_hangs.py").write_text(textwrap.dedent("""
        import threading

        def test_a_first_that_passes():
            pass

        def test_b_hangs_in_c():
            lock = threading.Lock()
            lock.acquire()
            lock.acquire()  # forever, in C
    """))
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-c",
         str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path), "--timeout=1",
         str(tmp_path / "test_hangs.py")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path)
    out = run.stdout + run.stderr
    assert run.returncode != 0, out
    assert "test_a_first_that_passes PASSED" in out
    assert "Timeout" in out and "test_b_hangs_in_c" in out
    assert "lock.acquire()  # forever, in C" in out  # the hung thread's stack
