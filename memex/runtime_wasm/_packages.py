"""Packages in the guest: pure-Python wheels the host resolves, fetches and unpacks once per
machine, then mounts read-only at :data:`GUEST_PACKAGES` (on the guest's ``sys.path``).

No third-party code runs on the host, by construction: MemEx reads the package indexes
itself (``packages/``: pip's configured indexes, read as hostile input, never pip run) and
decides the whole set from the indexes' pages and the wheels' metadata before any wheel is
fetched for it. Only wheels are candidates (an sdist would need its build code run), only
pure-Python ones run in the guest, and a dependency named by a direct reference (a URL, a
path, VCS) is refused by name as soon as its parent's metadata is read. Then, still before a
wheel is fetched, the caller's grant check (``allow``) sees every wheel of the set; each
wheel is fetched into a private folder and checked against the hash the index gave; the
set's unpacked size, from the zips' directories, is checked against ``max_bytes`` and
:data:`MAX_SET_BYTES`; only then is anything unpacked into the cache. A refusal leaves
nothing in the cache.

The cache is content-addressed: each wheel is kept under the sha256 of its bytes, a set
under its wheels' hashes, and a resolution record is keyed by the indexes that answered it,
except a set asked for by locked pins (``name==version --hash=sha256:...``, what
:attr:`PackageSet.locked` gives), whose hashes name its bytes whatever index is configured:
a saved session, a worker and a cluster's slab reopen exactly the wheels they were given, or
refuse. The guest's bundled packages (numpy, pandas...) stand in at their bundled versions,
so a requirement that needs another version of one fails to resolve instead of shadowing it.
Requirements are names, extras, version specifiers and markers (and hashes): a URL or a pip
option would let whoever writes them make the host fetch from anywhere.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import ConfigError, PackageError
from .engine._artifacts import Artifacts
from .engine._cache import atomic_write, cache_dir
from .engine._files import GUEST_PACKAGES, materialize
from .packages._index import redact
from .packages._store import Held, building, cache_bound, evict, hold, record_set, stamp

__all__ = ["GUEST_PACKAGES", "PackageSet", "Wheel", "bundled_packages", "cancel_resolutions",
           "resolve_packages", "script_dependencies"]


RESOLVE_TTL = 3600.0
"""Seconds a resolution of requirements that are not all pinned is reused before the index
is asked again (pinned ones, ``name==version``, are reused for as long as the cache holds
them)."""

MAX_REQUIREMENTS = 64
MAX_DOWNLOAD_BYTES = 512 << 20
"""Bytes one resolution may download (metadata aside): past this it stops, refused."""
MAX_SET_BYTES = 512 << 20
"""Bytes a set may take unpacked, whatever the sandbox's disk cap (a server's bound on what
one create can make it write)."""
FETCH_TIMEOUT = 300.0
"""Seconds one resolution (pages, metadata and wheels) may take."""
Allow = Callable[[Sequence[tuple[str, str]]], None]
"""A grant check: called with every (name, version) of a resolved set before any of its
wheels is fetched; raises to refuse the set."""
_HASHED = re.compile(r"^(?P<req>.*?)(?P<hashes>(?:\s+--hash=sha256:[0-9a-fA-F]{64})+)\s*$")


@dataclass(frozen=True)
class Wheel:
    """One wheel of a package set: what was fetched and unpacked, and where from."""

    name: str
    version: str
    filename: str
    sha256: str
    size: int  # bytes unpacked
    origin: str = ""  # the index that served it (credentials removed)

    @property
    def pin(self) -> str:
        return f"{self.name}=={self.version}"

    @property
    def locked(self) -> str:
        """The pin with its hash: these bytes and no others."""
        return f"{self.name}=={self.version} --hash=sha256:{self.sha256}"


@dataclass(frozen=True)
class PackageSet:
    """Resolved guest packages: the wheels, and the cached folder holding them unpacked."""

    requirements: tuple[str, ...]
    wheels: tuple[Wheel, ...]
    root: Path
    bundled: tuple[str, ...] = ()  # requirements the guest's bundle already met

    @property
    def id(self) -> str:
        """Names the set by its wheels' content (the same wheels: the same id)."""
        h = hashlib.sha256()
        for w in sorted(self.wheels, key=lambda w: w.name):
            h.update(f"{w.name}\0{w.sha256}\0".encode())
        return h.hexdigest()[:24]

    @property
    def size(self) -> int:
        """Bytes the unpacked wheels take (counted against the sandbox's disk cap)."""
        return sum(w.size for w in self.wheels)

    @property
    def pins(self) -> tuple[str, ...]:
        return tuple(sorted(w.pin for w in self.wheels))

    @property
    def locked(self) -> tuple[str, ...]:
        """The pins with their hashes: what reopens exactly this set (a worker, a save, a
        slab), from the cache or else from the configured index, checked by hash."""
        return tuple(sorted(w.locked for w in self.wheels))

    def describe(self) -> list[dict[str, object]]:
        return [{"name": w.name, "version": w.version, "sha256": w.sha256, "size": w.size,
                 "origin": w.origin} for w in self.wheels]


