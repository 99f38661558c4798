"""The host's HTTP client for guest requests: check, resolve once, check every address,
connect to a checked address, and re-check every redirect.

One hop: the policy decides on the URL before any DNS lookup (a denied name is never
resolved, so DNS cannot leak it); the name is resolved once (injectable resolver) and every
address is checked; the connection goes to a checked address while the ``Host`` header and
TLS SNI/certificate check use the name (no second lookup: no DNS rebinding). The guest's
headers lose the host-controlled ones (Host, Content-Length, hop-by-hop) and the policy's
strip list unless the matching rule allows them; the host's secrets are added last. Byte
caps are enforced before sending and while reading; each hop has a deadline enforced by a
watchdog that shuts the socket (a slow server cannot hold the door past it).
"""

from __future__ import annotations

import contextlib
import heapq
import http.client
import itertools
import socket
import ssl
import threading
import time
import urllib.parse
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._addr import IPAddress, Target, parse_address
from ._policy import EgressPolicy
from ._rules import EgressDecision, EgressSecret, SecretUnavailable

__all__ = ["FetchFailure", "FetchRequest", "FetchResponse", "Fetcher", "Hop", "Resolver",
           "open_connection", "parse_guest_request", "system_resolver"]

Resolver = Callable[[str, int], Sequence[str | IPAddress]]

HOST_CONTROLLED = frozenset({
    "host", "content-length", "transfer-encoding", "connection", "keep-alive",
    "proxy-connection", "te", "trailer", "upgrade", "expect",
})
REDIRECTS = frozenset({301, 302, 303, 307, 308})
REDACTED = "[REDACTED]"
MAX_HEADERS = 100
MAX_HEADER_BYTES = 64 << 10


def system_resolver(host: str, port: int) -> list[str]:
    """The host's own resolver (``getaddrinfo``), each address once, in its order."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    seen: dict[str, None] = {}
    for info in infos:
        seen.setdefault(str(info[4][0]), None)
    return list(seen)


def open_connection(address: str, port: int, timeout: float) -> socket.socket:
    """Open a TCP connection to an address the policy has checked (never a name)."""
    return socket.create_connection((address, port), timeout=timeout)


@dataclass(frozen=True, kw_only=True)
class FetchRequest:
    """One guest request as the door delivered it (validated by the host)."""

    url: str
    method: str = "GET"
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes | None = None
    timeout: float | None = None
    follow_redirects: bool = True
    via: str = "fetch"


@dataclass(frozen=True, kw_only=True)
class FetchResponse:
    status: int
    reason: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    url: str
    redirects: tuple[str, ...] = ()


class FetchFailure(Exception):
    """A request that did not complete. ``kind``: ``denied`` (the policy), ``cap`` (a byte,
    count, rate or redirect cap), ``invalid_request``, ``timeout``, ``dns``, ``connect``,
    ``tls`` or ``bad_response``."""

    def __init__(self, kind: str, reason: str, *, rule: str | None = None,
                 url: str | None = None) -> None:
        super().__init__(reason)
        self.kind, self.reason, self.rule, self.url = kind, reason, rule, url


@dataclass(frozen=True, kw_only=True)
class Hop:
    """One attempt (a request, or one hop of a redirect chain) for the audit."""

    time: float  # wall clock (epoch seconds) at the start
    via: str
    method: str
    url: str  # secrets redacted
    decision: str  # allow | deny
    outcome: str  # ok, or the FetchFailure kind
    reason: str
    rule: str | None = None
    status: int | None = None
    request_bytes: int = 0
    response_bytes: int = 0
    duration: float = 0.0
    addresses: tuple[str, ...] = ()
    address: str | None = None
    hop: int = 0
    redirect_from: str | None = None
    secrets: tuple[str, ...] = ()
    stripped_headers: tuple[str, ...] = ()


# ---- deadlines ----------------------------------------------------------------------------------
class _Guard:
    """What the watchdog shuts when a hop's deadline passes."""

    __slots__ = ("fired", "sock")

    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        self.fired = False

    def fire(self) -> None:
        self.fired = True
        s = self.sock
        if s is not None:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


