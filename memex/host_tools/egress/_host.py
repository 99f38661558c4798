"""``Egress``: an egress policy served to one sandbox through its door (``net.fetch``), with
the per-turn and per-sandbox request caps, the rate limit and the audit.

Every attempt (each hop of a redirect chain included, denied ones too) becomes an
:class:`EgressRecord`. A caller gets one turn's records with ``egress.since(mark)`` (take
``mark = egress.mark()`` before ``sandbox.run``) or ``egress.turn_records()`` (the attached
sandbox's last turn), and exports them with ``export_jsonl``. Denials reach the guest as data
(a ``DoorError`` whose map has ``egress: true``, raised in the guest as
``memex_guest.net.EgressDenied`` and its siblings), never as a host exception.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import math
import os
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from typing import IO, Any, NoReturn

from ...errors import ConfigError, SandboxError
from ...runtime_wasm import Door, DoorContext, DoorError, SandboxAPI, TurnStatus
from ._fetch import (
    Fetcher,
    FetchFailure,
    Hop,
    Resolver,
    parse_guest_request,
)
from ._policy import EgressPolicy
from ._rules import EgressDecision

__all__ = ["OP", "Egress", "EgressRecord"]

OP = "net.fetch"
_MARGIN = 0.05  # answer this long before the turn's deadline or the door's call bound
_FRAME_ROOM = 1 << 20  # reply bytes besides the body: status, headers, URLs


@dataclass(frozen=True, kw_only=True)
class EgressRecord(Hop):
    """One attempt as the host saw it. ``decision``: what the policy said (allow/deny);
    ``outcome``: ``ok`` or why it did not complete (``denied``, ``cap``, ``invalid_request``,
    ``timeout``, ``dns``, ``connect``, ``tls``, ``bad_response``). Bytes are body bytes each
    way; ``url`` has injected secrets redacted; ``secrets`` names (never values) what the
    host injected; ``stripped_headers`` what it removed from the guest's headers."""

    seq: int
    sandbox: str
    turn: int | None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        d["time"] = _dt.datetime.fromtimestamp(self.time, _dt.UTC).isoformat(
            timespec="microseconds").replace("+00:00", "Z")
        for k in ("addresses", "secrets", "stripped_headers"):
            d[k] = list(d[k])
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, separators=(",", ":"))


_HOP_FIELDS = tuple(f.name for f in fields(Hop))


def _as_policy(policy: EgressPolicy | str | os.PathLike[str] | Mapping[str, Any] | None
               ) -> EgressPolicy:
    if policy is None:
        return EgressPolicy()
    if isinstance(policy, EgressPolicy):
        return policy
    if isinstance(policy, (str, os.PathLike)):
        return EgressPolicy.load(policy)
    if isinstance(policy, Mapping):
        return EgressPolicy.from_dict(policy)
    raise ConfigError(f"Egress takes an EgressPolicy, a policy file or a mapping, got "
                      f"{type(policy).__name__}")


