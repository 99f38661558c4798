"""The package map stays true, checked on the source (not by convention):

* the layers import only downwards: ``runtime_wasm`` no other layer; ``backends`` only
  ``runtime_wasm``; ``host_tools`` neither ``backends`` nor ``executor``; ``serving`` (what
  the network front ends share) the runtime, backends and host tools; ``integrations`` and
  ``eval`` anything but the CLI, the service and each other; ``service`` (``memex serve``)
  the runtime, backends, host tools, ``serving`` and ``cluster`` (the slabs, storage and
  control actor of ``memex serve`` on Ray: the runtime, backends, host tools and
  ``serving``); ``client`` only ``backends``; nothing
  imports the CLI;
  wasmtime only inside the runtime; guest code (every ``guest/`` folder) nothing of the host;
* no import cycle between MemEx modules, counting imports inside functions (the way cycles
  hide) and leaving out ``if TYPE_CHECKING:`` blocks (they never run);
* a private module (``_name``) is imported only from inside its layer (``memex.<layer>``); tests,
  benchmarks and examples use public names, but for the few listed below on purpose (the
  tests of a layer, tests/<layer>/, may use its private modules: white-box tests);
* every third-party package the code imports is declared in pyproject.toml;
* docs/layout.md (the README links it) lists exactly the files under ``memex/``.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import re
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

import memex

ROOT = Path(memex.__file__).resolve().parent
REPO = ROOT.parent

# Import cycles that are allowed, each as the sorted tuple of its modules, with the reason.
# Empty on purpose: a cycle is a design problem to solve (a leaf module, a protocol, a
# function passed in), not to list.
ALLOWED_CYCLES: dict[tuple[str, ...], str] = {}

# Private imports outside their layer that tests, benchmarks and examples make on purpose:
# file -> {private target: why}.
ALLOWED_PRIVATE: dict[str, dict[str, str]] = {
    "bench/runtime.py": {
        "memex.runtime_wasm.images._dirty.TRACKER": "switched off for the whole-copy baseline rows",
        "memex.runtime_wasm.engine._engine.ASYNC_STACK": "the start-up floor's engine settings",
        "memex.runtime_wasm.engine._engine.WASM_STACK": "the start-up floor's engine settings",
        "memex.runtime_wasm.images._lz4": "plain lz4.block on one thread, for the codec's baseline",
        "memex.runtime_wasm._sandbox": "loads decompressed eagerly, for the load's baseline",
        "memex.runtime_wasm._awake.AWAKE": "every sandbox kept awake, for the density baseline",
        "memex.runtime_wasm.engine._engine.turn_started": "the epoch ticker held ticking, for "
                                                          "the idle process's baseline",
        "memex.runtime_wasm.engine._engine.turn_ended": "the same, let go",
    },
    "bench/control.py": {
        "memex.cluster._directory.Entry": "N directory entries made without a Ray cluster",
        "memex.cluster._control._Entry": "the same, in a baseline from before the split",
    },
    "tests/conftest.py": {
        "memex.runtime_wasm.engine._engine": "the tripwire that stops any test from compiling",
    },
    "tests/executor/spawn/test_spawn_spec.py": {
        "memex.host_tools._codec.EXT_RECORD": "the ABI's record ext code in a golden frame",
    },
    "tests/executor/spawn/test_spawn_tree.py": {
        "memex.runtime_wasm._sandbox._LIVE": "the registry of live sandboxes: none may leak",
    },
    "tests/security/test_spawn_flood.py": {
        "memex.runtime_wasm._sandbox._LIVE": "the registry of live sandboxes: none may leak",
    },
}
# (The tests of a layer, tests/<layer>/, are white-box tests of its rooms: they import its
# private modules like the layer's own modules do, without being listed.)


# ---- the import graph ---------------------------------------------------------------------------
def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_guest(path: Path) -> bool:
    return "guest" in path.relative_to(ROOT).parts


HOST_FILES = sorted(p for p in ROOT.rglob("*.py") if not _is_guest(p))
GUEST_FILES = sorted(p for p in ROOT.rglob("*.py") if _is_guest(p))
MODULES = {_module_name(p): p for p in HOST_FILES}


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import that can run: at module level or inside functions and classes, but not
    under ``if TYPE_CHECKING:``."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                stack.extend(child.orelse)
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                yield child
            stack.append(child)


def _package_of(path: Path) -> str:
    name = _module_name(path)
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _targets(path: Path, node: ast.Import | ast.ImportFrom) -> list[str]:
    """What an import statement reaches: a module (``import a.b``) or ``module.name`` for each
    name of a ``from`` import (the name may itself be a submodule)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:
        base = _package_of(path).split(".")
        base = base[: len(base) - node.level + 1]
        mod = ".".join([*base, node.module] if node.module else base)
    else:
        mod = node.module or ""
    return [f"{mod}.{a.name}" for a in node.names]


