"""``serve.toml``: the server's settings and its tenants, read strictly (an unknown key or a
value of the wrong type is a :class:`~memex.errors.ConfigError` naming it), and reread when the
file changes so keys rotate without a restart.

API keys are stored as ``sha256:<hex>`` of the key (``memex serve --hash-key`` prints one);
the key itself never sits in the file. A presented key is hashed and compared with every
stored hash in constant time (``hmac.compare_digest``), so neither the match nor its position
leaks through timing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import os
import re
import threading
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..host_tools import EgressPolicy, ToolSet
from ..runtime_wasm import Limits
from ..serving import Bounds, EdgeLimits
from ._tools import load_tools

__all__ = ["KeyRing", "MountGrant", "ServiceConfig", "TenantConfig", "check_config", "hash_key",
           "load_config"]

_LIMIT_FIELDS = {f.name for f in dataclasses.fields(Limits)}


def hash_key(key: str) -> str:
    """The form an API key is stored in: ``sha256:<64 hex digits>``."""
    if not isinstance(key, str) or len(key) < 16:
        raise ConfigError("an API key is a str of at least 16 characters")
    return _digest(key)


@dataclass(frozen=True, kw_only=True)
class MountGrant:
    """A host directory a tenant's sessions may mount (at any guest path), read-only unless
    ``writable``."""

    host: Path
    writable: bool = False

    def allows(self, host_path: Path, writable: bool) -> bool:
        inside = host_path == self.host or self.host in host_path.parents
        return inside and (self.writable or not writable)


@dataclass(frozen=True, kw_only=True)
class TenantConfig:
    """One tenant: its key hashes, what it may hold, and the ceiling of the limits its
    sessions may ask for (a field left out of ``ceiling`` is not capped)."""

    name: str
    keys: tuple[str, ...]
    max_sessions: int | None = 8  # below the default pool's 16 sandboxes
    max_memory: int | None = None  # bytes: the sum of Limits.memory over its live sessions
    max_disk: int | None = None  # bytes: the sum of Limits.disk_bytes over its live sessions
    max_checkpoints: int = 64  # held at once; the oldest is released past it
    turns_per_second: float | None = None
    max_running: int | None = None  # its turns running at once (the cores it may hold)
    queued: int = 16
    ceiling: Mapping[str, Any] = field(default_factory=dict)
    mounts: tuple[MountGrant, ...] = ()
    egress: EgressPolicy | None = None  # the network its guests get (None: only the client's)
    tools: ToolSet | None = None  # operator tools its guests call, run in the server (_tools)

    def bounds(self) -> Bounds:
        """What the session core holds this tenant to."""
        return Bounds(max_sessions=self.max_sessions, max_memory=self.max_memory,
                      max_disk=self.max_disk, max_checkpoints=self.max_checkpoints)

    def check_limits(self, limits: Limits) -> None:
        """Refuse limits above this tenant's ceiling (an unbounded value above any bound)."""
        for name, cap in self.ceiling.items():
            value = getattr(limits, name)
            if value is None or value > cap:
                raise ConfigError(f"limits.{name} = {value!r} is above tenant {self.name!r}'s "
                                  f"ceiling of {cap!r}")

    def default_limits(self, base: Limits, given: frozenset[str] | set[str] = frozenset()
                       ) -> dict[str, Any]:
        """The fields of ``base`` not in ``given``, each lowered to this tenant's ceiling
        (and the memory to its ``max_memory``): what a session asking for nothing gets."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(Limits):
            if f.name in given:
                continue
            value = getattr(base, f.name)
            cap = self.ceiling.get(f.name)
            if cap is not None and (value is None or value > cap):
                value = cap
            if f.name == "memory" and self.max_memory is not None:
                value = min(value, self.max_memory)
            out[f.name] = value
        return out

    def check_mount(self, host_path: Path, writable: bool) -> None:
        if not any(g.allows(host_path, writable) for g in self.mounts):
            kind = "writable" if writable else "read-only"
            raise ConfigError(f"tenant {self.name!r} may not mount {str(host_path)!r} "
                              f"({kind}); its granted mounts: "
                              f"{[str(g.host) for g in self.mounts] or 'none'}")


@dataclass(frozen=True, kw_only=True)
class ServiceConfig:
    """The server's settings (each documented in docs/service.md) and its tenants."""

    host: str = "127.0.0.1"
    port: int = 8000
    backend: str = "pool"
    workers: int = 2
    warm: int | None = None
    warm_timeout: float = 30.0  # the turn deadline of the pool's warm sandboxes
    max_sandboxes: int | None = None  # the pool's bound on live sandboxes (8 per worker)
    preload: tuple[str, ...] = ()  # modules the warm sandboxes have imported already
    max_body_bytes: int = 32 << 20
    threads: int = 64  # blocking operations (turns, forks, files) served at once
    tenant_threads: int = 0  # of those, what one tenant may hold (0: a quarter, at least 4)
    access_log: bool = True
    log_code: bool = False  # put cell bodies in the audit log
    state_dir: Path | None = None  # where sessions are saved (None: nothing outlives the process)
    save_interval: float = 30.0  # seconds between saves of a changed session (0: every turn)
    idle_evict: float | None = None  # seconds idle before a session is saved and evicted
    checkpoint_ttl: float = 600.0  # seconds a closed session's checkpoints are still held
    shared_dir: Path | None = None  # where sessions are parked for another node to take
    metrics_keys: tuple[str, ...] = ()  # key hashes /metrics asks for
    metrics_public: bool = False  # /metrics open to anyone (it names every tenant)
    edge: EdgeLimits = field(default_factory=EdgeLimits)  # connections: _edge
    tenants: Mapping[str, TenantConfig] = field(default_factory=dict)
    path: Path | None = None


