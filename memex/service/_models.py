"""The wire of the service's API, version 1: pydantic models for the request and response
bodies (the OpenAPI document is generated from them). Limits and turn results travel as the
same maps the worker wire uses (``Limits`` fields; ``TurnResult.to_dict()``)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
)

from ..serving import ID_PATTERN, LimitsModel, limits_model

__all__ = ["API_VERSION", "GUEST_PATH", "CheckpointOut", "CreateSession", "ErrorBody",
           "ErrorDetail", "FileList", "FileOut", "ForksIn", "LimitsIn", "MountIn", "RestoreIn",
           "RunIn", "RunOut", "SessionList", "SessionOut", "ToolList", "ToolOut"]

API_VERSION = "v1"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_MAX_ENV_VALUE = 32 << 10
# in the schema too, so a generated client (or a fuzzer) knows what a name may be
EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")]
EnvValue = Annotated[str, Field(max_length=_MAX_ENV_VALUE, pattern=r"^[^\x00]*$")]
ModuleName = Annotated[str, Field(max_length=256, pattern=r"^[A-Za-z_][A-Za-z0-9_]*"
                                                          r"(\.[A-Za-z_][A-Za-z0-9_]*)*$")]
EnvTable = Annotated[dict[EnvName, EnvValue],
                     Field(json_schema_extra={"additionalProperties": False})]


class _Strict(BaseModel):
    """Request bodies: unknown keys refused, and no type coerced (``true`` is not a number,
    ``"2"`` is not 2)."""

    model_config = ConfigDict(extra="forbid", strict=True)


def _guest_path(value: str) -> str:
    if not value.startswith("/") or "\0" in value or len(value) > 1024 or any(
            part in (".", "..") for part in value.split("/")):
        raise ValueError("an absolute guest path without '.', '..' or NUL, at most 1024 "
                         "characters")
    return value


_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_REL = r"[0-9]+(?:\.[0-9]+)*"
_TAIL = r"(?:(?:a|b|rc)[0-9]+)?(?:\.post[0-9]+)?(?:\.dev[0-9]+)?"
_SPEC = (rf"(?:(?:==|!=) ?(?:{_REL}\.\*|{_REL}{_TAIL})"
         rf"|~= ?[0-9]+(?:\.[0-9]+)+{_TAIL}|(?:<=|>=|<|>) ?{_REL}{_TAIL})")
REQUIREMENT = rf"^{_NAME}(?:\[{_NAME}(?:,{_NAME})*\])?(?: ?{_SPEC}(?: ?, ?{_SPEC})*)?$"
"""A package requirement as the API takes it: a name, extras, and version specifiers of
PEP 440 release versions (pre, post and dev releases too). A subset of what pip reads, on
purpose: no URL or path (the server never fetches one), no marker (the guest is one fixed
platform), no hash (the server pins what it resolves). Every string it admits is one the
server's parser accepts, so the document states what the server checks."""

GUEST_PATH = r"^(/([^/\x00.][^/\x00]*|\.[^/\x00.][^/\x00]*|\.\.[^/\x00]+)?)+$"
"""An absolute path whose parts are not '.' or '..', without NUL (what _guest_path checks,
in the schema: lookarounds left out, as generators of the schema's data may lack them)."""


class MountIn(_Strict):
    host: str = Field(description="a host directory inside one of the tenant's granted mounts",
                      min_length=1, max_length=4096, pattern=r"^[^\x00]*$")
    guest: str = Field(description="the absolute guest path it appears at", max_length=1024,
                       pattern=GUEST_PATH)
    writable: bool = False
    links: bool = False

    @field_validator("guest")
    @classmethod
    def _guest(cls, v: str) -> str:
        return _guest_path(v)

    @field_validator("host")
    @classmethod
    def _host(cls, v: str) -> str:
        if "\0" in v:
            raise ValueError("a host path without NUL")
        return v


def _integral(value: Any) -> Any:
    """JSON Schema's integer: 5.0 is one (its value is integral), so it is taken as 5; any
    other type still meets the strict check (``true`` and ``"5"`` are not integers)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2 ** 63:
        return int(value)
    return value


Seconds = Annotated[float, Field(gt=0, lt=1e9)]


class _LimitsBase(_Strict, LimitsModel):
    """Request bodies of Limits fields (strict JSON, not frozen)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=False)


if TYPE_CHECKING:
    LimitsIn = _LimitsBase
