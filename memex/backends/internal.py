"""What MemEx's other layers use of the backends and an application does not: the serving
core's ledger and accounts, the worker processes' wire
(frames, channels, the records' wire forms), the sandbox and checkpoint classes behind each
backend, and the HTTP client behind ``memex.client`` (its public home). Not a public surface:
names here may change in any release. Pinned in tests/test_public_api.py (``INTERNAL``) so
that a change is still deliberate."""

from typing import TYPE_CHECKING, Any

from ._clientdoor import ClientDoor
from ._ledger import Account, Ledger
from ._pool import TenantQuota
from ._ray import RayCheckpoint, RaySandbox
from ._subprocess import ProcessCheckpoint, ProcessSandbox
from ._tmpfiles import FILES_CAP, FILES_ENTRIES, tmp_files, tmp_files_from
from .worker._wire import (
    HEADER,
    Channel,
    ChannelClosed,
    FrameDecoder,
    ProtocolError,
    answer_of,
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

if TYPE_CHECKING:
    from ._remote import Client, RemoteCheckpoint, RemoteSandbox

_REMOTE = ('Client', 'RemoteCheckpoint', 'RemoteSandbox')

__all__ = [
    "FILES_CAP",
    "FILES_ENTRIES",
    "HEADER",
    "Account",
    "Channel",
    "ChannelClosed",
    "Client",
    "ClientDoor",
    "FrameDecoder",
    "Ledger",
    "ProcessCheckpoint",
    "ProcessSandbox",
    "ProtocolError",
    "RayCheckpoint",
    "RaySandbox",
    "RemoteCheckpoint",
    "RemoteSandbox",
    "TenantQuota",
    "answer_of",
    "encode_frame",
    "error_from_wire",
    "error_to_wire",
    "limits_from_wire",
    "limits_to_wire",
    "mounts_from_wire",
    "mounts_to_wire",
    "result_from_wire",
    "result_to_wire",
    "tmp_files",
    "tmp_files_from",
]


def __getattr__(name: str) -> Any:
    if name in _REMOTE:
        from . import _remote  # httpx and websockets only when used

        return getattr(_remote, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
