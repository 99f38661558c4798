"""What a tenant's sessions get on their door from the server side (its operator tools and its
egress policy), in a form that crosses machines: in a cluster a session's door lives in a
slab on any node (docs/scaling.md), which has neither the front's serve.toml nor the files it
names. A :class:`DoorKit` carries the tool entries, the source of each ``.py`` file they name
and the policy's text; the front that publishes its serve.toml publishes its tenants' kits
with it, the control actor hands a session's kit to the slab that opens it, and the slab
builds it (:class:`SlabDoors`), so operator tools run, and egress leaves, on the session's
node. A tool entry naming a module (``mypkg.tools:search``) needs that module installed on
every node, as any code a Ray cluster runs does."""

from __future__ import annotations

import json
import logging
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..host_tools import Egress, EgressPolicy, EgressRecord, ToolCallRecord, ToolHost, ToolSet
from ._tools import TOOL_SPEC, load_tools

__all__ = ["KIT_BYTES", "DoorKit", "SlabDoors"]

KIT_BYTES = 4 << 20
"""Bytes of sources and policy one tenant's kit may carry (it goes through the control
actor to every slab that opens one of the tenant's sessions)."""

AUDIT = logging.getLogger("memex.audit")


@dataclass(frozen=True)
class DoorKit:
    """One tenant's operator tools and egress policy, as data (see the module)."""

    tenant: str
    tools: tuple[str, ...] = ()  # its serve.toml entries, ``file.py:NAME`` or ``module:NAME``
    files: tuple[tuple[str, bytes], ...] = ()  # the source of each ``file.py`` they name
    egress: tuple[str, str] | None = None  # (the policy file's name, its text)

    @classmethod
    def read(cls, tenant: str, tools: list[str], egress: str | None, base: Path
             ) -> DoorKit | None:
        """The kit of a tenant's table (None when it has neither tools nor a policy): the
        files are read as the config is, relative to its folder."""
        if not tools and egress is None:
            return None
        where = f"[tenants.{tenant}]"
        files: dict[str, bytes] = {}
        for spec in tools:
            found = TOOL_SPEC.fullmatch(spec) if isinstance(spec, str) else None
            if found is not None and found["where"].endswith(".py"):
                files[found["where"]] = _read(f"{where} tools", base / found["where"])
        policy = None
        if egress is not None:
            policy = (Path(egress).name, _read(f"{where} egress", base / egress).decode(
                "utf-8", "replace"))
        kit = cls(tenant, tuple(tools), tuple(files.items()), policy)
        if kit.size() > KIT_BYTES:
            raise ConfigError(f"{where}: its tool files and policy hold {kit.size()} bytes, "
                              f"over the {KIT_BYTES} a cluster ships to its nodes")
        return kit

    def size(self) -> int:
        return sum(len(d) for _, d in self.files) + len(self.egress[1] if self.egress else "")

    def to_wire(self) -> dict[str, Any]:
        return {"tenant": self.tenant, "tools": list(self.tools),
                "files": [[n, d] for n, d in self.files],
                "egress": list(self.egress) if self.egress is not None else None}

    @classmethod
    def from_wire(cls, data: Any) -> DoorKit:
        """The kit ``to_wire`` made (ConfigError for anything else)."""
        try:
            egress = data["egress"]
            kit = cls(str(data["tenant"]), tuple(str(s) for s in data["tools"]),
                      tuple((str(n), bytes(d)) for n, d in data["files"]),
                      (str(egress[0]), str(egress[1])) if egress is not None else None)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise ConfigError(f"a malformed door kit: {type(exc).__name__}: {exc}") from None
        if kit.size() > KIT_BYTES:
            raise ConfigError(f"a door kit of {kit.size()} bytes (at most {KIT_BYTES})")
        return kit

    def build(self) -> tuple[ToolSet | None, EgressPolicy | None]:
        """Its tools and policy, loaded here: the files are written to a folder of this
        process (kept while it lives: the tools' modules were loaded from it)."""
        folder = Path(tempfile.mkdtemp(prefix=f"memex-kit-{self.tenant}-"))
        where = f"[tenants.{self.tenant}]"
        for i, (name, data) in enumerate(self.files):
            path = folder / str(i) / Path(name).name
            path.parent.mkdir()
            path.write_bytes(data)
        specs = []
        for spec in self.tools:
            found = TOOL_SPEC.fullmatch(spec)
            names = [n for n, _ in self.files]
            if found is not None and found["where"] in names:
                i = names.index(found["where"])
                spec = f"{folder / str(i) / Path(found['where']).name}:{found['attr']}"
            specs.append(spec)
        tools = load_tools(f"{where} tools", specs, folder, self.tenant)
        policy = None
        if self.egress is not None:
            path = folder / Path(self.egress[0]).name
            path.write_text(self.egress[1])
            try:
                policy = EgressPolicy.load(path)
            except ConfigError as exc:
                raise ConfigError(f"{where} egress: {exc}") from exc
        return tools, policy