@functools.cache
def _imports(path: Path) -> tuple[str, ...]:
    """What the file at ``path`` imports (parsed once per run: five tests walk every
    module's imports)."""
    tree = ast.parse(path.read_text(), str(path))
    return tuple(t for node in _import_nodes(tree) for t in _targets(path, node))


def _module_of(target: str) -> str | None:
    """The MemEx module an import target loads (``pkg.mod.name`` -> ``pkg.mod``)."""
    if target in MODULES:
        return target
    parent = target.rpartition(".")[0]
    return parent if parent in MODULES else None


def _edges() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        mods = {_module_of(t) for t in _imports(path)}
        graph[name] = {m for m in mods if m is not None and m != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _a_cycle(graph: dict[str, set[str]], comp: list[str]) -> list[str]:
    """One concrete loop inside a component, for the failure message."""
    members = set(comp)
    start = comp[0]
    path, seen = [start], {start}
    while True:
        nxt = sorted(w for w in graph[path[-1]] if w in members)
        back = next((w for w in nxt if w == start), None)
        if back is not None and len(path) > 1:
            return [*path, start]
        step = next((w for w in nxt if w not in seen), None)
        if step is None:
            return [*path, nxt[0]] if nxt else path
        path.append(step)
        seen.add(step)


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "memex"


# ---- layers -------------------------------------------------------------------------------------
LAYER_RULES = {
    # layer -> the MemEx layers it may import (besides itself and memex.errors)
    "runtime_wasm": set(),
    "backends": {"runtime_wasm"},
    "host_tools": {"runtime_wasm"},
    "executor": {"runtime_wasm", "backends", "host_tools"},
    "serving": {"runtime_wasm", "backends", "host_tools"},
    "integrations": {"runtime_wasm", "backends", "host_tools", "executor", "serving"},
    "eval": {"runtime_wasm", "backends", "host_tools", "executor"},
    "cluster": {"runtime_wasm", "backends", "host_tools", "serving"},
    "service": {"runtime_wasm", "backends", "host_tools", "serving", "cluster"},
    "client": {"backends"},
    "cli": {"runtime_wasm", "backends", "host_tools", "executor", "integrations", "eval",
            "service", "serving", "cluster"},
}


def test_every_module_belongs_to_a_known_layer() -> None:
    known = {*LAYER_RULES, "errors", "memex", "__main__"}
    unknown = sorted(m for m in MODULES if _layer(m) not in known)
    assert not unknown, f"modules outside the layers tests/test_layering.py knows: {unknown}"


@pytest.mark.parametrize("layer", sorted(LAYER_RULES))
def test_layers_import_only_downwards(layer: str) -> None:
    allowed = LAYER_RULES[layer] | {layer, "errors"}
    bad = []
    for name, path in MODULES.items():
        if _layer(name) != layer:
            continue
        for target in _imports(path):
            if target.split(".")[0] != "memex" or target == "memex":
                continue
            if _layer(target) not in allowed:
                bad.append(f"{name} imports {target}")
    assert not bad, f"the {layer} layer may import only {sorted(allowed)}:\n" + "\n".join(bad)


def test_no_layer_imports_the_cli() -> None:
    for name, path in MODULES.items():
        if _layer(name) in ("cli", "__main__"):
            continue
        bad = [t for t in _imports(path) if t == "memex.cli" or t.startswith("memex.cli.")]
        assert not bad, f"{name} imports the CLI: {bad}"


@pytest.mark.slow
def test_no_wasmtime_outside_the_runtime() -> None:
    for name, path in MODULES.items():
        if _layer(name) == "runtime_wasm":
            continue
        bad = [t for t in _imports(path) if t.split(".")[0] == "wasmtime"]
        assert not bad, f"{name} imports {bad}"


def test_guest_folders_are_all_checked() -> None:
    folders = {p.parent.relative_to(ROOT).parts[: p.relative_to(ROOT).parts.index("guest") + 1]
               for p in GUEST_FILES}
    assert {"/".join(f) for f in folders} == {
        "runtime_wasm/guest", "executor/guest", "executor/spawn/guest"}


@pytest.mark.parametrize("path", GUEST_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_guest_code_imports_nothing_from_the_host(path: Path) -> None:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            # relative imports stay inside the guest package itself
            assert "memex_guest" in path.parts, path
        names = (
            [a.name for a in node.names] if isinstance(node, ast.Import)
            else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
            else []
        )
        for name in names:
            assert not name.startswith("memex.") and name != "memex", f"{path}: {name}"


# ---- the runtime's rooms ------------------------------------------------------------------------
RT = "memex.runtime_wasm"
# Each room may import the rooms listed for it and the runtime's leaf modules; the instance,
# the door, the sandbox and what builds on them sit on top and import any room.
ROOMS = {"engine": set(), "files": {"engine"}, "images": {"engine", "files"}}
RUNTIME_LEAVES = {f"{RT}._records", f"{RT}._units", f"{RT}._bounded"}


def _room_of(module: str) -> str | None:
    rest = module.removeprefix(RT + ".").split(".")
    return rest[0] if module.startswith(RT + ".") and rest[0] in ROOMS else None


@pytest.mark.slow
def test_the_runtime_rooms_import_only_downwards() -> None:
    graph = _edges()
    bad = []
    for name, targets in graph.items():
        room = _room_of(name)
        if room is None:
            continue
        for t in targets:
            if not t.startswith(RT) or t in RUNTIME_LEAVES:
                continue
            if _room_of(t) not in {room, *ROOMS[room]}:
                bad.append(f"{name} imports {t}")
    assert not bad, "a runtime room imports above itself:\n" + "\n".join(sorted(bad))
    # the rooms are real: each holds modules, and the top imports them
    assert all(any(_room_of(m) == r for m in graph) for r in ROOMS)
    assert f"{RT}.engine._engine" in graph[f"{RT}._sandbox"]


# ---- cycles -------------------------------------------------------------------------------------
def test_no_import_cycles() -> None:
    graph = _edges()
    found = [c for c in _cycles(graph) if tuple(c) not in ALLOWED_CYCLES]
    shown = "\n".join(" -> ".join(_a_cycle(graph, c)) for c in found)
    assert not found, f"import cycles between MemEx modules:\n{shown}"


def _guest_name(path: Path) -> str:
    """A guest module's name inside the guest: ``memex_guest.tools``, or its file's stem."""
    parts = path.relative_to(ROOT).parts
    if "memex_guest" in parts:
        rest = parts[parts.index("memex_guest"):]
        name = ".".join(rest).removesuffix(".py")
        return name.removesuffix(".__init__")
    return path.stem


def _guest_edges() -> dict[str, set[str]]:
    """The guest modules' import graph (the same rules as the host's: imports inside
    functions count, TYPE_CHECKING blocks do not)."""
    names = {_guest_name(p): p for p in GUEST_FILES}
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(), str(path))
        reached: set[str] = set()
        for node in _import_nodes(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join([*base, node.module] if node.module else base)
                targets = [f"{mod}.{a.name}" for a in node.names]
            else:
                targets = [f"{node.module}.{a.name}" for a in node.names]
            for t in targets:  # a module, else the module holding the name (as _module_of)
                m = t if t in names else t.rpartition(".")[0]
                if m in names and m != name:
                    reached.add(m)
        graph[name] = reached
    return graph


def test_no_import_cycles_in_the_guest() -> None:
    """The guest packages (memex_guest, the agent prelude, the spawn API) have no cycle
    either: records are a leaf (_records), typed values (_typed) import only that, and the
    wire codec (_codec) loads _typed on need."""
    graph = _guest_edges()
    # the graph is built from the real files (a positive control for the check below)
    assert "memex_guest._typed" in graph["memex_guest._codec"]
    assert {"memex_guest._codec", "memex_guest._typed"} <= graph["memex_guest.codec"]
    assert graph["memex_guest._records"] == set()
    found = _cycles(graph)
    shown = "\n".join(" -> ".join(_a_cycle(graph, c)) for c in found)
    assert not found, f"import cycles between guest modules:\n{shown}"


@pytest.mark.slow
def test_allowed_cycles_still_exist() -> None:
    live = {tuple(c) for c in _cycles(_edges())}
    stale = [c for c in ALLOWED_CYCLES if c not in live]
    assert not stale, f"allowed cycles that no longer exist (remove them): {stale}"


def test_the_cycle_check_sees_imports_inside_functions(tmp_path: Path) -> None:
    a = tmp_path / "a.py"
    a.write_text("from __future__ import annotations\nfrom typing import TYPE_CHECKING\n"
                 "if TYPE_CHECKING:\n    import hidden_types\n"
                 "def f():\n    import inner\n    from . import sibling\n")
    tree = ast.parse(a.read_text())
    names = sorted(n for node in _import_nodes(tree) for n in
                   ([x.name for x in node.names] if isinstance(node, ast.Import)
                    else [node.module or "."]))
    assert names == [".", "__future__", "inner", "typing"]
    fake = ROOT / "executor" / "loops" / "_x.py"  # relative imports resolve from its package
    stmt = ast.parse("from .._y import z, w").body[0]
    assert isinstance(stmt, ast.ImportFrom)
    assert _targets(fake, stmt) == ["memex.executor._y.z", "memex.executor._y.w"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _a_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c"]) == [
        "a", "b", "c", "a"]


# ---- private modules ----------------------------------------------------------------------------
def _private_owner(target: str) -> str | None:
    """The package whose private module or name ``target`` is (None: all public)."""
    parts = target.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:i]) if i else None
    return None


