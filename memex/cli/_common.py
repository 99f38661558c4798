"""What several subcommands share: the sandbox options (limits, mounts, preload), a size
parser, printing a turn's result the way ``python`` would, and exit codes."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..runtime_wasm import Limits, Mount, PackageSet, TurnResult

__all__ = ["add_model_options", "add_sandbox_options", "exit_code", "limits", "llm_from_args",
           "mounts", "preload", "print_result", "seconds", "size"]


def size(text: str) -> int:
    """A byte size from text (512M, 2G, 65536): the runtime's one grammar."""
    from ..errors import ConfigError
    from ..runtime_wasm.internal import parse_size

    try:
        return parse_size(text)
    except ConfigError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 512M, 2G)") from None


def seconds(text: str) -> float:
    """Seconds > 0 from text (30, 1.5, 500ms, 2min): the runtime's one grammar."""
    from ..errors import ConfigError
    from ..runtime_wasm.internal import parse_seconds

    try:
        return parse_seconds(text)
    except ConfigError:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 30, 500ms, "
                                         "2min)") from None


def add_model_options(p: argparse.ArgumentParser, *, max_reply_tokens: int = 768) -> None:
    """Where the model is: an endpoint, else a local model served on 127.0.0.1."""
    p.add_argument("--model", default=None, help="model name at the endpoint (or $MEMEX_MODEL)")
    p.add_argument("--base-url", default=None, help="OpenAI-compatible endpoint "
                   "(or $OPENAI_BASE_URL)")
    p.add_argument("--api-key", default=None, help="(or $OPENAI_API_KEY)")
    p.add_argument("--local-model", default=None, metavar="NAME",
                   help="with no endpoint, the local model served on 127.0.0.1 (default "
                        "qwen-1.5b, fetched once; needs memex[local])")
    p.add_argument("--max-reply-tokens", type=int, default=max_reply_tokens,
                   help="tokens per model reply")
    p.add_argument("--llm-timeout", type=float, default=600.0, help="seconds per model call")


def llm_from_args(args: argparse.Namespace, stack: contextlib.ExitStack, who: str) -> Any:
    """The model client the flags name: the endpoint (``--base-url`` or $OPENAI_BASE_URL),
    else the local model served for the command's duration, as ``./build.sh demo`` does,
    saying so on stderr."""
    from ..executor.internal import DEFAULT_LOCAL_MODEL
    from ..executor.llm import LLMClient, LocalModel

    base_url = args.base_url or os.environ.get("OPENAI_BASE_URL")
    if base_url:
        return LLMClient(model=args.model, base_url=base_url, api_key=args.api_key,
                         max_reply_tokens=args.max_reply_tokens, timeout=args.llm_timeout)
    name = args.local_model or DEFAULT_LOCAL_MODEL
    print(f"memex {who}: no endpoint configured (--base-url, $OPENAI_BASE_URL): serving the "
          f"local model {name} on 127.0.0.1", file=sys.stderr)
    local = stack.enter_context(LocalModel(name))
    return local.client(max_reply_tokens=args.max_reply_tokens, timeout=args.llm_timeout)


def add_sandbox_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--timeout", type=seconds, default=None,
                   help="wall seconds per turn (default: memex.runtime_wasm.SANDBOX_LIMITS, 30)")
    p.add_argument("--memory", type=size, default=None, help="guest memory cap (e.g. 512M)")
    p.add_argument("--fuel", type=int, default=None, help="instruction budget per turn")
    p.add_argument("--disk", type=size, default=None,
                   help="bytes /tmp and writable mounts may hold (default 512M)")
    p.add_argument("--files", type=int, default=None,
                   help="files and folders they may hold (default 10000)")
    p.add_argument("--open-files", type=int, default=None,
                   help="descriptors open at once (default 128)")
    p.add_argument("--mount", action="append", default=[], metavar="HOST:GUEST[:rw]",
                   help="grant a host folder (read-only unless :rw)")
    p.add_argument("--preload", default=None, metavar="MOD,...",
                   help="start from a warm image with these modules imported")
    p.add_argument("--with", dest="packages", action="append", default=[], metavar="PKG",
                   help="a pure-Python package for the guest, as 'tabulate' or "
                        "'tabulate==0.9.0' (repeatable; pip fetches it from your index "
                        "once per machine)")


def limits(args: argparse.Namespace, base: Limits | None = None) -> Limits:
    """The flags given, over ``base`` (default: the sandbox's defaults)."""
    from ..runtime_wasm import Limits

    given = {field: getattr(args, name) for name, field in (
        ("timeout", "timeout"), ("memory", "memory"), ("fuel", "fuel"), ("disk", "disk_bytes"),
        ("files", "disk_files"), ("open_files", "open_files"))
        if getattr(args, name, None) is not None}
    return Limits.from_mapping(given, base=base)


def mounts(specs: Sequence[str]) -> list[Mount]:
    from ..runtime_wasm import Mount

    return [Mount.parse(s) for s in specs]


def preload(args: argparse.Namespace) -> list[str]:
    return [p for p in (args.preload or "").split(",") if p]


def resolved(packages: list[str], disk_bytes: int) -> PackageSet | None:
    """The guest packages a command was asked for, resolved before its sandbox starts, the
    steps shown on stderr once they take more than a second."""
    if not packages:
        return None
    from ..runtime_wasm import resolve_packages
    from ._progress import steps

    with steps("memex") as say:
        return resolve_packages(packages, max_bytes=disk_bytes, progress=say)


def print_result(r: TurnResult, *, echo: bool) -> None:
    """A turn's output as ``python`` shows it: stdout, stderr, the echoed value, the
    traceback; then MemEx's own notes (the limit that stopped it, truncation) on stderr."""
    if r.stdout:
        sys.stdout.write(r.stdout)
        sys.stdout.flush()
    if r.stderr:
        sys.stderr.write(r.stderr)
    if echo and r.value is not None:
        print(r.value, flush=True)
    if r.exception is not None:
        sys.stderr.write(r.exception.traceback or f"{r.exception.type}: {r.exception.message}\n")
        if r.exception.type == "ModuleNotFoundError":
            sys.stderr.write(f"memex: {missing_module_hint(r.exception.message)}\n")
    if r.limit is not None and r.status.value == "killed":
        note = " (state rolled back to the last good turn)" if r.rolled_back else ""
        sys.stderr.write(f"memex: turn stopped by {r.limit}: {r.trap}{note}\n")
    if r.truncated:
        sys.stderr.write(f"memex: output truncated: {', '.join(r.truncated)}\n")
    sys.stderr.flush()


def missing_module_hint(message: str) -> str:
    """How to add a module the guest does not bundle (a pure-Python package from the index:
    its name on the index may differ from the module's)."""
    import re

    m = re.search(r"No module named '([^'.]+)", message)
    name = m.group(1) if m else "NAME"
    return (f"the guest does not bundle {name!r}; a pure-Python package can be added: "
            f"memex run --with {name.replace('_', '-')} (Sandbox(packages=[...]) in Python, "
            "or a '# /// script' dependencies block)")


def exit_code(r: TurnResult) -> int:
    """The guest's exit code for sys.exit(n), 1 for an uncaught exception, 124 when the wall
    deadline stopped it, 125 for another limit."""
    status = r.status.value
    if status == "ok":
        return 0
    if status == "exit":
        return r.exit_code if r.exit_code is not None else 0
    if status == "killed":
        return 124 if r.limit in ("deadline", "lifetime") else 125
    return 1
