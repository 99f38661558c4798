"""Figures of the code's structure, side by side with a baseline revision (issue 31's
before/after): where the turn-timeout default is written, size parsers, parameters typed
``Any``, pinned public names, modules per room of the runtime and its import levels; and
issue 46's: where Limits' fields are written out, the front ends' modules that authenticate
on their own, and serve's config dataclasses that repeat a config-file model.

    python bench/structure.py [--base REV]   # REV: a git revision, default HEAD~0's parent

The baseline is read with ``git archive`` into a temporary folder; nothing is imported from
either tree (the figures come from the source's syntax)."""

from __future__ import annotations

import argparse
import ast
import io
import re
import subprocess
import tarfile
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TIMEOUTS = {30, 60, 600}


def _py(root: Path) -> list[Path]:
    return sorted(p for p in (root / "memex").rglob("*.py") if "/guest/" not in p.as_posix())


def _trees(root: Path) -> dict[Path, ast.Module]:
    return {p: ast.parse(p.read_text(), str(p)) for p in _py(root)}


def _num(node: ast.AST | None) -> float | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) \
            and not isinstance(node.value, bool):
        return float(node.value)
    return None


def timeout_defaults(trees: dict[Path, ast.Module]) -> Counter[float]:
    """Turn-timeout defaults written as a number: ``Limits(timeout=N)``, ``--timeout``
    options with ``default=N``, and a ``timeout`` field or parameter defaulting to 30, 60 or
    600 in the limits' own record and configs."""
    out: Counter[float] = Counter()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = node.func.id if isinstance(node.func, ast.Name) else (
                    node.func.attr if isinstance(node.func, ast.Attribute) else "")
                kws = {k.arg: k.value for k in node.keywords}
                if name == "Limits" and (v := _num(kws.get("timeout"))) is not None:
                    out[v] += 1
                if name == "add_argument" and node.args and isinstance(node.args[0],
                                                                       ast.Constant) \
                        and node.args[0].value == "--timeout" \
                        and (v := _num(kws.get("default"))) is not None:
                    out[v] += 1
            if isinstance(node, ast.ClassDef) and node.name in ("Limits", "LimitsConfig"):
                for st in node.body:
                    if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) \
                            and st.target.id == "timeout":
                        v = _num(st.value)
                        if v is None and isinstance(st.value, ast.Call):
                            v = _num({k.arg: k.value for k in st.value.keywords}.get("default"))
                        if v in TIMEOUTS:
                            out[v] += 1
            if isinstance(node, ast.FunctionDef) and node.name in ("kernelspec",):
                a = node.args
                for arg, d in zip(a.kwonlyargs, a.kw_defaults, strict=True):
                    if arg.arg == "timeout" and _num(d) in TIMEOUTS:
                        out[_num(d) or 0.0] += 1
    return out


def size_parsers(root: Path) -> int:
    """Functions that turn text like '512M' into bytes (a unit table of K/M/G), a module-level
    table counting as one parser."""
    n = 0
    unit = re.compile(r"['\"][Mm]['\"]\s*:\s*1 << 20")
    for p in _py(root):
        tree = ast.parse(p.read_text())
        n += sum(1 for node in tree.body if isinstance(node, ast.Assign)
                 and unit.search(ast.unparse(node)))
        n += sum(1 for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
                 and unit.search(ast.unparse(node)))
    return n


def any_params(trees: dict[Path, ast.Module]) -> int:
    n = 0
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                a = node.args
                for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
                    if arg is not None and isinstance(arg.annotation, ast.Name) \
                            and arg.annotation.id == "Any":
                        n += 1
    return n


