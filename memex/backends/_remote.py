"""The remote backend: sandboxes held by a ``memex serve`` service, reached over HTTP
(:class:`Client`, httpx) with the guest's door carried over one WebSocket per handle (opened
by the first turn once the door has a handler), so a host tool the guest calls runs in *this*
process, as on every other backend. A handle's turns go over a second WebSocket (the turns
socket: one msgpack message each way, a fraction of an HTTP request's cost), or over
``POST .../run`` when they stream output, are large, or the socket cannot be opened.

``get_backend("remote", url=..., api_key=...)`` gives a :class:`RemoteBackend`; its handles are
:class:`RemoteSandbox` (the ``SandboxAPI``), checkpoints :class:`RemoteCheckpoint` (ids the
server holds for the tenant). Errors the server raises come back as the same MemEx class with
the same message; a server that cannot be reached, refuses the key or answers outside its API
is a :class:`~memex.errors.ServiceError`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn

import httpx2
import msgpack
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException
from websockets.sync.client import ClientConnection, connect

from ..errors import ConfigError, MemexError, SandboxClosed, SandboxError, ServiceError
from ..runtime_wasm import (
    Door,
    GuestFile,
    GuestKilled,
    Limits,
    Mount,
    OutputListener,
    TurnResult,
    serving_door,
)
from ..runtime_wasm.internal import (
    DecodeCost,
    SandboxHandle,
    fork_count,
    http_tls,
    retry_after,
    unpack_bounded,
)
from ._contract import Backend
from ._subprocess import check_run_args
from .worker._wire import error_from_wire, limits_from_wire, limits_to_wire, result_from_wire

__all__ = ["Client", "RemoteBackend", "RemoteCheckpoint", "RemoteSandbox"]


def _message_cost(data: bytes) -> DecodeCost:
    """The decoding budget of one message from the service (bounded like every input)."""
    return DecodeCost.for_bytes(max(len(data), 16 << 20))

_LOG = logging.getLogger("memex.client")
_GRACE = 30.0  # seconds past a turn's deadline the client waits for the answer
_SOCKET_CELL_CHARS = 1 << 20  # larger cells go over POST /run: its body cap answers 413, where
# a message past the server's WebSocket frame bound would only break the socket


URL_ENV = "MEMEX_URL"
"""The variable the client reads the service's URL from when none is passed."""
KEY_ENV = "MEMEX_API_KEY"
"""The variable the client reads its API key from when none is passed."""


IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
"""The methods a refused call is retried for: doing them twice is doing them once."""
MAX_RETRY_WAIT = 30.0
"""The longest one wait a Retry-After may ask of the client; longer, the error is raised."""
KEEPALIVE_EXPIRY = 2.0
"""Seconds an idle pooled connection is kept for the next call: less than the server's own
idle keep-alive (memex serve's ``keep_alive_timeout``, 5 s by default), so the client never
sends a call on a connection the server is closing as idle at that moment (httpx keeps one 5
s as well: a POST that met the server's close was answered "Server disconnected without
sending a response", and a POST is not retried)."""