class Egress:
    """Network egress for a sandbox under ``policy`` (an :class:`EgressPolicy`, a TOML/YAML
    path or a mapping; None denies everything but still audits).

    ``Egress(policy).attach(sandbox)`` registers ``net.fetch`` on the sandbox's door; the
    guest's ``urllib.request``, ``http.client`` and ``memex_guest.net.fetch`` then reach the
    network through it. ``resolver(host, port) -> [address, ...]`` replaces the system DNS
    (tests, pinned hosts); ``ssl_context`` the default certificate checks. A fork of the
    sandbox shares its door, hence this object, its records and its per-sandbox caps."""

    def __init__(self, policy: EgressPolicy | str | os.PathLike[str] | Mapping[str, Any] | None
                 = None, *, resolver: Resolver | None = None,
                 ssl_context: ssl.SSLContext | None = None, label: str | None = None,
                 keep_records: int = 10_000,
                 on_record: Callable[[EgressRecord], None] | None = None) -> None:
        if keep_records < 1:
            raise ConfigError("keep_records must be >= 1")
        self.policy = _as_policy(policy)
        self.label = label
        self.on_record = on_record
        self._fetcher = Fetcher(self.policy, resolver=resolver, ssl_context=ssl_context)
        self._keep = keep_records
        self._records: list[EgressRecord] = []
        self._seq = 0
        self._lock = threading.Lock()
        self._door: Door | None = None
        self._sandbox: SandboxAPI[Any] | None = None
        self._turn_key: Any = None
        self._turn_count = 0
        self._total = 0
        self._refill = time.monotonic()
        lim = self.policy.limits
        self._burst = float(lim.burst if lim.burst is not None
                            else max(1, math.ceil(lim.rate or 1)))
        self._tokens = self._burst

    # ---- wiring -------------------------------------------------------------------------------
    def register(self, door: Door) -> Egress:
        """Serve ``net.fetch`` on ``door`` (without touching any guest)."""
        if self._door is not None and self._door is not door:
            raise ConfigError("this Egress already serves another door")
        caps = [self.policy.limits.max_response_bytes] + [
            r.max_response_bytes for r in self.policy.rules if r.max_response_bytes is not None]
        room = door.max_reply_bytes - _FRAME_ROOM
        if max(caps) > room:
            raise ConfigError(
                f"the policy allows responses of {max(caps)} bytes but this door's replies are "
                f"capped at {door.max_reply_bytes} bytes (headers included): lower "
                "max_response_bytes or make the Door with a larger max_reply_bytes")
        self._door = door
        door.register(OP, self._op_fetch, context=True)
        return self

    def attach(self, sandbox: SandboxAPI[Any], *, install: bool = True) -> Egress:
        """Serve ``sandbox`` and make sure its guest routes ``http.client``/``urllib`` here
        (fresh guests already do; ``install`` also covers images saved before egress)."""
        self.register(sandbox.door)
        self._sandbox = sandbox
        if self.label is None:
            self.label = f"sandbox-{id(sandbox):x}"
        if install:
            self.install(sandbox)
        return self

    def install(self, sandbox: SandboxAPI[Any]) -> None:
        r = sandbox.run("import memex_guest.net as _mx_net\n_mx_net.install()\ndel _mx_net\n",
                        filename="<memex-egress-install>")
        if r.status is not TurnStatus.OK:
            what = (f"{r.exception.type}: {r.exception.message}" if r.exception
                    else f"{r.status.value} ({r.limit})")
            raise SandboxError(f"installing network egress in the guest failed: {what}")

    def detach(self) -> None:
        """Stop serving ``net.fetch`` on the door (the guest's requests are then refused as
        without egress). Idempotent; the records stay."""
        door, self._door = self._door, None
        if door is not None:
            door.unregister(OP)

    def __enter__(self) -> Egress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()

    # ---- the policy ---------------------------------------------------------------------------
    def check(self, url: str, method: str = "GET", *,
              addresses: Iterable[str] | None = None) -> EgressDecision:
        """The policy's decision for a request, without making it."""
        return self.policy.check(url, method, addresses=addresses)

    # ---- the audit ----------------------------------------------------------------------------
    @property
    def records(self) -> tuple[EgressRecord, ...]:
        """The last ``keep_records`` attempts, oldest first."""
        with self._lock:
            return tuple(self._records)

    def mark(self) -> int:
        """A position in the audit: ``since(mark)`` returns what came after it."""
        with self._lock:
            return self._seq

    def since(self, mark: int) -> tuple[EgressRecord, ...]:
        with self._lock:
            return tuple(r for r in self._records if r.seq >= mark)

    def turn_records(self, turn: int | None = None) -> tuple[EgressRecord, ...]:
        """The records of one turn of the attached sandbox (default: its last turn)."""
        if turn is None:
            turn = self._sandbox.turns if self._sandbox is not None else None
        with self._lock:
            return tuple(r for r in self._records if r.turn == turn)

    def export_jsonl(self, dest: str | os.PathLike[str] | IO[str],
                     records: Iterable[EgressRecord] | None = None) -> int:
        """Append records (default: all kept) as JSON lines; returns how many."""
        recs = self.records if records is None else tuple(records)
        text = "".join(r.to_json() + "\n" for r in recs)
        if isinstance(dest, (str, os.PathLike)):
            with open(dest, "a", encoding="utf-8") as f:
                f.write(text)
        else:
            dest.write(text)
        return len(recs)

    # ---- the door op --------------------------------------------------------------------------
    def _turn(self, ctx: DoorContext) -> int | None:
        turn = self._sandbox.turns if self._sandbox is not None else None
        key = (turn, ctx.deadline)
        with self._lock:
            if key != self._turn_key:
                self._turn_key, self._turn_count = key, 0
        return turn

    def _admit(self) -> str | None:
        lim = self.policy.limits
        with self._lock:
            if lim.requests_per_turn is not None and self._turn_count >= lim.requests_per_turn:
                return f"the cap of {lim.requests_per_turn} requests per turn is used up"
            if lim.requests_per_sandbox is not None and self._total >= lim.requests_per_sandbox:
                return (f"the cap of {lim.requests_per_sandbox} requests for this sandbox is "
                        "used up")
            if lim.rate is not None:
                now = time.monotonic()
                self._tokens = min(self._burst, self._tokens + (now - self._refill) * lim.rate)
                self._refill = now
                if self._tokens < 1:
                    return (f"rate limit: at most {lim.rate:g} requests per second "
                            f"(burst {self._burst:g})")
                self._tokens -= 1
            self._turn_count += 1
            self._total += 1
        return None

    def _record(self, hop: Hop, turn: int | None) -> None:
        with self._lock:
            rec = EgressRecord(seq=self._seq, sandbox=self.label or f"door-{id(self._door):x}",
                               turn=turn, **{k: getattr(hop, k) for k in _HOP_FIELDS})
            self._seq += 1
            self._records.append(rec)
            if len(self._records) > self._keep:
                del self._records[: len(self._records) - self._keep]
        if self.on_record is not None:
            with contextlib.suppress(Exception):
                self.on_record(rec)

    def _op_fetch(self, ctx: DoorContext, request: object = None) -> Any:
        turn = self._turn(ctx)
        start = time.monotonic()
        deadline = min(ctx.deadline, start + ctx.door.call_timeout) - _MARGIN
        try:
            req = parse_guest_request(request)
        except ValueError as exc:
            url = request.get("url") if isinstance(request, dict) else None
            url = url if isinstance(url, str) else "?"
            self._record(Hop(time=time.time(), via="?", method="?", url=url[:2048],
                             decision="deny", outcome="invalid_request", reason=str(exc)), turn)
            self._failure(FetchFailure("invalid_request", str(exc)), "?", url)
        try:
            resp = self._fetcher.fetch(req, deadline=deadline, admit=self._admit,
                                       on_hop=lambda hop: self._record(hop, turn))
        except FetchFailure as exc:
            self._failure(exc, req.method, exc.url or req.url)
        return {"status": resp.status, "reason": resp.reason,
                "headers": [list(h) for h in resp.headers], "body": resp.body,
                "url": resp.url, "redirects": list(resp.redirects)}

    def _failure(self, exc: FetchFailure, method: str, url: str) -> NoReturn:
        verb = "denied" if exc.kind in ("denied", "cap", "invalid_request") else "failed"
        rule = f" [rule {exc.rule}]" if exc.rule else ""
        message = f"egress {verb}: {method} {url}: {exc.reason}{rule}"
        raise DoorError(exc.kind, message, egress=True, reason=exc.reason, rule=exc.rule,
                        url=url, method=method)
