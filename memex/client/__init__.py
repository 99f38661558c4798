"""The client of a ``memex serve`` service: :class:`Client` (one method per endpoint of the
HTTP API) and :class:`RemoteBackend`, the backend whose sandboxes live on the service, so
``MemexAgent(backend=RemoteBackend(url=..., api_key=...))`` runs unchanged. Both live in
``memex.backends`` (the remote backend is a backend like the others); this package names them
where a service's users look first. See docs/service.md."""

from ..backends import RemoteBackend
from ..backends.internal import Client, RemoteCheckpoint, RemoteSandbox

__all__ = ["Client", "RemoteBackend", "RemoteCheckpoint", "RemoteSandbox"]
