"""One TLS client context per process for each kind of HTTPS client MemEx opens.

Why: making a context loads the machine's CA certificates, about 20 ms of CPU, and MemEx
makes HTTP clients often (an ``LLMClient``'s async call opens a client per call, a
``RemoteBackend`` one per backend, a package index one per resolution), while a context
made once serves every connection of every client (httpx's own advice). The context's
trust is fixed when it is first made: ``SSL_CERT_FILE``/``SSL_CERT_DIR`` set later in the
process are not read again.

Only clients without HTTP/2 get these: httpcore sets a connection's ALPN protocols on the
context it is handed, which is the same list (``http/1.1``) for all of them.
"""

from __future__ import annotations

import functools
import ssl

__all__ = ["http_tls", "index_tls"]


@functools.cache
def http_tls() -> ssl.SSLContext:
    """httpx's default trust (``SSL_CERT_FILE``, ``SSL_CERT_DIR``, the system's store), made
    once: what an httpx client made with ``verify=True`` would make for itself."""
    import httpx2

    return httpx2.create_ssl_context()


@functools.cache
def index_tls(cafile: str | None) -> ssl.SSLContext:
    """The standard library's default trust, or ``cafile`` alone (pip's ``cert``), made once
    per file: a package index's opener."""
    return ssl.create_default_context(cafile=cafile) if cafile else \
        ssl.create_default_context()
