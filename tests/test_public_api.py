"""The public surface of every package, pinned: a rename, addition or removal must be
deliberate. Also: the root's lazy names resolve to the layers' own objects, importing a layer
loads no layer above it, and ``memex/__init__.pyi`` (what type checkers read) says exactly what
``memex._EXPORTS`` says. After changing ``_EXPORTS``, regenerate the stub with
``MEMEX_WRITE_STUB=1 python -m pytest tests/test_public_api.py -k stub``.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import memex
import memex.errors

PINNED: dict[str, list[str]] = {
    "memex": [
        "Aids", "ArtifactsError", "Backend", "BackendBusy", "Budget", "Checkpoint", "ConfigError",
        "Door", "DoorCall", "DoorContext", "DoorError", "Egress", "EgressDecision", "EgressLimits",
        "EgressPolicy", "EgressRecord", "EgressRule", "EgressSecret", "EndReason", "EvalTask",
        "GateDecision", "GuestException", "GuestFileError", "GuestFileTooLarge", "GuestStartError",
        "Hooks", "ImageError", "LLMClient", "LLMConnectionError", "LLMError", "LLMResponseError",
        "LLMTimeoutError", "Limits", "LocalModel", "LocalModelError", "MCPServerError",
        "MemexAgent", "MemexError", "ModelFileError", "ModelSettings", "ModuleCacheMissing",
        "Mount", "NotGranted", "PackageError", "PolicyError", "RemoteBackend", "Rollout",
        "Sandbox", "SandboxAPI",
        "SandboxClosed", "SandboxError", "SandboxLost", "SandboxSpec", "ScriptedLLM",
        "ServiceError", "SetupError", "Step", "Suite", "Tool", "ToolBudget", "ToolCallRecord",
        "ToolDefinitionError", "ToolHost", "ToolInstallError", "ToolParam", "ToolPolicy",
        "ToolRequest", "ToolSet", "Trajectory", "TreeBudget", "TurnResult", "TurnStatus",
        "Workspace", "__version__", "get_backend", "load_trajectories", "run_eval", "tool",
    ],
    "memex.errors": [
        "ArtifactsError", "BackendBusy", "ConfigError", "GuestFileError", "GuestFileTooLarge",
        "GuestStartError", "ImageError", "LLMConnectionError", "LLMError", "LLMResponseError",
        "LLMTimeoutError",
        "LocalModelError", "MCPServerError", "MemexError", "ModelFileError", "ModuleCacheMissing",
        "NotGranted", "PackageError", "PolicyError", "SandboxClosed", "SandboxError", "SandboxLost",
        "ServiceError",
        "SetupError", "ToolDefinitionError", "ToolInstallError",
    ],
    "memex.runtime_wasm": [
        "AGENT_LIMITS", "INTERPRETER", "KERNEL_LIMITS", "SANDBOX_LIMITS", "Checkpoint", "Door",
        "DoorCall", "DoorContext", "DoorError", "EngineSupport", "GuestException", "GuestFile",
        "GuestKilled", "Limits", "Mount", "OutputListener", "PackageSet", "Sandbox", "SandboxAPI",
        "TurnResult", "TurnStatus", "Wheel", "bundled_packages", "cache_dir", "dirty_tracking",
        "engine_support", "prepare", "resolve_packages", "serving_door",
    ],
    # the runtime's rooms: no public names (the runtime's modules import their modules)
    "memex.runtime_wasm.engine": [],
    "memex.runtime_wasm.files": [],
    "memex.runtime_wasm.images": [],
    "memex.runtime_wasm.packages": [],
    "memex.backends": [
        "BACKENDS", "LOOPBACK_NODE", "Backend", "InProcessBackend", "PoolBackend", "PoolStats",
        "RayBackend", "RemoteBackend", "SubprocessBackend", "get_backend", "init_ray",
        "ray_on_loopback",
    ],
    "memex.client": [
        "Client", "RemoteBackend", "RemoteCheckpoint", "RemoteSandbox",
    ],
    "memex.serving": [
        "ID_PATTERN", "Bounds", "ConnectionGuard", "DurableSession", "EdgeLimits", "EdgeTable",
        "FileModel", "Keeper", "KeyRing", "LimitsModel", "LimitsTable", "PackageGate", "Principal",
        "PrincipalTable", "QuotaExceeded", "Seconds", "SecondsOrZero", "SessionTable", "Shares",
        "Size", "allowed_packages", "bearer_key", "check_key_hashes", "config_error",
        "default_running_turns", "describe_tools", "hash_key", "key_matches", "limits_model",
        "load_tools", "read_toml", "session_fields", "unenforced",
    ],
    "memex.cluster": [],
    "memex.service": [
        "API_VERSION", "MountGrant", "ServiceConfig", "TenantConfig", "check_cluster",
        "check_config", "create_app", "drain_node", "hash_key", "load_config", "serve",
    ],
    "memex.backends.worker": [],
    "memex.host_tools": [
        "ArgumentsInvalid", "DecodeError", "Egress", "EgressDecision", "EgressLimits",
        "EgressPolicy", "EgressRecord", "EgressRule", "EgressSecret", "EncodeError", "Gate",
        "GateDecision", "McpAudio", "McpImage", "McpResource", "McpResourceLink", "RecordFields",
        "ReturnInvalid", "Tool", "ToolBudget", "ToolCallRecord", "ToolHost", "ToolParam",
        "ToolRequest", "ToolSet", "decode", "encode", "tool",
    ],
    "memex.host_tools.egress": [
        "BadURL", "FetchRequest", "Fetcher", "fmt_path", "load_document", "parse_url",
        "system_resolver",
    ],
    "memex.executor": [
        "ActionSpace", "AgentSpec", "Aids", "Budget", "Caps", "EndReason", "Hooks", "MemexAgent",
        "ModelSettings", "Rollout", "SandboxSpec", "Step", "ToolCallInfo", "ToolPolicy",
        "Trajectory", "TreeBudget", "load_trajectories", "render_step", "render_trajectory",
        "save_trajectories",
    ],
    "memex.executor.llm": [
        "DEFAULT_PRICES", "Completion", "LLMClient", "LocalModel", "Price", "ScriptedError",
        "ScriptedLLM", "ScriptedReply", "ScriptedToolCall", "ToolCall", "Usage",
    ],
    "memex.executor.loops": [],
    "memex.executor.spawn": [
        "TreeBudget",
    ],
    "memex.eval": [
        "FAILURE_KINDS", "SUITES", "EvalTask", "FailureClass", "RolloutResult", "Suite", "Summary",
        "Workspace", "audit", "by_task", "export_rollouts", "format_by_task", "format_summaries",
        "grade", "load_audit", "load_results", "load_suite", "load_tasks", "pareto_plot",
        "run_eval", "summarise",
    ],
    "memex.eval.suites": [
        "SUITES",
    ],
    "memex.cli": [
        "build_parser", "main", "run",
    ],
    "memex.integrations": [],
    "memex.integrations.mcp": [
        "BearerAuth", "BridgeConfig", "HttpConfig", "LimitsConfig", "McpConfig", "MountConfig",
        "Session", "SessionError", "Sessions", "SessionsConfig", "build_server", "load_config",
        "load_tools", "serve",
    ],
    "memex.integrations.jupyter": [
        "KernelSettings", "MemexKernel", "install_kernelspec", "kernelspec", "launch",
        "settings_from_args",
    ],
    "memex.integrations.smolagents": [
        "MemexExecutor", "tool_from_smolagents",
    ],
    "memex.integrations.pydantic_ai": [
        "MemexCodeMode", "MemexToolset",
    ],
    "memex.integrations.openai_agents": [
        "MemexCodeMode",
    ],
    "memex.integrations.fastmcp": [
        "MemexSandboxProvider",
    ],
}

INTERNAL: dict[str, list[str]] = {
    "memex.backends.internal": [
        "FILES_CAP", "FILES_ENTRIES", "HEADER", "Account", "Channel", "ChannelClosed",
        "Client", "ClientDoor", "FrameDecoder", "Ledger", "ProcessCheckpoint", "ProcessSandbox",
        "ProtocolError", "RayCheckpoint", "RaySandbox", "RemoteCheckpoint", "RemoteSandbox",
        "TenantQuota", "answer_of", "encode_frame", "error_from_wire", "error_to_wire",
        "limits_from_wire", "limits_to_wire", "mounts_from_wire", "mounts_to_wire",
        "result_from_wire", "result_to_wire", "tmp_files", "tmp_files_from",
    ],
    "memex.cluster.internal": [
        "CONTROL_NAME", "FRONT_LEASE", "SLAB_LEASE", "TOKEN_LEASE", "Answer", "Call",
        "Control", "Done", "Failed", "Granted", "Heard", "Hello", "NotHeld", "Outcome",
        "Raised", "RateTokens", "Refused", "Reply", "RunningSlots", "Slab", "Slots",
        "Started", "Storage", "Tokens", "Wait", "Welcome",
        "checkpoint_key", "from_wire", "session_key", "to_wire",
    ],
    "memex.eval.internal": [
        "EXPORT_FORMATS", "FORMATS", "GRADERS", "AuditVerdict", "EvalRun", "TaskCell",
        "normalise_text", "wilson",
    ],
    "memex.executor.internal": [
        "DEFAULT_LOCAL_MODEL", "MODELS", "NO_OUTPUT", "ModelSpec", "RecordedRequest",
        "TrajectoryWriter", "bound_text", "count_prompt_tokens", "fetch_model",
        "local_model_unavailable", "make_submit_tool", "model_dir", "render_observation",
        "trim_traceback", "verify_model_file",
    ],
    "memex.serving.internal": [
        "KIT_BYTES", "DoorKit", "SlabDoors",
    ],
    "memex.runtime_wasm.internal": [
        "CACHE_PARTS", "GUEST_NICE_ENV", "LIMIT_FIELDS", "Artifacts", "DecodeCost",
        "InterpreterRelease", "Job", "LimitField", "SandboxHandle", "Workers", "atomic_write",
        "cache_report", "cancel_resolutions", "checked_requirements", "checkpoint_from_bytes",
        "checkpoint_from_fds", "checkpoint_to_bytes", "checkpoint_to_fds", "clean_cache",
        "compile_module", "find_artifacts", "fork_count", "fork_each", "guest_nice",
        "http_tls", "load_module", "module_path", "open_from_checkpoint", "parse_seconds",
        "parse_size", "private_dir", "remove_tree", "retry_after", "scratch_dir",
        "script_dependencies", "set_guest_nice", "size_text", "state_dir", "unpack_bounded",
    ],
}
"""What MemEx's own layers use of each other and an application does not (each layer's
``internal`` module, no stability promise): pinned too, so that a change is deliberate, and
kept apart from the public surface above."""

STUB = Path(memex.__file__).with_suffix(".pyi")


@pytest.mark.parametrize("module", sorted(PINNED))
def test_all_is_pinned(module: str) -> None:
    assert importlib.import_module(module).__all__ == PINNED[module]


@pytest.mark.parametrize("module", sorted(INTERNAL))
def test_internal_is_pinned(module: str) -> None:
    assert importlib.import_module(module).__all__ == INTERNAL[module]
    for name in INTERNAL[module]:
        assert hasattr(importlib.import_module(module), name), f"{module}.{name}"


def test_every_internal_module_is_pinned() -> None:
    root = Path(memex.__file__).parent
    found = {".".join(p.relative_to(root.parent).with_suffix("").parts)
             for p in root.rglob("internal.py")}
    assert found == set(INTERNAL)


def test_internal_names_are_not_public() -> None:
    """A name is public (an application's) or internal (MemEx's layers'), never both: no
    public package of its layer exports what its internal module holds."""
    public = {(m, n) for m, names in PINNED.items() for n in names}
    for module, names in INTERNAL.items():
        layer = module.rsplit(".", 1)[0]
        for name in names:
            owners = [m for m, n in public if n == name and (m == layer or
                                                           m.startswith(layer + "."))]
            assert not owners, f"{name} is in {module} and in {owners}"


def test_the_public_surface_is_within_its_budget() -> None:
    """Issue 48's budget: at most 320 pinned public names (every name beyond what users
    touch went to an internal module)."""
    assert sum(len(names) for names in PINNED.values()) <= 320


@pytest.mark.parametrize("module", sorted(PINNED))
def test_every_exported_name_exists(module: str) -> None:
    mod = importlib.import_module(module)
    for name in mod.__all__:
        assert hasattr(mod, name), f"{module}.{name} is exported but missing"


def test_every_package_is_pinned() -> None:
    root = Path(memex.__file__).parent
    packages = {".".join(("memex", *p.parent.relative_to(root).parts))
                for p in root.rglob("__init__.py") if "guest" not in p.parts}
    assert packages | {"memex.errors"} == set(PINNED)  # errors is the one plain module


def test_root_names_are_the_layers_objects() -> None:
    for module, names in memex._EXPORTS.items():
        mod = importlib.import_module(module)
        for name in names:
            assert name in mod.__all__, f"{module}.{name} is not public there"
            assert getattr(memex, name) is getattr(mod, name)
    assert set(memex.__all__) <= set(dir(memex))
    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        memex.NoSuchName  # noqa: B018


def render_stub() -> str:
    """``memex/__init__.pyi`` as ``memex._EXPORTS`` defines it."""
    out = ["# Generated from memex._EXPORTS by tests/test_public_api.py; do not edit by hand.",
           "# Type checkers read this instead of memex/__init__.py, whose lazy names they",
           "# cannot follow.", ""]
    for module, names in memex._EXPORTS.items():
        out.append(f"from {module.removeprefix('memex')} import (")
        out += [f"    {n} as {n}," for n in names]
        out.append(")")
    out += ["", "__version__: str", "__all__: list[str]", ""]
    return "\n".join(out)


def test_stub_matches_exports() -> None:
    want = render_stub()
    if os.environ.get("MEMEX_WRITE_STUB"):
        STUB.write_text(want)
    assert STUB.read_text() == want, ("memex/__init__.pyi is out of date: run "
                                      "MEMEX_WRITE_STUB=1 python -m pytest "
                                      "tests/test_public_api.py -k stub")


def _loaded_after(statement: str) -> list[str]:
    code = (f"import sys\n{statement}\n"
            "import json; print(json.dumps(sorted({'.'.join(m.split('.')[:2]) "
            "for m in sys.modules if m.startswith('memex.')})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    loaded: list[str] = json.loads(out.stdout)
    return loaded


def test_import_memex_loads_only_errors_and_the_runtime() -> None:
    assert _loaded_after("import memex") == ["memex.errors", "memex.runtime_wasm"]


HEAVY = ["anyio", "httpx", "httpx2", "jsonschema", "numpy", "openai", "pandas", "pydantic",
         "pydantic_core", "rich", "yaml",
         # the runtime binds wasmtime's library itself (runtime_wasm/engine/_capi.py): wasmtime-py's
         # Python layer is ~25 ms of import; msgpack waits for the first door frame
         "wasmtime", "msgpack", "zipfile"]


@pytest.mark.parametrize("code", [
    "import memex.runtime_wasm",
    "from memex.cli import main; main(['run', '-c', 'pass'])",
])
def test_the_runtime_and_memex_run_load_no_heavy_module(code: str) -> None:
    """Start-up is paid by every CLI use and MCP host process: the runtime and `memex run`
    import none of the heavy optional libraries."""
    probe = (f"import sys, json\n{code}\n"
             f"top = {{m.split('.')[0] for m in sys.modules}}\n"
             f"print(json.dumps(sorted(top & {set(HEAVY)!r})))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=120, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_memex_run_imports_no_other_command() -> None:
    loaded = _loaded_after("from memex.cli import main; main(['run', '-c', 'pass'])")
    assert "memex.cli" in loaded
    probe = ("import sys\nfrom memex.cli import main; main(['run', '-c', 'pass'])\n"
             "print(sorted(m for m in sys.modules if m.startswith('memex.cli._')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip().splitlines()[-1] == "['memex.cli._common', 'memex.cli._main', " \
        "'memex.cli._run']"


def test_a_lazy_name_loads_its_layer() -> None:
    assert "memex.host_tools" in _loaded_after("import memex; memex.Tool")
    assert "memex.executor" not in _loaded_after("import memex; memex.Tool")


@pytest.mark.parametrize(("layer", "above"), [
    ("memex.runtime_wasm", ["memex.backends", "memex.host_tools", "memex.executor"]),
    ("memex.backends", ["memex.host_tools", "memex.executor"]),
    ("memex.host_tools", ["memex.backends", "memex.executor"]),
])
def test_a_layer_loads_no_layer_above_it(layer: str, above: list[str]) -> None:
    loaded = _loaded_after(f"import {layer}")
    assert not set(loaded) & set(above), loaded


# The documented exception tree: name -> direct parent(s) within MemEx.
ERROR_PARENTS = {
    "ConfigError": "MemexError",
    "SetupError": "MemexError",
    "ArtifactsError": "SetupError",
    "ModuleCacheMissing": "SetupError",
    "SandboxError": "MemexError",
    "SandboxClosed": "SandboxError",
    "GuestStartError": "SandboxError",
    "GuestFileError": "SandboxError",
    "GuestFileTooLarge": "GuestFileError",
    "ImageError": "SandboxError",
    "ToolDefinitionError": "ConfigError",
    "ToolInstallError": "SandboxError",
    "PackageError": "SetupError",
    "NotGranted": "ConfigError",
    "PolicyError": "ConfigError",
    "LocalModelError": "SetupError",
    "ModelFileError": "LocalModelError",
    "SandboxLost": "SandboxError",
    "BackendBusy": "SandboxError",
    "LLMError": "MemexError",
    "LLMConnectionError": "LLMError",
    "LLMTimeoutError": "LLMConnectionError",
    "LLMResponseError": "LLMError",
    "MCPServerError": "MemexError",
}


def test_door_error_is_a_handler_signal_not_a_memex_error() -> None:
    assert issubclass(memex.DoorError, Exception)
    assert not issubclass(memex.DoorError, memex.MemexError)
    err = memex.DoorError("denied", "no", path=["a"])
    assert (err.kind, err.message, err.extra) == ("denied", "no", {"path": ["a"]})


SIGNALS = {
    "DoorError": "raised by a door handler to answer the guest; Door.dispatch always catches it",
    "GuestKilled": "raised in a host function to trap the running turn; never leaves the turn",
    "ChannelClosed": "a worker channel's end, caught by the backends that own the channel",
    "ProtocolError": "a worker channel's bad frame, caught by the backends that own it",
}
"""Exception classes exported that are signals between MemEx's own parts, not errors a user
catches: outside the MemexError tree on purpose."""


def test_every_exported_exception_a_user_catches_is_a_memex_error() -> None:
    """``except MemexError`` catches every exception MemEx raises to its users (the public
    packages' and the internal modules' exports), the named signals aside; the control: the
    walk finds exceptions in several packages, errors of host_tools and serving among them."""
    seen, outside = set(), set()
    for module in [*PINNED, *INTERNAL]:
        mod = importlib.import_module(module)
        for name in mod.__all__:
            obj = getattr(mod, name)
            if isinstance(obj, type) and issubclass(obj, BaseException):
                seen.add(name)
                if not issubclass(obj, memex.MemexError):
                    outside.add(name)
    assert outside == set(SIGNALS)
    assert {"ArgumentsInvalid", "EncodeError", "BadURL", "QuotaExceeded",
            "SandboxClosed"} <= seen


def test_version() -> None:
    assert isinstance(memex.__version__, str)
    assert memex.__version__.count(".") >= 2


@pytest.mark.parametrize("name", PINNED["memex.errors"])
def test_every_error_derives_from_memex_error(name: str) -> None:
    cls = getattr(memex.errors, name)
    assert inspect.isclass(cls)
    assert issubclass(cls, memex.errors.MemexError)
    assert issubclass(cls, Exception)


def test_every_exception_class_in_errors_module_is_exported_and_rooted() -> None:
    classes = {n for n, obj in vars(memex.errors).items()
               if inspect.isclass(obj) and issubclass(obj, BaseException)
               and obj.__module__ == memex.errors.__name__}
    assert classes == set(PINNED["memex.errors"])
    for n in classes:
        assert issubclass(getattr(memex.errors, n), memex.errors.MemexError)


@pytest.mark.parametrize(("child", "parent"), sorted(ERROR_PARENTS.items()))
def test_error_tree(child: str, parent: str) -> None:
    assert getattr(memex.errors, parent) in getattr(memex.errors, child).__mro__[1:]


def test_config_error_is_also_value_error() -> None:
    assert issubclass(memex.ConfigError, ValueError)


def test_sandbox_closed_carries_reason() -> None:
    exc = memex.SandboxClosed("idle timeout")
    assert exc.reason == "idle timeout"
    assert "idle timeout" in str(exc)


def test_turn_status_values() -> None:
    assert {s.name: s.value for s in memex.TurnStatus} == {
        "OK": "ok", "ERROR": "error", "EXIT": "exit", "KILLED": "killed"}


