"""What a slab answers, and the messages of its direct path, as typed records.

Every slab method answers an :data:`Outcome` (through Ray, which pickles it, or over the
direct path): :class:`Done` with its value, :class:`Raised` with the error on the wire
(``error_to_wire``), or :class:`NotHeld` when the slab does not hold the session (it moved,
ended, or the slab's lease from the control actor ran out: ``lease``). A caller matches on
the type; ``unwrap()`` gives the value or raises what the slab raised.

The direct path (a front's socket to a slab, ``Slab._serve``) speaks in
:data:`DirectMessage` records: the front's :class:`Hello` (the slab's secret) first, the
slab's :class:`Welcome`, then the front's :class:`Call` answered by :class:`Answer` (a turn
acknowledged by :class:`Started` as it begins). They cross as msgpack arrays headed by a
tag; :func:`to_wire` and :func:`from_wire` are the one encoder and the one decoder, and the
decoder takes anything that is not exactly one of these records as a protocol error (what
arrives on a socket is untrusted: a slab's port is reachable by anything on the network).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, NoReturn

from ..backends.internal import ProtocolError, error_from_wire, error_to_wire
from ..errors import MemexError, SandboxClosed

__all__ = ["DIRECT", "Answer", "Call", "DirectMessage", "Done", "Hello", "NotHeld",
           "NotHeldHere", "Outcome", "Raised", "Started", "Welcome", "from_wire",
           "outcome_of", "raised", "to_wire"]

DIRECT = frozenset({"run", "read_file", "write_file", "list_files", "checkpoint", "restore",
                    "save"})
"""What a front calls over a slab's socket (the rest goes through Ray)."""
SECRET_BYTES = 32


# ---- outcomes -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Done:
    """The call ran; ``value`` is what it returned."""

    value: Any
    TAG: ClassVar[str] = "ok"

    def unwrap(self) -> Any:
        return self.value


@dataclass(frozen=True, slots=True)
class Raised:
    """The call raised ``error`` (``[class name, message, reason]``, ``error_to_wire``)."""

    error: list[Any]
    TAG: ClassVar[str] = "err"

    def unwrap(self) -> NoReturn:
        raise error_from_wire(self.error)


@dataclass(frozen=True, slots=True)
class NotHeld:
    """The slab does not hold ``sid``: it moved (a drain, a recovery) or ended; ``lease``
    when the slab holds nothing because its lease from the control actor ran out (it is
    being recovered elsewhere now). Nothing ran."""

    sid: str
    lease: bool
    TAG: ClassVar[str] = "not_held"

    @property
    def message(self) -> str:
        if self.lease:
            return (f"session {self.sid} is not held by this slab: its lease from the control "
                    "actor ran out")
        return f"session {self.sid} is not held by this slab"

    def unwrap(self) -> NoReturn:
        raise SandboxClosed(self.message)


Outcome = Done | Raised | NotHeld
"""What every slab method answers."""


class NotHeldHere(Exception):
    """Raised in a slab for a session it does not hold; answered :class:`NotHeld`."""

    def __init__(self, sid: str, lease: bool = False) -> None:
        super().__init__(sid)
        self.sid, self.lease = sid, lease


def raised(exc: BaseException) -> Raised:
    """``exc`` on the wire: MemEx's own as itself, anything else as a ``SandboxError`` naming
    its type (the one translation for the slabs' answers and the control actor's)."""
    if isinstance(exc, MemexError):
        return Raised(list(error_to_wire(exc)))
    return Raised(["SandboxError", f"{type(exc).__name__}: {exc}", None])


def outcome_of(fn: Callable[..., Any], *args: Any) -> Outcome:
    """``fn(*args)`` as an outcome: :class:`Done`, :class:`NotHeld`, or :class:`Raised` for
    what else it raised (:func:`raised`)."""
    try:
        return Done(fn(*args))
    except NotHeldHere as exc:
        return NotHeld(exc.sid, exc.lease)
    except Exception as exc:
        return raised(exc)


# ---- the direct path's messages ---------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Hello:
    """A front's first message: the slab's secret (given out by the control actor only)."""

    secret: bytes
    TAG: ClassVar[str] = "hello"


@dataclass(frozen=True, slots=True)
class Welcome:
    """The slab took the front's hello."""

    TAG: ClassVar[str] = "welcome"


@dataclass(frozen=True, slots=True)
class Call:
    """``method(*args)`` on the slab (``args[0]`` the session), numbered ``seq``."""

    seq: int
    method: str
    args: list[Any]
    TAG: ClassVar[str] = "call"


@dataclass(frozen=True, slots=True)
class Started:
    """The turn of call ``seq`` begins: past this, it may have had effects."""

    seq: int
    TAG: ClassVar[str] = "started"


@dataclass(frozen=True, slots=True)
class Answer:
    """What call ``seq`` came to."""

    seq: int
    outcome: Outcome
    TAG: ClassVar[str] = "reply"


DirectMessage = Hello | Welcome | Call | Started | Answer


def to_wire(msg: DirectMessage) -> list[Any]:
    """The record as a msgpack array headed by its tag."""
    match msg:
        case Hello(secret):
            return [Hello.TAG, secret]
        case Welcome():
            return [Welcome.TAG]
        case Call(seq, method, args):
            return [Call.TAG, seq, method, args]
        case Started(seq):
            return [Started.TAG, seq]
        case Answer(seq, outcome):
            return [Answer.TAG, seq, _outcome_to_wire(outcome)]
    raise TypeError(f"not a message of a slab's direct path: {msg!r}")


def _outcome_to_wire(out: Outcome) -> list[Any]:
    match out:
        case Done(value):
            return [Done.TAG, value]
        case Raised(error):
            return [Raised.TAG, error]
        case NotHeld(sid, lease):
            return [NotHeld.TAG, sid, lease]
    raise TypeError(f"not a slab's outcome: {out!r}")


def from_wire(msg: Any) -> DirectMessage:
    """The record ``msg`` (a decoded msgpack value) is; :class:`ProtocolError` for anything
    that is not exactly one (a wrong tag, count or type of a field, an unknown method)."""
    match msg:
        case [Hello.TAG, bytes() as secret] if len(secret) == SECRET_BYTES:
            return Hello(secret)
        case [Welcome.TAG]:
            return Welcome()
        case [Call.TAG, int() as seq, str() as method, list() as args] \
                if _seq(seq) and method in DIRECT and args and isinstance(args[0], str):
            return Call(seq, method, args)
        case [Started.TAG, int() as seq] if _seq(seq):
            return Started(seq)
        case [Answer.TAG, int() as seq, list() as out] if _seq(seq):
            return Answer(seq, _outcome_from_wire(out))
    raise ProtocolError(f"not a message of a slab's direct path: {_shown(msg)}")


def _outcome_from_wire(out: list[Any]) -> Outcome:
    match out:
        case [Done.TAG, value]:
            return Done(value)
        case [Raised.TAG, [str(), str(), _] as error]:
            return Raised(list(error))
        case [NotHeld.TAG, str() as sid, bool() as lease]:
            return NotHeld(sid, lease)
    raise ProtocolError(f"not a slab's outcome: {_shown(out)}")


def _seq(seq: int) -> bool:
    return not isinstance(seq, bool) and 0 <= seq < 1 << 63


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."