def _private_reach(importer: str, targets: tuple[str, ...]) -> list[str]:
    bad = []
    for target in targets:
        if target.split(".")[0] != "memex":
            continue
        owner = _private_owner(target)
        if owner is None:
            continue
        # private means private to the layer (memex.<layer>): its modules import each other
        # freely; a private name of the root package stays the root's
        scope = ".".join(owner.split(".")[:2])
        if importer != scope and not importer.startswith(scope + "."):
            bad.append(target)
    return bad


@pytest.mark.slow
def test_private_modules_are_imported_only_inside_their_layer() -> None:
    bad = []
    for name, path in MODULES.items():
        bad += [f"{name} imports {t}" for t in _private_reach(name, _imports(path))]
    assert not bad, ("a layer's private modules are for that layer only; promote the seam "
                     "to its public surface instead:\n" + "\n".join(bad))


def _outside_files() -> list[Path]:
    return sorted(p for d in ("tests", "bench", "examples") for p in (REPO / d).rglob("*.py"))


def _tester(path: Path) -> str:
    """Whom a file outside the package imports as: the tests of a layer (tests/<layer>/,
    white-box tests of its rooms) as that layer; everything else as an outsider."""
    parts = path.relative_to(REPO).parts
    if parts[0] == "tests" and len(parts) > 2 and (ROOT / parts[1]).is_dir():
        return f"memex.{parts[1]}.<tests>"
    return "<outside>"


