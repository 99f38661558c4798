# Runs inside the guest. Imports nothing from the host packages.
"""The guest end of the door: msgpack request frames over the `_host.call` import.

Request frame: a map {"v": 1, "id": int, "op": str, "args": list, "kwargs": map}.
Reply frame:   {"v": 1, "id": int, "ok": true, "value": any}
           or  {"v": 1, "id": int, "ok": false, "error": {"kind": str, "message": str}}.
"""

import _host

from ._codec import packb, unpackb

_next_id = [0]


class DoorError(Exception):
    """A door call the host refused or could not complete; `kind` says why."""

    def __init__(self, kind, message):
        super().__init__("%s: %s" % (kind, message))
        self.kind = kind
        self.message = message


def call(op, *args, **kwargs):
    """Call the host handler registered as `op`; returns its value or raises DoorError."""
    _next_id[0] += 1
    frame = packb({"v": 1, "id": _next_id[0], "op": op, "args": list(args), "kwargs": kwargs})
    reply = unpackb(_host.call(frame))
    if not isinstance(reply, dict):
        raise DoorError("protocol", "malformed reply from host")
    if reply.get("ok"):
        return reply.get("value")
    err = reply.get("error") or {}
    raise DoorError(err.get("kind", "unknown"), err.get("message", ""))
