# Runs inside the guest. Imports nothing from the host packages.
"""Calling host tools from the guest: records, tool errors and ``call``.

``call(name, arguments)`` sends one ``tools.call`` door request (docs/abi.md, Layer 3) and
returns the tool's typed value. Inside the MemEx event loop (``memex_guest.aio``: top-level
``await`` in a cell, ``asyncio.run``) it returns an awaitable instead (``aio.ToolCall``, a
coroutine whose call is already queued); every call made before the loop next waits goes to
the host in one ``tools.batch`` request.

Tool failures raise a ``ToolError`` subclass chosen by the error map's ``kind``.
"""

from . import door as _door
from ._records import MISSING, Record, define_record, make_record
from ._codec import Raw as _Raw
from ._codec import pack_arguments as _pack_arguments
from .codec import DecodeError as _DecodeError

__all__ = [
    "MISSING",
    "Record",
    "ToolArgumentError",
    "ToolBudgetError",
    "ToolDeniedError",
    "ToolError",
    "ToolExecutionError",
    "ToolNotFoundError",
    "ToolReturnError",
    "ToolTimeoutError",
    "call",
    "define_record",
    "make_record",
]


# ---- errors ----------------------------------------------------------------------------------
class ToolError(Exception):
    """A tool call that did not produce a value. ``kind`` is the host's error kind,
    ``message`` its message, ``errors`` the ``{"path": [...], "message"}`` entries it gave
    (argument or return validation), ``tool`` the tool's name, ``details`` the whole map."""

    kind = "tool_error"

    def __init__(self, message="", *, tool=None, kind=None, errors=None, details=None):
        super().__init__(message)
        self.message = message
        self.tool = tool
        if kind is not None:
            self.kind = kind
        self.errors = list(errors) if errors else []
        self.details = details if details is not None else {}

    def __str__(self):
        lines = [self.message] if self.message else []
        for e in self.errors:
            if not isinstance(e, dict):
                text = str(e)
            else:
                path = e.get("path") or []
                where = ".".join(str(p) for p in path) if isinstance(path, (list, tuple)) \
                    else str(path)
                text = "%s: %s" % (where or "<value>", e.get("message", ""))
            if text not in self.message:
                lines.append("  " + text if lines else text)
        return "\n".join(lines)


class ToolArgumentError(ToolError):
    """The arguments were refused (validation, size or depth); ``errors`` lists
    ``{"path": [...], "message": str}``."""

    kind = "invalid_arguments"


class ToolExecutionError(ToolError):
    """The tool raised; the message is what the tool exposes."""

    kind = "tool_failed"


class ToolReturnError(ToolError):
    """The tool returned a value that violates its declared return type."""

    kind = "invalid_return"


class ToolNotFoundError(ToolError):
    """No such tool."""

    kind = "unknown_tool"


class ToolDeniedError(ToolError):
    """The host's gate refused the call."""

    kind = "denied"


class ToolBudgetError(ToolError):
    """A call budget (per turn or per sandbox) is used up."""

    kind = "budget_exceeded"


class ToolTimeoutError(ToolError):
    """The call outlived its bound. ``ran`` says whether the tool started on the host (it
    may still be running there); None when the host did not say."""

    kind = "timeout"

    @property
    def ran(self):
        ran = self.details.get("ran")
        return ran if type(ran) is bool else None


_KINDS = {
    "invalid_arguments": ToolArgumentError,
    "too_large": ToolArgumentError,
    "too_deep": ToolArgumentError,
    "tool_failed": ToolExecutionError,
    "invalid_return": ToolReturnError,
    "unknown_tool": ToolNotFoundError,
    "denied": ToolDeniedError,
    "budget_exceeded": ToolBudgetError,
    "timeout": ToolTimeoutError,
    # door-level kinds (the tool layer did not answer itself)
    "handler_error": ToolExecutionError,
    "unencodable": ToolReturnError,
    "unknown_op": ToolNotFoundError,
}


def error_from_map(err, tool=None):
    """The ToolError for a tool error map ``{"kind", "message", ...}``."""
    if not isinstance(err, dict):
        err = {"kind": "protocol", "message": "malformed tool error: %r" % (err,)}
    kind = err.get("kind")
    kind = kind if isinstance(kind, str) else "tool_error"
    message = err.get("message")
    message = message if isinstance(message, str) else ("" if message is None else str(message))
    cls = _KINDS.get(kind, ToolError)
    if kind == "too_large" and message.startswith("reply"):
        cls = ToolReturnError  # the door's cap on the reply, not on the arguments
    elif kind == "unknown_op" and not message:
        message = "tools are not available in this sandbox"
    if not message:
        message = kind.replace("_", " ")
    name = err.get("tool", tool)
    errors = err.get("errors")
    return cls(message, errors=errors if isinstance(errors, list) else None, tool=name,
               kind=kind, details=err)


