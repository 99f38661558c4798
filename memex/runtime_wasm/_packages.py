"""Packages in the guest: pure-Python wheels the host resolves, fetches and unpacks once per
machine, then mounts read-only at :data:`GUEST_PACKAGES` (on the guest's ``sys.path``).

The host does the fetching with pip (the user's configured index: ``PIP_INDEX_URL``,
pip.conf), so a guest needs no network for it. pip resolves for the guest (CPython 3.15,
platform ``any``): a package with native code has no wheel that fits and is refused by name.
The guest's bundled packages (numpy, pandas...) stand in as stubs at their bundled versions,
so a requirement that needs another version of one fails to resolve instead of shadowing it.
Requirements are names and version specifiers only: a URL or a pip option would let whoever
writes them make the host fetch from anywhere.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, TYPE_CHECKING

from ..errors import ConfigError, PackageError
from .engine._artifacts import Artifacts
from .engine._cache import atomic_write, cache_dir
from .engine._files import GUEST_PACKAGES, materialize

if TYPE_CHECKING:
    import zipfile

__all__ = ["GUEST_PACKAGES", "PackageSet", "Wheel", "bundled_packages", "resolve_packages",
           "script_dependencies"]


RESOLVE_TTL = 3600.0
"""Seconds a resolution of requirements that are not all pinned is reused before pip is
asked again (pinned ones, ``name==version``, are reused for as long as the cache holds them)."""

MAX_REQUIREMENTS = 64
MAX_WHEEL_BYTES = 64 << 20
MAX_WHEEL_FILES = 20_000
MAX_UNPACKED_BYTES = 256 << 20
MAX_DOWNLOAD_BYTES = 512 << 20
"""Bytes pip may write while fetching one set (wheels and its own temporary files; it keeps
no cache of its own): past this it is stopped and the set refused."""
PIP_TIMEOUT = 300.0
_NATIVE = re.compile(r"\.(so|pyd|dylib|dll|a|o|wasm)(\.[0-9.]+)?$", re.IGNORECASE)
_PIP_ENV_DROPPED = ("PIP_CONSTRAINT", "PIP_REQUIREMENT", "PIP_TARGET", "PIP_PREFIX",
                    "PIP_ONLY_BINARY", "PIP_NO_BINARY", "PIP_PLATFORM", "PIP_PYTHON_VERSION",
                    "PIP_IMPLEMENTATION", "PIP_ABI", "PIP_FIND_LINKS", "PIP_NO_DEPS")


@dataclass(frozen=True)
class Wheel:
    """One wheel of a package set: what pip fetched and MemEx unpacked."""

    name: str
    version: str
    filename: str
    sha256: str
    size: int  # bytes unpacked

    @property
    def pin(self) -> str:
        return f"{self.name}=={self.version}"


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

    def describe(self) -> list[dict[str, object]]:
        return [{"name": w.name, "version": w.version, "sha256": w.sha256, "size": w.size}
                for w in self.wheels]


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
    """Each requirement parsed (names, extras, specifiers and markers only), normalized."""
    from packaging.requirements import InvalidRequirement, Requirement

    out: list[str] = []
    for raw in requirements:
        if not isinstance(raw, str):
            raise ConfigError(f"a package requirement is a string, got {type(raw).__name__}")
        text = raw.strip()
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
        out.append(str(req))
    if len(out) > MAX_REQUIREMENTS:
        raise ConfigError(f"{len(out)} package requirements; at most {MAX_REQUIREMENTS}")
    return tuple(sorted(set(out)))


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
                     timeout: float = PIP_TIMEOUT) -> PackageSet:
    """The pure-Python wheels ``requirements`` need in the guest, fetched and unpacked (once
    per machine). Raises :class:`PackageError` (naming the package) when one cannot run in
    the guest or pip cannot resolve them. ``arts``: the guest's (default: this machine's)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    reqs = checked_requirements(requirements)
    if arts is None:
        from .engine._artifacts import find_artifacts

        arts = find_artifacts()
    bundled = bundled_packages(arts)
    wanted, met = [], []
    for text in reqs:
        req = Requirement(text)
        have = bundled.get(canonicalize_name(req.name))
        if have is None:
            wanted.append(text)
        elif req.specifier.contains(have, prereleases=True):
            met.append(text)
        else:
            raise PackageError(f"{text!r}: the guest bundles {req.name} {have}, which that "
                               "requirement excludes (a bundled package cannot be replaced)")
    root = (cache or cache_dir()) / "packages"
    index = index_url or os.environ.get("PIP_INDEX_URL") or ""
    extra = os.environ.get("PIP_EXTRA_INDEX_URL") or ""
    def key_of(reqs: Sequence[str], pinned: bool) -> str:
        # a pinned set is named by its pins alone (what a worker, a fork, a load or a
        # cluster's slab on this machine asks for, whatever index its process is told of);
        # a range depends on the index that answered it
        where = [] if pinned else [index, extra]
        return hashlib.sha256(json.dumps([sorted(reqs), *where, arts.python_tag,
                                          sorted(bundled.items())]).encode()).hexdigest()[:32]

    pinned = all(_exact(t) for t in wanted)
    key = key_of(wanted, pinned)
    known = _read_resolution(root / "resolved" / f"{key}.json", None if pinned else RESOLVE_TTL)
    if known is not None:
        wheels = tuple(known)
        folder = root / "sets" / _set_id(wheels)
        if folder.is_dir() and all((root / "wheels" / w.sha256).is_dir() for w in wheels):
            return PackageSet(reqs, wheels, folder, tuple(met))
    wheels = _fetch(wanted, arts, bundled, root, index_url, timeout) if wanted else ()
    folder = _assemble(root, wheels)
    record = json.dumps({"at": time.time(), "wheels": [w.__dict__ for w in wheels]}).encode()
    atomic_write(root / "resolved" / f"{key}.json", record)
    pins = sorted(w.pin for w in wheels)
    if pins != sorted(wanted):  # what opens it again (a worker, a fork, a load) asks by pins
        atomic_write(root / "resolved" / f"{key_of(pins, True)}.json", record)
    return PackageSet(reqs, wheels, folder, tuple(met))


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


