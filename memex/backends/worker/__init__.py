"""Worker processes of the subprocess and pool backends: the process itself (``_main``, run as
``python -m memex.backends.worker``), the caller's side of it (``_client``: start, requests,
door frames, death) and the wire between them (``_wire``: length-prefixed msgpack frames over a
Unix socket, file descriptors passed alongside)."""

from ._wire import (
    Channel,
    ChannelClosed,
    FrameDecoder,
    ProtocolError,
    encode_frame,
    error_from_wire,
    error_to_wire,
    limits_from_wire,
    limits_to_wire,
    mounts_from_wire,
    mounts_to_wire,
    result_from_wire,
    result_to_wire,
)

__all__ = [
    "Channel",
    "ChannelClosed",
    "FrameDecoder",
    "ProtocolError",
    "encode_frame",
    "error_from_wire",
    "error_to_wire",
    "limits_from_wire",
    "limits_to_wire",
    "mounts_from_wire",
    "mounts_to_wire",
    "result_from_wire",
    "result_to_wire",
]
