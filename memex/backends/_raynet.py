"""The one way MemEx starts or joins Ray, and the address it gives a node it starts.

Ray does not default to loopback on Linux: a node it starts takes the machine's interface
address, and a driver told to join ``127.0.0.1:PORT`` rewrites that to the interface address
too (``services.resolve_ip_for_localhost``), so a cluster listening on loopback cannot be
joined at all. Ray's switch for "this machine's nodes live on loopback" is
``ray_constants.ENABLE_RAY_CLUSTER`` (environment ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``),
read once when Ray is first imported. :func:`ray_on_loopback` sets it at the call, whatever
was imported before, for this process (the module constant) and for every process a node
started from here spawns (the environment); every node MemEx, its tests and its benchmarks
start for local use is also given ``127.0.0.1`` by name (:data:`LOOPBACK_NODE`), and
:func:`init_ray` checks where the driver landed instead of trusting either.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import ConfigError

__all__ = ["LOOPBACK", "LOOPBACK_NODE", "init_ray", "is_loopback_address", "ray_on_loopback"]

LOOPBACK = "127.0.0.1"
LOOPBACK_NODE: dict[str, Any] = {"node_ip_address": LOOPBACK}
"""The arguments that put a node ``ray.cluster_utils.Cluster`` starts on loopback
(``head_node_args`` and ``add_node``)."""
_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def is_loopback_address(address: str | None) -> bool:
    """Whether a Ray address (``host:port``, ``ray://host:port``) names this machine's
    loopback (127.0.0.0/8, ``localhost``, ``::1``)."""
    import ipaddress

    if not address or address in ("auto", "local"):
        return False
    host = address.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def ray_on_loopback() -> None:
    """Make this process's Ray, and every Ray process started from it, place this machine's
    nodes on 127.0.0.1 (a driver joining ``127.0.0.1:PORT`` then stays on loopback)."""
    import ray._private.ray_constants as constants

    os.environ[_SWITCH] = "0"  # the node processes (GCS, raylet, workers) read it at import
    constants.ENABLE_RAY_CLUSTER = False  # this one's was read when Ray was first imported


def init_ray(address: str | None = None, **options: Any) -> bool:
    """``ray.init`` as MemEx calls it. ``address`` None means ``RAY_ADDRESS`` when set, else
    a new local Ray (never one found running on the machine, which ``ray.init()`` would
    join); ``"local"`` starts a new one on 127.0.0.1; an address on loopback is joined over
    loopback; any other is the operator's cluster, joined as given (its nodes' addresses are
    theirs). Does nothing when this process is a Ray driver already. True when this call
    started or joined Ray (the caller shuts it down).

    ConfigError when a local start landed elsewhere than loopback (a Ray that ignores the
    switch): nothing of MemEx's local use may listen beyond this machine."""
    import ray

    if ray.is_initialized():
        return False
    if address is None:  # RAY_ADDRESS, else a new one: never whatever /tmp/ray names
        address = os.environ.get("RAY_ADDRESS") or "local"
    local = address == "local" or is_loopback_address(address)
    if local:
        ray_on_loopback()
        options.setdefault("_node_ip_address", LOOPBACK)
    ray.init(address=address, **options)
    if local:
        where = ray.util.get_node_ip_address()
        if where != LOOPBACK:
            ray.shutdown()
            raise ConfigError(f"Ray placed this local node on {where}, not {LOOPBACK}")
    return True