class Client:
    """The service's HTTP API, one method per endpoint (docs/service.md). Thread-safe: one
    connection pool shared by every handle of a backend. ``url`` and ``api_key`` default to
    ``$MEMEX_URL`` and ``$MEMEX_API_KEY`` (a key kept out of code and of ``ps``).

    An idempotent call (GET, PUT, DELETE) the service refuses for now (429 or 503 with a
    ``Retry-After``) is made again after the wait it asks for, at most ``retries`` times
    and each wait at most 30 s; a POST (a turn, a create) never is: the caller decides."""

    def __init__(self, url: str | None = None, api_key: str | None = None, *,
                 timeout: float = 60.0, retries: int = 3) -> None:
        if url is None:
            url = os.environ.get(URL_ENV)
            if not url:
                raise ConfigError(f"no service URL: pass url=... or set ${URL_ENV}")
        if api_key is None:
            api_key = os.environ.get(KEY_ENV)
            if not api_key:
                raise ConfigError(f"no API key: pass api_key=... or set ${KEY_ENV}")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ConfigError(f"url must be an http(s):// URL, got {url!r}")
        if not isinstance(api_key, str) or not api_key:
            raise ConfigError("api_key must be a non-empty str")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ConfigError(f"retries must be an int >= 0, got {retries!r}")
        self.retries = retries
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self._http = httpx2.Client(base_url=self.url, timeout=timeout, verify=http_tls(),
                                   headers={"Authorization": f"Bearer {api_key}"},
                                   limits=httpx2.Limits(keepalive_expiry=KEEPALIVE_EXPIRY))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, *, timeout: float | None = None,
                **kwargs: Any) -> httpx2.Response:
        """One call (idempotent ones again after a Retry-After, see the class); a typed
        error body is raised as its MemEx class."""
        attempt = 0
        while True:
            try:
                resp = self._http.request(method, path, timeout=timeout or self.timeout,
                                          **kwargs)
            except httpx2.TimeoutException as exc:
                raise ServiceError(f"{method} {path}: the service did not answer in time"
                                   ) from exc
            except httpx2.HTTPError as exc:
                raise ServiceError(f"{method} {path}: cannot reach the service at {self.url}: "
                                   f"{type(exc).__name__}: {exc}") from exc
            wait = self._retry_wait(method, resp, attempt)
            if wait is None:
                break
            attempt += 1
            time.sleep(wait)
        if resp.status_code >= 400:
            _raise(resp, f"{method} {path}")
        return resp

    def _retry_wait(self, method: str, resp: httpx2.Response, attempt: int) -> float | None:
        """How long to wait before asking again, or None: answer the caller now."""
        if resp.status_code not in (429, 503) or method.upper() not in IDEMPOTENT \
                or attempt >= self.retries:
            return None
        wait = retry_after(resp.headers)
        return wait if wait is not None and wait <= MAX_RETRY_WAIT else None

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        resp = self.request(method, path, **kwargs)
        try:
            return resp.json()
        except ValueError as exc:
            raise ServiceError(f"{method} {path}: the answer is not JSON",
                               status=resp.status_code) from exc

    # ---- endpoints ----------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        return dict(self.json("GET", "/readyz"))

    def tools(self) -> list[dict[str, Any]]:
        """The operator's tools for this tenant (``definition``, ``returns``, ``catalogue``):
        ``ToolSet.from_service(client.tools())`` offers them to a model."""
        return list(self.json("GET", "/v1/tools")["tools"])

    def sessions(self) -> list[dict[str, Any]]:
        return list(self.json("GET", "/v1/sessions")["sessions"])

    def create(self, **body: Any) -> dict[str, Any]:
        return dict(self.json("POST", "/v1/sessions", json=body))

    def session(self, sid: str) -> dict[str, Any]:
        return dict(self.json("GET", f"/v1/sessions/{sid}"))

    def run(self, sid: str, code: str, *, timeout: float | None = None,
            filename: str | None = None, wait: float | None = None) -> dict[str, Any]:
        return dict(self.json("POST", f"/v1/sessions/{sid}/run", timeout=wait,
                              json={"code": code, "timeout": timeout, "filename": filename}))

    def run_stream(self, sid: str, code: str, on_output: OutputListener, *,
                   timeout: float | None = None, filename: str | None = None,
                   wait: float | None = None) -> dict[str, Any]:
        """``run`` over server-sent events: ``on_output(stream, text)`` hears the output as
        the guest writes it; the answer is the same as ``run``'s."""
        path = f"/v1/sessions/{sid}/run/stream"
        body = {"code": code, "timeout": timeout, "filename": filename}
        try:
            with self._http.stream("POST", path, json=body, timeout=wait or self.timeout
                                   ) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    _raise(resp, f"POST {path}")
                kind, data = "", ""
                for line in resp.iter_lines():
                    if line.startswith("event: "):
                        kind = line[7:]
                    elif line.startswith("data: "):
                        data = line[6:]
                    elif not line and kind:
                        event = json.loads(data)
                        if kind == "output":
                            on_output(str(event["stream"]), str(event["text"]))
                        elif kind == "result":
                            return dict(event)
                        elif kind == "error":
                            _raise_body(event, 200, f"POST {path}")
                        kind, data = "", ""
        except httpx2.TimeoutException as exc:
            raise ServiceError(f"POST {path}: the service did not answer in time") from exc
        except httpx2.HTTPError as exc:
            raise ServiceError(f"POST {path}: the stream from {self.url} broke: "
                               f"{type(exc).__name__}: {exc}") from exc
        except (ValueError, KeyError, TypeError) as exc:
            raise ServiceError(f"POST {path}: an event outside the API: {exc}") from exc
        raise ServiceError(f"POST {path}: the stream ended without a result")

    def fork(self, sid: str) -> dict[str, Any]:
        return dict(self.json("POST", f"/v1/sessions/{sid}/fork"))

    def forks(self, sid: str, n: int) -> list[dict[str, Any]]:
        out = self.json("POST", f"/v1/sessions/{sid}/forks", json={"count": n})
        sessions = out.get("sessions") if isinstance(out, dict) else None
        if not isinstance(sessions, list) or not all(isinstance(x, dict) for x in sessions):
            raise ServiceError(f"POST /v1/sessions/{sid}/forks: an answer outside the API")
        return [dict(x) for x in sessions]

    def checkpoint(self, sid: str) -> str:
        return str(self.json("POST", f"/v1/sessions/{sid}/checkpoints")["checkpoint"])

    def restore(self, sid: str, checkpoint: str) -> None:
        self.request("POST", f"/v1/sessions/{sid}/restore", json={"checkpoint": checkpoint})

    def drop_checkpoint(self, checkpoint: str) -> None:
        self.request("DELETE", f"/v1/checkpoints/{checkpoint}")

    def share_checkpoint(self, checkpoint: str) -> None:
        """Write a held checkpoint to the nodes' shared folder (any node restores it)."""
        self.request("POST", f"/v1/checkpoints/{checkpoint}/share")

    def read_file(self, sid: str, path: str, max_bytes: int | None = None) -> bytes:
        params: dict[str, Any] = {"path": path}
        if max_bytes is not None:
            params["max_bytes"] = max_bytes
        return self.request("GET", f"/v1/sessions/{sid}/files", params=params).content

    def write_file(self, sid: str, path: str, data: bytes) -> None:
        self.request("PUT", f"/v1/sessions/{sid}/files", params={"path": path}, content=data)

    def list_files(self, sid: str, path: str = "/tmp", limit: int = 10_000
                   ) -> list[dict[str, Any]]:
        return list(self.json("GET", f"/v1/sessions/{sid}/files/list",
                              params={"path": path, "limit": limit})["files"])

    def close_session(self, sid: str) -> None:
        self.request("DELETE", f"/v1/sessions/{sid}")

    def park(self, sid: str) -> None:
        self.request("POST", f"/v1/sessions/{sid}/park")

    def unpark(self, sid: str) -> dict[str, Any]:
        return dict(self.json("POST", f"/v1/sessions/{sid}/unpark"))