class _Watchdog:
    """One thread for all deadlines: a heap of (deadline, guard), cancelled lazily."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._heap: list[list[Any]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def watch(self, deadline: float, guard: _Guard) -> list[Any]:
        entry = [deadline, next(self._seq), guard]
        with self._cv:
            heapq.heappush(self._heap, entry)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="memex-egress-watchdog")
                self._thread.start()
            if self._heap[0] is entry:
                self._cv.notify()
        return entry

    def cancel(self, entry: list[Any]) -> None:
        entry[2] = None

    def _run(self) -> None:
        with self._cv:
            while True:
                while self._heap and self._heap[0][2] is None:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cv.wait()
                    continue
                delay = self._heap[0][0] - time.monotonic()
                if delay > 0:
                    self._cv.wait(delay)
                    continue
                guard = heapq.heappop(self._heap)[2]
                if guard is not None:
                    guard.fire()


_WATCHDOG = _Watchdog()


# ---- the client ---------------------------------------------------------------------------------
def _redact(text: str, values: Sequence[str]) -> str:
    for v in sorted(values, key=len, reverse=True):
        if v:
            text = text.replace(v, REDACTED)
    return text


def _with_query(t: Target, name: str, value: str) -> Target:
    pairs = [p for p in (t.query or "").split("&") if p and p.partition("=")[0] != name]
    pairs.append(f"{name}={urllib.parse.quote(value, safe='')}")
    return Target(scheme=t.scheme, host=t.host, ip=t.ip, port=t.port, path=t.path,
                  query="&".join(pairs))


@dataclass
class _HopState:
    """Scratch of one hop while it runs (becomes a Hop)."""

    url: str
    method: str
    hop: int
    redirect_from: str | None
    start: float = field(default_factory=time.monotonic)
    wall: float = field(default_factory=time.time)
    decision: EgressDecision | None = None
    addresses: tuple[str, ...] = ()
    address: str | None = None
    secrets: tuple[str, ...] = ()
    stripped: tuple[str, ...] = ()
    redact: list[str] = field(default_factory=list)
    request_bytes: int = 0
    response_bytes: int = 0
    status: int | None = None
    sent_url: str | None = None  # with the host's query secrets (redacted in the audit)


class Fetcher:
    """Performs guest requests under a policy. ``admit()`` is asked once per allowed hop
    (quotas and rate; it returns a refusal reason or None); ``on_hop`` gets every Hop."""

    def __init__(self, policy: EgressPolicy, *, resolver: Resolver | None = None,
                 ssl_context: ssl.SSLContext | None = None,
                 connect: Callable[[str, int, float], socket.socket] | None = None) -> None:
        self.policy = policy
        self.resolver = resolver
        self._ssl = ssl_context
        self._connect = connect
        self._lock = threading.Lock()

    def _context(self) -> ssl.SSLContext:
        with self._lock:
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            return self._ssl

    def fetch(self, req: FetchRequest, *, deadline: float, admit: Callable[[], str | None],
              on_hop: Callable[[Hop], None]) -> FetchResponse:
        url, method, headers, body = req.url, req.method.upper(), list(req.headers), req.body
        redirects: list[str] = []
        prev: str | None = None
        prev_origin: tuple[str, str, int] | None = None
        limit = self.policy.limits.max_redirects
        for hop in range(limit + 1):
            st = _HopState(url=url, method=method, hop=hop, redirect_from=prev)
            try:
                status, reason, rheaders, rbody, t = self._hop(st, req, headers, body, deadline,
                                                               admit, prev_origin)
            except FetchFailure as exc:
                if exc.rule is None and st.decision is not None and st.decision.allowed:
                    exc.rule = st.decision.rule
                exc.reason = _redact(exc.reason, st.redact)  # the guest sees these
                exc.url = _redact(exc.url, st.redact) if exc.url else exc.url
                on_hop(self._report(st, req, exc.kind, exc.reason, exc.rule))
                raise
            d = st.decision
            assert d is not None
            on_hop(self._report(st, req, "ok", d.reason, d.rule))
            location = next((v for k, v in rheaders if k.lower() == "location"), None)
            if not (req.follow_redirects and status in REDIRECTS and location):
                shown = tuple(_redact(u, st.redact) for u in redirects)
                return FetchResponse(status=status, reason=reason, headers=rheaders, body=rbody,
                                     url=_redact(t.url, st.redact), redirects=shown)
            if hop == limit:
                raise FetchFailure("cap", f"more than {limit} redirects (last to {location})",
                                   url=url)
            prev, prev_origin = _redact(t.url, st.redact), t.origin()
            url = urllib.parse.urljoin(t.url, location)
            redirects.append(url)
            if (status == 303 and method != "HEAD") or (status in (301, 302) and method == "POST"):
                method, body = "GET", None
                headers = [(k, v) for k, v in headers
                           if k.lower() not in ("content-type", "content-encoding")]
        raise AssertionError("unreachable")  # pragma: no cover

    def _report(self, st: _HopState, req: FetchRequest, outcome: str, reason: str,
                rule: str | None) -> Hop:
        d = st.decision
        url = st.sent_url or (d.url if d is not None else st.url)
        return Hop(time=st.wall, via=req.via, method=st.method, url=_redact(url, st.redact),
                   decision="allow" if d is not None and d.allowed else "deny",
                   outcome=outcome, reason=_redact(reason, st.redact), rule=rule,
                   status=st.status, request_bytes=st.request_bytes,
                   response_bytes=st.response_bytes, duration=time.monotonic() - st.start,
                   addresses=st.addresses, address=st.address, hop=st.hop,
                   redirect_from=st.redirect_from, secrets=st.secrets,
                   stripped_headers=st.stripped)

    def _decide(self, st: _HopState, addresses: Sequence[Any] | None) -> EgressDecision:
        d = self.policy.check(st.url, st.method, addresses=addresses)
        st.decision = d
        st.addresses = d.addresses
        if not d.allowed and not (addresses is None and d.code == "pending_dns"):
            kind = "invalid_request" if d.code == "invalid" and addresses is None else "denied"
            raise FetchFailure(kind, d.reason, rule=d.rule, url=d.url)
        return d

    def _hop(self, st: _HopState, req: FetchRequest, headers: list[tuple[str, str]],
             body: bytes | None, deadline: float, admit: Callable[[], str | None],
             prev_origin: tuple[str, str, int] | None
             ) -> tuple[int, str, tuple[tuple[str, str], ...], bytes, Target]:
        d = self._decide(st, None)
        t = d.target
        assert t is not None
        addrs: list[IPAddress]
        if t.ip is None:
            resolve = self.resolver or system_resolver
            try:
                found = list(resolve(t.host, t.port))
            except Exception as exc:  # the resolver's failure is the guest's DNS error
                msg = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
                raise FetchFailure("dns", f"cannot resolve {t.host}: {msg}", url=t.url) from None
            d = self._decide(st, found)
            addrs = [parse_address(a) for a in d.addresses]
        else:
            addrs = [t.ip]
        rule = d.matched
        assert rule is not None
        lim = self.policy.limits
        req_cap = rule.max_request_bytes if rule.max_request_bytes is not None \
            else lim.max_request_bytes
        resp_cap = rule.max_response_bytes if rule.max_response_bytes is not None \
            else lim.max_response_bytes
        timeout = rule.timeout if rule.timeout is not None else lim.timeout
        if req.timeout is not None:
            timeout = min(timeout, req.timeout)
        if body is not None and len(body) > req_cap:
            raise FetchFailure("cap", f"the request body of {len(body)} bytes exceeds the "
                               f"{req_cap}-byte cap", rule=d.rule, url=t.url)
        refusal = admit()
        if refusal is not None:
            raise FetchFailure("cap", refusal, rule=d.rule, url=t.url)
        sent, stripped = self._headers(headers, rule.allows_header,
                                       cross_origin=prev_origin not in (None, t.origin()))
        st.stripped = stripped
        sent_t = self._inject(st, t, sent)
        st.sent_url = sent_t.url
        hop_deadline = min(deadline, st.start + timeout)
        st.request_bytes = len(body or b"")
        if st.redact:
            # A secret went out: the answer must come back whole, in a form the host can
            # search for it. Ask for no content coding (one the server applies anyway is
            # undone below) and for no part of the resource (a reflecting server could hand
            # the secret out in pieces the redactor never sees whole).
            dropped = {"accept-encoding", *PARTIAL}
            st.stripped = tuple(dict.fromkeys((*st.stripped, *(
                k.lower() for k, _ in sent if k.lower() in PARTIAL))))
            sent[:] = [(k, v) for k, v in sent if k.lower() not in dropped]
            sent.append(("Accept-Encoding", "identity"))
        status, reason, rheaders, rbody = self._exchange(st, sent_t, addrs, sent, body,
                                                         hop_deadline, resp_cap)
        if st.redact:
            return (*_seen_whole(status, reason, rheaders, rbody, st.redact, resp_cap,
                                 t.url), t)
        return status, reason, _framing_dropped(rheaders), rbody, t

    def _headers(self, headers: list[tuple[str, str]], allowed: Callable[[str], bool], *,
                 cross_origin: bool) -> tuple[list[tuple[str, str]], tuple[str, ...]]:
        strip = self.policy.strip_headers
        sent, stripped = [], []
        for k, v in headers:
            low = k.lower()
            if low in HOST_CONTROLLED or (low in strip and (cross_origin or not allowed(low))):
                stripped.append(low)
            else:
                sent.append((k, v))
        return sent, tuple(dict.fromkeys(stripped))

    def _inject(self, st: _HopState, t: Target, sent: list[tuple[str, str]]) -> Target:
        chosen: list[EgressSecret] = self.policy.secrets_for(t)
        for s in chosen:
            try:
                raw = s.resolve()
            except SecretUnavailable as exc:
                raise FetchFailure("denied", str(exc), url=t.url) from None
            value = s.render(raw)
            st.redact.extend((raw, value, urllib.parse.quote(raw, safe="")))
            if s.header is not None:
                low = s.header.lower()
                sent[:] = [(k, v) for k, v in sent if k.lower() != low]
                sent.append((s.header, value))
            elif s.query is not None:
                t = _with_query(t, s.query, value)
        st.secrets = tuple(s.name for s in chosen)
        return t

    def _exchange(self, st: _HopState, t: Target, addrs: list[IPAddress],
                  headers: list[tuple[str, str]], body: bytes | None, deadline: float,
                  cap: int) -> tuple[int, str, tuple[tuple[str, str], ...], bytes]:
        """One request and its response over a connection to the first address that
        answers, under one deadline (a watchdog closes the socket when it passes)."""
        sock = self._connect_any(st, t, addrs, deadline)
        guard = _Guard()
        guard.sock = sock
        entry = _WATCHDOG.watch(deadline, guard)
        conn = http.client.HTTPConnection("egress.invalid")
        try:
            if t.scheme == "https":
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
                sock = self._context().wrap_socket(sock, server_hostname=t.host)
                guard.sock = sock
            conn.sock = sock
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            conn.putrequest(st.method, t.target, skip_host=True, skip_accept_encoding=True)
            conn.putheader("Host", t.authority)
            for k, v in headers:
                conn.putheader(k, v)
            if body is not None or st.method in ("POST", "PUT", "PATCH"):
                conn.putheader("Content-Length", str(len(body or b"")))
            conn.endheaders(body)
            resp = conn.getresponse()
            st.status = resp.status
            data = _read_body(st, t, resp, sock, deadline, cap)
            rheaders = tuple((k, v.replace("\r", " ").replace("\n", " "))
                             for k, v in resp.getheaders())
            return resp.status, resp.reason, rheaders, data
        except FetchFailure:
            raise
        except ssl.SSLError as exc:
            raise FetchFailure("tls", f"TLS with {t.host} failed: {exc.reason or exc}",
                               url=t.url) from None
        except (OSError, http.client.HTTPException, ValueError) as exc:
            if guard.fired or time.monotonic() >= deadline or isinstance(exc, TimeoutError):
                raise FetchFailure("timeout", f"{t.authority} did not answer in time",
                                   url=t.url) from None
            raise FetchFailure("bad_response", f"{t.authority}: {type(exc).__name__}: {exc}",
                               url=t.url) from None
        finally:
            _WATCHDOG.cancel(entry)
            conn.close()
            sock.close()

    def _connect_any(self, st: _HopState, t: Target, addrs: list[IPAddress],
                     deadline: float) -> socket.socket:
        """A connection to the first of the checked addresses that accepts one."""
        connect = self._connect or open_connection
        errors = []
        for a in addrs:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                sock = connect(str(a), t.port, remaining)
            except OSError as exc:
                errors.append(f"{a}: {exc.strerror or exc}")
                continue
            st.address = str(a)
            return sock
        if time.monotonic() >= deadline:
            raise FetchFailure("timeout", f"connecting to {t.authority} timed out", url=t.url)
        raise FetchFailure("connect", f"cannot connect to {t.authority} "
                           f"({'; '.join(errors)})", url=t.url)


def _read_body(st: _HopState, t: Target, resp: http.client.HTTPResponse, sock: socket.socket,
               deadline: float, cap: int) -> bytes:
    """The response body, refused as soon as it (or its declared length) passes ``cap``."""
    length = resp.getheader("content-length")
    if length and length.strip().isdigit() and int(length) > cap:
        raise FetchFailure("cap", f"the response of {int(length)} bytes exceeds the "
                           f"{cap}-byte cap", url=t.url)
    chunks: list[bytes] = []
    total = 0
    while True:
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        chunk = resp.read1(65536)
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        st.response_bytes = total
        if total > cap:
            raise FetchFailure("cap", f"the response exceeds the {cap}-byte cap", url=t.url)
        chunks.append(chunk)


PARTIAL = frozenset({"range", "if-range"})
"""Request headers that ask for part of a response: dropped from a request a secret goes out
with (docs/egress.md)."""


def _framing_dropped(headers: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """The headers without ``Transfer-Encoding`` (the host's HTTP client undid the framing)."""
    return tuple((k, v) for k, v in headers if k.lower() != "transfer-encoding")


def _seen_whole(status: int, reason: str, headers: tuple[tuple[str, str], ...], body: bytes,
                secrets: Sequence[str], cap: int, url: str
                ) -> tuple[int, str, tuple[tuple[str, str], ...], bytes]:
    """The one rule for a response to a request that carried a secret: it reaches the guest
    only in a form the redactor has seen whole, or not at all. Every transfer coding but
    plain ``chunked`` (which the client undid) and a partial response (206, or any
    ``Content-Range``) are refused; every content coding is undone; then the status line's
    reason, every header's name and value and the body are redacted."""
    transfer = [c.strip().lower() for k, v in headers if k.lower() == "transfer-encoding"
                for c in v.split(",") if c.strip()]
    if transfer and transfer != ["chunked"]:
        raise FetchFailure("bad_response", f"the response's transfer coding "
                           f"{', '.join(transfer)!r} cannot be checked for secrets: refused",
                           url=url)
    if status == 206 or any(k.lower() == "content-range" for k, _ in headers):
        raise FetchFailure("bad_response", "a partial response (206 or Content-Range) to a "
                           "request that carried a secret is refused: only a whole one can "
                           "be checked for it", url=url)
    headers, body = _decoded(_framing_dropped(headers), body, cap, url)
    values = [v for v in secrets if len(v) >= 4]
    headers = tuple((_redact(k, values), _redact(v, values)) for k, v in headers)
    for v in values:
        body = body.replace(v.encode("utf-8"), REDACTED.encode())
    return status, _redact(reason, values), headers, body


def _decoded(headers: tuple[tuple[str, str], ...], body: bytes, cap: int, url: str
             ) -> tuple[tuple[tuple[str, str], ...], bytes]:
    """The body without its content codings (gzip, deflate, brotli where the host has it),
    each decoded into at most ``cap`` bytes; the headers then say it is plain. A coding the
    host cannot undo is refused: the body could carry a secret where no one can see it."""
    codings = [c.strip().lower() for k, v in headers if k.lower() == "content-encoding"
               for c in v.split(",") if c.strip()]
    codings = [c for c in codings if c != "identity"]
    if not codings:
        return headers, body
    for coding in reversed(codings):  # applied in the order listed: undone in reverse
        body = _undo(coding, body, cap, url)
    kept = tuple((k, v) for k, v in headers
                 if k.lower() not in ("content-encoding", "content-length"))
    return (*kept, ("Content-Length", str(len(body)))), body


def _undo(coding: str, body: bytes, cap: int, url: str) -> bytes:
    try:
        if coding in ("gzip", "x-gzip", "deflate"):
            # gzip, or deflate as zlib (RFC 9110) or, as some servers send it, raw
            wbits = 31 if coding != "deflate" else (15 if body[:1] and (
                body[0] & 0x0F) == 8 and int.from_bytes(body[:2], "big") % 31 == 0 else -15)
            d = zlib.decompressobj(wbits)
            out = d.decompress(body, cap + 1)
            if len(out) > cap or d.unconsumed_tail:
                raise FetchFailure("cap", f"the response exceeds the {cap}-byte cap once "
                                   f"decoded ({coding})", url=url)
            if not d.eof:
                raise ValueError("cut stream")
            return out
        if coding == "br":
            try:
                import brotli
            except ImportError:
                raise FetchFailure("bad_response", "the response is brotli-encoded and this "
                                   "host cannot decode brotli to check it for secrets "
                                   "(pip install brotli)", url=url) from None
            br = brotli.Decompressor()
            out = br.process(body, output_buffer_limit=cap + 1)
            if len(out) > cap or not br.is_finished():
                if len(out) > cap or not br.can_accept_more_data():
                    raise FetchFailure("cap", f"the response exceeds the {cap}-byte cap once "
                                       "decoded (br)", url=url)
                raise ValueError("cut stream")
            return bytes(out)
    except FetchFailure:
        raise
    except Exception as exc:
        raise FetchFailure("bad_response", f"the response's {coding} body does not decode: "
                           f"{exc}", url=url) from None
    raise FetchFailure("bad_response", f"the response is encoded as {coding!r}, which the host "
                       "cannot decode to check it for secrets", url=url)


def parse_guest_request(value: object) -> FetchRequest:
    """Validate the map a guest sent to ``net.fetch`` (ValueError with the reason)."""
    if not isinstance(value, dict):
        raise ValueError("net.fetch takes one map {url, method, headers, body, timeout, ...}")
    url = value.get("url")
    method = value.get("method", "GET")
    if not isinstance(url, str):
        raise ValueError("url must be a string")
    if not isinstance(method, str) or not method:
        raise ValueError("method must be a non-empty string")
    raw_headers = value.get("headers") or []
    if not isinstance(raw_headers, list) or len(raw_headers) > MAX_HEADERS:
        raise ValueError(f"headers must be a list of at most {MAX_HEADERS} [name, value] pairs")
    headers = []
    size = 0
    for h in raw_headers:
        if not (isinstance(h, list) and len(h) == 2 and all(isinstance(x, str) for x in h)):
            raise ValueError("each header must be a [name, value] pair of strings")
        name, val = h
        if not name or not all(c.isascii() and (c.isalnum() or c in "!#$%&'*+.^_`|~-")
                               for c in name):
            raise ValueError(f"invalid header name {name!r}")
        if any(c in val for c in "\r\n\0"):
            raise ValueError(f"the value of header {name!r} contains a line break or NUL")
        try:
            val.encode("latin-1")
        except UnicodeEncodeError:
            raise ValueError(f"the value of header {name!r} is not Latin-1 text") from None
        size += len(name) + len(val)
        headers.append((name, val.strip()))
    if size > MAX_HEADER_BYTES:
        raise ValueError(f"headers total more than {MAX_HEADER_BYTES} bytes")
    body = value.get("body")
    if body is not None and not isinstance(body, bytes):
        raise ValueError("body must be bytes or nil")
    timeout = value.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(
            timeout, (int, float)) or not timeout > 0):
        raise ValueError("timeout must be seconds > 0 or nil")
    via = value.get("via", "fetch")
    return FetchRequest(url=url, method=method.upper(), headers=tuple(headers), body=body,
                        timeout=float(timeout) if timeout is not None else None,
                        follow_redirects=bool(value.get("follow_redirects", True)),
                        via=via if isinstance(via, str) else "fetch")