def _typed(where: str, value: Any, kind: type | tuple[type, ...]) -> Any:
    if isinstance(value, bool) and kind is not bool and bool not in (
            kind if isinstance(kind, tuple) else (kind,)):
        raise ConfigError(f"{where} must be {kind}, got {value!r}")
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ConfigError(f"{where} must be {names}, got {value!r}")
    return value


def _known(where: str, table: Mapping[str, Any], keys: set[str]) -> None:
    unknown = sorted(set(table) - keys)
    if unknown:
        raise ConfigError(f"{where}: unknown keys {unknown} (known: {sorted(keys)})")


def _check_hashes(where: str, keys: tuple[str, ...]) -> None:
    for k in keys:
        if not (k.startswith("sha256:") and len(k) == 71
                and all(c in "0123456789abcdef" for c in k[7:])):
            raise ConfigError(f"{where}: {k[:12]!r}... is not sha256:<64 hex digits> "
                              "(store `memex serve --hash-key` output, never the key)")


def _digest(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def key_matches(stored: tuple[str, ...], key: str | None) -> bool:
    """Whether ``key`` hashes to one of ``stored`` (every hash compared, in constant time)."""
    if not key:
        return False
    presented = _digest(key)
    found = False
    for h in stored:
        found |= hmac.compare_digest(h, presented)
    return found


def _tenant(name: str, t: Any, base: Path) -> TenantConfig:
    where = f"[tenants.{name}]"
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name) or name in (".", ".."):
        raise ConfigError(f"{where}: a tenant name is 1-64 letters, digits, '_', '.' or '-'")
    _typed(where, t, dict)
    _known(where, t, {"keys", "max_sessions", "max_memory", "max_disk", "max_checkpoints",
                      "turns_per_second", "max_running", "queued", "ceiling", "mounts",
                      "egress", "tools"})
    keys = tuple(_typed(f"{where} keys[]", k, str) for k in _typed(f"{where} keys",
                                                                      t.get("keys", []), list))
    _check_hashes(f"{where} keys", keys)
    ceiling = dict(_typed(f"{where}.ceiling", t.get("ceiling", {}), dict))
    _known(f"[tenants.{name}.ceiling]", ceiling, _LIMIT_FIELDS)
    for k, v in ceiling.items():
        _typed(f"[tenants.{name}.ceiling] {k}", v, (int, float))
    grants = []
    for i, m in enumerate(_typed(f"{where} mounts", t.get("mounts", []), list)):
        _typed(f"{where} mounts[{i}]", m, dict)
        _known(f"{where} mounts[{i}]", m, {"host", "writable"})
        host = Path(_typed(f"{where} mounts[{i}].host", m.get("host"), str))
        grants.append(MountGrant(host=(base / host).resolve(),
                                 writable=_typed(f"{where} mounts[{i}].writable",
                                                 m.get("writable", False), bool)))
    egress = None
    if "egress" in t:
        policy_path = base / _typed(f"{where} egress", t["egress"], str)
        try:
            egress = EgressPolicy.load(policy_path)
        except ConfigError as exc:
            raise ConfigError(f"{where} egress: {exc}") from exc
    specs = _typed(f"{where} tools", t.get("tools", []), list)
    tools = load_tools(f"{where} tools", [_typed(f"{where} tools[]", x, str) for x in specs],
                       base, name)
    opt_int = (int, type(None))
    tps = t.get("turns_per_second")
    return TenantConfig(
        name=name, keys=keys,
        max_sessions=_typed(f"{where} max_sessions", t.get("max_sessions", 8), opt_int),
        max_memory=_typed(f"{where} max_memory", t.get("max_memory"), opt_int),
        max_disk=_typed(f"{where} max_disk", t.get("max_disk"), opt_int),
        max_checkpoints=_typed(f"{where} max_checkpoints", t.get("max_checkpoints", 64), int),
        turns_per_second=None if tps is None else float(
            _typed(f"{where} turns_per_second", tps, (int, float))),
        max_running=_typed(f"{where} max_running", t.get("max_running"), opt_int),
        queued=_typed(f"{where} queued", t.get("queued", 16), int),
        ceiling=ceiling, mounts=tuple(grants), egress=egress, tools=tools)