def _raise(resp: httpx2.Response, what: str) -> NoReturn:
    try:
        body = resp.json()
    except ValueError:
        body = None
    try:
        _raise_body(body, resp.status_code, what)
    except MemexError as exc:  # the wait the service asked for, for the caller's own retry
        exc.retry_after = retry_after(resp.headers)
        raise


def _raise_body(body: Any, status: int, what: str) -> NoReturn:
    try:
        err = body["error"]
        code, message = str(err["code"]), str(err["message"])
        name, reason = err.get("type"), err.get("reason")
    except (KeyError, TypeError):
        raise ServiceError(f"{what}: HTTP {status} without an error body",
                           status=status) from None
    if isinstance(name, str) and name != "ServiceError":
        exc = error_from_wire([name, message, reason])
        if type(exc).__name__ == name:  # a MemEx class this client knows
            raise exc
    raise ServiceError(f"{what}: {message}", status=status, code=code)


class RemoteCheckpoint:
    """A checkpoint the service holds for the tenant (released past its ``max_checkpoints``,
    oldest first). Restorable into any session of the same tenant with the same mounts."""

    __slots__ = ("__weakref__", "id", "turns")

    def __init__(self, cid: str, turns: int) -> None:
        self.id, self.turns = cid, turns

    def __repr__(self) -> str:
        return f"<RemoteCheckpoint {self.id} turns={self.turns}>"


