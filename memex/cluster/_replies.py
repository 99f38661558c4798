"""The control actor's answers to a cluster's fronts, as typed records (they cross Ray,
which pickles them): a front matches on the type, not on a string at the head of a list.

* :class:`Granted` -- done; ``value`` is what was made (a session's entry, a checkpoint id).
* :class:`Slots` -- running slots of a ``max_running`` tenant for a front to spend itself
  (each the room for one turn at once, held under the front's lease until given back).
* :class:`Wait` -- the tenant runs its ``max_running`` turns across the cluster: ask again.
* :class:`Tokens` -- a batch of a tenant's rate tokens for a front to spend itself.
* :class:`Heard` -- the answer to a front's poll: the config if newer than the front's, and
  the tenants whose turns wait for a slot (a front gives back their idle slots at once).
* :class:`Refused` -- a bound or the cluster's room says no: ``code`` is ``quota`` (429),
  ``busy`` (503) or ``not_found`` (404), with the seconds to wait before trying again.
* :class:`Failed` -- it could not be done: the error on the wire (``error_from_wire``).

Inside the actor, a refusal is raised as :class:`ControlRefusal` by whichever part finds it
(the directory's bounds, placement's room, a checkpoint's hold) and answered as its
:class:`Refused`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ControlRefusal", "Failed", "Granted", "Heard", "Refused", "Reply", "Slots", "Tokens",
           "Wait"]


@dataclass(frozen=True, slots=True)
class Granted:
    value: Any


@dataclass(frozen=True, slots=True)
class Slots:
    n: int


@dataclass(frozen=True, slots=True)
class Wait:
    pass


@dataclass(frozen=True, slots=True)
class Tokens:
    n: int


@dataclass(frozen=True, slots=True)
class Heard:
    config: tuple[int, str, dict[str, Any]] | None
    wanted: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Refused:
    code: str
    message: str
    retry_after: int = 1


@dataclass(frozen=True, slots=True)
class Failed:
    error: list[Any]


Reply = Granted | Refused | Failed
"""What a create, a fork or a checkpoint's hold answers."""


class ControlRefusal(Exception):
    """What the control actor refuses, as data a front turns into its answer: ``code`` is
    ``quota`` (429), ``busy`` (503: no room in the cluster) or ``not_found``."""

    def __init__(self, code: str, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.code, self.message, self.retry_after = code, message, retry_after

    def reply(self) -> Refused:
        return Refused(self.code, self.message, self.retry_after)

    def __reduce__(self) -> tuple[Any, ...]:  # it may cross Ray: rebuilt with its arguments
        return (type(self), (self.code, self.message, self.retry_after))
