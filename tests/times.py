"""Write docs/test-times.md from a run's JUnit XML: each lane's tests and seconds, and the 20
slowest tests. ``./build.sh test`` writes the XML to test-results/junit.xml (CI keeps it)::

    python tests/times.py test-results/junit.xml    # then commit docs/test-times.md

The lane of each test is the one tests/conftest.py gave it (a property of its testcase)."""

from __future__ import annotations

import argparse
import collections
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_CASES = 100_000  # a suite's XML holds a few thousand: more is not a run of this suite


def read(path: Path) -> list[tuple[float, str, str, str]]:
    """(seconds, lane, outcome, test) of each testcase."""
    out = []
    for case in ET.parse(path).getroot().iter("testcase"):
        if len(out) >= MAX_CASES:
            raise SystemExit(f"{path}: more than {MAX_CASES} testcases")
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        outcome = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")),
                       "passed")
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        out.append((float(case.get("time") or 0.0), props.get("lane") or "fast", outcome,
                    name))
    return out


def render(cases: list[tuple[float, str, str, str]], source: str) -> str:
    lanes: dict[str, list[float]] = collections.defaultdict(list)
    for seconds, lane, outcome, _ in cases:
        if outcome != "skipped":
            lanes[lane].append(seconds)
    lines = ["# Test times", "",
             f"Written by `python tests/times.py` from {source}; the seconds are pytest's "
             "(each test's call, setup and teardown), not wall time, and move with the "
             "machine's load: a guide to where the suite's time goes, not a target.", "",
             "| lane | tests run | seconds | share |", "|---|---:|---:|---:|"]
    total = sum(sum(v) for v in lanes.values()) or 1.0
    for lane, times in sorted(lanes.items(), key=lambda kv: -sum(kv[1])):
        lines.append(f"| {lane} | {len(times)} | {sum(times):.0f} | "
                     f"{100 * sum(times) / total:.0f}% |")
    lines.append(f"| all | {sum(len(v) for v in lanes.values())} | {total:.0f} | 100% |")
    lines += ["", "The 20 slowest:", "", "| seconds | lane | test |", "|---:|---|---|"]
    for seconds, lane, _, name in sorted(cases, reverse=True)[:20]:
        lines.append(f"| {seconds:.1f} | {lane} | `{name}` |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("junit", type=Path, help="a run's JUnit XML (test-results/junit.xml)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "test-times.md",
                    help="where to write (default docs/test-times.md)")
    ap.add_argument("--run", default=None, metavar="TEXT",
                    help="what run the XML is from, said in the document (commit, machine)")
    args = ap.parse_args()
    source = args.junit.name + (f" of {args.run}" if args.run else "")
    args.out.write_text(render(read(args.junit), source))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
