"""``serve.toml``: the server's settings and its tenants, read strictly (an unknown key or a
value of the wrong type is a :class:`~memex.errors.ConfigError` naming it), and reread when the
file changes so keys rotate without a restart.

API keys are stored as ``sha256:<hex>`` of the key (``memex serve --hash-key`` prints one);
the key itself never sits in the file. Authentication is the front ends' one
(``memex.serving.KeyRing``): each tenant is a principal.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from ..errors import ConfigError, NotGranted
from ..host_tools import EgressPolicy, ToolSet
from ..runtime_wasm import SANDBOX_LIMITS, Limits
from ..runtime_wasm.internal import size_text
from ..serving import (
    Bounds,
    EdgeTable,
    FileModel,
    KeyRing,
    PrincipalTable,
    Seconds,
    SecondsOrZero,
    Size,
    allowed_packages,
    check_key_hashes,
    config_error,
    hash_key,
    load_tools,
    read_toml,
)
from ..serving.internal import DoorKit

__all__ = ["MountGrant", "ServiceConfig", "TenantConfig", "adopt_tenants", "check_config",
           "hash_key", "load_config", "service_keys"]

@dataclass(frozen=True, kw_only=True)
class MountGrant:
    """A host directory a tenant's sessions may mount (at any guest path), read-only unless
    ``writable``."""

    host: Path
    writable: bool = False

    def allows(self, host_path: Path, writable: bool) -> bool:
        inside = host_path == self.host or self.host in host_path.parents
        return inside and (self.writable or not writable)


class TenantConfig(PrincipalTable):
    """One tenant as the server holds it: its ``[tenants.NAME]`` table (the one schema of a
    principal: keys, bounds, ceiling; a field left out of ``ceiling`` is not capped) with
    its grants made real: mount grants resolved against the file's folder, its egress
    policy and operator tools loaded, its packages expanded to what they pull in."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True,
                              arbitrary_types_allowed=True)

    name: str
    mounts: tuple[MountGrant, ...] = ()  # type: ignore[assignment]
    egress: EgressPolicy | None = None  # type: ignore[assignment]  # None: the client's only
    tools: ToolSet | None = None  # type: ignore[assignment]  # run in the server (_tools)
    kit: DoorKit | None = None  # those two as data, for a cluster's slabs (serving._doorkit)
    # the guest packages its sessions may ask for (canonical names; None: any), with every
    # dependency they pull in (serving._packages)
    packages: frozenset[str] | None = frozenset()  # type: ignore[assignment]

    def bounds(self) -> Bounds:
        """What the session core holds this tenant to."""
        return Bounds(max_sessions=self.max_sessions, max_memory=self.max_memory,
                      max_disk=self.max_disk, max_checkpoints=self.max_checkpoints)

    def limits(self, given: Mapping[str, Any], base: Limits) -> Limits:
        """A session's limits: what it asks for (``given``), each within this tenant's
        ceiling (refused above it); the rest from ``base`` lowered to the ceiling, and its
        memory to ``max_memory``. The one reader: :meth:`Limits.from_mapping`."""
        if self.max_memory is not None and base.memory > self.max_memory:
            base = dataclasses.replace(base, memory=self.max_memory)
        return Limits.from_mapping(given, base=base, ceiling=self.ceiling.given(),
                                   where=f"tenant {self.name!r}: limits")

    def check_mount(self, host_path: Path, writable: bool) -> None:
        if not any(g.allows(host_path, writable) for g in self.mounts):
            kind = "writable" if writable else "read-only"
            raise NotGranted(f"tenant {self.name!r} may not mount {str(host_path)!r} "
                              f"({kind}); its granted mounts: "
                              f"{[str(g.host) for g in self.mounts] or 'none'}")


def _local_path(value: Any, info: ValidationInfo) -> Any:
    """A folder of the config, relative to the file's own folder (the validation's
    ``base``), made absolute."""
    if isinstance(value, str):
        value = Path(value)
    if isinstance(value, Path) and not value.is_absolute():
        base = (info.context or {}).get("base") or Path.cwd()
        value = (Path(base) / value).resolve()
    return value


