# Runs inside the guest. Imports nothing from the host packages.
"""Network egress through the host: ``urllib.request``, ``http.client`` and ``fetch``.

The guest has no sockets. Every HTTP request goes to the host as one ``net.fetch`` door call
(a map ``{url, method, headers, body, timeout, follow_redirects, via}``) and the host's egress
policy decides (docs/egress.md). ``install()`` (run when ``memex_guest`` is imported) patches
``http.client`` as soon as it is imported, and so ``urllib.request``, which uses it:

* ``http.client.HTTPConnection`` / ``HTTPSConnection`` keep all of the stdlib's request and
  response code; only their socket is replaced by a buffer whose request goes to the host
  when the response is read (so errors surface at ``getresponse()``). TLS is the host's job:
  ``https`` works without an ``ssl`` module and a ``context`` argument is ignored.
  ``urllib`` follows redirects itself, each hop one request the policy checks.
* ``fetch(url, method=, headers=, body=, json=, timeout=, follow_redirects=True)`` returns a
  :class:`Response` (``status``, ``reason``, ``headers``, ``body``, ``url``, ``redirects``,
  ``text``, ``json()``, ``ok``, ``raise_for_status()``); the host follows redirects,
  re-checking each.

Errors, all ``urllib.error.URLError`` (so ``OSError``): ``EgressDenied`` (also
``PermissionError``; the policy, a cap, or no egress attached), ``EgressTimeout`` (also
``TimeoutError``), ``EgressConnectionError`` (also ``ConnectionError``: DNS, connect, TLS, a
bad response). ``str(e)`` (and ``e.reason``, as for any URLError) names the request, the
reason and the rule; ``e.kind``, ``e.rule``, ``e.url``, ``e.method`` and ``e.details`` (the
host's whole error map, with its short ``reason``) are there for code.
They are created on first use (``urllib.error`` costs ~40 ms to import in the guest), so
importing this module stays cheap.
"""

import sys as _sys

__all__ = ["EgressConnectionError", "EgressDenied", "EgressError", "EgressTimeout",  # noqa: F822
           "Headers", "Response", "fetch", "install"]

OP = "net.fetch"
_DENIED = ("denied", "cap", "invalid_request", "no_policy", "no_socket")
_CONNECTION = ("dns", "connect", "tls", "bad_response")
_LAZY = ("EgressError", "EgressDenied", "EgressTimeout", "EgressConnectionError")


def __getattr__(name):
    if name in _LAZY:
        return _errors()[name]
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


def _errors():
    g = globals()
    if "EgressError" in g:
        return g
    import urllib.error

    class EgressError(urllib.error.URLError):
        """A request through the host's egress that did not complete."""

        def __init__(self, message, kind="error", reason=None, rule=None, url=None,
                     method=None, details=None):
            urllib.error.URLError.__init__(self, message)
            self.message = message
            self.kind = kind
            self.rule = rule
            self.url = url
            self.method = method
            self.details = dict(details) if details else {}

        def __str__(self):
            return self.message

        def __reduce__(self):
            return (type(self), (self.message, self.kind, None, self.rule, self.url,
                                 self.method, self.details))

    class EgressDenied(EgressError, PermissionError):
        """The host refused the request: its egress policy, a cap, or no egress at all."""

    class EgressTimeout(EgressError, TimeoutError):
        """The request ran out of time (its own timeout, the policy's, or the turn's)."""

    class EgressConnectionError(EgressError, ConnectionError):
        """The host could not complete the request: DNS, connection, TLS or a bad response."""

    for cls in (EgressError, EgressDenied, EgressTimeout, EgressConnectionError):
        cls.__qualname__ = cls.__name__
        g[cls.__name__] = cls
    return g


def _error(err, method, url):
    """The exception for an error map from the host (or the door)."""
    g = _errors()
    kind = err.get("kind")
    kind = kind if isinstance(kind, str) else "error"
    message = err.get("message")
    if not isinstance(message, str) or not message:
        message = "egress failed: %s %s: %s" % (method, url, kind)
    if kind in _DENIED:
        cls = g["EgressDenied"]
    elif kind == "timeout":
        cls = g["EgressTimeout"]
    elif kind in _CONNECTION:
        cls = g["EgressConnectionError"]
    else:
        cls = g["EgressError"]
    reason = err.get("reason")
    rule = err.get("rule")
    return cls(message, kind=kind, reason=reason if isinstance(reason, str) else None,
               rule=rule if isinstance(rule, str) else None,
               url=err.get("url") if isinstance(err.get("url"), str) else url,
               method=method, details=err)


