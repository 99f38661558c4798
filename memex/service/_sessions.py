"""The server's session record: the core's (``memex.serving``: its table, bounds and
checkpoints are the ones ``memex mcp`` uses) with what serve adds: the session's door to its
client, how to open it again, and the bookkeeping of its saves (``_durable``). Each session is
owned by one tenant: a lookup with another tenant's name finds nothing (the API answers 404,
the same as for an id that never existed)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from ..backends.internal import ClientDoor
from ..serving import DurableSession, QuotaExceeded, SessionTable

__all__ = ["QuotaExceeded", "Session", "SessionTable", "new_checkpoint_id", "new_session_id"]


@dataclass(kw_only=True, eq=False)
class Session(DurableSession):
    """One session on the server (``owner``: its tenant): its sandbox (None while it is
    saved and evicted, or after a restart until its next use), its door to its client, and
    the core's bookkeeping of its saves (``memex.serving.Keeper``)."""

    door: ClientDoor
    egress: Any = None  # the tenant's Egress serving this session's door (shared by forks)
    tools: Any = None  # the ToolHost of the tenant's operator tools on that door (shared too)

    @property
    def tenant(self) -> str:
        return self.owner

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