LocalPath = Annotated[Path, BeforeValidator(_local_path)]


class ServerTable(EdgeTable):
    """``[server]``: the server's settings and its connection edge's (each documented in
    docs/service.md)."""

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    backend: Literal["pool", "subprocess", "inprocess"] = "pool"
    workers: int = Field(default=2, gt=0)
    warm: int | None = Field(default=None, ge=0)
    max_sandboxes: int | None = Field(default=None, gt=0)  # the pool's (8 per worker)
    warm_timeout: Seconds = SANDBOX_LIMITS.timeout  # the warm sandboxes' turn deadline
    max_body_bytes: Size = 32 << 20
    threads: int = Field(default=64, gt=0)  # blocking operations served at once
    tenant_threads: int = Field(default=0, ge=0)  # one tenant's (0: a quarter, at least 4)
    running_turns: int = Field(default=0, ge=0)  # turns running at once in all, shared
    # fairly among the tenants running turns (0: one per core; see serving/_shares.py)
    guest_nice: int = Field(default=10, ge=0, le=19)  # nice steps its guests run below its
    # own threads (0: the same; see runtime_wasm/engine/_runner.py)
    tenant_sockets: int = Field(default=0, ge=0)  # one tenant's open WebSockets (0: a
    # quarter of the server's connections, at least 8)
    access_log: bool = True
    log_code: bool = False  # put cell bodies in the audit log
    preload: tuple[str, ...] = ()  # modules the warm sandboxes have imported already
    state_dir: LocalPath | None = None  # sessions saved here (None: nothing outlives it)
    shared_dir: LocalPath | None = None  # sessions parked for another node to take
    save_interval: SecondsOrZero = 30.0  # between saves of a changed session (0: every turn)
    idle_evict: SecondsOrZero | None = None  # idle seconds before a session is saved, evicted
    checkpoint_ttl: SecondsOrZero = 600.0  # a closed session's checkpoints still held
    metrics_keys: tuple[str, ...] = ()  # key hashes /metrics asks for
    metrics_public: bool = False  # /metrics open to anyone (it names every tenant)

    @field_validator("preload", "metrics_keys", mode="before")
    @classmethod
    def _listed(cls, value: Any) -> Any:
        return tuple(value) if isinstance(value, list) else value  # a TOML array


