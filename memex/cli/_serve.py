"""``memex serve``: sandboxed sessions as a multi-tenant HTTP service (docs/service.md).
Needs the ``serve`` extra."""

from __future__ import annotations

import argparse
import getpass
import sys
from typing import Any

from ..errors import ConfigError

__all__ = ["add_parser"]

DESCRIPTION = """Serve sandboxed Python sessions over HTTP to many tenants, each with its own
API keys, quotas and limit ceilings (from --config serve.toml; see docs/service.md). Clients
use memex.client.Client or get_backend("remote", url=..., api_key=...)."""


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        from ..service import (
            check_cluster,
            check_config,
            drain_node,
            hash_key,
            load_config,
            serve,
        )
    except ImportError as exc:
        raise ConfigError(f"memex serve needs its extra: pip install 'memex[serve]' ({exc})"
                          ) from exc
    if args.hash_key:
        key = sys.stdin.readline().strip() if not sys.stdin.isatty() else getpass.getpass(
            "API key to hash: ")
        print(hash_key(key))
        return 0
    if args.config is None:
        raise ConfigError("memex serve needs --config serve.toml (docs/service.md)")
    config = load_config(args.config)
    if args.drain is not None or args.undrain is not None:
        if config.cluster is None:
            raise ConfigError("--drain moves sessions between a cluster's nodes: the config "
                              "has no [cluster] table")
        if args.undrain is not None:
            drain_node(config.cluster, args.undrain, undo=True)
            print(f"node {args.undrain}: takes new slabs again")
            return 0
        out = drain_node(config.cluster, args.drain)
        print(f"node {args.drain}: {out['moved']} session(s) moved; it takes no new slab")
        for f in out["failed"]:
            print(f"  not moved: {f['session']}: {f['error']}")
        return 1 if out["failed"] else 0
    if args.check:
        where = f"a Ray cluster ({config.cluster.address})" if config.cluster is not None \
            else f"backend {config.backend} with {config.workers} worker(s), state " + (
                f"in {config.state_dir}" if config.state_dir else "not kept")
        print(f"{args.config}: ok, {where}")
        from ..runtime_wasm.internal import LIMIT_FIELDS, size_text

        sizes = {f.name for f in LIMIT_FIELDS if f.kind == "bytes"}
        for t in config.tenants.values():  # sizes as the config takes them ('512M')
            bounds = ", ".join(f"{k} {v}" for k, v in (
                ("sessions", t.max_sessions),
                ("memory", None if t.max_memory is None else size_text(t.max_memory)),
                ("disk", None if t.max_disk is None else size_text(t.max_disk)),
                ("running", t.max_running), ("turns/s", t.turns_per_second)) if v is not None)
            ceiling = {k: size_text(v) if k in sizes and v is not None else v
                       for k, v in t.ceiling.given().items()}
            print(f"  tenant {t.name}: {len(t.keys)} key(s); {bounds or 'no bounds'}; "
                  f"ceiling {ceiling or 'none'}; {len(t.mounts)} mount grant(s); "
                  f"egress {'policy' if t.egress is not None else 'none'}")
        notes, problems = check_config(config)
        if config.cluster is not None:
            more = check_cluster(config.cluster)
            notes, problems = notes + more[0], problems + more[1]
        for line in notes:
            print(f"  {line}")
        for line in problems:
            print(f"  problem: {line}")
        return 1 if problems else 0
    changes = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    config = config.model_copy(update=changes)
    if not config.tenants:
        print("memex serve: warning: no tenants in the config, every request gets 401",
              file=sys.stderr)

    def ready(url: str) -> None:
        print(f"memex serve: serving {url} for {len(config.tenants)} tenant(s); "
              "Ctrl-C or SIGTERM stops it", file=sys.stderr, flush=True)

    serve(config, ready=ready)
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="serve sandboxed sessions over HTTP to many tenants",
                       description=DESCRIPTION)
    p.add_argument("--config", metavar="FILE", help="serve.toml: server settings and tenants")
    p.add_argument("--host", help="address to bind (default from the config: 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (0: any free one; default 8000)")
    p.add_argument("--check", action="store_true",
                   help="read the config, print what it sets, and exit (no server)")
    p.add_argument("--drain", metavar="NODE_ID",
                   help="on a cluster: move every session off this Ray node (saved there, "
                        "opened on another) and place no new slab on it, then exit")
    p.add_argument("--undrain", metavar="NODE_ID",
                   help="on a cluster: place slabs on this drained node again, then exit")
    p.add_argument("--hash-key", action="store_true",
                   help="read an API key on stdin and print the sha256: form for the config")
    p.set_defaults(func=cmd_serve)
