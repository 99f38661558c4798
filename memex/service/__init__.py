"""``memex serve``: sandboxed sessions as a multi-tenant HTTP service (FastAPI on uvicorn),
whose client is just another backend (``get_backend("remote", url=..., api_key=...)``).

Tenants and their keys (stored hashed), quotas and limit ceilings come from ``serve.toml``
(``_config``); sessions, checkpoints, quotas, fair shares, saves and eviction are the session
core's (``memex.serving``, shared with ``memex mcp``), each session owned by one tenant
(``_sessions``); a session's guest calls tools in the client's process through the door
WebSocket (``backends.internal.ClientDoor``); the API's routes are in ``_routes`` over one
``_service.Service`` (the process's state; ``_cluster.ClusterService`` on a Ray cluster),
the app and its typed errors in ``_app`` and ``_http``, the wire in ``_models``; moves
between nodes in ``_durable``; ``/metrics`` in ``_metrics``; uvicorn, held by
``memex.serving``'s connection guard, in ``_serve``.
See docs/service.md.
"""

from ._app import create_app
from ._cluster import check_cluster, drain_node
from ._config import MountGrant, ServiceConfig, TenantConfig, check_config, hash_key, load_config
from ._models import API_VERSION
from ._serve import serve

__all__ = [
    "API_VERSION",
    "MountGrant",
    "ServiceConfig",
    "TenantConfig",
    "check_cluster",
    "check_config",
    "create_app",
    "drain_node",
    "hash_key",
    "load_config",
    "serve",
]
