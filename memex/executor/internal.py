"""What MemEx's other layers use of the executor and an application does not: the
observation helpers the integrations render a turn with, the submit tool and trajectory
writer ``memex eval`` builds on, and the local model's registry, download and checks that
``memex model`` drives. Not a public surface: names here may change in any release. Pinned in
tests/test_public_api.py (``INTERNAL``) so that a change is still deliberate."""

from ._session import make_submit_tool
from ._trajectory import TrajectoryWriter
from .llm._local import (
    DEFAULT_LOCAL_MODEL,
    MODELS,
    ModelSpec,
    fetch_model,
    local_model_unavailable,
    model_dir,
    verify_model_file,
)
from .llm._scripted import RecordedRequest, count_prompt_tokens
from .loops._observe import NO_OUTPUT, bound_text, render_observation, trim_traceback

__all__ = [
    "DEFAULT_LOCAL_MODEL",
    "MODELS",
    "NO_OUTPUT",
    "ModelSpec",
    "RecordedRequest",
    "TrajectoryWriter",
    "bound_text",
    "count_prompt_tokens",
    "fetch_model",
    "local_model_unavailable",
    "make_submit_tool",
    "model_dir",
    "render_observation",
    "trim_traceback",
    "verify_model_file",
]