def test_tests_benchmarks_and_examples_use_public_names() -> None:
    bad, used = [], set()
    for path in _outside_files():
        rel = str(path.relative_to(REPO))
        allowed = ALLOWED_PRIVATE.get(rel, {})
        for target in _private_reach(_tester(path), _imports(path)):
            if any(target == a or target.startswith(a + ".") for a in allowed):
                used.add((rel, next(a for a in allowed
                                    if target == a or target.startswith(a + "."))))
                continue
            bad.append(f"{rel} imports {target}")
    assert not bad, "\n".join(bad)
    unused = [f"{f}: {t}" for f, ts in ALLOWED_PRIVATE.items() for t in ts if (f, t) not in used]
    assert not unused, f"allowed private imports no longer made (remove them): {unused}"


def test_private_import_rule() -> None:
    assert _private_owner("memex.executor.llm._client._retry_after") == "memex.executor.llm"
    assert _private_owner("memex.executor.llm.LLMClient") is None
    assert _private_reach("memex.executor.loops._code", ["memex.executor._trajectory"]) == []
    # inside one layer, private modules are shared: the runtime's rooms, executor's packages
    assert _private_reach("memex.executor._run", ["memex.executor.loops._code"]) == []
    assert _private_reach("memex.runtime_wasm._sandbox",
                          ["memex.runtime_wasm.engine._engine.load_module"]) == []
    # across layers they are not, neighbours or not
    assert _private_reach("memex.service._config", ["memex.serving._settings.Size"]) == [
        "memex.serving._settings.Size"]
    assert _private_reach("<outside>", ["memex.executor._run"]) == ["memex.executor._run"]
    assert _private_reach("memex.cli._run", ["memex.runtime_wasm.engine._engine.FLAVOURS"]) == [
        "memex.runtime_wasm.engine._engine.FLAVOURS"]


