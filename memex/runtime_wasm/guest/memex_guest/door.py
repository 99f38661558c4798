# Runs inside the guest. Imports nothing from the host packages.
"""The guest end of the door: msgpack request frames over the `_host.call` import.

Request frame: a map {"v": 1, "id": int, "op": str, "args": list, "kwargs": map}.
Reply frame:   {"v": 1, "id": int, "ok": true, "value": any}
           or  {"v": 1, "id": int, "ok": false, "error": {"kind": str, "message": str}}.
"""

import _host

_next_id = [0]
_packer = [None]


class DoorError(Exception):
    """A door call the host refused or could not complete; `kind` says why."""

    def __init__(self, kind, message):
        super().__init__("%s: %s" % (kind, message))
        self.kind = kind
        self.message = message


def _codec():
    if _packer[0] is None:
        import msgpack

        _packer[0] = msgpack
    return _packer[0]


def call(op, *args, **kwargs):
    """Call the host handler registered as `op`; returns its value or raises DoorError."""
    msgpack = _codec()
    _next_id[0] += 1
    frame = msgpack.packb(
        {"v": 1, "id": _next_id[0], "op": op, "args": list(args), "kwargs": kwargs},
        use_bin_type=True,
    )
    reply = msgpack.unpackb(_host.call(frame), raw=False, strict_map_key=False)
    if not isinstance(reply, dict):
        raise DoorError("protocol", "malformed reply from host")
    if reply.get("ok"):
        return reply.get("value")
    err = reply.get("error") or {}
    raise DoorError(err.get("kind", "unknown"), err.get("message", ""))
