"""What `pip install memex` and each extra put on disk, beside an empty virtualenv (the
baseline: pip alone), each in a fresh virtualenv, installed from this checkout within
constraints.txt (the versions CI tests).

    python bench/install.py                       # every extra but local
    python bench/install.py --only serve --only mcp

Prints one table: the site-packages size above the baseline, the distributions installed
above it, and the wall time of the install (pip's cache warm or not, as this machine has it).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXTRAS = ["", "serve", "mcp", "jupyter", "eval", "ray", "cluster", "smolagents", "pydantic-ai",
          "openai-agents", "fastmcp"]  # local builds llama.cpp: --only local to include it


def site_size(venv: Path) -> tuple[int, int]:
    """(bytes, distributions) of the venv's site-packages."""
    site = next((venv / "lib").glob("python*/site-packages"))
    total = 0
    for dirpath, _, files in os.walk(site):
        for f in files:
            p = Path(dirpath) / f
            if not p.is_symlink():
                total += p.stat().st_size
    return total, len(list(site.glob("*.dist-info")))


def venv(where: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    return where


def install(where: Path, target: str) -> float:
    t = time.perf_counter()
    subprocess.run([str(where / "bin" / "python"), "-m", "pip", "install", "--quiet",
                    "--disable-pip-version-check", "-c", str(ROOT / "constraints.txt"), target],
                   check=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", metavar="EXTRA",
                    help="these extras ('' for the core); repeatable")
    args = ap.parse_args()
    extras = args.only if args.only else EXTRAS
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base_bytes, base_dists = site_size(venv(Path(tmp) / "base"))
        rows.append(("empty venv (baseline: pip)", base_bytes, base_dists, 0.0, True))
        for extra in extras:
            where = venv(Path(tmp) / (extra or "core"))
            target = f"{ROOT}[{extra}]" if extra else str(ROOT)
            seconds = install(where, target)
            size, dists = site_size(where)
            rows.append((f"memex[{extra}]" if extra else "memex", size - base_bytes,
                         dists - base_dists, seconds, False))
            print(f"  {rows[-1][0]:28s} {rows[-1][1] / 2**20:8.1f} MiB  {rows[-1][2]:4d} "
                  f"dists  {seconds:6.1f} s", file=sys.stderr, flush=True)
    print(f"\nInstall size (site-packages of a fresh venv, {sys.version.split()[0]}, "
          f"within constraints.txt)\n")
    print(f"{'what':28s} {'size':>10s} {'dists':>6s} {'install':>8s}")
    for name, size, dists, seconds, is_base in rows:
        label = "(total)" if is_base else "(above)"
        print(f"{name:28s} {size / 2**20:7.1f} MiB {dists:6d} {seconds:7.1f}s  {label}")


if __name__ == "__main__":
    main()
