"""`memex run --with PKG`: a package for the guest from the index pip is configured with (a
package index on 127.0.0.1 here, set by PIP_INDEX_URL as a user would)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from package_index import PackageIndex, build_wheel, package_index


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PackageIndex]:
    w = tmp_path_factory.mktemp("wheels")
    build_wheel(w, "memexcli-tabular", "2.0",
                {"memexcli_tabular.py": "def table(rows):\n"
                                        "    return '\\n'.join(' | '.join(map(str, r)) "
                                        "for r in rows)\n"})
    build_wheel(w, "memexcli-native", "1.0", {"memexcli_native.py": ""},
                tag="cp315-cp315-linux_x86_64")
    with package_index(w) as idx:
        yield idx


def run(index: PackageIndex, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PIP_INDEX_URL=index.url)
    return subprocess.run([sys.executable, "-m", "memex", "run", *args], capture_output=True,
                          text=True, timeout=300, env=env)


def test_run_with_a_package_imports_it(index: PackageIndex, tmp_path: Path) -> None:
    code = "import memexcli_tabular as t\nprint(t.table([[1, 2], [3, 4]]))"
    p = run(index, "--with", "memexcli-tabular==2.0", "-c", code)
    assert p.returncode == 0, p.stderr
    assert p.stdout == "1 | 2\n3 | 4\n"
    bare = run(index, "-c", code)  # the positive control: not there without --with
    assert bare.returncode == 1 and "ModuleNotFoundError" in bare.stderr + bare.stdout


@pytest.mark.slow
def test_run_with_a_native_package_says_why_and_exits_2(index: PackageIndex) -> None:
    p = run(index, "--with", "memexcli-native", "-c", "pass")
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "no wheel of memexcli-native runs in the guest" in p.stderr
    assert "numpy" in p.stderr  # it names what the guest bundles instead
