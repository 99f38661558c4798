"""What ``memex mcp`` serves, from a TOML file and/or flags: the sandbox every session gets
(limits, mounts, preload, egress policy), the host tools and bridged MCP servers its guest may
call (and nothing else), the session bounds and the HTTP listener. Unknown keys and bad
values are refused with the file and the key that is wrong."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, ValidationError

from ...errors import ConfigError
from ...runtime_wasm import SANDBOX_LIMITS, Mount
from ...serving import (
    FileModel,
    LimitsModel,
    Seconds,
    SecondsOrZero,
    Size,
    config_error,
    limits_model,
)

__all__ = ["BridgeConfig", "HttpConfig", "LimitsConfig", "McpConfig", "MountConfig",
           "SessionsConfig", "load_config"]



if TYPE_CHECKING:
    LimitsConfig = LimitsModel
else:
    LimitsConfig = limits_model(
        "LimitsConfig", LimitsModel,
        defaults={"timeout": SANDBOX_LIMITS.timeout, "stdout_bytes": 64 << 10,
                  "stderr_bytes": 64 << 10},
        doc="Per-call caps of every session's sandbox: every field of ``memex.Limits`` ("
            "a model reads what a call prints, so the output caps are smaller than a "
            "sandbox's own).")


class MountConfig(FileModel):
    """A host folder granted to every session (read-only unless ``writable``)."""

    host: str
    guest: str
    writable: bool = False

    def mount(self, base: Path) -> Mount:
        host = Path(self.host)
        return Mount(host_path=str(host if host.is_absolute() else base / host),
                     guest_path=self.guest, writable=self.writable)


class BridgeConfig(FileModel):
    """An MCP server whose tools the guest may call (``ToolSet.from_mcp``): a ``command`` with
    ``args``/``env``/``cwd`` (stdio) or a ``url`` with ``headers``."""

    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] | None = None
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    prefix: str = ""
    include: list[str] | None = None
    timeout: Seconds = Field(default=30.0)


class SessionsConfig(FileModel):
    """The session core's bounds (``memex.serving``), per server and per principal."""

    idle_timeout: Seconds = Field(default=300.0,
                                description="seconds before an idle session ends")
    max_sessions: int = Field(default=16, gt=0, description="sessions of the server in all")
    max_sessions_per_token: int | None = Field(
        default=None, gt=0, description="sessions one principal (a bearer token, the stdio "
        "process) may hold at once (unset: max_sessions)")
    max_memory_per_token: Size | None = Field(
        default=None, gt=0, description="bytes of session memory limits and held checkpoints "
        "one principal may hold ('4G' works; unset: no bound)")
    max_running_per_token: int = Field(default=4, gt=0, description="cells one principal "
                                       "runs at once (the cores it may hold)")
    queued: int = Field(default=64, gt=0, description="calls waiting per session, and cells "
                        "waiting per principal; past it a call is refused (a host may send "
                        "a model's parallel tool calls at once)")
    max_checkpoints: int = Field(default=16, gt=0, description="named checkpoints per session")
    max_output_chars: int = Field(default=20_000, gt=0, description="text returned per call")
    state_dir: str | None = Field(default=None, description="folder where sessions are saved "
                                  "(state.db): they outlive a restart or a kill -9, called by "
                                  "their handle (named checkpoints do not)")
    save_interval: SecondsOrZero = Field(default=30.0, description="seconds between saves of a "
                                 "changed session (0: after every call)")
    rollback: bool = Field(default=True, description="copy the guest's state after every good "
                           "cell so that a cell a limit stops is undone (off: a trap resets "
                           "the session to a fresh interpreter, and each cell is cheaper)")



class HttpConfig(FileModel):
    host: str = "127.0.0.1"
    port: int = Field(default=8765, ge=0, le=65535)
    token_env: str | None = Field(default=None, description="environment variable holding "
                                  "the bearer token clients must send (several, comma-"
                                  "separated: one per client, each its own principal)")
    no_auth: bool = Field(default=False, description="serve without a token: only on a "
                          "loopback address, with a warning (every local process may use it)")
    max_request_bytes: Size = Field(default=16 << 20, gt=0, description="bytes of one "
                                    "request: an HTTP body, or a line over stdio")


class McpConfig(FileModel):
    """The whole server configuration (``memex mcp --config FILE``; flags override keys)."""

    name: str = "memex"
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    mounts: list[MountConfig] = Field(default_factory=list)
    preload: list[str] = Field(default_factory=list)
    packages: list[str] = Field(
        default=["*"], max_length=1000,
        description="packages a cell's PEP 723 dependencies may fetch (names; [\"*\"]: any "
                    "pure-Python one; []: none)")
    policy: str | None = Field(default=None,
                               description="egress policy file: the guest's network")
    tools: list[str] = Field(default=[], description="host tools as module:attribute")
    bridge: list[BridgeConfig] = Field(default_factory=list)
    sessions: SessionsConfig = Field(default_factory=SessionsConfig)
    http: HttpConfig = Field(default_factory=HttpConfig)
    transport: Literal["stdio", "http"] = "stdio"
    base: str = Field(default=".", description="folder relative paths are resolved from")

    def resolve(self, path: str) -> Path:
        p = Path(path)
        return p if p.is_absolute() else Path(self.base) / p


def load_config(path: str | Path | None = None, **overrides: Any) -> McpConfig:
    """The configuration in ``path`` (TOML; relative paths in it are resolved from its folder)
    with ``overrides`` applied on top (top-level keys; ``limits``/``sessions``/``http`` merge
    key by key). ConfigError names the file and the key when something is wrong."""
    data: dict[str, Any] = {}
    source = "the command line"
    if path is not None:
        source = str(path)
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"cannot read {path}: {exc.strerror}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: {exc}") from exc
        data.setdefault("base", str(Path(path).resolve().parent))
    for key, value in overrides.items():
        if value is None:
            continue
        if key in ("limits", "sessions", "http") and isinstance(value, dict):
            merged = {**data.get(key, {}), **{k: v for k, v in value.items() if v is not None}}
            data[key] = merged
        elif key in ("mounts", "tools", "bridge", "preload") and isinstance(value, list):
            data[key] = [*data.get(key, []), *value]
        else:
            data[key] = value
    try:
        return McpConfig.model_validate(data)
    except ValidationError as exc:
        raise config_error(source, McpConfig, exc, style="dotted") from None
