"""The runtime's public records: limits, mounts and turn results (frozen, keyword-only)."""

from __future__ import annotations

import dataclasses
import os
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ._units import parse_seconds, parse_size

__all__ = ["AGENT_LIMITS", "KERNEL_LIMITS", "SANDBOX_LIMITS", "GuestException", "GuestFile",
           "Limits", "Mount", "TurnResult", "TurnStatus"]

# The one home of the turn deadlines every entry point defaults to.
TURN_TIMEOUT = 30.0  # a sandbox's turn: the SDK, `memex run`, the service, MCP tools
AGENT_TURN_TIMEOUT = 60.0  # an agent's code block: MemexAgent, the framework adapters, eval
KERNEL_TURN_TIMEOUT = 600.0  # a cell a person runs: Jupyter, `memex kernel`
_SIZES = ("memory", "stdout_bytes", "stderr_bytes", "disk_bytes")
_COUNTS = ("fuel", "fuel_total", "disk_files", "open_files")
_SECONDS = ("timeout", "idle_timeout", "lifetime")

RESERVED_GUEST_PATHS = ("/usr/local/lib", "/memex", "/tmp")
MIN_OPEN_FILES = 16
MAX_OPEN_FILES = 4096


@dataclass(frozen=True, kw_only=True)
class Limits:
    """Hard caps for one sandbox. Every cap ends a turn with a clear result, never a host
    crash or hang.

    Attributes:
        timeout: wall seconds per turn (epoch interruption; also bounds guest sleeps and door
            handlers). A turn past it is trapped and rolled back.
        memory: bytes of guest linear memory; an allocation beyond it is a MemoryError in the
            guest, which lives on.
        fuel: instructions per turn (selects the fuel-metered engine, ~20% slower); None = off.
        fuel_total: instructions over the sandbox's lifetime; None = off.
        stdout_bytes / stderr_bytes: bytes kept per stream per turn; the rest is counted and
            replaced by a truncation marker.
        idle_timeout: seconds without a turn after which the sandbox closes itself.
        lifetime: seconds after creation after which the sandbox closes itself.
        disk_bytes: bytes the sandbox's writable places (its /tmp and writable mounts,
            counted together, apparent sizes) may hold; a write, truncate or allocation past it
            fails in the guest with ``OSError(EDQUOT)`` and the turn records ``limit="disk"``.
        disk_files: files, folders and links those places may hold together (same error).
        open_files: descriptors the guest may hold open at once (``OSError(EMFILE)``,
            ``limit="open_files"``); the interpreter itself needs a few.
    """

    timeout: float = TURN_TIMEOUT
    memory: int = 1 << 30
    fuel: int | None = None
    fuel_total: int | None = None
    stdout_bytes: int = 1 << 20
    stderr_bytes: int = 1 << 20
    idle_timeout: float | None = None
    lifetime: float | None = None
    disk_bytes: int = 512 << 20
    disk_files: int = 10_000
    open_files: int = 128

    def __post_init__(self) -> None:
        for name in ("memory", "stdout_bytes", "stderr_bytes", "disk_bytes", "disk_files",
                     "open_files"):  # bounded: None is no value for these
            if getattr(self, name) is None:
                raise ConfigError(f"Limits.{name} must be bounded (an int), got None")
        for name in ("memory", "fuel", "fuel_total", "stdout_bytes", "stderr_bytes",
                     "disk_bytes", "disk_files", "open_files"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
                raise ConfigError(f"Limits.{name} must be an int, got {v!r}")
        for name in ("timeout", "idle_timeout", "lifetime"):
            v = getattr(self, name)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < 1e9:
                raise ConfigError(
                    f"Limits.{name} must be a finite number of seconds > 0, got {v!r}"
                )
        if self.memory > (4 << 30):
            raise ConfigError(f"Limits.memory cannot exceed 4 GiB (wasm32), got {self.memory!r}")
        if self.memory < (48 << 20):
            raise ConfigError(
                f"Limits.memory must be at least 48 MiB (the interpreter alone needs ~40 MiB), "
                f"got {self.memory!r}"
            )
        for name in ("fuel", "fuel_total"):
            v = getattr(self, name)
            if v is not None and v <= 0:
                raise ConfigError(f"Limits.{name} must be positive or None, got {v!r}")
        for name in ("stdout_bytes", "stderr_bytes"):
            if getattr(self, name) < 0:
                raise ConfigError(f"Limits.{name} must be >= 0")
        for name in ("idle_timeout", "lifetime"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise ConfigError(f"Limits.{name} must be > 0 seconds or None, got {v!r}")
        for name in ("disk_bytes", "disk_files"):
            if not 0 <= getattr(self, name) < 1 << 62:
                raise ConfigError(f"Limits.{name} must be >= 0")
        if not MIN_OPEN_FILES <= self.open_files <= MAX_OPEN_FILES:
            raise ConfigError(f"Limits.open_files must be between {MIN_OPEN_FILES} (the "
                              f"interpreter needs a few) and {MAX_OPEN_FILES}, got "
                              f"{self.open_files!r}")

    @property
    def metered(self) -> bool:
        return self.fuel is not None or self.fuel_total is not None

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, base: Limits | None = None,
                     ceiling: Limits | Mapping[str, Any] | None = None,
                     where: str = "limits") -> Limits:
        """Limits from loose input (flags, a config table, a request body, a sub-agent's
        spec): what every entry point uses, so that each reads the same way.

        Unknown keys are refused; sizes and durations take the one grammar (``'512M'``,
        ``'500ms'``); a field given as None means unbounded (only where the field allows it).
        Fields not given come from ``base`` (default: :data:`SANDBOX_LIMITS`), each lowered
        to ``ceiling``. A given field above ``ceiling`` is refused ("only tighter"): the
        ceiling is a Limits (a parent's) or a partial mapping (a tenant's); a field it holds
        as None is not capped, and an unbounded value is above any cap."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"{where}: expected a table of Limits fields, got "
                              f"{type(data).__name__}")
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(str(k) for k in data if k not in names)
        if unknown:
            raise ConfigError(f"{where}: unknown field(s) {', '.join(unknown)}; Limits has "
                              f"{', '.join(names)}")
        caps = _caps(ceiling, where)
        base = base if base is not None else SANDBOX_LIMITS
        out: dict[str, Any] = {}
        above = []
        for name in names:
            if name in data:
                value = _parse_field(name, data[name], f"{where}.{name}")
                cap = caps.get(name)
                if cap is not None and (value is None or value > cap):
                    above.append(f"{where}.{name} = {value!r} is above the ceiling of {cap!r}")
            else:
                value = getattr(base, name)
                cap = caps.get(name)
                if cap is not None and (value is None or value > cap):
                    value = cap
            out[name] = value
        if above:
            raise ConfigError("; ".join(above) + ": limits can only be tighter")
        return cls(**out)

    def to_mapping(self) -> dict[str, Any]:
        """The fields as a plain dict (what :meth:`from_mapping` reads back)."""
        return dataclasses.asdict(self)


def _parse_field(name: str, value: object, what: str) -> Any:
    if value is None:
        return None  # Limits itself refuses None where a field must be bounded
    if name in _SIZES:
        return parse_size(value, what=what)
    if name in _SECONDS:
        return parse_seconds(value, what=what)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{what}: expected an int, got {value!r:.80}")
    return value


def _caps(ceiling: Limits | Mapping[str, Any] | None, where: str) -> dict[str, Any]:
    if ceiling is None:
        return {}
    if isinstance(ceiling, Limits):
        return {k: v for k, v in dataclasses.asdict(ceiling).items() if v is not None}
    names = {f.name for f in dataclasses.fields(Limits)}
    out = {}
    for k, v in ceiling.items():
        if k not in names:
            raise ConfigError(f"{where} ceiling: unknown field {k!r}")
        if v is not None:
            out[k] = _parse_field(k, v, f"{where} ceiling.{k}")
    return out


SANDBOX_LIMITS = Limits()  # what a Sandbox gets when given none
AGENT_LIMITS = Limits(timeout=AGENT_TURN_TIMEOUT)  # an agent's sandbox
KERNEL_LIMITS = Limits(timeout=KERNEL_TURN_TIMEOUT)  # an interactive kernel's sandbox


@dataclass(frozen=True, kw_only=True)
class Mount:
    """A host directory the guest may see at ``guest_path`` (read-only unless ``writable``).

    A writable mount counts towards the sandbox's disk caps (what it holds when the sandbox
    starts included). The guest may create symbolic and hard links in it only when ``links``
    is set, and then only to targets inside the mount."""

    host_path: str | os.PathLike[str]
    guest_path: str
    writable: bool = False
    links: bool = False

    def __post_init__(self) -> None:
        host = Path(self.host_path)
        if not host.is_dir():
            raise ConfigError(f"mount source {host} is not an existing directory")
        g = self.guest_path
        if not isinstance(g, str) or not g.startswith("/"):
            raise ConfigError(f"mount target must be an absolute guest path, got {g!r}")
        norm = posixpath.normpath(g)
        if norm != g.rstrip("/") or ".." in g.split("/") or norm == "/":
            raise ConfigError(f"mount target {g!r} must be a normalized path below /")
        for reserved in RESERVED_GUEST_PATHS:
            if norm == reserved or norm.startswith(reserved + "/") or reserved.startswith(
                norm + "/"
            ):
                raise ConfigError(f"mount target {g!r} overlaps MemEx's reserved {reserved}")

    @classmethod
    def parse(cls, spec: str) -> Mount:
        """``HOST:GUEST[:ro|rw]`` as the CLI takes it."""
        parts = spec.split(":")
        if len(parts) == 3 and parts[2] in ("ro", "rw"):
            return cls(host_path=parts[0], guest_path=parts[1], writable=parts[2] == "rw")
        if len(parts) == 2:
            return cls(host_path=parts[0], guest_path=parts[1])
        raise ConfigError(f"mount spec {spec!r} is not HOST:GUEST[:ro|rw]")


class TurnStatus(StrEnum):
    OK = "ok"  # the cell ran to the end
    ERROR = "error"  # the cell raised; `exception` says what
    EXIT = "exit"  # the cell called sys.exit()/exit() or os._exit(); `exit_code` says which
    KILLED = "killed"  # a limit or trap stopped the turn; `limit` says which


@dataclass(frozen=True, kw_only=True)
class GuestFile:
    """One entry of ``Sandbox.list_files``: ``kind`` is ``file``, ``dir`` or ``link`` (a link is
    reported, never followed); ``size`` in bytes (0 for folders and links)."""

    name: str
    path: str  # the guest path
    kind: str
    size: int = 0


@dataclass(frozen=True, kw_only=True)
class GuestException:
    type: str
    message: str
    traceback: str


@dataclass(frozen=True, kw_only=True)
class TurnResult:
    """What one turn did, as data: nothing a guest does raises on the host."""

    status: TurnStatus
    stdout: str = ""
    stderr: str = ""
    value: str | None = None  # repr of the cell's final expression, like a REPL echo
    exception: GuestException | None = None
    exit_code: int | None = None
    # deadline|fuel|fuel_total|memory|stack|lifetime|cancelled|trap|disk|open_files
    limit: str | None = None
    trap: str | None = None  # the engine's message when a trap ended the turn
    rolled_back: bool = False  # guest state is back to the end of the last good turn
    duration: float = 0.0  # wall seconds
    fuel_used: int | None = None
    memory_bytes: int = 0  # guest linear memory after the turn
    truncated: tuple[str, ...] = field(default=())  # streams that hit their byte cap
    disk_bytes: int = 0  # what the writable places hold after the turn (see Limits.disk_bytes)
    disk_files: int = 0

    @property
    def ok(self) -> bool:
        return self.status is TurnStatus.OK

    def to_dict(self) -> dict[str, object]:
        d: dict[str, object] = {
            "status": self.status.value,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "value": self.value,
            "exception": None
            if self.exception is None
            else {
                "type": self.exception.type,
                "message": self.exception.message,
                "traceback": self.exception.traceback,
            },
            "exit_code": self.exit_code,
            "limit": self.limit,
            "trap": self.trap,
            "rolled_back": self.rolled_back,
            "duration": self.duration,
            "fuel_used": self.fuel_used,
            "memory_bytes": self.memory_bytes,
            "truncated": list(self.truncated),
            "disk_bytes": self.disk_bytes,
            "disk_files": self.disk_files,
        }
        return d
