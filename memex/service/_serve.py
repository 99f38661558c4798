"""Running the service: uvicorn serving :func:`create_app` on one port. ``SIGTERM`` and
``SIGINT`` stop it gracefully: no new connections, requests in flight finish, then every
session is closed and the backend stopped (the app's shutdown). ``SIGHUP`` reads the
tenants again."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType

import uvicorn

from ..backends import Backend
from ..runtime_wasm.internal import cancel_resolutions
from ..serving import ConnectionGuard
from ._app import create_app
from ._config import ServiceConfig
from ._logs import configure

__all__ = ["serve"]


class _Server(uvicorn.Server):
    """uvicorn, whose SIGTERM (or SIGINT) also stops the guest-package resolutions in
    flight: a create waiting on a slow index would otherwise hold the shutdown for its whole
    deadline."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        cancel_resolutions("the server is stopping")
        super().handle_exit(sig, frame)


def serve(config: ServiceConfig, *, backend: Backend | None = None,
          ready: Callable[[str], None] | None = None) -> None:
    """Serve until stopped. ``ready(url)`` is called once the port accepts connections (with
    ``port = 0`` the URL names the port the system chose)."""
    configure(logging.getLogger("memex").level or logging.INFO, access=config.access_log)
    app = create_app(config, backend=backend)
    guard = ConnectionGuard(config.edge)
    app.state.service.edge = guard
    server = _Server(uvicorn.Config(app, host=config.host, port=config.port,
                                           log_level="warning", access_log=False,
                                           log_config=None,  # our JSON lines (_logs)
                                           lifespan="on", ws_max_size=64 << 20,
                                           **guard.config()))

    def announce() -> None:
        while not server.started and not server.should_exit:
            threading.Event().wait(0.02)
        if server.started and ready is not None:
            sock = server.servers[0].sockets[0].getsockname()
            ready(f"http://{sock[0]}:{sock[1]}")

    threading.Thread(target=announce, name="memex-serve-ready", daemon=True).start()
    # SIGHUP: serve.toml's tenants read again at the next request, changed or not (they are
    # also read whenever the file's stat changes); [server] settings need a restart
    keys = app.state.service.keys
    main = threading.current_thread() is threading.main_thread()
    before = signal.signal(signal.SIGHUP, lambda sig, frame: keys.reload_soon()) if main \
        else None
    try:
        server.run()
    finally:
        if main:
            signal.signal(signal.SIGHUP, before)