@functools.lru_cache(maxsize=4)
def bundled_packages(arts: Artifacts) -> dict[str, str]:
    """The distributions the guest bundles (canonical name -> version), from its stdlib zip."""
    import zipfile

    from packaging.utils import canonicalize_name

    found: dict[str, str] = {}
    with zipfile.ZipFile(arts.stdlib_zip) as z:
        for name in z.namelist():
            top = name.split("/", 1)[0]
            if top.endswith(".dist-info") and "-" in top:
                dist, version = top[: -len(".dist-info")].rsplit("-", 1)
                found[canonicalize_name(dist)] = version
    return found


def checked_requirements(requirements: Iterable[str]) -> tuple[str, ...]:
    """Each requirement parsed (names, extras, specifiers and markers only; a pinned one may
    carry ``--hash=sha256:HEX``, pip's hash-checking form, which only narrows), normalized."""
    from packaging.requirements import InvalidRequirement, Requirement

    out: list[str] = []
    for raw in requirements:
        if not isinstance(raw, str):
            raise ConfigError(f"a package requirement is a string, got {type(raw).__name__}")
        text = raw.strip()
        hashed = _HASHED.match(text) if len(text) <= 2000 else None
        hashes: list[str] = []
        if hashed:
            text = hashed["req"].strip()
            hashes = sorted({h.split(":", 1)[1].lower()
                             for h in hashed["hashes"].split()})
        if not text or text.startswith("-") or len(text) > 200:
            raise ConfigError(f"not a package requirement: {raw!r} (a name and an optional "
                              "version, as 'tabulate==0.9.0')")
        try:
            req = Requirement(text)
        except InvalidRequirement as exc:
            raise ConfigError(f"not a package requirement: {raw!r} ({exc})") from None
        if req.url is not None:
            raise ConfigError(f"{raw!r}: a requirement names a package of the index, not a "
                              "URL (the host would fetch it from anywhere)")
        if hashes and not _exact(str(req)):
            raise ConfigError(f"{raw!r}: a requirement with a hash pins one version "
                              "(name==version --hash=sha256:...)")
        out.append(str(req) + "".join(f" --hash=sha256:{h}" for h in hashes))
    if len(out) > MAX_REQUIREMENTS:
        raise ConfigError(f"{len(out)} package requirements; at most {MAX_REQUIREMENTS}")
    return tuple(sorted(set(out)))


def _split_hashes(text: str) -> tuple[str, frozenset[str]]:
    """A checked requirement's text and the hashes it allows (none: any)."""
    req, *hashes = text.split(" --hash=sha256:")
    return req, frozenset(hashes)


MAX_SCRIPT_METADATA = 64 << 10


def _script_blocks(code: str) -> list[str]:
    """The TOML of each ``# /// script`` block (PEP 723), in one pass over the lines: a
    block is the run of comment lines after its opener, up to the last ``# ///`` of it."""
    lines = code.splitlines()
    found, i = [], 0
    while i < len(lines):
        if lines[i].rstrip() != "# /// script":
            i += 1
            continue
        j, close = i + 1, -1
        while j < len(lines) and (lines[j] == "#" or lines[j].startswith("# ")):
            if lines[j].rstrip() == "# ///":
                close = j
            j += 1
        if close < 0:  # nor can an opener inside this run close (no '# ///' in it)
            i = j
            continue
        found.append("".join(line[2:] + "\n" if line.startswith("# ") else "\n"
                             for line in lines[i + 1:close]))
        i = close + 1
    return found


