"""What ``memex mcp`` serves, from a TOML file and/or flags: the sandbox every session gets
(limits, mounts, preload, egress policy), the host tools and bridged MCP servers its guest may
call (and nothing else), the session bounds and the HTTP listener. Unknown keys and bad
values are refused with the file and the key that is wrong."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, ValidationError, model_validator

from ...runtime_wasm import SANDBOX_LIMITS, Limits, Mount
from ...serving import (
    Bounds,
    EdgeTable,
    FileModel,
    LimitsModel,
    PrincipalTable,
    Seconds,
    SecondsOrZero,
    Size,
    check_key_hashes,
    config_error,
    limits_model,
    read_toml,
    unenforced,
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
    total_sessions: int = Field(default=16, gt=0, description="sessions of the server in "
                                "all (a server-wide bound: a principal's is max_sessions)")
    max_sessions_per_token: int | None = Field(
        default=None, gt=0, description="sessions one principal (a bearer token, the stdio "
        "process) may hold at once, unless its [principals.NAME] says (unset: "
        "total_sessions)")
    max_memory_per_token: Size | None = Field(
        default=None, gt=0, description="bytes of session memory limits and held checkpoints "
        "one principal may hold ('4G' works; unset: no bound)")
    max_running_per_token: int | None = Field(
        default=None, gt=0, description="cells one principal runs at once, at most (unset: "
        "its fair share of running_cells)")
    running_cells: int | None = Field(
        default=None, gt=0, description="cells the server runs at once in all, shared "
        "fairly among the principals running cells (unset: one per core)")
    guest_nice: int = Field(default=10, ge=0, le=19, description="nice steps the guests "
                            "run below the server's own threads (0: the same)")
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



    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "max_sessions" in data:
            raise ValueError("[sessions] max_sessions is now total_sessions (the server's "
                             "sessions in all); a principal's own bound is "
                             "max_sessions_per_token, or max_sessions in [principals.NAME]")
        return data


MCP_ENFORCES = frozenset({"max_sessions", "max_memory", "max_disk", "max_checkpoints",
                          "turns_per_second", "max_running", "queued", "ceiling"})
"""What ``memex mcp`` enforces of a ``[principals.NAME]`` table besides its keys: every
bound. Its grants (mounts, packages, egress, tools) are the server's, the same for every
principal (the top-level keys); a principal table that sets one is refused."""

_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_RESERVED = ("stdio", "anonymous", ".", "..")


@dataclass(frozen=True)
class Own:
    """One principal's bounds in ``memex mcp`` (:meth:`McpConfig.own`)."""

    bounds: Bounds
    limits: Limits
    running: int | None
    queued: int
    rate: float | None


class HttpConfig(EdgeTable):
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
    principals: dict[str, PrincipalTable] = Field(
        default_factory=dict, description="named principals, each with its keys and bounds "
        "(the schema of serve.toml's [tenants.NAME]; see docs/policy.md)")
    transport: Literal["stdio", "http"] = "stdio"
    base: str = Field(default=".", description="folder relative paths are resolved from")

    @model_validator(mode="after")
    def _principals_checked(self) -> McpConfig:
        for name, table in self.principals.items():
            where = f"principals.{name}"
            if not _NAME.fullmatch(name) or name in _RESERVED:
                raise ValueError(f"{where}: a principal's name is 1-64 letters, digits, '_', "
                                 f"'.' or '-', other than {', '.join(_RESERVED[:2])}")
            check_key_hashes(f"{where}.keys", table.keys)
            if not table.keys:
                raise ValueError(f"{where}: a principal needs at least one key")
            extra = unenforced(table, MCP_ENFORCES)
            if extra:
                raise ValueError(f"{where}: {', '.join(extra)}: memex mcp grants mounts, "
                                 "packages, egress and tools to every principal alike; set "
                                 "them at the top level")
            self.own(name)  # its ceiling and bounds make limits a session can have
        return self

    def own(self, name: str | None) -> Own:
        """A principal's bounds here: ``[principals.NAME]``'s where it sets them, the rest
        [sessions]' per-token ones (``None``: a principal without a table, such as a token
        of ``http.token_env`` or the stdio host); its sessions' limits within its ceiling
        and its memory bound."""
        cfg = self.sessions
        per_token = cfg.max_sessions_per_token or cfg.total_sessions
        bounds = Bounds(max_sessions=cfg.max_sessions_per_token,
                        max_memory=cfg.max_memory_per_token,
                        max_checkpoints=cfg.max_checkpoints * per_token)
        base = self.limits.limits()
        if name is None:
            return Own(bounds=bounds, limits=base, running=cfg.max_running_per_token,
                       queued=cfg.queued, rate=None)
        t = self.principals[name]
        given = t.given()
        bounds = Bounds(
            max_sessions=t.max_sessions if "max_sessions" in given else bounds.max_sessions,
            max_memory=t.max_memory if "max_memory" in given else bounds.max_memory,
            max_disk=t.max_disk if "max_disk" in given else bounds.max_disk,
            max_checkpoints=t.max_checkpoints if "max_checkpoints" in given
            else bounds.max_checkpoints)
        if bounds.max_memory is not None and base.memory > bounds.max_memory:
            base = dataclasses.replace(base, memory=bounds.max_memory)
        limits = Limits.from_mapping({}, base=base, ceiling=t.ceiling.given(),
                                     where=f"principals.{name}")
        return Own(bounds=bounds, limits=limits,
                   running=t.max_running if "max_running" in given
                   else cfg.max_running_per_token,
                   queued=t.queued if "queued" in given else cfg.queued,
                   rate=t.turns_per_second)

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
        data = read_toml(path, "MCP config")
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