def _request(req):
    """One ``net.fetch`` round trip: the reply map, or the matching exception."""
    from . import door as _door

    method, url = req["method"], req["url"]
    try:
        value = _door.request(OP, [req], {})
    except _door.DoorError as exc:
        err = exc.error if isinstance(exc.error, dict) else {}
        if err.get("egress"):
            raise _error(err, method, url) from None
        if exc.kind == "unknown_op":
            raise _error({"kind": "no_policy", "reason": "no egress policy is attached",
                          "message": "egress denied: %s %s: network access is disabled in "
                          "this sandbox: no egress policy is attached (the host serves no "
                          "%r); the request was not sent" % (method, url, OP)},
                         method, url) from None
        if exc.kind == "timeout":
            raise _error({"kind": "timeout", "message": "egress failed: %s %s: the host did "
                          "not answer in time (%s)" % (method, url, exc.message)},
                         method, url) from None
        if exc.kind == "too_large":
            raise _error({"kind": "cap", "message": "egress denied: %s %s: %s"
                          % (method, url, exc.message)}, method, url) from None
        raise _error({"kind": exc.kind, "message": "egress failed: %s %s: %s"
                      % (method, url, exc.message)}, method, url) from None
    if type(value) is not dict or not isinstance(value.get("status"), int):
        raise _error({"kind": "bad_response", "message": "egress failed: %s %s: malformed "
                      "reply from the host" % (method, url)}, method, url)
    return value


def _timeout(value):
    if value is None or type(value) is object:  # socket._GLOBAL_DEFAULT_TIMEOUT
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return None
    return float(value)


# ---- fetch ----------------------------------------------------------------------------------
class Headers:
    """Response headers: case-insensitive lookup, order and repeats kept."""

    def __init__(self, pairs=()):
        self._pairs = [(str(k), str(v)) for k, v in pairs]

    def get(self, name, default=None):
        low = name.lower()
        for k, v in self._pairs:
            if k.lower() == low:
                return v
        return default

    def get_all(self, name):
        low = name.lower()
        return [v for k, v in self._pairs if k.lower() == low]

    def __getitem__(self, name):
        value = self.get(name)
        if value is None:
            raise KeyError(name)
        return value

    def __contains__(self, name):
        return isinstance(name, str) and self.get(name) is not None

    def items(self):
        return list(self._pairs)

    def keys(self):
        return [k for k, _ in self._pairs]

    def __iter__(self):
        return iter(self.keys())

    def __len__(self):
        return len(self._pairs)

    def __eq__(self, other):
        return isinstance(other, Headers) and self._pairs == other._pairs

    def __repr__(self):
        return "Headers(%r)" % (self._pairs,)


class Response:
    """What ``fetch`` returns (the host followed redirects unless told not to)."""

    def __init__(self, status, reason, headers, body, url, redirects=()):
        self.status = status
        self.reason = reason
        self.headers = headers if isinstance(headers, Headers) else Headers(headers)
        self.body = body
        self.url = url
        self.redirects = tuple(redirects)

    @property
    def ok(self):
        return self.status < 400

    @property
    def encoding(self):
        ctype = self.headers.get("content-type", "")
        for part in ctype.split(";")[1:]:
            key, _, value = part.strip().partition("=")
            if key.strip().lower() == "charset" and value.strip():
                return value.strip().strip('"')
        return "utf-8"

    @property
    def text(self):
        try:
            return self.body.decode(self.encoding, "replace")
        except LookupError:
            return self.body.decode("utf-8", "replace")

    def json(self):
        import json

        return json.loads(self.body)

    def raise_for_status(self):
        """Raise ``urllib.error.HTTPError`` for a 4xx or 5xx status."""
        if self.status >= 400:
            import io
            import urllib.error

            raise urllib.error.HTTPError(self.url, self.status, self.reason, None,
                                         io.BytesIO(self.body))
        return self

    def __repr__(self):
        return "<Response %d %s %s (%d bytes)>" % (self.status, self.reason, self.url,
                                                  len(self.body))


def _header_pairs(headers):
    if headers is None:
        return []
    items = headers.items() if hasattr(headers, "items") else headers
    out = []
    for pair in items:
        k, v = pair
        if not isinstance(k, str):
            raise TypeError("header names must be str, got %s" % type(k).__name__)
        if isinstance(v, bytes):
            v = v.decode("latin-1")
        out.append([k, str(v)])
    return out