else:
    LimitsIn = limits_model(
        "LimitsIn", _LimitsBase, style="wire", doc="memex.Limits, each field within the "
        "tenant's ceiling (unset: the service's default, itself kept within the ceiling).")


def _requirement(text: str) -> str:
    """What REQUIREMENT admits, refused with the server's own words where it has them
    (a URL, a malformed name) and else with the subset's."""
    if _REQUIREMENT.fullmatch(text):
        return text
    from ..runtime_wasm.internal import checked_requirements

    checked_requirements([text])  # raises ConfigError (a ValueError) with its reason
    raise ValueError(f"{text[:60]!r}: a requirement here is a name, extras and version "
                     "specifiers ('tabulate==0.9.0'), without a marker or a hash")


_REQUIREMENT = re.compile(REQUIREMENT)
Requirement = Annotated[str, Field(max_length=200, json_schema_extra={"pattern": REQUIREMENT}),
                        AfterValidator(_requirement)]


class CreateSession(_Strict):
    limits: LimitsIn | None = Field(
        None, description="memex.Limits fields; each within the tenant's ceiling")
    preload: list[ModuleName] = Field(default_factory=list, max_length=64)
    packages: list[Requirement] = Field(
        default_factory=list, max_length=64,
        description="pure-Python requirements for the guest ('humanize', 'tabulate==0.9.0'), "
                    "resolved by the server; each wheel must be one the tenant is allowed")
    mounts: list[MountIn] = Field(default_factory=list, max_length=32)
    env: EnvTable | None = Field(None, max_length=256, description="environment "
                                                "variables: names [A-Za-z_][A-Za-z0-9_]*, "
                                                "values without NUL, at most 32 KiB each")

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        for name, value in (v or {}).items():
            if not _ENV_NAME.fullmatch(name):
                raise ValueError(f"{name[:40]!r} is not an environment variable name")
            if "\0" in value or len(value) > _MAX_ENV_VALUE:
                raise ValueError(f"the value of {name} has a NUL or is over 32 KiB")
        return v


class SessionOut(BaseModel):
    id: str
    turns: int
    created: float
    last_used: float
    parent: str | None = None
    memory: int
    door_attached: bool
    live: bool = Field(description="false while saved and evicted, or after a restart until "
                       "its next use opens it again")
    saved_turns: int | None = Field(None, description="the turns its last save holds")
    restored: dict[str, Any] | None = Field(
        None, description="when it was (or will be) opened from a save: from_turn, "
        "lost_turns, files_kept, reason; also on the next run's answer, once")
    limits: dict[str, Any]


class SessionList(BaseModel):
    sessions: list[SessionOut]


MAX_FORKS = 1024


ForkCount = Annotated[Annotated[int, Field(ge=1, le=MAX_FORKS)], BeforeValidator(_integral)]


class ForksIn(_Strict):
    count: ForkCount = Field(description="how many forks to make: all of them, within the "
                             "tenant's quota, or none")


class RunIn(_Strict):
    code: str
    timeout: Seconds | None = Field(None, description="seconds; at most the session's timeout")
    filename: str | None = Field(None, max_length=1024)


class RunOut(BaseModel):
    result: dict[str, Any] = Field(description="TurnResult.to_dict()")
    turns: int
    restored: dict[str, Any] | None = Field(
        None, description="present once, on the first answer after the session was opened "
        "from a save: what that save held and what was lost")


class CheckpointOut(BaseModel):
    checkpoint: str


class RestoreIn(_Strict):
    checkpoint: str = Field(pattern=ID_PATTERN)


class FileOut(BaseModel):
    name: str
    path: str
    kind: str = Field(description="file, dir or link (a link is listed, never followed)")
    size: int


class FileList(BaseModel):
    files: list[FileOut]


class ErrorDetail(BaseModel):
    code: str = Field(description="stable: unauthorized, not_found, invalid_request, invalid, "
                      "guest_file, session_closed, session_lost, busy, quota, too_large, "
                      "sandbox_error, method_not_allowed, not_ready, internal")
    message: str
    type: str | None = Field(None, description="the MemEx exception class, when there is one")
    reason: str | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail


class ToolOut(BaseModel):
    definition: dict[str, Any] = Field(description="the OpenAI function definition (name, "
                                       "description, JSON Schema of the parameters)")
    returns: str = Field("", description="what the tool returns, in words")
    catalogue: str = Field("", description="its line in the guest's help(tools)")


class ToolList(BaseModel):
    tools: list[ToolOut] = Field(description="the operator's tools for this tenant: its "
                                 "guests call them, and the server runs them")