# ---- third-party imports ------------------------------------------------------------------------
def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared() -> set[str]:
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    reqs = list(meta["dependencies"])
    for extra in meta.get("optional-dependencies", {}).values():
        reqs += extra
    return {_norm(re.match(r"[A-Za-z0-9_.-]+", r).group(0)) for r in reqs}  # type: ignore[union-attr]


@pytest.mark.slow
def test_every_third_party_import_is_declared() -> None:
    dists = importlib.metadata.packages_distributions()
    declared = _declared()
    missing = []
    for name, path in MODULES.items():
        for target in _imports(path):
            top = target.split(".")[0]
            if top in sys.stdlib_module_names or top in ("memex", "__future__", ""):
                continue
            owners = {_norm(d) for d in dists.get(top, [top])}
            if not owners & declared:
                missing.append(f"{name} imports {top} ({', '.join(sorted(owners))})")
    assert not missing, "undeclared third-party imports:\n" + "\n".join(sorted(set(missing)))


# ---- docs/layout.md ------------------------------------------------------------------------------
def _layout_entries() -> list[tuple[str, str]]:
    """(path, description) of each line of docs/layout.md's file list."""
    text = (REPO / "docs" / "layout.md").read_text()
    block = text.split("```", 2)[1]
    entries: list[tuple[str, str]] = []
    stack: list[str] = []
    for line in block.splitlines():
        if not line.strip():
            continue
        indent = (len(line) - len(line.lstrip(" "))) // 2
        name, _, desc = line.strip().partition(" ")
        if not name.endswith(("/", ".py", ".pyi", ".typed")) and entries:
            # a continuation of the previous line's description
            path, prev = entries[-1]
            entries[-1] = (path, f"{prev} {line.strip()}")
            continue
        del stack[indent:]
        path = "".join(stack) + name
        entries.append((path, desc.strip()))
        if name.endswith("/"):
            stack.append(name)
    return entries


def test_readme_layout_lists_every_file_of_the_package() -> None:
    entries = _layout_entries()
    listed = {p for p, _ in entries if p.startswith("memex/") and not p.endswith("/")}
    actual = {str(p.relative_to(REPO)) for p in ROOT.rglob("*")
              if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}
    assert sorted(actual - listed) == [], "files missing from docs/layout.md"
    assert sorted(listed - actual) == [], "docs/layout.md lists files that do not exist"
    folders = {p for p, _ in entries if p.endswith("/")}
    for f in folders:
        assert (REPO / f).is_dir(), f"docs/layout.md lists {f}, which does not exist"
    empty = [p for p, d in entries if not d]
    assert not empty, f"Layout lines without a description: {empty}"


def test_test_files_have_unique_names() -> None:
    """pytest imports test files by basename (no packages under tests/): two test files with
    one name make the second fail to collect."""
    names = [p.name for p in (ROOT.parent / "tests").rglob("test_*.py")]
    assert len(names) > 30
    assert sorted(n for n in set(names) if names.count(n) > 1) == []