# ---- calls -----------------------------------------------------------------------------------
_ACTIVE = [None]  # the memex_guest.aio loop running right now, if any


def _arguments(arguments):
    if arguments is None:
        return {}
    if isinstance(arguments, Record):
        arguments = arguments.to_dict()
    elif type(arguments) is not dict:
        try:
            arguments = dict(arguments)
        except (TypeError, ValueError):
            raise TypeError("tool arguments must be a mapping of names to values, not %s"
                            % type(arguments).__name__) from None
    out = {}
    for k, v in arguments.items():
        if not isinstance(k, str):
            raise TypeError("tool argument names must be str, not %r" % (k,))
        if v is not MISSING:
            out[k] = v
    return out


def call(name, arguments=None):
    """Call the host tool ``name`` with ``arguments`` (a dict of argument name -> value).

    Outside an event loop: blocks and returns the tool's value (typed: records, ndarrays,
    DataFrames, datetimes...), or raises a ToolError subclass. Inside the MemEx event loop:
    returns an awaitable (``memex_guest.aio.ToolCall``) whose call is queued at once; calls
    still pending when the loop next waits are sent together in one ``tools.batch``
    request. Arguments that cannot be encoded raise TypeError here, before anything is sent.
    """
    if type(name) is not str:
        raise TypeError("a tool name must be a str")
    if type(arguments) is not dict:
        arguments = _arguments(arguments)
    raw = _pack_arguments(arguments, MISSING)
    loop = _ACTIVE[0]
    if loop is not None:
        return loop.memex_submit(name, _Raw(raw))
    try:  # _request, inlined: this is the path of every plain call
        return _door.tool_request(name, raw)
    except _door.DoorError as exc:
        raise error_from_map(exc.error, name) from None
    except _DecodeError as exc:
        raise ToolReturnError("the host's value cannot be rebuilt in the guest: %s" % (exc,),
                              tool=name, kind="invalid_return") from exc


def call_encoded(name, raw):
    """``tools.call`` with arguments already encoded (a ``_codec.Raw``); returns the value or
    raises a ToolError."""
    return _request(name, raw.data)


def _request(name, raw):
    try:
        return _door.tool_request(name, raw)
    except _door.DoorError as exc:
        raise error_from_map(exc.error, name) from None
    except _DecodeError as exc:
        raise ToolReturnError("the host's value cannot be rebuilt in the guest: %s" % (exc,),
                              tool=name, kind="invalid_return") from exc


def call_batch(calls):
    """Send ``[(name, raw_arguments), ...]`` as one ``tools.batch`` request. Returns one
    ``(True, value)`` or ``(False, ToolError)`` per call, in order."""
    n = len(calls)
    entries = [[i, name, raw] for i, (name, raw) in enumerate(calls)]
    try:
        reply = _door.request("tools.batch", [entries], {}, True)
    except _door.DoorError as exc:
        if exc.kind == "unknown_op":  # a host without batches: one call at a time
            return [_one(name, raw) for name, raw in calls]
        return [(False, error_from_map(exc.error, name)) for name, _ in calls]
    except _DecodeError as exc:
        return [(False, ToolReturnError("the host's batch reply cannot be rebuilt in the "
                                        "guest: %s" % (exc,), tool=name, kind="invalid_return"))
                for name, _ in calls]
    results = [None] * n
    if type(reply) is list:
        for item in reply:
            if type(item) is list and len(item) == 3 and type(item[0]) is int \
                    and 0 <= item[0] < n and results[item[0]] is None:
                cid, ok, value = item
                tool = calls[cid][0]
                if ok:
                    results[cid] = (True, value)
                else:
                    results[cid] = (False, error_from_map(value, tool))
    for i, r in enumerate(results):
        if r is None:
            results[i] = (False, ToolError("the host's batch reply has no result for this call",
                                           tool=calls[i][0], kind="protocol"))
    return results


def _one(name, raw):
    try:
        return True, call_encoded(name, raw)
    except ToolError as exc:
        return False, exc
