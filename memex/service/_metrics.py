"""``/metrics`` for Prometheus: sessions, turns, turn latency, limits hit and what the tenant
holds now (its ledger account), per tenant, and HTTP answers by status. One registry per app
(two apps in one process never share counts)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from ..backends.internal import Ledger
from ..runtime_wasm import TurnResult

__all__ = ["Metrics"]


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self._sessions = Gauge("memex_sessions", "live sessions", ["tenant"], registry=r)
        self._turns = Counter("memex_turns", "turns run", ["tenant", "status"], registry=r)
        self._seconds = Histogram("memex_turn_seconds", "wall seconds per turn", ["tenant"],
                                  registry=r, buckets=(.001, .003, .01, .03, .1, .3, 1, 3, 10,
                                                       30, 100))
        self._limits = Counter("memex_limits_hit", "turns stopped or capped by a limit",
                               ["tenant", "limit"], registry=r)
        self._http = Counter("memex_http_responses", "HTTP answers", ["status"], registry=r)
        self._config_error = Gauge("memex_config_error", "1 while serve.toml fails to parse "
                                   "(the last good tenants are kept; the log says why)",
                                   registry=r)
        self._edge = Gauge("memex_connections", "connections by state (open, pending: no "
                           "whole request head yet) and closed by the edge (refused, "
                           "evicted, timed_out: counts since start)", ["state"], registry=r)
        self._held = Gauge("memex_held", "what each tenant holds now, from its account of "
                           "the server's ledger (sessions being made, checkpoints and their "
                           "bytes, running and waiting turns, threads, sockets, package "
                           "resolutions, pool sandboxes and their memory)", ["tenant", "what"],
                           registry=r)
        self._known: set[str] = set()
        # on a cluster: the control actor's view (every front reports the same one)
        self._nodes = Gauge("memex_cluster_nodes", "the cluster's nodes by state (alive, "
                            "dead, draining)", ["state"], registry=r)
        self._slabs = Gauge("memex_cluster_slab", "each live slab's sessions, and the memory "
                            "its sessions' limits take of its capacity (bytes)",
                            ["node", "slab", "what"], registry=r)
        self._running = Gauge("memex_cluster_running", "running slots held across the "
                              "cluster (a max_running tenant's turns running, and the slots "
                              "fronts keep for their next turns)", ["tenant"], registry=r)
        self._control = Gauge("memex_cluster_control_calls", "calls the control actor "
                              "answered since it started, by kind", ["kind"], registry=r)

    def turn(self, tenant: str, r: TurnResult) -> None:
        self._turns.labels(tenant, r.status.value).inc()
        self._seconds.labels(tenant).observe(r.duration)
        if r.limit:
            self._limits.labels(tenant, r.limit).inc()

    def request(self, status: int) -> None:
        self._http.labels(str(status)).inc()

    def sessions(self, counts: Mapping[str, int]) -> None:
        for tenant in self._known | set(counts):
            self._sessions.labels(tenant).set(counts.get(tenant, 0))
        self._known |= set(counts)

    def held(self, ledger: Ledger) -> None:
        """Each tenant's account, field by field (a tenant whose account is gone drops out)."""
        self._held.clear()
        for a in ledger.accounts():
            for what, n in ledger.held(a.name).items():
                self._held.labels(a.name, what).set(float(n))

    def config_error(self, error: str | None) -> None:
        self._config_error.set(1 if error else 0)

    def edge(self, stats: Mapping[str, int]) -> None:
        for state, n in stats.items():
            self._edge.labels(state).set(n)

    def cluster(self, stats: Mapping[str, Any]) -> None:
        """The cluster's state as the control actor reports it (``Control.stats``)."""
        for g in (self._nodes, self._slabs, self._running):
            g.clear()
        states = {"alive": 0, "dead": 0, "draining": 0}
        for n in stats["nodes"]:
            states["draining" if n["draining"] else "alive" if n["alive"] else "dead"] += 1
        for state, count in states.items():
            self._nodes.labels(state).set(count)
        for slab in stats["slabs"]:
            for what in ("sessions", "used", "capacity"):
                self._slabs.labels(slab["node"], slab["name"], what).set(slab[what])
        for tenant, n in stats["running"].items():
            self._running.labels(tenant).set(n)
        for kind, n in stats["counts"].items():
            self._control.labels(kind).set(n)

    def render(self) -> bytes:
        return generate_latest(self.registry)
