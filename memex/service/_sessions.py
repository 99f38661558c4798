"""The server's session record: the core's (``memex.serving``: its table, bounds and
checkpoints are the ones ``memex mcp`` uses) with what serve adds: the session's door to its
client, how to open it again, and the bookkeeping of its saves (``_durable``). Each session is
owned by one tenant: a lookup with another tenant's name finds nothing (the API answers 404,
the same as for an id that never existed)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from ..runtime_wasm import Mount
from ..serving import CoreSession, QuotaExceeded, SessionTable
from ._door import ClientDoor

__all__ = ["QuotaExceeded", "Session", "SessionTable", "new_checkpoint_id", "new_session_id"]


@dataclass(kw_only=True, eq=False)
class Session(CoreSession):
    """One session on the server (``owner``: its tenant): its sandbox (None while it is
    saved and evicted, or after a restart until its next use), its door, what is needed to
    open it again, and the bookkeeping of its saves (``_durable``)."""

    door: ClientDoor
    mounts: tuple[Mount, ...] = ()
    preload: tuple[str, ...] = ()
    env: dict[str, str] | None = None
    parent: str | None = None
    turn_base: int = 0  # turns run before the current sandbox was opened (a restore)
    gen: int = 0  # changes of the guest state (turns, restores)
    saved_gen: int = -1
    saved_turns: int | None = None
    saved_at: float | None = None
    files_kept: bool = False  # its last save holds its /tmp files too
    notice: dict[str, Any] | None = None  # how much a restore lost, for the next answer
    lost: str | None = None  # why the session cannot be brought back
    egress: Any = None  # the tenant's Egress serving this session's door (shared by forks)
    tools: Any = None  # the ToolHost of the tenant's operator tools on that door (shared too)

    @property
    def tenant(self) -> str:
        return self.owner

    @property
    def turns(self) -> int:
        return self.turn_base + (self.sandbox.turns if self.sandbox is not None else 0)

    def info(self) -> dict[str, Any]:
        return {"id": self.id, "turns": self.turns, "created": self.created,
                "last_used": self.last_used, "parent": self.parent,
                "memory": self.limits.memory, "door_attached": self.door.attached,
                "live": self.sandbox is not None, "saved_turns": self.saved_turns,
                "restored": self.notice}


def new_session_id() -> str:
    return "s_" + secrets.token_urlsafe(12)


def new_checkpoint_id() -> str:
    return "c_" + secrets.token_urlsafe(12)