def _read(where: str, path: Path) -> bytes:
    try:
        with path.open("rb") as f:
            data = f.read(KIT_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read {str(path)!r}: {exc}") from None
    if len(data) > KIT_BYTES:
        raise ConfigError(f"{where}: {str(path)!r} is over {KIT_BYTES} bytes")
    return data


class SlabDoors:
    """Serves tenants' kits on the doors of a slab's sessions (what the control actor gives a
    slab, so the runtime layer it lives in needs no tools of its own). One build of each
    tenant's newest kit per process (a config that changes often does not pile up builds);
    one tool host and one egress per door (a fork shares its parent's)."""

    def __init__(self) -> None:
        # each tenant's newest kit, built (an older kit's sessions keep what they were given)
        self._built: dict[str, tuple[DoorKit, tuple[ToolSet | None, EgressPolicy | None]]] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {}  # each slab builds its own

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]

    def _build(self, kit: DoorKit) -> tuple[ToolSet | None, EgressPolicy | None]:
        with self._lock:
            held = self._built.get(kit.tenant)
            if held is None or held[0] != kit:
                held = self._built[kit.tenant] = (kit, kit.build())
            return held[1]

    def __call__(self, wire: Any, sid: str, sandbox: Any, door: Any, fresh: bool,
                 audit: Callable[[dict[str, Any]], None] | None = None) -> Callable[[], None]:
        """Serve the kit ``wire`` on ``door`` (the door of ``sandbox``, session ``sid``);
        ``fresh``: the guest is new, so the tools' module is installed in it (an image
        holds it already); ``audit`` hears each call's audit event (the slab hands them to
        the front with its turn's answer; they are logged here too). What it returns stops
        serving them."""
        def said(event: dict[str, Any]) -> None:
            AUDIT.info(json.dumps(event))
            if audit is not None:
                audit(event)

        kit = DoorKit.from_wire(wire)
        tools, policy = self._build(kit)
        closers: list[Callable[[], None]] = []
        if policy is not None:
            def heard(rec: EgressRecord) -> None:
                d = rec.to_dict()
                said({"event": "egress", "tenant": kit.tenant, "session": sid,
                      **{k: d.get(k) for k in ("method", "url", "decision", "rule", "outcome",
                                               "reason", "status", "request_bytes",
                                               "response_bytes")}})
            egress = Egress(policy, label=f"{kit.tenant}/{sid}", on_record=heard)
            egress.attach(sandbox, install=False)  # a guest routes urllib to its door already
            closers.append(egress.detach)
        if tools is not None:
            def called(rec: ToolCallRecord) -> None:
                said({"event": "tool", "tenant": kit.tenant, "session": sid, "tool": rec.tool,
                      "outcome": rec.outcome, "seconds": round(rec.duration, 4)})
            host = ToolHost(tools, on_call=called)
            closers.append(host.close)
            host.register(door)
            door.serve_tools(tools.names)
            if fresh:
                try:
                    host.install(sandbox, pin=True)
                except BaseException:
                    host.close()
                    raise

        def close() -> None:  # once: a second call finds nothing left
            while closers:
                closers.pop()()
        return close