_SERVER_KEYS: dict[str, Any] = {
    "host": str, "port": int, "backend": str, "workers": int, "warm": int, "max_sandboxes": int,
    "warm_timeout": (int, float), "max_body_bytes": int, "threads": int, "tenant_threads": int,
    "access_log": bool, "log_code": bool, "preload": list, "state_dir": str, "shared_dir": str,
    "save_interval": (int, float), "idle_evict": (int, float), "metrics_keys": list,
    "checkpoint_ttl": (int, float),
    "metrics_public": bool}
_EDGE_KEYS: dict[str, Any] = {
    "max_connections": int, "max_pending": int, "max_pending_per_peer": int,
    "header_timeout": (int, float), "body_timeout": (int, float), "max_header_bytes": int,
    "keep_alive_timeout": (int, float)}


def parse_config(data: Mapping[str, Any], *, path: Path | None = None) -> ServiceConfig:
    """A :class:`ServiceConfig` from the parsed TOML tables ``[server]`` and ``[tenants.*]``."""
    _known("serve.toml", data, {"server", "tenants"})
    server = _typed("[server]", data.get("server", {}), dict)
    _known("[server]", server, set(_SERVER_KEYS) | set(_EDGE_KEYS))
    edge = {k: _typed(f"[server] {k}", v, _EDGE_KEYS[k]) for k, v in server.items()
            if k in _EDGE_KEYS}
    for k, v in edge.items():
        if v <= 0 and not (k == "max_connections" and v == 0):
            raise ConfigError(f"[server] {k} must be > 0, got {v!r}")
    opts = {k: _typed(f"[server] {k}", v, _SERVER_KEYS[k]) for k, v in server.items()
            if k not in _EDGE_KEYS}
    edge_opts: dict[str, Any] = {k: float(v) if isinstance(_EDGE_KEYS[k], tuple) else v
                                 for k, v in edge.items()}
    opts["edge"] = EdgeLimits(**edge_opts)
    if opts.get("backend", "pool") not in ("pool", "subprocess", "inprocess"):
        raise ConfigError(f"[server] backend must be pool, subprocess or inprocess, got "
                          f"{opts['backend']!r}")
    if "warm_timeout" in opts:
        opts["warm_timeout"] = float(opts["warm_timeout"])
    base = path.parent if path is not None else Path.cwd()
    for k in ("state_dir", "shared_dir"):
        if k in opts:
            opts[k] = (base / opts[k]).resolve()
    for k in ("save_interval", "idle_evict", "checkpoint_ttl"):
        if k in opts:
            opts[k] = float(opts[k])
            if opts[k] < 0:
                raise ConfigError(f"[server] {k} must be >= 0, got {opts[k]!r}")
    if "metrics_keys" in opts:
        opts["metrics_keys"] = tuple(_typed("[server] metrics_keys[]", k, str)
                                     for k in opts["metrics_keys"])
        _check_hashes("[server] metrics_keys", opts["metrics_keys"])
    if "preload" in opts:
        opts["preload"] = tuple(_typed("[server] preload[]", m, str) for m in opts["preload"])
    tenants = {n: _tenant(n, t, base)
               for n, t in _typed("[tenants]", data.get("tenants", {}), dict).items()}
    seen: dict[str, str] = {}
    for t in tenants.values():
        for k in t.keys:
            if k in seen:
                raise ConfigError(f"one key is listed for tenants {seen[k]!r} and {t.name!r}")
            seen[k] = t.name
    if "state_dir" in opts and "idle_evict" not in opts:
        opts["idle_evict"] = 600.0  # a durable server evicts idle sessions by default
    return ServiceConfig(**opts, tenants=tenants, path=path)