class _DoorLink:
    """This handle's door WebSocket: a thread answers each forwarded frame with
    ``door.dispatch`` (handlers run here, marked as serving the door), answering ``killed``
    when a handler outlives the turn's deadline, as the subprocess backend's door server."""

    def __init__(self, client: Client, sid: str, door: Door) -> None:
        ws_url = "ws" + client.url[4:] + f"/v1/sessions/{sid}/door"
        try:
            self._ws: ClientConnection = connect(
                ws_url, additional_headers={"Authorization": f"Bearer {client.api_key}"},
                open_timeout=client.timeout, max_size=None, compression=None, proxy=None)
            first = self._ws.recv(timeout=client.timeout)
        except (InvalidStatus, WebSocketException, OSError, TimeoutError) as exc:
            raise ServiceError(f"cannot open the door of session {sid}: {exc}") from exc
        if first != msgpack.packb(["ready"]):
            self._ws.close()
            raise ServiceError(f"session {sid}'s door did not say ready")
        self.door = door
        self._thread = threading.Thread(target=self._serve, name="memex-remote-door",
                                        daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        turn: tuple[Any, float] = (None, float("inf"))
        while True:
            try:
                data = self._ws.recv()
            except (ConnectionClosed, OSError):
                break
            try:
                if not isinstance(data, bytes):
                    raise ValueError("a text message")
                _, seq, left, frame, key = unpack_bounded(data, _message_cost(data))
                if key is None or key != turn[0]:  # one local deadline per turn of the server
                    turn = (key, float("inf") if left is None else time.monotonic() + left)
            except (ValueError, TypeError):
                break  # not our protocol
            deadline = turn[1]
            try:
                out: list[Any] = ["door_reply", seq, "ok", self.door.dispatch(frame, deadline)]
            except GuestKilled as k:
                out = ["door_reply", seq, "killed", k.limit, k.detail]
            except Exception as exc:
                out = ["door_reply", seq, "killed", "trap", f"the door failed: {exc}"]
            try:
                self._ws.send(msgpack.packb(out, use_bin_type=True))
            except (ConnectionClosed, OSError):
                break

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._ws.close()


class _TurnLink:
    """This handle's turns WebSocket (``/v1/sessions/{id}/turns``): a turn is one message
    each way on the calling thread, without HTTP's parsing, routing and headers per turn."""

    def __init__(self, client: Client, sid: str) -> None:
        self.sid = sid
        self._ws: ClientConnection = connect(
            "ws" + client.url[4:] + f"/v1/sessions/{sid}/turns",
            additional_headers={"Authorization": f"Bearer {client.api_key}"},
            open_timeout=client.timeout, max_size=None, compression=None, proxy=None)
        self.broken = False

    def run(self, fields: dict[str, Any], wait: float) -> dict[str, Any]:
        what = f"the turn of session {self.sid}"
        try:
            self._ws.send(msgpack.packb(["run", fields], use_bin_type=True))
            data = self._ws.recv(timeout=wait)
            if not isinstance(data, bytes):
                raise ValueError("a text message")
            msg = unpack_bounded(data, _message_cost(data))
        except TimeoutError as exc:
            self.close()  # its answer, if it comes, would be read as the next turn's
            raise ServiceError(f"{what}: the service did not answer in time") from exc
        except (ConnectionClosed, OSError) as exc:
            self.close()
            raise ServiceError(f"{what}: the connection to the service broke: {exc}") from exc
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            self.close()
            raise ServiceError(f"{what}: an answer outside the API: {exc}") from exc
        if isinstance(msg, list) and len(msg) == 2 and msg[0] == "result" and isinstance(
                msg[1], dict):
            return msg[1]
        if isinstance(msg, list) and len(msg) == 3 and msg[0] == "error" and isinstance(
                msg[1], int):
            _raise_body(msg[2], int(msg[1]), what)
        self.close()
        raise ServiceError(f"{what}: an answer outside the API: {msg!r:.80}")

    def close(self) -> None:
        self.broken = True
        with contextlib.suppress(Exception):
            self._ws.close()


class RemoteSandbox(SandboxHandle):
    """A sandbox held by the service: the ``SandboxAPI`` of ``memex.Sandbox``, with the same
    results, errors and limits. ``checkpoint()`` returns a :class:`RemoteCheckpoint`."""

    close_on_collect = False  # no network call from a finalizer: RemoteBackend.close() closes
    # the sessions still open

    def __init__(self, backend: RemoteBackend, info: dict[str, Any], door: Door) -> None:
        self._backend = backend
        self.id: str = info["id"]
        self.limits: Limits = limits_from_wire(info["limits"])
        self.door = door
        self.turns = int(info.get("turns", 0))
        self._lock = threading.RLock()
        self._closed_reason: str | None = None
        self._link: _DoorLink | None = None  # opened by the first turn that may need it
        self._turns: _TurnLink | None = None  # opened by the first turn
        self.restored: dict[str, Any] | None = info.get("restored")
        """Set when the service brought this session back from a save (after a restart or an
        idle eviction): ``from_turn``, ``lost_turns``, ``files_kept``, ``reason``."""

    def _ensure_link(self) -> None:
        """Open the door WebSocket once the door can answer something (a handler registered,
        or a Door subclass with its own dispatch): a session without tools never pays for
        it, and the service answers its guest's calls as an empty door would."""
        if self._link is not None and not self._link.alive:  # the service restarted
            self._link = None
        if self._link is None and (self.door.ops or type(self.door).dispatch
                                   is not Door.dispatch):
            self._link = _DoorLink(self._backend.client, self.id, self.door)

    def _turn_link(self) -> _TurnLink | None:
        """The turns socket, (re)opened as needed; None when it cannot be opened: then the
        turn goes over ``POST .../run``, which says why (a closed session, a refused key, an
        unreachable service) or runs it."""
        if self._turns is not None and self._turns.broken:
            self._turns = None
        if self._turns is None:
            try:
                self._turns = _TurnLink(self._backend.client, self.id)
            except (WebSocketException, OSError, TimeoutError):
                return None
        return self._turns

    def _check_open(self) -> None:
        if self._closed_reason is not None:
            raise SandboxClosed(self._closed_reason)

    def run(self, code: str, *, timeout: float | None = None, filename: str | None = None,
            on_output: OutputListener | None = None) -> TurnResult:
        """Run one cell on the service. Guest errors, exits and limits come back as data.
        ``on_output(stream, text)`` hears stdout/stderr as the guest writes them (the turn
        then streams over server-sent events), as on ``memex.Sandbox.run``."""
        check_run_args(code, timeout)
        if serving_door() is self.door:
            raise SandboxError(
                "a door handler cannot run code in the sandbox whose turn is waiting for it")
        with self._lock:
            self._check_open()
            budget = self.limits.timeout if timeout is None else min(timeout, self.limits.timeout)
            self._ensure_link()
            self.turns += 1  # counted while the turn runs, as tools see it (then the server's)
            client = self._backend.client
            small = len(code) < _SOCKET_CELL_CHARS
            link = self._turn_link() if on_output is None and small else None
            if link is not None:
                try:
                    out = link.run({"code": code, "timeout": timeout, "filename": filename},
                                   budget + _GRACE)
                finally:
                    if self._closed_reason is not None:  # closed while this turn ran
                        self._drop_turns()
            elif on_output is None:
                out = client.run(self.id, code, timeout=timeout, filename=filename,
                                 wait=budget + _GRACE)
            else:
                out = client.run_stream(self.id, code, on_output, timeout=timeout,
                                        filename=filename, wait=budget + _GRACE)
            self.turns = int(out["turns"])
            if out.get("restored"):
                self.restored = dict(out["restored"])
                _LOG.warning("session %s was restored from its save at turn %s: %s turn(s) "
                             "lost, /tmp files %s (%s)", self.id,
                             self.restored.get("from_turn"), self.restored.get("lost_turns"),
                             "kept" if self.restored.get("files_kept") else "not kept",
                             self.restored.get("reason"))
            return result_from_wire(out["result"])

    def checkpoint(self) -> RemoteCheckpoint:
        with self._lock:
            self._check_open()
            return RemoteCheckpoint(self._backend.client.checkpoint(self.id), self.turns)

    def restore(self, checkpoint: RemoteCheckpoint) -> None:
        if not isinstance(checkpoint, RemoteCheckpoint):
            raise ConfigError("restore takes a checkpoint from checkpoint() of this kind of "
                              "sandbox")
        with self._lock:
            self._check_open()
            self._backend.client.restore(self.id, checkpoint.id)

    def fork(self) -> RemoteSandbox:
        """An independent copy on the service, sharing this handle's door."""
        with self._lock:
            self._check_open()
            info = self._backend.client.fork(self.id)
        return self._backend._adopt(info, self.door)

    def fork_many(self, n: int) -> list[RemoteSandbox]:
        """``n`` independent copies in one request, all or none (the service counts them
        against the tenant's quota together), sharing this handle's door."""
        with self._lock:
            self._check_open()
            infos = self._backend.client.forks(self.id, fork_count(n))
        return [self._backend._adopt(info, self.door) for info in infos]

    def read_file(self, guest_path: str, *, max_bytes: int | None = None) -> bytes:
        with self._lock:
            self._check_open()
            return self._backend.client.read_file(self.id, guest_path, max_bytes)

    def list_files(self, guest_path: str = "/tmp", *, limit: int = 10_000) -> list[GuestFile]:
        """The entries of a folder under /tmp or a mount, as ``memex.Sandbox.list_files``."""
        with self._lock:
            self._check_open()
            return [GuestFile(name=f["name"], path=f["path"], kind=f["kind"], size=f["size"])
                    for f in self._backend.client.list_files(self.id, guest_path, limit)]

    def write_file(self, guest_path: str, data: bytes) -> None:
        with self._lock:
            self._check_open()
            self._backend.client.write_file(self.id, guest_path, bytes(data))

    def detach(self) -> str:
        """Let go of the session without ending it: this handle is closed, the session lives
        on in the service (until its own limits end it), and ``RemoteBackend.attach(id)``
        takes it again, from this process or another. Returns the session id."""
        with self._lock:
            self._check_open()
            self._let_go("detached: the session lives on in the service")
        return self._forgotten()

    def park(self) -> str:
        """Hand the session to another node of the service: saved to the nodes' shared
        folder and closed here. ``RemoteBackend(url=<other node>).unpark(id)`` takes it;
        this handle is closed. Returns the session id."""
        with self._lock:
            self._check_open()
            self._backend.client.park(self.id)
            self._let_go("parked for another node")
        return self._forgotten()

    def _let_go(self, reason: str) -> None:
        """Close this handle, not the session (under the handle's lock)."""
        self._closed_reason = reason
        self._drop_turns()

    def _forgotten(self) -> str:
        if self._link is not None:
            self._link.close()
        self._backend._forget(self)
        return self.id

    def _shutdown(self, reason: str) -> None:
        """Close the session on the service (a running turn ends ``cancelled``); does not
        wait for a running turn's lock."""
        if self._closed_reason is not None:
            return
        self._closed_reason = "closed by the caller" if reason == "closed" else reason
        try:
            self._backend.client.close_session(self.id)
        except SandboxError:
            pass  # already gone on the service (closed, lost, or the service is down)
        finally:
            if self._link is not None:
                self._link.close()
            if self._lock.acquire(blocking=False):  # else the running turn closes it, once
                try:                                # its answer (cancelled) has come
                    self._drop_turns()
                finally:
                    self._lock.release()
            self._backend._forget(self)

    def _drop_turns(self) -> None:
        if self._turns is not None:
            self._turns.close()
            self._turns = None

    def __repr__(self) -> str:
        return f"<RemoteSandbox {self.id} turns={self.turns}{' closed' if self.closed else ''}>"


class RemoteBackend(Backend):
    """Sandboxes on a ``memex serve`` service at ``url``, as the tenant whose ``api_key``
    this is (each read from ``$MEMEX_URL`` / ``$MEMEX_API_KEY`` when not passed; the service
    decides the tenant, ``open(tenant=...)`` is ignored). ``open`` with no limits gets the
    service's default (those of its warm sandboxes). ``retries``: how often an idempotent
    call the service refuses for now is made again after its Retry-After (see Client)."""

    name = "remote"

    def __init__(self, *, url: str | None = None, api_key: str | None = None,
                 timeout: float = 60.0, retries: int = 3) -> None:
        self.client = Client(url, api_key, timeout=timeout, retries=retries)
        self._lock = threading.Lock()
        self._live: weakref.WeakSet[RemoteSandbox] = weakref.WeakSet()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def open(self, *, limits: Limits | None = None, mounts: Sequence[Mount] = (),
             preload: Iterable[str] = (), door: Door | None = None,
             env: dict[str, str] | None = None, tenant: str | None = None,
             packages: Sequence[str] = ()) -> RemoteSandbox:
        if self._closed:
            raise SandboxClosed("the remote backend was closed")
        if limits is not None and not isinstance(limits, Limits):
            raise ConfigError(f"limits must be a Limits, got {type(limits).__name__}")
        for m in mounts:
            if not isinstance(m, Mount):
                raise ConfigError(f"mounts must be Mount objects, got {type(m).__name__}")
        if door is not None and not isinstance(door, Door):
            raise ConfigError(f"door must be a Door, got {type(door).__name__}")
        body = {"limits": None if limits is None else limits_to_wire(limits),
                "preload": list(preload), "env": env,
                "mounts": [{"host": os.fspath(m.host_path), "guest": m.guest_path,
                            "writable": m.writable, "links": m.links} for m in mounts]}
        if packages:  # resolved by the service, within what this tenant may use
            body["packages"] = list(packages)
        info = self.client.create(**body)
        return self._adopt(info, door if door is not None else Door())

    def attach(self, session_id: str, *, door: Door | None = None) -> RemoteSandbox:
        """A handle on a live session of this tenant by its id, from any process: the
        reattach a worker needs after a restart, or a second process needs to share one
        (``RemoteSandbox.detach()`` lets go without ending it). ``door`` serves the
        session's client tools from this process (several handles may serve them; a call
        goes to the least busy). The handle owns the session as ``open``'s does: its
        ``close()`` ends it."""
        if self._closed:
            raise SandboxClosed("the remote backend was closed")
        if not isinstance(session_id, str) or not session_id:
            raise ConfigError("attach takes a session id (RemoteSandbox.id)")
        if door is not None and not isinstance(door, Door):
            raise ConfigError(f"door must be a Door, got {type(door).__name__}")
        try:
            info = self.client.session(session_id)
        except ServiceError as exc:
            if exc.status != 404:
                raise
            raise SandboxClosed(f"no session {session_id!r} lives for this key (closed, "
                                "ended by a limit, or another tenant's)") from None
        return self._adopt(info, door if door is not None else Door())

    def unpark(self, sid: str, *, door: Door | None = None) -> RemoteSandbox:
        """Take a session another node parked (``RemoteSandbox.park``) onto this node."""
        if self._closed:
            raise SandboxClosed("the remote backend was closed")
        return self._adopt(self.client.unpark(sid), door if door is not None else Door())

    def share(self, checkpoint: RemoteCheckpoint) -> RemoteCheckpoint:
        """Write a checkpoint this node holds to the nodes' shared folder and return it: a
        handle on any node of the service restores it by id (``RemoteCheckpoint(id, turns)``
        names it there)."""
        if not isinstance(checkpoint, RemoteCheckpoint):
            raise ConfigError("share takes a RemoteCheckpoint from checkpoint()")
        self.client.share_checkpoint(checkpoint.id)
        return checkpoint

    def _adopt(self, info: dict[str, Any], door: Door) -> RemoteSandbox:
        try:
            sb = RemoteSandbox(self, info, door)
        except (KeyError, TypeError, ValueError) as exc:
            raise ServiceError(f"the service described a session outside its API: {exc}"
                               ) from exc
        with self._lock:
            self._live.add(sb)
        return sb

    def _forget(self, sb: RemoteSandbox) -> None:
        with self._lock:
            self._live.discard(sb)

    def close(self) -> None:
        """Close every session this backend opened, then the connection pool. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            live = list(self._live)
        for sb in live:
            sb.close()
        self.client.close()
