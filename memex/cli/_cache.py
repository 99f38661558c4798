"""``memex cache``: what MemEx keeps on disk, with sizes, and cleaning it, as ``pip cache``
and ``uv cache`` do: ``memex cache dir``, ``memex cache info`` (the default), ``memex cache
clean [PART ...]`` (every part but the compiled guest and the models when none is named)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_parser"]

_DEFAULT_CLEAN = ("packages", "warm")
"""What ``memex cache clean`` removes when no part is named: what is made again on use
(the compiled guest and the stdlib take ``memex prepare``, a model its download)."""


def _models() -> tuple[Path, str]:
    from ..executor.internal import model_dir

    return model_dir(), "local model weights (memex model fetch downloads them again)"


def _report() -> list[dict[str, Any]]:
    from ..runtime_wasm.internal import cache_report

    parts = cache_report()
    rows = [{"name": p.name, "paths": [str(x) for x in p.paths], "bytes": p.bytes,
             "files": p.files, "what": p.what} for p in parts]
    folder, what = _models()
    size = files = 0
    if folder.is_dir():
        for f in folder.iterdir():
            if f.is_file():
                size += f.stat().st_blocks * 512
                files += 1
    rows.append({"name": "models", "paths": [str(folder)], "bytes": size, "files": files,
                 "what": what})
    return rows


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"


def cmd_cache(args: argparse.Namespace) -> int:
    from ..runtime_wasm import cache_dir
    from ..runtime_wasm.internal import clean_cache

    action = args.action or "info"
    if action == "dir":
        print(cache_dir())
        return 0
    if action == "info":
        rows = _report()
        if args.json:
            print(json.dumps({"dir": str(cache_dir()), "parts": rows}))
            return 0
        print(f"cache folder: {cache_dir()}")
        w = max(len(str(r["name"])) for r in [*rows, {"name": "total"}])
        for r in rows:
            print(f"  {r['name']:{w}s} {_human(r['bytes']):>10s}  {r['files']:>6d} files  "
                  f"{r['what']}")
        print(f"  {'total':{w}s} {_human(sum(r['bytes'] for r in rows)):>10s}")
        return 0
    parts = tuple(args.parts) or _DEFAULT_CLEAN
    runtime = tuple(p for p in parts if p != "models")
    freed = clean_cache(runtime) if runtime else 0
    if "models" in parts:
        folder, _ = _models()
        for f in folder.iterdir() if folder.is_dir() else ():
            if f.is_file():
                freed += f.stat().st_blocks * 512
                f.unlink()
    print(f"memex cache: removed {_human(freed)} ({', '.join(parts)})", file=sys.stderr)
    return 0


def add_parser(sub: Any) -> None:
    from ..runtime_wasm.internal import CACHE_PARTS

    names = [*CACHE_PARTS, "models"]
    p = sub.add_parser("cache", help="what MemEx keeps on disk (packages, warm images, the "
                       "compiled guest, models), with sizes; and cleaning it")
    p.add_argument("action", nargs="?", choices=["info", "dir", "clean"], default=None,
                   help="info (default): each part and its size; dir: the cache folder; "
                        "clean: remove parts")
    p.add_argument("parts", nargs="*", metavar="PART",
                   help=f"with clean: what to remove, of {', '.join(names)} (default: "
                        f"{' and '.join(_DEFAULT_CLEAN)}; a package set a live sandbox "
                        "holds stays)")
    p.add_argument("--json", action="store_true", help="with info: print JSON")
    p.set_defaults(func=cmd_cache)
