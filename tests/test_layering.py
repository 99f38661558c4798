"""The package map in the README stays true: checked on the source, not by convention."""

from __future__ import annotations

import ast
from pathlib import Path

import memex

ROOT = Path(memex.__file__).resolve().parent


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    pkg = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts[:-1])
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            found.add(mod)
            found.update(f"{mod}.{a.name}" for a in node.names)
    return found


def _files(sub: str) -> list[Path]:
    files = sorted((ROOT / sub).rglob("*.py"))
    assert files, sub
    return files


def test_runtime_imports_neither_tools_nor_executor() -> None:
    for path in _files("runtime_wasm"):
        bad = {m for m in _imports(path) if m.startswith(("memex.host_tools", "memex.executor"))}
        assert not bad, f"{path} imports {bad}"


def test_host_tools_does_not_import_executor() -> None:
    for path in _files("host_tools"):
        bad = {m for m in _imports(path) if m.startswith("memex.executor")}
        assert not bad, f"{path} imports {bad}"


def test_guest_code_imports_nothing_from_the_host() -> None:
    for path in _files("runtime_wasm/guest"):
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


def test_no_layer_imports_the_cli() -> None:
    for path in ROOT.rglob("*.py"):
        if path.name in ("cli.py", "__main__.py"):
            continue
        bad = {m for m in _imports(path) if m == "memex.cli" or m.startswith("memex.cli.")}
        assert not bad, f"{path} imports the CLI"


def test_no_wasmtime_outside_the_runtime() -> None:
    for path in ROOT.rglob("*.py"):
        if "runtime_wasm" in path.parts:
            continue
        bad = {m for m in _imports(path) if m.split(".")[0] == "wasmtime"}
        assert not bad, f"{path} imports {bad}"