def fetch(url, method="GET", headers=None, body=None, *, json=None, timeout=None,
          follow_redirects=True):
    """Make one HTTP request through the host's egress policy and return a Response.

    ``headers``: a mapping or (name, value) pairs; ``body``: bytes or str (UTF-8); ``json``:
    a value sent as JSON (sets Content-Type). Raises EgressDenied, EgressTimeout or
    EgressConnectionError; an HTTP error status is a Response (see raise_for_status)."""
    if not isinstance(url, str):
        raise TypeError("url must be str, got %s" % type(url).__name__)
    if not isinstance(method, str) or not method:
        raise TypeError("method must be a non-empty str")
    pairs = _header_pairs(headers)
    if json is not None:
        if body is not None:
            raise TypeError("give body or json, not both")
        import json as _json

        body = _json.dumps(json).encode("utf-8")
        if not any(k.lower() == "content-type" for k, _ in pairs):
            pairs.append(["Content-Type", "application/json"])
    if isinstance(body, str):
        body = body.encode("utf-8")
    elif isinstance(body, (bytearray, memoryview)):
        body = bytes(body)
    elif body is not None and not isinstance(body, bytes):
        raise TypeError("body must be bytes or str, got %s" % type(body).__name__)
    value = _request({"url": url, "method": method.upper(), "headers": pairs, "body": body,
                      "timeout": _timeout(timeout), "follow_redirects": bool(follow_redirects),
                      "via": "fetch"})
    return Response(value["status"], value.get("reason") or "", value.get("headers") or (),
                    value.get("body") or b"", value.get("url") or url,
                    value.get("redirects") or ())


# ---- http.client --------------------------------------------------------------------------
def _dechunk(data):
    out = []
    i = 0
    while True:
        end = data.find(b"\r\n", i)
        if end == -1:
            break
        size = int(data[i:end].split(b";")[0].strip() or b"0", 16)
        if size == 0:
            break
        out.append(data[end + 2:end + 2 + size])
        i = end + 2 + size + 2
    return b"".join(out)


def _exchange(conn, raw):
    """Send the request http.client wrote (``raw``) to the host; the response as bytes."""
    head, sep, rest = raw.partition(b"\r\n\r\n")
    if not sep:
        raise _error({"kind": "invalid_request", "message": "egress denied: the request "
                      "was not complete when its response was read"}, "?", "?")
    lines = head.decode("latin-1").split("\r\n")
    method, target = lines[0].split(" ")[:2]
    headers = []
    length = None
    chunked = False
    for line in lines[1:]:
        name, _, value = line.partition(":")
        name, value = name.strip(), value.strip()
        low = name.lower()
        if low == "content-length" and value.isdigit():
            length = int(value)
        elif low == "transfer-encoding" and "chunked" in value.lower():
            chunked = True
        if low not in ("host", "content-length", "transfer-encoding", "connection"):
            headers.append([name, value])
    body = _dechunk(rest) if chunked else rest[:length] if length is not None else rest
    if target.startswith(("http://", "https://")):
        url = target
    else:
        host = conn.host if ":" not in conn.host else "[%s]" % conn.host
        port = "" if conn.port == conn.default_port else ":%d" % conn.port
        url = "%s://%s%s%s" % (conn._memex_scheme, host, port, target)
    value = _request({"url": url, "method": method, "headers": headers,
                      "body": body if (body or length is not None or chunked) else None,
                      "timeout": _timeout(conn.timeout), "follow_redirects": False,
                      "via": "http.client"})
    status = value["status"]
    out = ["HTTP/1.1 %d %s" % (status, value.get("reason") or "")]
    bodiless = method == "HEAD" or status in (204, 304) or 100 <= status < 200
    for name, val in value.get("headers") or ():
        low = name.lower()
        if low == "transfer-encoding" or (low == "content-length" and not bodiless):
            continue
        out.append("%s: %s" % (name, val))
    data = value.get("body") or b""
    if not bodiless:
        out.append("Content-Length: %d" % len(data))
    return ("\r\n".join(out) + "\r\n\r\n").encode("latin-1", "replace") + data


class _Wire:
    """The socket of a patched connection: collects the request, answers from the host."""

    def __init__(self, conn):
        self._conn = conn
        self._out = []

    def sendall(self, data):
        self._out.append(bytes(data))

    def send(self, data):
        self._out.append(bytes(data))
        return len(data)

    def makefile(self, mode="rb", *args, **kwargs):
        import io

        raw, self._out = b"".join(self._out), []
        try:
            data = _exchange(self._conn, raw)
        except Exception as exc:  # raised by the response's first read, inside getresponse()
            return _FailedFile(exc)
        return io.BufferedReader(io.BytesIO(data))

    def close(self):
        self._out = []

    def settimeout(self, value):
        pass

    def setsockopt(self, *args):
        pass

    def shutdown(self, how):
        pass

    def fileno(self):
        return -1


class _FailedFile:
    """The response "file" of a request the host refused or could not complete: reading it
    raises the error (so http.client's response object is fully built and closes cleanly)."""

    closed = False

    def __init__(self, exc):
        self._exc = exc

    def _raise(self, *args, **kwargs):
        raise self._exc.with_traceback(None)

    read = readline = read1 = readinto = peek = _raise

    def flush(self):
        pass

    def close(self):
        self.closed = True


