"""`memex run --with PKG`: a package for the guest from the index pip is configured with (a
package index on 127.0.0.1 here, set by PIP_INDEX_URL as a user would)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from package_index import PackageIndex, build_wheel, hostile_wheel, package_index


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PackageIndex]:
    w = tmp_path_factory.mktemp("wheels")
    build_wheel(w, "memexcli-tabular", "2.0",
                {"memexcli_tabular.py": "def table(rows):\n"
                                        "    return '\\n'.join(' | '.join(map(str, r)) "
                                        "for r in rows)\n"})
    build_wheel(w, "memexcli-native", "1.0", {"memexcli_native.py": ""},
                tag="cp315-cp315-linux_x86_64")
    hostile_wheel(w, "memexcli-evil", MARKER)
    with package_index(w) as idx:
        yield idx


MARKER = Path("/tmp") / f"memex-cli-evil-{os.getpid()}"


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
    # ... and the error says how to add it
    assert "memex: the guest does not bundle 'memexcli_tabular'" in bare.stderr
    assert "memex run --with memexcli-tabular" in bare.stderr


@pytest.mark.slow
def test_run_with_a_native_package_says_why_and_exits_2(index: PackageIndex) -> None:
    p = run(index, "--with", "memexcli-native", "-c", "pass")
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "no wheel of memexcli-native runs in the guest" in p.stderr
    assert "numpy" in p.stderr  # it names what the guest bundles instead


def test_a_name_the_index_does_not_have_says_so(index: PackageIndex) -> None:
    p = run(index, "--with", "memexcli-nothere", "-c", "pass")
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "no package named memexcli-nothere is on the index" in p.stderr, p.stderr


@pytest.mark.slow
def test_a_resolution_that_takes_a_while_shows_its_steps(tmp_path: Path) -> None:
    """A wheel the index trickles: past a second, the step under way is shown on stderr;
    a set from the cache says nothing (the control: the same command again)."""
    w = tmp_path / "w"
    w.mkdir()
    big = build_wheel(w, "memexcli-big", "1.0", {"memexcli_big/blob.bin": os.urandom(16 << 20)})
    with package_index(w) as idx:
        idx.slow.add(big.name)
        env = dict(os.environ, PIP_INDEX_URL=idx.url)
        cmd = [sys.executable, "-m", "memex", "run", "--with", "memexcli-big", "-c",
               "import memexcli_big"]
        first = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
        assert first.returncode == 0, first.stderr
        assert "memex: fetching 1 wheel ..." in first.stderr, first.stderr
        again = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
        assert again.returncode == 0 and "memex:" not in again.stderr, again.stderr


@pytest.mark.parametrize("how", ["--with", "pep723"])
def test_a_direct_reference_in_the_tree_is_refused_and_never_built(
        index: PackageIndex, tmp_path: Path, how: str) -> None:
    """memexcli-evil depends on a source tree by path: refused by name, its build code never
    run, whether asked for with --with or by the script's PEP 723 block; the benign package
    of the same index installs (test_run_with_a_package_imports_it)."""
    script = tmp_path / "s.py"
    script.write_text('# /// script\n# dependencies = ["memexcli-evil"]\n# ///\npass\n')
    args = ["--with", "memexcli-evil", "-c", "pass"] if how == "--with" else [str(script)]
    p = run(index, *args)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "memexcli-evil 1.0 depends on memexevil @ file://" in p.stderr, p.stderr
    assert not MARKER.exists()