def check_config(config: ServiceConfig) -> tuple[list[str], list[str]]:
    """(what the config means that is easy to miss, what is likely a mistake): per tenant,
    the limits of a session created without any (the service's defaults within its
    ceiling), and a tenant that may hold every sandbox of the pool."""
    notes: list[str] = []
    problems: list[str] = []
    base = Limits(timeout=config.warm_timeout)
    capacity = (config.max_sandboxes or 8 * config.workers) if config.backend == "pool" \
        else None
    for t in config.tenants.values():
        got = t.default_limits(base)
        lowered = {k: v for k, v in got.items() if v != getattr(base, k)}
        notes.append(f"tenant {t.name}: a session asking for no limits gets timeout "
                     f"{got['timeout']:g} s, memory {got['memory']}"
                     + (f" (lowered to its bounds: {sorted(lowered)})" if lowered else ""))
        try:
            t.check_limits(Limits(**got))
        except ConfigError as exc:
            problems.append(f"tenant {t.name}: {exc}")
        if t.max_memory is not None and got["memory"] > t.max_memory:
            problems.append(f"tenant {t.name}: max_memory {t.max_memory} holds no session")
        if capacity is not None and (t.max_sessions is None or t.max_sessions >= capacity):
            problems.append(f"tenant {t.name}: max_sessions {t.max_sessions} lets it hold "
                            f"every sandbox of the pool ({capacity}); other tenants would "
                            "get 429 while it holds them")
    if config.state_dir is not None and config.idle_evict is None:
        notes.append("idle sessions are saved and evicted after 600 s (idle_evict)")
    return notes, problems


def load_config(path: str | os.PathLike[str]) -> ServiceConfig:
    """Read ``serve.toml``; every problem is a ConfigError naming the file."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text())
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read the service config: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from exc
    try:
        return parse_config(data, path=p.resolve())
    except ConfigError as exc:
        raise ConfigError(f"{p}: {exc}") from exc


class KeyRing:
    """Tenants by API key, reread from the config file when it changes (checked on each
    lookup: a ``stat``). A file that no longer parses keeps the last good tenants and is
    reported through ``last_error``."""

    def __init__(self, config: ServiceConfig) -> None:
        self._lock = threading.Lock()
        self._tenants = dict(config.tenants)
        self._path = config.path
        self._stamp = self._stat()
        self.last_error: str | None = None

    def _stat(self) -> tuple[int, int] | None:
        if self._path is None:
            return None
        try:
            st = self._path.stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size)

    def _refresh(self) -> None:
        stamp = self._stat()
        if stamp is None or stamp == self._stamp or self._path is None:
            return
        with self._lock:
            if stamp == self._stamp:
                return
            self._stamp = stamp
            try:
                self._tenants = dict(load_config(self._path).tenants)
                self.last_error = None
            except ConfigError as exc:
                self.last_error = str(exc)

    def tenants(self) -> dict[str, TenantConfig]:
        self._refresh()
        return dict(self._tenants)

    def lookup(self, key: str | None) -> TenantConfig | None:
        """The tenant whose key this is, else None (every stored hash compared)."""
        if not key:
            return None
        self._refresh()
        presented = _digest(key)
        found = None
        for tenant in self._tenants.values():
            for stored in tenant.keys:
                if hmac.compare_digest(stored, presented):
                    found = tenant
        return found
