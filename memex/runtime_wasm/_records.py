"""The runtime's public records: limits, mounts and turn results (frozen, keyword-only)."""

from __future__ import annotations

import dataclasses
import os
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from ..errors import ConfigError
from ._units import parse_seconds, parse_size

__all__ = ["AGENT_LIMITS", "KERNEL_LIMITS", "LIMIT_FIELDS", "SANDBOX_LIMITS", "GuestException",
           "GuestFile", "LimitField", "Limits", "Mount", "TurnResult", "TurnStatus"]

# The one home of the turn deadlines every entry point defaults to.
TURN_TIMEOUT = 30.0  # a sandbox's turn: the SDK, `memex run`, the service, MCP tools
AGENT_TURN_TIMEOUT = 60.0  # an agent's code block: MemexAgent, the framework adapters, eval
KERNEL_TURN_TIMEOUT = 600.0  # a cell a person runs: Jupyter, `memex kernel`
RESERVED_GUEST_PATHS = ("/usr/local/lib", "/memex", "/tmp")
MIN_OPEN_FILES = 16
MAX_OPEN_FILES = 4096
_TOP = 1 << 62  # what any count or size may be (below a JSON integer's and int64's range)


@dataclass(frozen=True, kw_only=True)
class LimitField:
    """One field of :class:`Limits` as every reader sees it: its unit, whether None (no
    bound) is a value, and its range. The one declaration of a limit's shape: ``Limits``
    checks itself against it, and the front ends' config tables and wire models are made
    from it (``memex.serving``), so no field list is written twice.

    ``kind``: ``"seconds"`` (a config file also takes ``'500ms'``, ``'2min'``), ``"bytes"``
    (``'512M'``) or ``"count"``. The range is ``low < v`` (``low_open``) or ``low <= v``,
    and ``v < high`` (``high_open``) or ``v <= high``."""

    name: str
    kind: Literal["seconds", "bytes", "count"]
    nullable: bool
    low: float
    low_open: bool = False
    high: float
    high_open: bool = False
    doc: str
    low_why: str = ""  # why each end is where it is, for the error
    high_why: str = ""

    def admits(self, value: float) -> bool:
        return (value > self.low if self.low_open else value >= self.low) and (
            value < self.high if self.high_open else value <= self.high)

    def describe(self) -> str:
        """The range in words: ``at least 48 MiB and at most 4 GiB``."""
        low = f"{'more than' if self.low_open else 'at least'} {self._amount(self.low)}"
        if self.high_open and self.high in (_TOP, 1e9):  # practically unbounded above
            return low
        return f"{low} and {'below' if self.high_open else 'at most'} " \
            f"{self._amount(self.high)}"

    def _amount(self, v: float) -> str:
        if self.kind == "bytes":
            for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
                if v and v % (1 << shift) == 0:
                    return f"{int(v) >> shift} {unit}"
        return f"{v:g}" if isinstance(v, float) and not v.is_integer() else f"{int(v)}"


def _limit(default: Any, kind: Literal["seconds", "bytes", "count"], doc: str, *,
           nullable: bool = False, low: float = 0, low_open: bool = False,
           high: float = _TOP, high_open: bool | None = None, low_why: str = "",
           high_why: str = "") -> Any:
    if high_open is None:
        high_open = high == _TOP or kind == "seconds"
    spec = {"kind": kind, "nullable": nullable, "low": low, "low_open": low_open,
            "high": high, "high_open": high_open, "doc": doc, "low_why": low_why,
            "high_why": high_why}
    return field(default=default, metadata={"limit": spec})


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

    timeout: float = _limit(TURN_TIMEOUT, "seconds", "wall seconds per turn", nullable=True,
                            low_open=True, high=1e9)
    memory: int = _limit(1 << 30, "bytes", "bytes of guest linear memory", low=48 << 20,
                         high=4 << 30, low_why="the interpreter alone needs ~40 MiB",
                         high_why="wasm32")
    fuel: int | None = _limit(None, "count", "instructions per turn (the metered engine)",
                              nullable=True, low_open=True)
    fuel_total: int | None = _limit(None, "count", "instructions over the sandbox's life",
                                    nullable=True, low_open=True)
    stdout_bytes: int = _limit(1 << 20, "bytes", "stdout bytes kept per turn")
    stderr_bytes: int = _limit(1 << 20, "bytes", "stderr bytes kept per turn")
    idle_timeout: float | None = _limit(None, "seconds", "seconds without a turn before the "
                                        "sandbox closes itself", nullable=True,
                                        low_open=True, high=1e9)
    lifetime: float | None = _limit(None, "seconds", "seconds after creation before the "
                                    "sandbox closes itself", nullable=True, low_open=True,
                                    high=1e9)
    disk_bytes: int = _limit(512 << 20, "bytes", "bytes its writable places may hold")
    disk_files: int = _limit(10_000, "count", "files, folders and links they may hold")
    open_files: int = _limit(128, "count", "descriptors open at once", low=MIN_OPEN_FILES,
                             high=MAX_OPEN_FILES, low_why="the interpreter needs a few")

    def __post_init__(self) -> None:
        for spec in LIMIT_FIELDS:  # the checks follow the one table of fields
            name, v = spec.name, getattr(self, spec.name)
            if v is None:
                if not spec.nullable:  # bounded: None is no value for these
                    raise ConfigError(f"Limits.{name} must be bounded (an int), got None")
                continue
            if spec.kind == "seconds":
                if isinstance(v, bool) or not isinstance(v, int | float) or v != v:
                    raise ConfigError(f"Limits.{name} must be a finite number of seconds > 0, "
                                      f"got {v!r}")
            elif isinstance(v, bool) or not isinstance(v, int):
                raise ConfigError(f"Limits.{name} must be an int, got {v!r}")
            if not spec.admits(v):
                if spec.kind == "seconds":
                    raise ConfigError(f"Limits.{name} must be a finite number of seconds > 0, "
                                      f"got {v!r}")
                why = spec.high_why if v >= spec.high else spec.low_why
                why = f" ({why})" if why else ""
                raise ConfigError(f"Limits.{name} must be {spec.describe()}{why}, got {v!r}")

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
    kind = _KINDS[name]
    if kind == "bytes":
        return parse_size(value, what=what)
    if kind == "seconds":
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


LIMIT_FIELDS: tuple[LimitField, ...] = tuple(
    LimitField(name=f.name, **f.metadata["limit"]) for f in dataclasses.fields(Limits))
"""Limits' fields in order, each with its unit and range: the one declaration the config
tables and wire models are made from."""
_KINDS = {f.name: f.kind for f in LIMIT_FIELDS}

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