def script_dependencies(code: str) -> list[str] | None:
    """The ``dependencies`` of a cell's inline script metadata (PEP 723: a ``# /// script``
    block), None when it has none. ConfigError for a block that is not valid TOML, a second
    script block, or dependencies that are not a list of strings."""
    import tomllib

    if "# /// script" not in code:  # the common case: not even a split of a large cell
        return None
    blocks = _script_blocks(code)
    if not blocks:
        return None
    if len(blocks) > 1:
        raise ConfigError("the code has more than one '# /// script' block (PEP 723)")
    if len(blocks[0]) > MAX_SCRIPT_METADATA:
        raise ConfigError(f"a '# /// script' block of more than {MAX_SCRIPT_METADATA} bytes")
    try:
        meta = tomllib.loads(blocks[0])
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"the '# /// script' block is not valid TOML: {exc}") from None
    deps = meta.get("dependencies", [])
    if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
        raise ConfigError("the '# /// script' block's dependencies must be a list of strings")
    return list(deps)


def resolve_packages(requirements: Sequence[str], arts: Artifacts | None = None, *,
                     index_url: str | None = None, cache: Path | None = None,
                     timeout: float = FETCH_TIMEOUT, allow: Allow | None = None,
                     max_bytes: int | None = None,
                     progress: Callable[[str], None] | None = None) -> PackageSet:
    """The pure-Python wheels ``requirements`` need in the guest, fetched and unpacked (once
    per machine). Raises :class:`PackageError` (naming the package) when one cannot run in
    the guest or the set cannot be had; nothing of a refused set stays in the cache.

    ``arts``: the guest's (default: this machine's). ``index_url``: this index alone instead
    of pip's configured ones. ``allow``: the grant check, given every wheel of the set before
    any is fetched. ``max_bytes``: what the set may take unpacked (a sandbox's disk cap),
    checked from the zips' directories before a byte is unpacked. ``progress``: told, in a
    few words, what the resolution is doing (a CLI shows it)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    from .packages._index import configured_indexes

    reqs = checked_requirements(requirements)
    if arts is None:
        from .engine._artifacts import find_artifacts

        arts = find_artifacts()
    bundled = bundled_packages(arts)
    wanted, met = [], []
    hashes: dict[str, frozenset[str]] = {}
    for full in reqs:
        text, allowed = _split_hashes(full)
        req = Requirement(text)
        name = canonicalize_name(req.name)
        have = bundled.get(name)
        if have is None:
            wanted.append(full)
            if allowed:
                hashes[name] = hashes.get(name, frozenset()) | allowed
        elif req.specifier.contains(have, prereleases=True):
            met.append(full)
        else:
            raise PackageError(f"{text!r}: the guest bundles {req.name} {have}, which that "
                               "requirement excludes (a bundled package cannot be replaced)")
    root = (cache or cache_dir()) / "packages"
    indexes = configured_indexes(index_url)
    cap = MAX_SET_BYTES if max_bytes is None else min(max_bytes, MAX_SET_BYTES)
    if not wanted:
        return PackageSet(reqs, (), root / "sets" / "none", tuple(met))
    locked = all(_split_hashes(t)[1] for t in wanted)
    pinned = locked or all(_exact(_split_hashes(t)[0]) for t in wanted)
    key = _key(wanted, [] if locked else list(indexes), arts, bundled)
    known = _read_resolution(root / "resolved" / f"{key}.json", None if pinned else RESOLVE_TTL)
    folder = None
    if known is not None:
        wheels = tuple(known)
        _admit(wheels, allow, cap)
        with building(root):  # no eviction between the look and the set's record
            if all((root / "wheels" / w.sha256).is_dir() for w in wheels):
                folder = _assemble(root, wheels)
    if folder is not None:  # from the cache: its records stand, nothing was added
        stamp(folder)
        return PackageSet(reqs, wheels, folder, tuple(met))
    wheels, folder = _fetch(wanted, arts, bundled, hashes, root, indexes, timeout, allow, cap,
                            progress)
    stamp(folder)
    record = json.dumps({"at": time.time(), "indexes": [redact(i) for i in indexes],
                         "wheels": [asdict(w) for w in wheels]}).encode()
    atomic_write(root / "resolved" / f"{key}.json", record)
    # what reopens it (a worker, a fork, a load, a slab) asks by its hashes: index-free
    again = _key(sorted(w.locked for w in wheels), [], arts, bundled)
    atomic_write(root / "resolved" / f"{again}.json", record)
    evict(root, cache_bound(), keep=folder.name)  # within MEMEX_PACKAGE_CACHE_BYTES
    return PackageSet(reqs, wheels, folder, tuple(met))


def hold_packages(packages: PackageSet, arts: Artifacts) -> tuple[PackageSet, Held]:
    """``packages`` held for a sandbox that mounts it (never evicted until released); a set
    evicted since it was resolved is made again from its locked pins (the cache, else the
    index, by hash)."""
    root = packages.root.parent.parent
    for _ in range(3):
        held = hold(root, packages.id, [w.sha256 for w in packages.wheels])
        if held is not None:
            return packages, held
        packages = resolve_packages(list(packages.locked), arts, cache=root.parent)
    raise PackageError(f"the package set {packages.id} was evicted each time it was made "
                       "again (MEMEX_PACKAGE_CACHE_BYTES too small for it?)")


def cancel_resolutions(reason: str = "the server is stopping") -> None:
    """Stop every resolution of this process at once (a server's SIGTERM): their open reads
    are closed and each raises PackageError naming ``reason``; nothing they fetched stays."""
    from .packages._index import cancel_all

    cancel_all(reason)


def _key(reqs: Sequence[str], indexes: Sequence[str], arts: Artifacts,
         bundled: dict[str, str]) -> str:
    """A resolution record's name: the requirements, the indexes that answer them (none for
    locked pins: their hashes name the bytes), the guest."""
    return hashlib.sha256(json.dumps([sorted(reqs), [redact(i) for i in indexes],
                                      arts.python_tag, sorted(bundled.items())]).encode()
                          ).hexdigest()[:32]


def _exact(text: str) -> bool:
    from packaging.requirements import Requirement

    spec = list(Requirement(text).specifier)
    return len(spec) == 1 and spec[0].operator in ("==", "===") and "*" not in spec[0].version


def _read_resolution(path: Path, ttl: float | None) -> list[Wheel] | None:
    try:
        data = json.loads(path.read_bytes())
        if ttl is not None and time.time() - float(data["at"]) > ttl:
            return None
        return [Wheel(**w) for w in data["wheels"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _set_id(wheels: Sequence[Wheel]) -> str:
    return PackageSet((), tuple(wheels), Path()).id


def _admit(wheels: Sequence[Wheel], allow: Allow | None, cap: int) -> None:
    """The grant check and the size cap, on a set known before anything is fetched."""
    if allow is not None:
        allow([(w.name, w.version) for w in wheels])
    total = sum(w.size for w in wheels)
    if total > cap:
        raise PackageError(f"{', '.join(w.pin for w in wheels)} take {total} bytes unpacked, "
                           f"more than the {cap} this set may take (the sandbox's disk cap, "
                           "or MemEx's per-set bound)")


def _fetch(wanted: list[str], arts: Artifacts, bundled: dict[str, str],
           hashes: dict[str, frozenset[str]], root: Path, indexes: Sequence[str],
           timeout: float, allow: Allow | None, cap: int,
           progress: Callable[[str], None] | None) -> tuple[tuple[Wheel, ...], Path]:
    """Resolve from metadata, check grants, fetch into a private folder, check sizes, then
    unpack into the cache and link the set (in that order: each step before the next
    writes anything). The wheels and the set's folder."""
    from .packages._index import Index
    from .packages._resolve import resolve
    from .packages._wheels import MAX_WHEEL_BYTES, WheelPlan, plan_wheel, unpack

    say = progress or (lambda _: None)
    (root / "downloads").mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout
    with tempfile.TemporaryDirectory(dir=root / "downloads") as work, \
            Index(indexes, deadline=deadline, download_budget=MAX_DOWNLOAD_BYTES) as index:
        say(f"resolving {', '.join(_split_hashes(t)[0] for t in wanted)}")
        chosen = resolve([_split_hashes(t)[0] for t in wanted], index, bundled=bundled,
                      python_tag=arts.python_tag, work=Path(work), hashes=hashes)
        if allow is not None:  # every wheel of the set, before any is fetched
            allow([(c.name, c.version) for c in chosen])
        planned: list[tuple[Wheel, Path | None, WheelPlan | None]] = []
        todo = [c for c in chosen
                if not (c.file.sha256 and (root / "wheels" / c.file.sha256).is_dir()
                        and _meta(root, c.file.sha256) is not None)]
        if todo:
            say(f"fetching {len(todo)} wheel{'s' * (len(todo) != 1)}")
        for i, c in enumerate(chosen):
            what = f"{c.name} {c.version}"
            cached = _meta(root, c.file.sha256) if c.file.sha256 else None
            if cached is not None and (root / "wheels" / cached.sha256).is_dir():
                planned.append((cached, None, None))
                continue
            if c.local is not None and c.sha256 is not None:
                path, sha = c.local, c.sha256
            else:
                path = Path(work) / f"fetch-{i}.whl"
                sha = index.download(c.file, path, MAX_WHEEL_BYTES)
            want = hashes.get(c.name)
            if want and sha not in want:
                raise PackageError(f"{what}: the index serves bytes (sha256 {sha}) other "
                                   "than the hash asked for")
            plan = plan_wheel(path, what)
            planned.append((Wheel(c.name, c.version, c.file.filename, sha, plan.size,
                                  c.file.index), path, plan))
        _admit([w for w, _, _ in planned], None, cap)  # the zips' directories: none unpacked
        out = []
        with building(root):  # no eviction takes a wheel before its set is recorded
            for w, src, how in planned:
                if src is not None and how is not None:
                    def build(tmp: Path, src: Path = src, how: WheelPlan = how,
                              what: str = f"{w.name} {w.version}") -> None:
                        unpack(src, how, tmp, what)

                    materialize(root / "wheels" / w.sha256, build)
                    atomic_write(root / "wheels" / f"{w.sha256}.json",
                                 json.dumps(asdict(w)).encode())
                out.append(w)
            folder = _assemble(root, out)
    return tuple(out), folder


