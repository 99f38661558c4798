"""The public surface of the package, pinned: a rename or removal must be deliberate."""

from __future__ import annotations

import importlib
import inspect

import pytest

import memex
import memex.errors
import memex.host_tools
import memex.runtime_wasm

MEMEX_ALL = [
    "Aids",
    "ArtifactsError",
    "BackendBusy",
    "Budget",
    "Checkpoint",
    "ConfigError",
    "Door",
    "DoorCall",
    "DoorContext",
    "DoorError",
    "Egress",
    "EgressDecision",
    "EgressLimits",
    "EgressPolicy",
    "EgressRecord",
    "EgressRule",
    "EgressSecret",
    "GateDecision",
    "GuestException",
    "GuestFileError",
    "GuestStartError",
    "ImageError",
    "LLMClient",
    "LLMConnectionError",
    "LLMError",
    "LLMResponseError",
    "LLMTimeoutError",
    "Limits",
    "LocalModel",
    "LocalModelError",
    "MemexAgent",
    "MemexError",
    "ModelFileError",
    "ModuleCacheMissing",
    "Mount",
    "PolicyError",
    "Rollout",
    "Sandbox",
    "SandboxClosed",
    "SandboxError",
    "SandboxLost",
    "ScriptedLLM",
    "SetupError",
    "Step",
    "Tool",
    "ToolBudget",
    "ToolCallRecord",
    "ToolDefinitionError",
    "ToolHost",
    "ToolInstallError",
    "ToolParam",
    "ToolRequest",
    "ToolSet",
    "Trajectory",
    "TreeBudget",
    "TurnResult",
    "TurnStatus",
    "__version__",
    "get_backend",
    "load_trajectories",
    "tool",
]

# Names memex re-exports lazily (imported on first access), by the submodule defining them.
MEMEX_LAZY = {
    "memex.host_tools": [
        "GateDecision", "Tool", "ToolBudget", "ToolCallRecord", "ToolHost", "ToolParam",
        "ToolRequest", "ToolSet", "tool", "Egress", "EgressDecision", "EgressLimits",
        "EgressPolicy", "EgressRecord", "EgressRule", "EgressSecret",
    ],
    "memex.executor": [
        "Aids", "Budget", "LLMClient", "LocalModel", "MemexAgent", "Rollout",
        "ScriptedLLM", "Step", "Trajectory", "TreeBudget", "get_backend",
        "load_trajectories",
    ],
}

RUNTIME_ALL = [
    "Checkpoint",
    "Door",
    "DoorCall",
    "DoorContext",
    "DoorError",
    "GuestException",
    "Limits",
    "Mount",
    "Sandbox",
    "SandboxAPI",
    "TurnResult",
    "TurnStatus",
    "compile_module",
    "load_module",
    "module_path",
]

ERRORS_ALL = [
    "ArtifactsError",
    "BackendBusy",
    "ConfigError",
    "GuestFileError",
    "GuestStartError",
    "ImageError",
    "LLMConnectionError",
    "LLMError",
    "LLMResponseError",
    "LLMTimeoutError",
    "LocalModelError",
    "MemexError",
    "ModelFileError",
    "ModuleCacheMissing",
    "PolicyError",
    "SandboxClosed",
    "SandboxError",
    "SandboxLost",
    "SetupError",
    "ToolDefinitionError",
    "ToolInstallError",
]

HOST_TOOLS_ALL = [
    "Egress",
    "EgressDecision",
    "EgressLimits",
    "EgressPolicy",
    "EgressRecord",
    "EgressRule",
    "EgressSecret",
    "GateDecision",
    "Tool",
    "ToolBudget",
    "ToolCallRecord",
    "ToolHost",
    "ToolParam",
    "ToolRequest",
    "ToolSet",
    "tool",
]

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
    "ImageError": "SandboxError",
    "ToolDefinitionError": "ConfigError",
    "ToolInstallError": "SandboxError",
    "PolicyError": "ConfigError",
    "LocalModelError": "SetupError",
    "ModelFileError": "LocalModelError",
    "SandboxLost": "SandboxError",
    "BackendBusy": "SandboxError",
    "LLMError": "MemexError",
    "LLMConnectionError": "LLMError",
    "LLMTimeoutError": "LLMConnectionError",
    "LLMResponseError": "LLMError",
}