def public_names(root: Path, table: str = "PINNED") -> tuple[int, int]:
    """(names pinned in tests/test_public_api.py's ``table``, modules pinned): ``PINNED`` is
    the public surface, ``INTERNAL`` the layers' internal modules (kept apart from it)."""
    tree = ast.parse((root / "tests/test_public_api.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                and node.target.id == table and isinstance(node.value, ast.Dict):
            lists = [v for v in node.value.values if isinstance(v, ast.List)]
            return sum(len(v.elts) for v in lists), len(lists)
    return 0, 0


def rooms(root: Path) -> dict[str, int]:
    rt = root / "memex/runtime_wasm"
    out: dict[str, int] = {}
    for p in rt.rglob("*.py"):
        rel = p.relative_to(rt)
        if rel.parts[0] == "guest":
            continue
        room = "runtime_wasm" if len(rel.parts) == 1 else "runtime_wasm/" + rel.parts[0]
        out[room] = out.get(room, 0) + 1
    return out


def import_levels(root: Path) -> int:
    """The longest chain of module-level imports between the runtime's own modules."""
    rt = root / "memex/runtime_wasm"
    mods = {}
    for p in rt.rglob("*.py"):
        rel = p.relative_to(rt)
        if rel.parts[0] == "guest":
            continue
        name = ".".join(rel.with_suffix("").parts).removesuffix(".__init__").removesuffix(
            "__init__")
        mods[name] = p
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        pkg = m.split(".")[:-1] if p.name != "__init__.py" else m.split(".")
        pkg = [x for x in pkg if x]
        for node in ast.parse(p.read_text()).body:
            if isinstance(node, ast.ImportFrom) and node.level:
                base = pkg[: len(pkg) - (node.level - 1)] if node.level > 1 else pkg
                if node.level - 1 > len(pkg):
                    continue
                target = ".".join([*base, *(node.module or "").split(".")]).strip(".")
                for cand in [target, *(f"{target}.{a.name}".strip(".") for a in node.names)]:
                    if cand in mods and cand != m:
                        edges[m].add(cand)
    depth: dict[str, int] = {}

    def level(m: str, seen: frozenset[str] = frozenset()) -> int:
        if m in depth:
            return depth[m]
        if m in seen:
            return 0
        d = 1 + max((level(t, seen | {m}) for t in edges[m]), default=0)
        depth[m] = d
        return d

    return max(level(m) for m in mods)


LIMIT_NAMES = {"timeout", "memory", "fuel", "fuel_total", "stdout_bytes", "stderr_bytes",
               "idle_timeout", "lifetime", "disk_bytes", "disk_files", "open_files"}
FRONTS = ("memex/service", "memex/serving", "memex/integrations", "memex/cli")


def _fields(node: ast.ClassDef) -> set[str]:
    return {st.target.id for st in node.body
            if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)}


def limits_declared(trees: dict[Path, ast.Module]) -> list[str]:
    """Classes that write out three or more of Limits' fields (Limits itself included):
    each is a declaration of Limits' fields that must be kept in step by hand."""
    out = []
    for p, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and len(_fields(node) & LIMIT_NAMES) >= 3:
                out.append(f"{node.name} ({p.name})")
    return sorted(out)


def auth_modules(root: Path, trees: dict[Path, ast.Module]) -> list[str]:
    """Modules of the front ends that compare a presented key or token themselves
    (``hmac.compare_digest``): each is an authentication scheme of its own."""
    out = []
    for p, tree in trees.items():
        rel = p.relative_to(root).as_posix()
        if not rel.startswith(FRONTS):
            continue
        if any(isinstance(n, ast.Attribute) and n.attr == "compare_digest"
               for n in ast.walk(tree)):
            out.append(rel.removeprefix("memex/"))
    return sorted(out)


_WHO = {"tenant", "owner", "principal", "who", "name"}


def ledgers(root: Path, trees: dict[Path, ast.Module]) -> list[str]:
    """Classes that keep per-principal counts of their own: an attribute of the instance
    changed under a principal's name (``self.x[tenant] += 1``, ``self.x[owner] = ...``,
    ``self.x.setdefault(tenant, ...)``, ``self.x.pop(owner)``). Each is a ledger of its
    own; a lookup of configured bounds by name is not one."""
    out = []

    def who_of_self(target: ast.expr, key: ast.expr) -> bool:
        return isinstance(key, ast.Name) and key.id in _WHO and \
            isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and \
            target.value.id == "self" and "slab" not in target.attr  # slabs: by their name

    for p, tree in trees.items():
        rel = p.relative_to(root).as_posix()
        if not rel.startswith((*FRONTS, "memex/backends")):
            continue  # where principals are served
        rel = rel.removeprefix("memex/")
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            if cls.name == "Ledger":
                continue  # the one
            for n in ast.walk(cls):
                changed = False
                if isinstance(n, ast.AugAssign | ast.Assign | ast.Delete):
                    targets = n.targets if isinstance(n, ast.Assign | ast.Delete) \
                        else [n.target]
                    changed = any(isinstance(t, ast.Subscript) and who_of_self(t.value, t.slice)
                                  for t in targets)
                elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and \
                        n.func.attr in ("setdefault", "pop", "add", "discard") and n.args:
                    changed = who_of_self(n.func.value, n.args[0])
                if changed:
                    out.append(f"{cls.name} ({rel})")
                    break
    return sorted(set(out))


def _is_dataclass(node: ast.ClassDef) -> bool:
    return any("dataclass" in ast.unparse(d) for d in node.decorator_list)


def config_twins(root: Path, trees: dict[Path, ast.Module]) -> tuple[int, int]:
    """(dataclasses of the service's config that repeat a config-file model's fields, the
    fields repeated): a dataclass in memex/service whose fields are, for half or more and at
    least three, the fields of a pydantic model of the config files (a class deriving from
    FileModel, anywhere in the package)."""
    models: list[set[str]] = []
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and any(
                    isinstance(b, ast.Name) and b.id in ("FileModel", "PrincipalTable")
                    for b in node.bases):
                models.append(_fields(node))
    twins = repeated = 0
    for p, tree in trees.items():
        if not p.relative_to(root).as_posix().startswith("memex/service"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and _is_dataclass(node):
                mine = _fields(node)
                best = max((len(mine & m) for m in models), default=0)
                if best >= 3 and best * 2 >= len(mine):
                    twins += 1
                    repeated += best
    return twins, repeated


def figures(root: Path) -> dict[str, str]:
    trees = _trees(root)
    t = timeout_defaults(trees)
    names, packages = public_names(root)
    inner, modules = public_names(root, "INTERNAL")
    r = rooms(root)
    return {
        "turn-timeout defaults written": f"{sum(t.values())} "
        f"({', '.join(f'{v:g} s: {n}' for v, n in sorted(t.items()))})",
        "size parsers": str(size_parsers(root)),
        "parameters typed Any": str(any_params(trees)),
        "public names pinned": f"{names} in {packages} packages",
        "internal names pinned": f"{inner} in {modules} internal modules (not public)",
        "runtime rooms (modules)": ", ".join(f"{k} {v}" for k, v in sorted(r.items())),
        "runtime import levels": str(import_levels(root)),
        "Limits' fields declared in": ", ".join(limits_declared(trees)),
        "authentication modules": ", ".join(auth_modules(root, trees)) or "none",
        "config dataclass twins": "{} ({} fields twice)".format(*config_twins(root, trees)),
        "per-principal ledgers": (lambda found: f"{len(found)}: " + ", ".join(found))(
            ledgers(root, trees)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="f726a08",
                    help="the baseline revision (default: the tree before issue 31)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        blob = subprocess.run(["git", "-C", str(REPO), "archive", args.base, "memex", "tests"],
                              check=True, capture_output=True).stdout
        with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
            tar.extractall(tmp, filter="data")
        before = figures(Path(tmp))
    after = figures(REPO)
    w = max(map(len, before))
    print(f"{'figure':<{w}}  {args.base:<40}  working tree")
    for k in before:
        print(f"{k:<{w}}  {before[k]:<40}  {after[k]}")


if __name__ == "__main__":
    main()
