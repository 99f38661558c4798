"""Which wheels a set of requirements needs in the guest, decided from the indexes' pages and
the wheels' metadata alone (resolvelib, the resolver pip itself uses), before any wheel is
fetched for the set.

Refused by construction: only wheel files are candidates (a source distribution would need
its build code run on the host: it is never one), only wheels whose tags run in the guest
(pure Python), and any dependency named by a direct reference (``x @ URL``, a path, VCS) is
refused by name the moment its parent's metadata is read, before anything of it is fetched.
The guest's bundled packages are fixed at their bundled versions (one candidate each, never
fetched). Markers are evaluated for the guest (CPython 3.15 on WASI, wasm32).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import resolvelib

from ...errors import PackageError
from ._index import MAX_METADATA_BYTES, Index, IndexFile
from ._wheels import MAX_WHEEL_BYTES, metadata_of

__all__ = ["MAX_METADATA_READS", "Chosen", "guest_markers", "resolve"]

MAX_METADATA_READS = 500
"""Wheels whose metadata one resolution may read (each a request)."""
MAX_ROUNDS = 5_000
MAX_DEPENDENCIES = 500
"""Requires-Dist lines of one wheel."""
_PYTHON = "<python>"  # the identifier of the guest's Python (Requires-Python)


def guest_markers(python_tag: str) -> dict[str, str]:
    """The environment markers of the guest (PEP 508), measured in it: ``sys.platform``
    'wasi', ``platform.machine()`` 'wasm32', ``platform.system()`` 'wasi'."""
    version = f"{python_tag[0]}.{python_tag[1:]}"
    return {"python_version": version, "python_full_version": f"{version}.0",
            "implementation_name": "cpython", "implementation_version": f"{version}.0",
            "platform_python_implementation": "CPython", "sys_platform": "wasi",
            "os_name": "posix", "platform_system": "wasi", "platform_machine": "wasm32",
            "platform_release": "0.0.0", "platform_version": "0.0.0", "extra": ""}


@dataclass(frozen=True)
class Chosen:
    """One wheel of a resolution: what it is and where its bytes come from."""

    name: str  # canonical
    version: str
    file: IndexFile
    local: Path | None = None  # already downloaded (an index without metadata files)
    sha256: str | None = None  # of ``local``


@dataclass(frozen=True)
class _Candidate:
    name: str
    version: Any  # packaging Version
    file: IndexFile | None  # None: bundled, or the guest's Python
    extras: frozenset[str] = frozenset()


@dataclass(frozen=True)
class _Req:
    name: str
    specifier: Any  # SpecifierSet
    extras: frozenset[str]
    parent: str | None  # "name version" of who asked (None: the caller)
    text: str
    hashes: frozenset[str] = frozenset()


def _ident(name: str, extras: frozenset[str]) -> str:
    return f"{name}[{','.join(sorted(extras))}]" if extras else name


@dataclass
class _Provider(resolvelib.AbstractProvider):  # type: ignore[type-arg]
    index: Index
    bundled: Mapping[str, str]
    markers: dict[str, str]
    python: Any  # Version of the guest
    work: Path
    hashes: Mapping[str, frozenset[str]]
    found: dict[str, str] = field(default_factory=dict)  # name -> why no candidate
    local: dict[str, tuple[Path, str]] = field(default_factory=dict)  # url -> (file, sha)
    raw: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    reads: int = 0

    # ---- resolvelib's provider interface ----------------------------------------------------
    def identify(self, requirement_or_candidate: _Req | _Candidate) -> str:
        return _ident(requirement_or_candidate.name, requirement_or_candidate.extras)

    def get_preference(self, identifier: str, resolutions: Mapping[str, Any],
                       candidates: Mapping[str, Iterator[_Candidate]],
                       information: Mapping[str, Iterator[Any]],
                       backtrack_causes: Sequence[Any]) -> Any:
        pinned = any(str(s.operator) in ("==", "===")
                     for info in information[identifier] for s in info.requirement.specifier)
        return (identifier != _PYTHON, identifier.split("[")[0] not in self.bundled,
                not pinned, identifier)

    def narrow_requirement_selection(self, identifiers: Iterable[str], *args: Any,
                                     **kwargs: Any) -> Iterable[str]:
        return identifiers

    def find_matches(self, identifier: str, requirements: Mapping[str, Iterator[_Req]],
                     incompatibilities: Mapping[str, Iterator[_Candidate]]
                     ) -> list[_Candidate]:
        from packaging.version import Version

        reqs = list(requirements[identifier])
        bad = {c.version for c in incompatibilities[identifier]}
        name = identifier.split("[")[0]
        extras = frozenset().union(*(r.extras for r in reqs)) if reqs else frozenset()
        if identifier == _PYTHON:
            return [] if self.python in bad else [_Candidate(_PYTHON, self.python, None)]
        if name in self.bundled:
            v = Version(self.bundled[name])
            ok = v not in bad and all(r.specifier.contains(v, prereleases=True) for r in reqs)
            return [_Candidate(name, v, None, extras)] if ok else []
        out: list[_Candidate] = []
        for version, f in self._versions(name):
            if version in bad or not all(self._admits(r, version, f) for r in reqs):
                continue
            out.append(_Candidate(name, version, f, extras))
        if not out and name not in self.found:
            self.found[name] = "versions"
        return out

    def is_satisfied_by(self, requirement: _Req, candidate: _Candidate) -> bool:
        if candidate.name == _PYTHON:
            return bool(requirement.specifier.contains(candidate.version, prereleases=True))
        if candidate.file is None:  # bundled
            return bool(requirement.specifier.contains(candidate.version, prereleases=True))
        return self._admits(requirement, candidate.version, candidate.file)

    def get_dependencies(self, candidate: _Candidate) -> list[_Req]:
        from packaging.specifiers import SpecifierSet

        if candidate.file is None:
            return []  # the guest's Python, or a bundled package: fixed, nothing to add
        base = self._requires(candidate)
        if candidate.extras:  # name[extras] is name itself plus what those extras add
            same = _Req(candidate.name, SpecifierSet(f"=={candidate.version}"), frozenset(),
                        None, f"{candidate.name}=={candidate.version}")
            return [same, *self._requires(candidate, candidate.extras)]
        return base

    # ---- what a project offers ---------------------------------------------------------------
    def _versions(self, name: str) -> list[tuple[Any, IndexFile]]:
        """(version, the best wheel of it for the guest), newest first."""
        from packaging.utils import InvalidWheelFilename, parse_wheel_filename
        from packaging.version import InvalidVersion

        got = self.index.project(name)
        if got is None:
            self.found[name] = "missing"
            return []
        _, files = got
        tags = _guest_tags(self.markers["python_version"])
        best: dict[Any, tuple[int, IndexFile]] = {}
        wheels = sdists = 0
        for f in files:
            if not f.filename.endswith(".whl"):
                sdists += f.filename.endswith((".tar.gz", ".zip", ".tar.bz2", ".tgz"))
                continue
            try:
                fname, version, _, ftags = parse_wheel_filename(f.filename)
            except (InvalidWheelFilename, InvalidVersion):
                continue
            from packaging.utils import canonicalize_name

            if canonicalize_name(fname) != name:
                continue
            wheels += 1
            rank = min((tags[t] for t in ftags if t in tags), default=None)
            if rank is None:
                continue
            if f.requires_python and not _python_ok(f.requires_python, self.python):
                continue
            if version not in best or rank < best[version][0]:
                best[version] = (rank, f)
        if not best and name not in self.found:
            self.found[name] = ("native" if wheels else "sdist" if sdists else "nothing")
        return sorted(((v, f) for v, (_, f) in best.items()), key=lambda x: x[0],
                      reverse=True)

    def _admits(self, r: _Req, version: Any, f: IndexFile) -> bool:
        if not r.specifier.contains(version, prereleases=_prereleases(r)):
            return False
        pinned = any(str(s.operator) in ("==", "===") for s in r.specifier)
        if f.yanked and not pinned:
            return False
        want = self.hashes.get(r.name)
        return not want or f.sha256 in want

    def _requires(self, c: _Candidate, extras: frozenset[str] = frozenset()) -> list[_Req]:
        """What ``c`` (with ``extras``: only what those add) needs in the guest."""
        from packaging.requirements import InvalidRequirement, Requirement
        from packaging.specifiers import InvalidSpecifier, SpecifierSet
        from packaging.utils import canonicalize_name

        assert c.file is not None
        what = f"{c.name} {c.version}"
        raw = self._metadata(c)
        out: list[_Req] = []
        if raw.get("requires_python"):
            try:
                spec = SpecifierSet(str(raw["requires_python"]))
            except InvalidSpecifier:
                raise PackageError(f"{what}: its metadata's Requires-Python is not valid: "
                                   f"{raw['requires_python']!r}") from None
            out.append(_Req(_PYTHON, spec, frozenset(), what, f"Requires-Python {spec}"))
        lines = list(raw.get("requires_dist") or [])
        if len(lines) > MAX_DEPENDENCIES:
            raise PackageError(f"{what}: {len(lines)} dependencies, more than "
                               f"{MAX_DEPENDENCIES}")
        for line in lines:
            try:
                dep = Requirement(str(line))
            except InvalidRequirement as exc:
                raise PackageError(f"{what}: its metadata names a dependency that is not a "
                                   f"requirement: {line!r} ({exc})") from None
            if dep.url is not None:
                raise PackageError(
                    f"{what} depends on {dep.name} @ {dep.url}: a direct reference (a URL, "
                    "path or VCS address) is refused, since the host would fetch it from "
                    "outside the index and may have to run its build code")
            if not self._wanted(dep, extras):
                continue
            out.append(_Req(canonicalize_name(dep.name), dep.specifier,
                            frozenset(canonicalize_name(e) for e in dep.extras), what,
                            str(dep)))
        return out

    def _wanted(self, dep: Any, extras: frozenset[str]) -> bool:
        """Whether the guest needs ``dep``: for the base wheel, what its markers admit with
        no extra; for ``extras``, only what those add beyond the base."""
        base = dep.marker is None or bool(dep.marker.evaluate({**self.markers, "extra": ""}))
        if not extras:
            return base
        return not base and any(dep.marker.evaluate({**self.markers, "extra": e})
                                for e in extras)

    def _metadata(self, c: _Candidate) -> dict[str, Any]:
        """The parsed metadata of ``c``'s wheel: its PEP 658 file, else (an index that
        serves none) the wheel itself, downloaded into the resolution's folder (and kept:
        the fetch takes it from there)."""
        from packaging.metadata import parse_email
        from packaging.utils import canonicalize_name
        from packaging.version import InvalidVersion, Version

        assert c.file is not None
        key = (c.name, str(c.version))
        if key in self.raw:
            return self.raw[key]
        what = f"{c.name} {c.version}"
        self.reads += 1
        if self.reads > MAX_METADATA_READS:
            raise PackageError(f"the resolution read the metadata of more than "
                               f"{MAX_METADATA_READS} wheels")
        f = c.file
        if f.metadata is not None:
            body = self.index.metadata(f)
        else:
            dest = self.work / f"{len(self.local)}.whl"
            sha = self.index.download(f, dest, MAX_WHEEL_BYTES)
            self.local[f.url] = (dest, sha)
            body = metadata_of(dest, c.name, what, MAX_METADATA_BYTES)
        try:
            raw, _ = parse_email(body)
        except Exception as exc:  # its parser on hostile bytes: any failure is one answer
            raise PackageError(f"{what}: its metadata cannot be read ({exc})") from None
        try:
            same = canonicalize_name(str(raw.get("name", ""))) == c.name and \
                Version(str(raw.get("version", ""))) == c.version
        except InvalidVersion:
            same = False
        if not same:
            raise PackageError(f"{what}: its metadata names {raw.get('name')!r} "
                               f"{raw.get('version')!r}, not the wheel it came with")
        # only what the resolution reads: a description of megabytes is not kept per wheel
        self.raw[key] = {k: v for k, v in raw.items() if k in ("requires_python",
                                                               "requires_dist")}
        return self.raw[key]


def _prereleases(r: _Req) -> bool | None:
    return True if any(s.prereleases for s in r.specifier) else None


def _python_ok(spec: str, python: Any) -> bool:
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        return bool(SpecifierSet(spec).contains(python, prereleases=True))
    except InvalidSpecifier:
        return False


_TAGS: dict[str, dict[Any, int]] = {}


def _guest_tags(version: str) -> dict[Any, int]:
    """The wheel tags that run in the guest, best first (pure Python only)."""
    if version not in _TAGS:
        from packaging.tags import compatible_tags

        major, minor = (int(x) for x in version.split("."))
        order = list(compatible_tags((major, minor), f"cp{major}{minor}", ["any"]))
        _TAGS[version] = {t: i for i, t in reversed(list(enumerate(order)))}
    return _TAGS[version]


def resolve(requirements: Sequence[str], index: Index, *, bundled: Mapping[str, str],
            python_tag: str, work: Path, hashes: Mapping[str, frozenset[str]]
            ) -> list[Chosen]:
    """The wheels ``requirements`` (checked requirement texts, none bundled) need in the
    guest. PackageError naming the package for anything that cannot be had."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import Version

    markers = guest_markers(python_tag)
    provider = _Provider(index, bundled, markers, Version(markers["python_full_version"]),
                         work, hashes)
    roots = []
    for text in requirements:
        r = Requirement(text)
        if r.marker is not None and not r.marker.evaluate(markers):
            continue
        roots.append(_Req(canonicalize_name(r.name), r.specifier,
                          frozenset(canonicalize_name(e) for e in r.extras), None, text))
    resolver: Any = resolvelib.Resolver(provider, resolvelib.BaseReporter())
    try:
        result = resolver.resolve(roots, max_rounds=MAX_ROUNDS)
    except resolvelib.ResolutionImpossible as exc:
        raise PackageError(_explain(exc.causes, provider)) from None
    except resolvelib.ResolutionTooDeep:
        raise PackageError(f"{', '.join(requirements)}: no resolution within {MAX_ROUNDS} "
                           "rounds") from None
    wheels = []
    for ident, c in sorted(result.mapping.items()):
        if "[" in ident or c.file is None:
            continue
        local = provider.local.get(c.file.url)
        wheels.append(Chosen(c.name, str(c.version), c.file, *(local or (None, None))))
    return wheels