def test_memex_all_is_pinned() -> None:
    assert memex.__all__ == MEMEX_ALL


def test_runtime_wasm_all_is_pinned() -> None:
    assert memex.runtime_wasm.__all__ == RUNTIME_ALL


def test_errors_all_is_pinned() -> None:
    assert memex.errors.__all__ == ERRORS_ALL


def test_host_tools_all_is_pinned() -> None:
    assert memex.host_tools.__all__ == HOST_TOOLS_ALL


@pytest.mark.parametrize("module", [memex, memex.runtime_wasm, memex.errors, memex.host_tools])
def test_every_exported_name_exists(module: object) -> None:
    for name in module.__all__:  # type: ignore[attr-defined]
        assert hasattr(module, name), f"{module.__name__}.{name} is exported but missing"  # type: ignore[attr-defined]


def test_top_level_names_are_the_runtime_objects() -> None:
    for name in set(MEMEX_ALL) & set(RUNTIME_ALL):
        assert getattr(memex, name) is getattr(memex.runtime_wasm, name)
    for name in set(ERRORS_ALL) & set(MEMEX_ALL):
        assert getattr(memex, name) is getattr(memex.errors, name)
    for name in set(HOST_TOOLS_ALL) & set(MEMEX_ALL):
        assert getattr(memex, name) is getattr(memex.host_tools, name)


def test_lazy_names_are_pinned_and_listed() -> None:
    lazy = dict(memex._LAZY)
    assert lazy == {n: mod for mod, names in MEMEX_LAZY.items() for n in names}
    assert set(lazy) <= set(memex.__all__)
    assert set(memex.__all__) <= set(dir(memex))
    for name, mod in lazy.items():
        assert getattr(memex, name) is getattr(importlib.import_module(mod), name)
    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        memex.NoSuchName  # noqa: B018


def test_import_memex_does_not_import_lazy_layers() -> None:
    import subprocess
    import sys

    code = (
        "import sys, memex\n"
        "lazy = sorted(set(memex._LAZY.values()))\n"
        "before = [m for m in lazy if m in sys.modules]\n"
        "names = [n for n in dir(memex) if n in memex._LAZY]\n"
        "tool = memex.Tool\n"
        "print(before, len(names) == len(memex._LAZY), 'memex.host_tools' in sys.modules,"
        " tool is sys.modules['memex.host_tools'].Tool)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == "[] True True True", out.stdout + out.stderr


def test_door_error_is_a_handler_signal_not_a_memex_error() -> None:
    assert issubclass(memex.DoorError, Exception)
    assert not issubclass(memex.DoorError, memex.MemexError)
    err = memex.DoorError("denied", "no", path=["a"])
    assert (err.kind, err.message, err.extra) == ("denied", "no", {"path": ["a"]})


def test_version() -> None:
    assert isinstance(memex.__version__, str)
    assert memex.__version__.count(".") >= 2


@pytest.mark.parametrize("name", ERRORS_ALL)
def test_every_error_derives_from_memex_error(name: str) -> None:
    cls = getattr(memex.errors, name)
    assert inspect.isclass(cls)
    assert issubclass(cls, memex.errors.MemexError)
    assert issubclass(cls, Exception)


def test_every_exception_class_in_errors_module_is_exported_and_rooted() -> None:
    classes = {n for n, obj in vars(memex.errors).items()
               if inspect.isclass(obj) and issubclass(obj, BaseException)
               and obj.__module__ == memex.errors.__name__}
    assert classes == set(ERRORS_ALL)
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


def test_runtime_layer_does_not_import_upper_layers() -> None:
    import subprocess
    import sys

    code = (
        "import sys, memex.runtime_wasm\n"
        "bad = [m for m in sys.modules if m.startswith(('memex.host_tools', 'memex.executor'))]\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