def _stubs(arts: Artifacts, bundled: dict[str, str], root: Path) -> Path:
    """Wheels holding only the metadata of each bundled package: what pip resolves a
    dependency on one to (they are never unpacked)."""
    import zipfile

    def build(tmp: Path) -> None:
        lines = []
        for name, version in sorted(bundled.items()):
            dist = name.replace("-", "_")
            with zipfile.ZipFile(tmp / f"{dist}-{version}-py3-none-any.whl", "w") as z:
                info = f"{dist}-{version}.dist-info"
                z.writestr(f"{info}/METADATA",
                           f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
                z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: memex\n"
                           "Root-Is-Purelib: true\nTag: py3-none-any\n")
                z.writestr(f"{info}/RECORD", "")
            lines.append(f"{name}=={version}\n")
        (tmp / "constraints.txt").write_text("".join(lines))

    key = hashlib.sha256(json.dumps(sorted(bundled.items())).encode()).hexdigest()[:16]
    return materialize(root / "bundled" / f"{arts.python_tag}-{key}", build)


def _fetch(wanted: list[str], arts: Artifacts, bundled: dict[str, str], root: Path,
           index_url: str | None, timeout: float) -> tuple[Wheel, ...]:
    import sys
    import tempfile

    stubs = _stubs(arts, bundled, root)
    tag = arts.python_tag  # "315"
    version = f"{tag[0]}.{tag[1:]}"
    env = {k: v for k, v in os.environ.items() if k not in _PIP_ENV_DROPPED}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    (root / "downloads").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root / "downloads") as work:
        dest, tmp, log = Path(work, "wheels"), Path(work, "tmp"), Path(work, "pip.log")
        dest.mkdir()
        tmp.mkdir()
        env["TMPDIR"] = str(tmp)  # pip's files in flight are counted with the wheels
        cmd = [sys.executable, "-m", "pip", "download", "--no-input", "--progress-bar", "off",
               "--no-cache-dir", "--only-binary=:all:", "--platform", "any", "--python-version",
               version, "--implementation", "py", "--abi", "none", "--find-links", str(stubs),
               "--constraint", str(stubs / "constraints.txt"), "--dest", str(dest)]
        if index_url:
            cmd += ["--index-url", index_url]
        with log.open("w+") as out:
            code = _bounded_run([*cmd, "--", *wanted], env, out, (dest, tmp), timeout,
                                ", ".join(wanted))
            out.seek(0)
            text = out.read(1 << 20)
        if code != 0:
            raise PackageError(_why(text, wanted, bundled)) from None
        wheels = []
        for f in sorted(dest.iterdir()):
            w = _admit(f, bundled)
            if w is not None:
                wheels.append(_unpack(f, w, root))
    return tuple(wheels)


