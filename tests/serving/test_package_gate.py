"""PackageGate: a tenant's resolution is a shared resource. One per tenant at a time and
``parallel`` per machine, nobody waiting: a second create of a busy tenant is answered 429 at
once while another tenant's proceeds (the positive control), and a full machine answers 503."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from memex.errors import BackendBusy, ConfigError
from memex.runtime_wasm import PackageSet, Wheel
from memex.serving import PackageGate, allowed_packages


class SlowResolve:
    """Stands in for the resolver: each call blocks until released (what a slow index
    does)."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.started = threading.Semaphore(0)

    def __call__(self, reqs: list[str], **kw: Any) -> PackageSet:
        self.started.release()
        assert self.go.wait(30)
        name = reqs[0].split("=")[0]
        return PackageSet(tuple(reqs), (Wheel(name, "1.0", f"{name}-1.0-py3-none-any.whl",
                                              "0" * 64, 10),), Path("."))


def test_one_resolution_per_tenant_and_parallel_per_machine() -> None:
    slow = SlowResolve()
    gate = PackageGate(parallel=2, resolve=slow)
    out: dict[str, Any] = {}

    def create(tenant: str, pkg: str) -> None:
        try:
            out[tenant] = gate.pins(tenant, None, [pkg])
        except BackendBusy as exc:
            out[tenant] = exc

    a = threading.Thread(target=create, args=("a", "alpha"))
    a.start()
    assert slow.started.acquire(timeout=10)
    with pytest.raises(BackendBusy) as busy:  # a's second create: at once, not queued
        gate.pins("a", None, ["beta"])
    assert busy.value.reason == "queue_full"
    b = threading.Thread(target=create, args=("b", "gamma"))  # another tenant goes on
    b.start()
    assert slow.started.acquire(timeout=10)
    with pytest.raises(BackendBusy) as full:  # both slots held: a third tenant gets 503
        gate.pins("c", None, ["delta"])
    assert full.value.reason == "no_room"
    slow.go.set()
    a.join(10)
    b.join(10)
    lock = " --hash=sha256:" + "0" * 64  # the gate answers locked pins
    assert out == {"a": ("alpha==1.0" + lock,), "b": ("gamma==1.0" + lock,)}
    assert gate.pins("a", None, ["beta"]) == ("beta==1.0" + lock,)  # free again


def test_allowed_names_are_canonical_and_star_means_any() -> None:
    assert allowed_packages(["Memex_Thing", "other.pkg"], "t") == {"memex-thing", "other-pkg"}
    assert allowed_packages(["*"], "t") is None
    assert allowed_packages([], "t") == frozenset()
    with pytest.raises(ConfigError, match="not a package name"):
        allowed_packages(["bad name!"], "t")


def test_a_name_not_allowed_is_refused_before_a_resolution_starts() -> None:
    slow = SlowResolve()
    gate = PackageGate(resolve=slow)
    with pytest.raises(ConfigError, match="does not allow"):
        gate.pins("t", frozenset({"other"}), ["alpha"])
    assert not slow.started.acquire(timeout=0.2)  # no resolution ran
