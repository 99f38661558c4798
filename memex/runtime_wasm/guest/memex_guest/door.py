# Runs inside the guest. Imports nothing from the host packages.
"""The guest end of the door: msgpack request frames over the `_host.call` import.

Request frame: a map {"v": 1, "id": int, "op": str, "args": list, "kwargs": map}.
Reply frame:   {"v": 1, "id": int, "ok": true, "value": any}
           or  {"v": 1, "id": int, "ok": false, "error": {"kind": str, "message": str, ...}}.

Values of types msgpack has no family for (numpy arrays, DataFrames, datetimes, Decimal,
sets...) travel as the ext types of docs/abi.md (see ``memex_guest.codec``); replies carrying
ext types decode to those values.
"""

import _host

from ._codec import _NO_VALUE, pack_request, pack_tool_call, unpack_ok_value, unpackb

_next_id = [0]


class DoorError(Exception):
    """A door call the host refused or could not complete; `kind` says why, `error` is the
    whole error map of the reply."""

    def __init__(self, kind, message, error=None):
        super().__init__("%s: %s" % (kind, message))
        self.kind = kind
        self.message = message
        self.error = error if error is not None else {"kind": kind, "message": message}


def request(op, args, kwargs, typed=False):
    """One door round trip. ``typed=True`` encodes tuples as ext 7 (the tool-call encoding);
    a plain frame sends them as arrays."""
    _next_id[0] += 1
    data = _host.call(pack_request(_next_id[0], op, args, kwargs, typed))
    value = unpack_ok_value(data)
    if value is not _NO_VALUE:
        return value
    return _reply_value(data)


def tool_request(name, raw):
    """``request("tools.call", [name, arguments], {}, True)`` with the arguments already
    encoded (``raw``: the bytes of the map): the tool-call fast path."""
    _next_id[0] += 1
    data = _host.call(pack_tool_call(_next_id[0], name, raw))
    value = unpack_ok_value(data)
    if value is not _NO_VALUE:
        return value
    return _reply_value(data)


def _reply_value(data):
    reply = unpackb(data)
    if type(reply) is not dict:
        raise DoorError("protocol", "malformed reply from host")
    if reply.get("ok"):
        return reply.get("value")
    err = reply.get("error")
    if type(err) is not dict:
        err = {}
    kind = err.get("kind", "unknown")
    message = err.get("message", "")
    raise DoorError(kind if isinstance(kind, str) else repr(kind),
                    message if isinstance(message, str) else repr(message), err)


def call(op, *args, **kwargs):
    """Call the host handler registered as `op`; returns its value or raises DoorError."""
    return request(op, list(args), kwargs)