class ClusterConfig(FileModel):
    """``[cluster]``: serve on a Ray cluster (docs/scaling.md)."""

    address: str
    storage: str
    storage_options: dict[str, Any] = Field(default_factory=dict)
    namespace: str = Field(default="memex", pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    slab_memory: Size = 4 << 30
    slab_cpus: float = Field(default=1.0, gt=0)
    save_interval: SecondsOrZero = 2.0
    place_timeout: Seconds = 60.0
    slab_idle: Seconds = 60.0  # seconds a slab holding no session is kept before retired
    # the Ray node of this machine the front joins, by the --temp-dir it was started with:
    # only where one machine runs more than one node (Ray otherwise joins the head's when it
    # is here, and a front on the head's node is ended with it: docs/scaling.md)
    node_temp_dir: str | None = Field(default=None, pattern=r"^/")


class ServiceConfig(ServerTable):
    """The server's settings (its ``[server]`` table, the one declaration of them), its
    cluster and its tenants: what :func:`load_config` reads from serve.toml."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True,
                              arbitrary_types_allowed=True)

    cluster: ClusterConfig | None = None  # serve on a Ray cluster: _cluster
    tenants: dict[str, TenantConfig] = Field(default_factory=dict)
    path: Path | None = None


class _ServeFile(FileModel):
    server: ServerTable = Field(default_factory=ServerTable)
    cluster: ClusterConfig | None = None
    tenants: dict[str, PrincipalTable] = Field(default_factory=dict)  # the one schema


_BACKEND_ONLY = {"warm": ("pool",), "max_sandboxes": ("pool",), "preload": ("pool",),
                 "workers": ("pool", "subprocess")}
"""[server] keys that only some backends use."""
_SERVER_ALL = frozenset(ServerTable.model_fields) - frozenset(_BACKEND_ONLY)



def _tenant(name: str, t: PrincipalTable, base: Path, kit: DoorKit | None = None
            ) -> TenantConfig:
    where = f"[tenants.{name}]"
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name) or name in (".", ".."):
        raise ConfigError(f"{where}: a tenant name is 1-64 letters, digits, '_', '.' or '-'")
    check_key_hashes(f"{where} keys", t.keys)
    here = None
    if kit is not None and kit.tenant == name:  # the one a cluster published: built from
        with contextlib.suppress(ConfigError):  # its own copy unless these files are it
            here = DoorKit.read(name, t.tools, t.egress, base)
        if here != kit:
            tools, egress = kit.build()
    if kit is None or kit.tenant != name or here == kit:
        tools, egress = _door_here(where, t, base, name)
        kit = DoorKit.read(name, t.tools, t.egress, base)
    made = {"name": name, "kit": kit, "egress": egress, "tools": tools,
            "mounts": tuple(MountGrant(host=(base / m.host).resolve(), writable=m.writable)
                            for m in t.mounts),
            "packages": allowed_packages(t.packages, f"{where} packages")}
    # the table's own fields as they are (set ones only: a default stays a default)
    return TenantConfig.model_validate(
        {**{k: getattr(t, k) for k in t.model_fields_set if k not in made}, **made})


def _door_here(where: str, t: PrincipalTable, base: Path, name: str
               ) -> tuple[ToolSet | None, EgressPolicy | None]:
    egress = None
    if t.egress is not None:
        try:
            egress = EgressPolicy.load(base / t.egress)
        except ConfigError as exc:
            raise ConfigError(f"{where} egress: {exc}") from exc
    return load_tools(f"{where} tools", t.tools, base, name), egress


def parse_config(data: Mapping[str, Any], *, path: Path | None = None,
                 kits: Mapping[str, DoorKit] | None = None) -> ServiceConfig:
    """A :class:`ServiceConfig` from the parsed TOML tables ``[server]`` and ``[tenants.*]``;
    ``kits``: tenants' tools and policies as a cluster published them (their files are then
    not read here)."""
    base = path.parent if path is not None else Path.cwd()
    try:
        f = _ServeFile.model_validate(data, context={"base": base})
    except ValidationError as exc:
        raise config_error(None, _ServeFile, exc) from None
    given = f.server.model_fields_set
    if f.cluster is None:
        unused = sorted(k for k in given if k not in _SERVER_ALL
                        and f.server.backend not in _BACKEND_ONLY.get(k, ()))
        if unused:
            users = sorted({b for k in unused for b in _BACKEND_ONLY[k]})
            raise ConfigError(f"[server] {', '.join(unused)}: backend "
                              f"{f.server.backend!r} does not use "
                              f"{'it' if len(unused) == 1 else 'them'} (backend "
                              f"{' or '.join(users)} does); a setting that would not be "
                              "enforced is refused")
    opts: dict[str, Any] = {k: getattr(f.server, k) for k in given}
    check_key_hashes("[server] metrics_keys", f.server.metrics_keys)
    tenants = {n: _tenant(n, t, base, (kits or {}).get(n)) for n, t in f.tenants.items()}
    seen: dict[str, str] = {}
    for t in tenants.values():
        for k in t.keys:
            if k in seen:
                raise ConfigError(f"one key is listed for tenants {seen[k]!r} and {t.name!r}")
            seen[k] = t.name
    if f.cluster is not None:
        for k in ("state_dir", "shared_dir"):
            if opts.get(k) is not None:
                raise ConfigError(f"[server] {k}: a cluster keeps its sessions in [cluster] "
                                  "storage, not in a folder of one node")
    if opts.get("state_dir") is not None and "idle_evict" not in opts:
        opts["idle_evict"] = 600.0  # a durable server evicts idle sessions by default
    return ServiceConfig.model_validate(
        {**opts, "cluster": f.cluster, "tenants": tenants, "path": path},
        context={"base": base})


def check_config(config: ServiceConfig) -> tuple[list[str], list[str]]:
    """(what the config means that is easy to miss, what is likely a mistake): per tenant,
    the limits of a session created without any (the service's defaults within its
    ceiling), and a tenant that may hold every sandbox of the pool."""
    notes: list[str] = []
    problems: list[str] = []
    base = dataclasses.replace(SANDBOX_LIMITS, timeout=config.warm_timeout)
    capacity = (config.max_sandboxes or 8 * config.workers) if config.backend == "pool" \
        and config.cluster is None else None
    for t in config.tenants.values():
        try:
            got = t.limits({}, base)
        except ConfigError as exc:
            problems.append(f"tenant {t.name}: max_memory {size_text(t.max_memory)} holds no "
                            "session "
                            f"({exc})" if t.max_memory is not None and
                            t.max_memory < base.memory else f"tenant {t.name}: {exc}")
        else:
            lowered = [k for k, v in got.to_mapping().items() if v != getattr(base, k)]
            notes.append(f"tenant {t.name}: a session asking for no limits gets timeout "
                         f"{got.timeout:g} s, memory {size_text(got.memory)}"
                         + (f" (lowered to its bounds: {sorted(lowered)})" if lowered else ""))
        if capacity is not None and (t.max_sessions is None or t.max_sessions >= capacity):
            problems.append(f"tenant {t.name}: max_sessions {t.max_sessions} lets it hold "
                            f"every sandbox of the pool ({capacity}); other tenants would "
                            "get 429 while it holds them")
    if config.cluster is not None:
        for t in config.tenants.values():
            top = t.ceiling.given().get("memory")
            if top is None or top > config.cluster.slab_memory:
                problems.append(f"tenant {t.name}: its sessions may ask for more memory "
                                f"({'any' if top is None else size_text(top)}) than a slab "
                                f"holds ({size_text(config.cluster.slab_memory)}): "
                                f"such a create is refused; set [tenants.{t.name}.ceiling] "
                                "memory")
    if config.state_dir is not None and config.idle_evict is None:
        notes.append("idle sessions are saved and evicted after 600 s (idle_evict)")
    return notes, problems


def load_config(path: str | os.PathLike[str]) -> ServiceConfig:
    """Read ``serve.toml``; every problem is a ConfigError naming the file."""
    p = Path(path)
    data = read_toml(p, "service config")
    try:
        return parse_config(data, path=p.resolve())
    except ConfigError as exc:
        raise ConfigError(f"{p}: {exc}") from exc


def service_keys(config: ServiceConfig, *, watch: bool = True) -> KeyRing[TenantConfig]:
    """The tenants by key, reread from serve.toml when it changes (``watch``; off on a
    cluster, where the control actor's copy rules: :func:`adopt_tenants`)."""
    return KeyRing(config.tenants, source=config.path if watch else None, load=_tenants_of)


def _tenants_of(path: Path) -> Mapping[str, TenantConfig]:
    return load_config(path).tenants


def adopt_tenants(ring: KeyRing[TenantConfig], text: str, path: Path | None,
                  kits: Mapping[str, DoorKit] | None = None) -> None:
    """Serve the tenants of ``text``: a serve.toml the cluster holds, with the ``kits``
    published with it (a text that does not parse keeps the last good tenants, reported
    through ``ring.last_error``)."""
    try:
        tenants = parse_config(tomllib.loads(text), path=path, kits=kits).tenants
        ring.replace(tenants)
    except (ConfigError, tomllib.TOMLDecodeError) as exc:
        ring.last_error = str(exc)
