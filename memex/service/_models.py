"""The wire of the service's API, version 1: pydantic models for the request and response
bodies (the OpenAPI document is generated from them). Limits and turn results travel as the
same maps the worker wire uses (``Limits`` fields; ``TurnResult.to_dict()``)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["API_VERSION", "CheckpointOut", "CreateSession", "ErrorBody", "ErrorDetail",
           "FileList", "FileOut", "MountIn", "RestoreIn", "RunIn", "RunOut", "SessionList",
           "SessionOut", "ToolList", "ToolOut"]

API_VERSION = "v1"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MountIn(_Strict):
    host: str = Field(description="a host directory inside one of the tenant's granted mounts")
    guest: str = Field(description="the absolute guest path it appears at")
    writable: bool = False
    links: bool = False


class CreateSession(_Strict):
    limits: dict[str, Any] | None = Field(
        None, description="memex.Limits fields; each within the tenant's ceiling")
    preload: list[str] = Field(default_factory=list, max_length=64)
    mounts: list[MountIn] = Field(default_factory=list, max_length=32)
    env: dict[str, str] | None = None


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


class RunIn(_Strict):
    code: str
    timeout: float | None = Field(None, description="seconds; at most the session's timeout")
    filename: str | None = None


class RunOut(BaseModel):
    result: dict[str, Any] = Field(description="TurnResult.to_dict()")
    turns: int
    restored: dict[str, Any] | None = Field(
        None, description="present once, on the first answer after the session was opened "
        "from a save: what that save held and what was lost")


class CheckpointOut(BaseModel):
    checkpoint: str


class RestoreIn(_Strict):
    checkpoint: str


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
