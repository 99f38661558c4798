"""``memex mcp``: serve persistent sandboxes to MCP hosts over stdio (the default, for a host
that starts the command) or streamable HTTP; settings from ``--config FILE`` (TOML, see
docs/mcp.md) with flags on top. Needs the ``mcp`` extra."""

from __future__ import annotations

import argparse
import contextlib
import shlex
import sys
from typing import Any

from ..errors import ConfigError
from ._common import size

__all__ = ["add_parser"]

DESCRIPTION = """Serve persistent Python sandboxes to MCP hosts: over stdio (the default, for a
host that starts this command) or streamable HTTP (--http). Settings come from --config FILE
(TOML, see docs/mcp.md), with the flags below on top."""


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    from ..runtime_wasm import Mount

    mounts = []
    for spec in args.mount:
        m = Mount.parse(spec)
        mounts.append({"host": m.host_path, "guest": m.guest_path, "writable": m.writable})
    bridges: list[dict[str, Any]] = []
    for cmd in args.bridge:
        words = shlex.split(cmd)
        if not words:
            raise ConfigError("--bridge takes a command line, got an empty one")
        bridges.append({"command": words[0], "args": words[1:]})
    bridges += [{"url": url} for url in args.bridge_url]
    return {
        "transport": "http" if args.http else None,
        "limits": {"timeout": args.timeout, "memory": args.memory, "fuel": args.fuel},
        "sessions": {"idle_timeout": args.idle_timeout, "total_sessions": args.total_sessions,
                     "max_sessions_per_token": args.max_sessions_per_token,
                     "max_memory_per_token": args.max_memory_per_token,
                     "state_dir": args.state_dir, "save_interval": args.save_interval,
                     "rollback": False if args.no_rollback else None},
        "http": {"host": args.host, "port": args.port, "token_env": args.token_env,
                 "no_auth": True if args.no_auth else None},
        "mounts": mounts or None, "tools": args.tool or None, "bridge": bridges or None,
        "preload": [p for p in (args.preload or "").split(",") if p] or None,
        "policy": args.policy,
    }


def cmd_mcp(args: argparse.Namespace) -> int:
    try:
        from ..integrations.mcp import load_config, serve
    except ImportError as exc:
        raise ConfigError(f"memex mcp needs the MCP SDK: pip install 'memex[mcp]' ({exc})"
                          ) from exc
    config = load_config(args.config, **_overrides(args))

    def ready(url: str) -> None:
        token = f" (bearer token from ${config.http.token_env})" if config.http.token_env \
            else ""
        print(f"memex mcp: serving {url}{token}; Ctrl-C stops it", file=sys.stderr, flush=True)

    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: a normal way to stop it
        serve(config, ready=ready,
              reload=lambda: load_config(args.config, **_overrides(args)))
    return 0


class _Renamed(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        parser.error("--max-sessions is now --total-sessions (the server's sessions in all); "
                     "a principal's own bound is --max-sessions-per-token")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("mcp", help="serve persistent Python sandboxes to MCP hosts (stdio or "
                       "streamable HTTP)", description=DESCRIPTION)
    p.add_argument("--config", default=None, metavar="FILE", help="a TOML configuration")
    p.add_argument("--http", action="store_true", help="streamable HTTP instead of stdio")
    p.add_argument("--host", default=None, help="HTTP address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="HTTP port (default 8765; 0: any)")
    p.add_argument("--token-env", default=None, metavar="VAR",
                   help="require the bearer token held in this environment variable "
                   "(--http needs it, or --no-auth)")
    p.add_argument("--no-auth", action="store_true",
                   help="with --http on a loopback address: serve without a token (every "
                   "local process may then run code; a warning says so)")
    p.add_argument("--timeout", type=float, default=None, help="wall seconds per call")
    p.add_argument("--memory", type=size, default=None, help="guest memory cap (e.g. 512M)")
    p.add_argument("--fuel", type=int, default=None, help="instruction budget per call")
    p.add_argument("--mount", action="append", default=[], metavar="HOST:GUEST[:rw]",
                   help="grant a host folder (read-only unless :rw)")
    p.add_argument("--preload", default=None, metavar="MOD,...",
                   help="start sessions from a warm image with these modules imported")
    p.add_argument("--policy", default=None, metavar="FILE", help="egress policy (TOML/YAML)")
    p.add_argument("--tool", action="append", default=[], metavar="MODULE:ATTR",
                   help="a host tool, list of tools or ToolSet the guest may call")
    p.add_argument("--bridge", action="append", default=[], metavar="'COMMAND ARGS'",
                   help="an MCP server (stdio command) whose tools the guest may call")
    p.add_argument("--bridge-url", action="append", default=[], metavar="URL",
                   help="an MCP server (streamable HTTP) whose tools the guest may call")
    p.add_argument("--idle-timeout", type=float, default=None,
                   help="seconds before an idle session ends (default 300)")
    p.add_argument("--max-sessions", nargs="?", action=_Renamed, help=argparse.SUPPRESS,
                   default=None)  # named here so that no abbreviation takes its place
    p.add_argument("--total-sessions", type=int, default=None, metavar="N",
                   help="sessions of the server in all (default 16; a server-wide bound: "
                   "a principal's own is --max-sessions-per-token)")
    p.add_argument("--state-dir", default=None, metavar="DIR",
                   help="save sessions here: they outlive a restart or a kill -9 (called by "
                   "their session handle)")
    p.add_argument("--save-interval", type=float, default=None, metavar="SECONDS",
                   help="with --state-dir: seconds between saves of a changed session "
                   "(default 30; 0: after every call)")
    p.add_argument("--max-sessions-per-token", type=int, default=None, metavar="N",
                   help="sessions one bearer token (or the stdio host) may hold at once "
                   "(default: --total-sessions)")
    p.add_argument("--max-memory-per-token", type=size, default=None, metavar="BYTES",
                   help="memory limits of its sessions plus held checkpoints one token may "
                   "hold (e.g. 4G; default: no bound)")
    p.add_argument("--no-rollback", action="store_true",
                   help="no per-cell state copy: cheaper cells, but a cell a limit stops resets "
                   "the session instead of being undone")
    p.set_defaults(func=cmd_mcp)