def _explain(causes: Iterable[Any], p: _Provider) -> str:
    """Why there is no resolution, said for the guest."""
    names = sorted({c.requirement.name for c in causes})
    lines = []
    for c in causes:
        r = c.requirement
        lines.append(f"{r.parent} needs {r.text}" if r.parent else f"asked for {r.text}")
    asked = "; ".join(dict.fromkeys(lines))
    for n in names:
        if n == _PYTHON:
            return (f"no version fits the guest's Python ({p.markers['python_full_version']})"
                    f": {asked}")
        why = p.found.get(n)
        if p.hashes.get(n) and why == "versions":
            return (f"the index serves no wheel of {n} with the hash asked for "
                    f"(sha256 {', '.join(sorted(p.hashes[n]))}): {asked}")
        if n in p.bundled:
            return (f"{asked}: that cannot be resolved for the guest alongside its bundled "
                    f"packages (fixed at their bundled versions: {n} {p.bundled[n]})")
        if why == "missing":
            return (f"no package named {n} is on the index ({', '.join(p.index.urls)}): "
                    f"{asked}")
        if why == "native":
            return (f"no wheel of {n} runs in the guest: it needs a pure-Python wheel "
                    f"(py3-none-any), and {n}'s wheels hold native code (the guest bundles "
                    f"these with native code built for it: {_bundle(p)})")
        if why == "sdist":
            return (f"no wheel of {n} runs in the guest: {n} publishes only source "
                    "distributions, whose build code would have to run on the host (refused)")
        if why == "versions":
            return f"no version of {n} that runs in the guest satisfies: {asked}"
        if why == "nothing":
            return f"no wheel of {n} runs in the guest: the index lists no files of it"
    return f"the requirements cannot be resolved for the guest: {asked}"


def _bundle(p: _Provider) -> str:
    return ", ".join(sorted(n for n in ("numpy", "pandas", "scipy", "matplotlib", "lxml",
                                        "pyyaml", "regex", "pillow", "scikit-learn")
                            if n in p.bundled))
