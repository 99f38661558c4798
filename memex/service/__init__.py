"""``memex serve``: sandboxed sessions as a multi-tenant HTTP service (FastAPI on uvicorn),
whose client is just another backend (``get_backend("remote", url=..., api_key=...)``).

Tenants and their keys (stored hashed), quotas and limit ceilings come from ``serve.toml``
(``_config``); sessions and checkpoints are owned per tenant (``_sessions``); a session's guest
calls tools in the client's process through the door WebSocket (``_door``); the API's
routes are in ``_routes`` over one ``_service.Service`` (the process's state), the app and
its typed errors in ``_app`` and ``_http``, the wire in ``_models``; saves, eviction and moves
between nodes in ``_durable``; ``/metrics`` in ``_metrics``; the tenants' fair shares in
``_shares``; the connection guard in ``_edge`` (shared with ``memex mcp --http``); uvicorn
in ``_serve``. See docs/service.md.

The app and the server (``create_app``, ``serve``) load FastAPI when first used; the rest
(the config, the connection guard) does not, so that ``memex mcp`` can use the guard with
its own extra.
"""

from typing import TYPE_CHECKING, Any

from ._config import (
    KeyRing,
    MountGrant,
    ServiceConfig,
    TenantConfig,
    check_config,
    hash_key,
    load_config,
)
from ._door import ClientDoor
from ._edge import ConnectionGuard, EdgeLimits
from ._models import API_VERSION

if TYPE_CHECKING:
    from ._app import create_app
    from ._serve import serve

__all__ = [
    "API_VERSION",
    "ClientDoor",
    "ConnectionGuard",
    "EdgeLimits",
    "KeyRing",
    "MountGrant",
    "ServiceConfig",
    "TenantConfig",
    "check_config",
    "create_app",
    "hash_key",
    "load_config",
    "serve",
]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from ._app import create_app

        return create_app
    if name == "serve":
        from ._serve import serve

        return serve
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