def _meta(root: Path, sha256: str) -> Wheel | None:
    """The record of a wheel unpacked in the cache (written beside it)."""
    try:
        w = Wheel(**json.loads((root / "wheels" / f"{sha256}.json").read_bytes()))
    except (OSError, ValueError, TypeError):
        return None
    return w if w.sha256 == sha256 else None


def _assemble(root: Path, wheels: Sequence[Wheel]) -> Path:
    """One folder holding every wheel of the set (hard links into the unpacked wheels)."""

    def build(tmp: Path) -> None:
        owner: dict[str, str] = {}  # a file's path -> the wheel holding it
        folders: dict[str, str] = {}
        for w in wheels:
            src = root / "wheels" / w.sha256
            for dirpath, _, files in os.walk(src):
                rel = Path(dirpath).relative_to(src)
                if str(rel) in owner:
                    raise PackageError(f"{w.name} holds a folder {rel} where "
                                       f"{owner[str(rel)]} holds a file")
                folders.setdefault(str(rel), w.name)
                (tmp / rel).mkdir(parents=True, exist_ok=True)
                for f in files:
                    key = str(rel / f)
                    if key in owner:
                        raise PackageError(f"{w.name} and {owner[key]} both hold {key}")
                    if key in folders:
                        raise PackageError(f"{w.name} holds a file {key} where "
                                           f"{folders[key]} holds a folder")
                    owner[key] = w.name
                    try:
                        os.link(Path(dirpath) / f, tmp / rel / f)
                    except OSError:
                        shutil.copy2(Path(dirpath) / f, tmp / rel / f)

    set_id = _set_id(wheels)
    folder = materialize(root / "sets" / set_id, build)
    if not (root / "sets" / f"{set_id}.json").is_file():
        record_set(root, set_id, [w.sha256 for w in wheels])
    return folder