def _bounded_run(cmd: list[str], env: dict[str, str], out: IO[str], watched: Sequence[Path],
                 timeout: float, what: str) -> int:
    """pip's exit status, or PackageError once it runs past ``timeout`` or the files under
    ``watched`` pass MAX_DOWNLOAD_BYTES (looked at every 0.1 s and at the end; it is
    killed then)."""
    import subprocess

    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out,
                            stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                code = proc.wait(0.1)
            except subprocess.TimeoutExpired:
                code = None
            if _bytes_under(watched) > MAX_DOWNLOAD_BYTES:
                raise PackageError(f"fetching {what} wrote more than {MAX_DOWNLOAD_BYTES} "
                                   "bytes: refused")
            if code is not None:
                return code
            if time.monotonic() > deadline:
                raise PackageError(f"pip took more than {timeout:.0f} s to fetch {what}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _bytes_under(folders: Sequence[Path]) -> int:
    """Bytes of the files under ``folders`` (pip's own: a few folders deep, a few files)."""
    total = 0
    stack = [str(f) for f in folders]
    while stack:
        with contextlib.suppress(OSError), os.scandir(stack.pop()) as it:
            for e in it:
                with contextlib.suppress(OSError):
                    if e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
                    elif e.is_file(follow_symlinks=False):
                        total += e.stat(follow_symlinks=False).st_size
    return total


def _why(text: str, wanted: list[str], bundled: dict[str, str]) -> str:
    """pip's refusal, said for the guest: which package has no wheel that runs there."""
    missing = re.findall(r"No matching distribution found for ([^\s]+)", text)
    bundle = ", ".join(sorted(n for n in ("numpy", "pandas", "scipy", "matplotlib", "lxml",
                                          "pyyaml", "regex", "pillow", "scikit-learn")
                              if n in bundled))
    if missing:
        return (f"no wheel of {', '.join(missing)} runs in the guest: it needs a pure-Python "
                "wheel (py3-none-any), and a package with native code has none (the guest "
                f"bundles these with native code built for it: {bundle})")
    if "ResolutionImpossible" in text or "conflict" in text.lower():
        tail = "\n".join(line for line in text.splitlines() if line.strip())[-1500:]
        return (f"{', '.join(wanted)} cannot be resolved for the guest alongside its bundled "
                f"packages (fixed at their bundled versions):\n{tail}")
    return f"pip could not fetch {', '.join(wanted)}:\n{text.strip()[-1500:]}"


def _admit(path: Path, bundled: dict[str, str]) -> Wheel | None:
    """The wheel's record if it goes into the set (None: a bundled package's stand-in)."""
    from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

    try:
        name, version, _, tags = parse_wheel_filename(path.name)
    except InvalidWheelFilename:
        raise PackageError(f"pip fetched {path.name}, which is not a wheel") from None
    if canonicalize_name(name) in bundled:
        return None
    if any(t.platform != "any" or t.abi != "none" for t in tags):
        raise PackageError(f"{name} {version}: its wheel {path.name} holds native code, which "
                           "does not run in the guest")
    size = path.stat().st_size
    if size > MAX_WHEEL_BYTES:
        raise PackageError(f"{name} {version}: its wheel is {size} bytes, more than "
                           f"{MAX_WHEEL_BYTES}")
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return Wheel(str(name), str(version), path.name, h.hexdigest(), 0)


def _unpack(path: Path, w: Wheel, root: Path) -> Wheel:
    """The wheel unpacked once per machine under its sha256 (bounded before anything is
    written: file count, sizes, names; native code refused by name)."""
    import shutil
    import stat
    import zipfile

    with zipfile.ZipFile(path) as z:
        infos = z.infolist()
        if len(infos) > MAX_WHEEL_FILES:
            raise PackageError(f"{w.name} {w.version}: {len(infos)} files in its wheel, more "
                               f"than {MAX_WHEEL_FILES}")
        total = 0
        plan: list[tuple[zipfile.ZipInfo, PurePosixPath]] = []
        for info in infos:
            p = PurePosixPath(info.filename)
            if info.is_dir():
                continue
            if p.is_absolute() or ".." in p.parts or "\\" in info.filename or \
                    stat.S_ISLNK(info.external_attr >> 16):
                raise PackageError(f"{w.name} {w.version}: its wheel holds {info.filename!r}, "
                                   "a path outside the package")
            if _NATIVE.search(p.name):
                raise PackageError(f"{w.name} {w.version}: its wheel holds native code "
                                   f"({info.filename}), which does not run in the guest")
            parts = p.parts
            if parts[0].endswith(".data"):  # purelib/platlib go in the root; scripts do not
                if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                    continue
                p = PurePosixPath(*parts[2:])
            total += info.file_size
            plan.append((info, p))
        if total > MAX_UNPACKED_BYTES:
            raise PackageError(f"{w.name} {w.version}: {total} bytes unpacked, more than "
                               f"{MAX_UNPACKED_BYTES}")

        def build(tmp: Path) -> None:
            for info, p in plan:
                dest = tmp.joinpath(*p.parts)
                dest.parent.mkdir(parents=True, exist_ok=True)
                with z.open(info) as src, dest.open("wb") as out:
                    shutil.copyfileobj(src, out, 1 << 20)
                    if out.tell() != info.file_size:
                        raise PackageError(f"{w.name}: {info.filename} is not the size its "
                                           "wheel says")
                dest.chmod(0o444)

        materialize(root / "wheels" / w.sha256, build)
    return Wheel(w.name, w.version, w.filename, w.sha256, total)


def _assemble(root: Path, wheels: Sequence[Wheel]) -> Path:
    """One folder holding every wheel of the set (hard links into the unpacked wheels)."""
    import shutil

    def build(tmp: Path) -> None:
        owner: dict[str, str] = {}
        for w in wheels:
            src = root / "wheels" / w.sha256
            for dirpath, _, files in os.walk(src):
                rel = Path(dirpath).relative_to(src)
                (tmp / rel).mkdir(parents=True, exist_ok=True)
                for f in files:
                    key = str(rel / f)
                    if key in owner:
                        raise PackageError(f"{w.name} and {owner[key]} both hold {key}")
                    owner[key] = w.name
                    try:
                        os.link(Path(dirpath) / f, tmp / rel / f)
                    except OSError:
                        shutil.copy2(Path(dirpath) / f, tmp / rel / f)

    return materialize(root / "sets" / _set_id(wheels), build)