class _TLSContext:
    """What urllib's HTTPSHandler keeps as its context: TLS is done by the host."""

    check_hostname = True
    verify_mode = 2
    post_handshake_auth = None

    def set_alpn_protocols(self, protocols):
        pass

    def load_verify_locations(self, *args, **kwargs):
        pass


def _https_context(http_version=None):
    return _TLSContext()


def _patch_http_client(hc):
    if getattr(hc, "_memex_egress", False):
        return
    base = hc.HTTPConnection

    class HTTPConnection(base):
        """http.client.HTTPConnection whose requests go through the host's egress."""

        _memex_scheme = "http"

        def connect(self):
            self.sock = _Wire(self)

        def set_tunnel(self, host, port=None, headers=None):
            raise _error({"kind": "denied", "message": "egress denied: HTTP tunnels (proxies) "
                          "are not available; requests go through the host's egress"},
                         "CONNECT", "%s:%s" % (host, port))

    class HTTPSConnection(HTTPConnection):
        """http.client.HTTPSConnection for the guest: TLS is done by the host."""

        default_port = hc.HTTPS_PORT
        _memex_scheme = "https"

        def __init__(self, host, port=None, *args, context=None, **kwargs):
            super().__init__(host, port, *args, **kwargs)
            self._context = context

    for cls in (HTTPConnection, HTTPSConnection):
        cls.__qualname__ = cls.__name__
    hc.HTTPConnection = HTTPConnection
    hc.HTTPSConnection = HTTPSConnection
    hc._create_https_context = _https_context
    if "HTTPSConnection" not in hc.__all__:
        hc.__all__.append("HTTPSConnection")
    hc._memex_egress = True
    ur = _sys.modules.get("urllib.request")
    if ur is not None and not getattr(getattr(ur, "__spec__", None), "_initializing", False) \
            and not hasattr(ur, "HTTPSHandler"):
        _add_https_handler(ur, hc)


def _add_https_handler(ur, hc):
    """For a urllib.request imported before http.client was patched (it then lacks https)."""

    class HTTPSHandler(ur.AbstractHTTPHandler):
        def __init__(self, debuglevel=None, context=None, check_hostname=None):
            ur.AbstractHTTPHandler.__init__(self, debuglevel or 0)
            self._context = context

        def https_open(self, req):
            return self.do_open(hc.HTTPSConnection, req, context=self._context)

        https_request = ur.AbstractHTTPHandler.do_request_

    ur.HTTPSHandler = HTTPSHandler
    if getattr(ur, "_opener", None) is not None:
        ur._opener.add_handler(HTTPSHandler())


def _ftp_refused(self, req):
    url = req.get_full_url()
    raise _error({"kind": "denied", "message": "egress denied: %s: scheme 'ftp' is not "
                  "supported (the sandbox's egress carries http and https only)" % url},
                 "GET", url)


def _patch_urllib_request(ur):
    """urllib's FTP handlers would open sockets: refuse ftp like any other scheme."""
    for name in ("FTPHandler", "CacheFTPHandler"):
        cls = getattr(ur, name, None)
        if cls is not None:
            cls.ftp_open = _ftp_refused


_PATCHES = {"http.client": _patch_http_client, "urllib.request": _patch_urllib_request}


class _PatchingLoader:
    """Wraps a module's loader: once the module has run, route it through the host."""

    def __init__(self, loader, patch):
        self._loader = loader
        self._patch = patch

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        try:
            self._patch(module)
        except Exception as exc:  # never break the import itself
            _sys.stderr.write("memex_guest.net: could not route %s through the host: %r\n"
                              % (module.__name__, exc))

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _HttpClientFinder:
    """A meta path finder that wraps the loaders of http.client and urllib.request (it stays:
    a re-import is patched too)."""

    def find_spec(self, name, path=None, target=None):
        patch = _PATCHES.get(name)
        if patch is None:
            return None
        for finder in _sys.meta_path:
            if finder is self or type(finder).__name__ == "_HttpClientFinder":
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader, patch)
                return spec
        return None


def install():
    """Route ``http.client`` (and so ``urllib.request``) through the host: now if it is
    imported, else as soon as it is. Cheap; idempotent."""
    hc = _sys.modules.get("http.client")
    if hc is not None:
        _patch_http_client(hc)
    ur = _sys.modules.get("urllib.request")
    if ur is not None:
        _patch_urllib_request(ur)
    if not any(type(f).__name__ == "_HttpClientFinder" for f in _sys.meta_path):
        _sys.meta_path.insert(0, _HttpClientFinder())
