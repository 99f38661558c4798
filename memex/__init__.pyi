# Generated from memex._EXPORTS by tests/test_public_api.py; do not edit by hand.
# Type checkers read this instead of memex/__init__.py, whose lazy names they
# cannot follow.

from .errors import (
    ArtifactsError as ArtifactsError,
    BackendBusy as BackendBusy,
    ConfigError as ConfigError,
    GuestFileError as GuestFileError,
    GuestFileTooLarge as GuestFileTooLarge,
    GuestStartError as GuestStartError,
    ImageError as ImageError,
    LLMConnectionError as LLMConnectionError,
    LLMError as LLMError,
    LLMResponseError as LLMResponseError,
    LLMTimeoutError as LLMTimeoutError,
    LocalModelError as LocalModelError,
    MCPServerError as MCPServerError,
    MemexError as MemexError,
    ModelFileError as ModelFileError,
    ModuleCacheMissing as ModuleCacheMissing,
    NotGranted as NotGranted,
    PackageError as PackageError,
    PolicyError as PolicyError,
    SandboxClosed as SandboxClosed,
    SandboxError as SandboxError,
    SandboxLost as SandboxLost,
    ServiceError as ServiceError,
    SetupError as SetupError,
    ToolDefinitionError as ToolDefinitionError,
    ToolInstallError as ToolInstallError,
)
from .runtime_wasm import (
    Checkpoint as Checkpoint,
    Door as Door,
    DoorCall as DoorCall,
    DoorContext as DoorContext,
    DoorError as DoorError,
    GuestException as GuestException,
    Limits as Limits,
    Mount as Mount,
    Sandbox as Sandbox,
    SandboxAPI as SandboxAPI,
    TurnResult as TurnResult,
    TurnStatus as TurnStatus,
)
from .backends import (
    Backend as Backend,
    RemoteBackend as RemoteBackend,
    get_backend as get_backend,
)
from .host_tools import (
    Egress as Egress,
    EgressDecision as EgressDecision,
    EgressLimits as EgressLimits,
    EgressPolicy as EgressPolicy,
    EgressRecord as EgressRecord,
    EgressRule as EgressRule,
    EgressSecret as EgressSecret,
    GateDecision as GateDecision,
    Tool as Tool,
    ToolBudget as ToolBudget,
    ToolCallRecord as ToolCallRecord,
    ToolHost as ToolHost,
    ToolParam as ToolParam,
    ToolRequest as ToolRequest,
    ToolSet as ToolSet,
    tool as tool,
)
from .executor import (
    Aids as Aids,
    Budget as Budget,
    EndReason as EndReason,
    Hooks as Hooks,
    MemexAgent as MemexAgent,
    ModelSettings as ModelSettings,
    Rollout as Rollout,
    SandboxSpec as SandboxSpec,
    Step as Step,
    ToolPolicy as ToolPolicy,
    Trajectory as Trajectory,
    TreeBudget as TreeBudget,
    load_trajectories as load_trajectories,
)
from .executor.llm import (
    LLMClient as LLMClient,
    LocalModel as LocalModel,
    ScriptedLLM as ScriptedLLM,
)
from .eval import (
    EvalTask as EvalTask,
    Suite as Suite,
    Workspace as Workspace,
    run_eval as run_eval,
)

__version__: str
__all__: list[str]
