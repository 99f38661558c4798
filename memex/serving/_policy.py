"""The one schema of a principal in a policy file: ``[tenants.NAME]`` in serve.toml and
``[principals.NAME]`` in ``memex mcp``'s config are both a :class:`PrincipalTable`, read by
this model alone. A principal has keys (stored hashed), grants (mounts, packages, an egress
policy, operator tools) and bounds (the ceiling of the limits its sessions may ask for, and
its quotas in the ledger). Each front end says which of these it enforces
(``unenforced``): a setting a front end would not enforce is an error there, never a
silently ignored line."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from ._settings import FileModel, LimitsTable, Size

__all__ = ["GRANTS", "QUOTAS", "MountTable", "PrincipalTable", "unenforced"]


class MountTable(FileModel):
    """A host folder granted to a principal (read-only unless ``writable``)."""

    host: str
    writable: bool = False


class PrincipalTable(FileModel):
    """``[tenants.NAME]`` / ``[principals.NAME]``: one principal's keys, grants and bounds.
    Every bound here is the principal's own; a server-wide bound has another name."""

    keys: list[str] = Field(default_factory=list, description="sha256:<hex> of each key "
                            "(`memex serve --hash-key` prints one)")
    # bounds: the principal's quotas in the ledger
    max_sessions: int | None = Field(default=8, ge=0, description="its sessions at once")
    max_memory: Size | None = Field(default=None, description="bytes: Limits.memory over "
                                    "its sessions, and its held checkpoints")
    max_disk: Size | None = Field(default=None, description="bytes: Limits.disk_bytes over "
                                  "its sessions")
    max_checkpoints: int = Field(default=64, ge=0, description="checkpoints it holds")
    turns_per_second: float | None = Field(default=None, gt=0, description="its turns "
                                           "started per second (a token bucket)")
    max_running: int | None = Field(default=None, ge=1, description="its turns running at "
                                    "once, at most (unset: its fair share of the server's "
                                    "running turns)")
    queued: int = Field(default=16, ge=0, description="its turns waiting to run")
    ceiling: LimitsTable = Field(default_factory=LimitsTable, description="the most each "
                                 "Limits field of its sessions may be")
    # grants
    mounts: list[MountTable] = Field(default_factory=list)
    egress: str | None = Field(default=None, description="its guests' egress policy file")
    tools: list[str] = Field(default_factory=list, description="operator tools "
                             "(module:attribute)")
    packages: list[str] = Field(default_factory=list, max_length=1000,
                                description="guest packages it may ask for")

    def given(self) -> set[str]:
        """The keys the file sets."""
        return set(self.model_fields_set)


GRANTS = ("mounts", "egress", "tools", "packages")
QUOTAS = ("max_sessions", "max_memory", "max_disk", "max_checkpoints", "turns_per_second",
          "max_running", "queued", "ceiling")


def unenforced(table: PrincipalTable, enforced: frozenset[str]) -> list[str]:
    """The settings ``table`` makes that a front end enforcing only ``enforced`` would not."""
    out: list[str] = []
    for name in sorted(table.given() - enforced - {"keys"}):
        value: Any = getattr(table, name)
        if value in (None, [], {}) and name in GRANTS:
            continue  # granting nothing is what not enforcing a grant gives
        out.append(name)
    return out
