"""Guest packages through `memex serve`: a create asks for requirements, the server resolves
them (pip, from the index it is configured with: a package index on 127.0.0.1 here) within
what the tenant's operator allows, every dependency included; refusals are 422 naming the
package (raised by the client as the ConfigError the server raised)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from package_index import build_wheel, hostile_wheel, package_index
from served import Served, start_server

from memex import ConfigError, Limits
from memex.backends import get_backend
from memex.errors import PackageError

MARKER = Path("/tmp") / f"memex-svc-evil-{os.getpid()}"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    wheels = tmp_path_factory.mktemp("wheels")
    build_wheel(wheels, "memexsvc-app", "1.0",
                {"memexsvc_app.py": "from memexsvc_dep import N\nTOTAL = N + 1\n"},
                requires=("memexsvc-dep",))
    build_wheel(wheels, "memexsvc-dep", "1.0", {"memexsvc_dep.py": "N = 41\n"})
    build_wheel(wheels, "memexsvc-extra", "1.0", {"memexsvc_extra.py": ""})
    hostile_wheel(wheels, "memexsvc-evil", MARKER)
    with package_index(wheels) as index, pytest.MonkeyPatch.context() as mp:
        mp.setenv("PIP_INDEX_URL", index.url)  # the server's pip configuration
        s = start_server(tmp_path_factory.mktemp("serve"), {
            "pk": 'packages = ["memexsvc-app", "memexsvc_dep"]',
            "apponly": 'packages = ["memexsvc-app"]',
            "none": "",
            "any": 'packages = ["*"]'})
        try:
            yield s
        finally:
            s.stop()


def opened(served: Served, tenant: str, packages: list[str]) -> object:
    with get_backend("remote", url=served.url, api_key=served.keys[tenant]) as b:
        sb = b.open(limits=Limits(timeout=30), packages=packages)
        try:
            return sb.run("import memexsvc_app; memexsvc_app.TOTAL").value
        finally:
            sb.close()


@pytest.mark.slow
def test_an_allowed_package_and_its_dependency_run_in_the_session(served: Served) -> None:
    assert opened(served, "pk", ["memexsvc-app"]) == "42"
    assert opened(served, "any", ["memexsvc-app==1.0"]) == "42"


@pytest.mark.parametrize("tenant, packages, says", [
    ("none", ["memexsvc-app"], "asks for memexsvc-app, which its operator does not allow "
                               "(allowed: none)"),
    ("apponly", ["memexsvc-app"], "needs memexsvc-dep, which its operator does not allow"),
    ("pk", ["memexsvc-extra"], "asks for memexsvc-extra"),
    ("pk", ["memexsvc-app @ http://127.0.0.1:9/x.whl"], "not a URL"),
    ("any", ["memexsvc-evil"], "memexsvc-evil 1.0 depends on memexevil @ file://"),
])
def test_what_the_tenant_may_not_have_is_refused_with_422(served: Served, tenant: str,
                                                          packages: list[str], says: str
                                                          ) -> None:
    with pytest.raises((ConfigError, PackageError)) as err:  # the server's 422, as it was
        opened(served, tenant, packages)
    assert says in str(err.value), err.value
    assert not MARKER.exists()  # no package's build code ever ran on the server


def test_a_bundled_package_needs_no_grant(served: Served) -> None:
    """numpy is in every guest: a tenant allowed nothing may still ask for it."""
    with get_backend("remote", url=served.url, api_key=served.keys["none"]) as b:
        sb = b.open(limits=Limits(timeout=30), packages=["numpy>=2"])
        assert sb.run("import numpy; numpy.__version__ >= '2'").value == "True"
        sb.close()


def test_a_fork_keeps_its_parents_packages(served: Served, tmp_path: Path) -> None:
    with get_backend("remote", url=served.url, api_key=served.keys["pk"]) as b:
        sb = b.open(limits=Limits(timeout=30), packages=["memexsvc-app"])
        child = sb.fork()
        assert child.run("import memexsvc_app; memexsvc_app.TOTAL").value == "42"
        child.close()
        sb.close()


@pytest.mark.slow
def test_sigterm_stops_a_resolution_in_flight(tmp_path: Path) -> None:
    """A create whose package comes from an index that trickles it: SIGTERM of the server
    stops the download at once (the index had not sent the whole wheel), and the server
    exits instead of waiting out the resolution's deadline."""
    import threading

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    big = build_wheel(wheels, "memexsvc-slow", "1.0",
                      {"memexsvc_slow/blob.bin": os.urandom(24 << 20)})
    with package_index(wheels) as index, pytest.MonkeyPatch.context() as mp:
        index.slow.add(big.name)
        mp.setenv("PIP_INDEX_URL", index.url)
        s = start_server(tmp_path / "serve", {"any": 'packages = ["*"]'})
        out: list[BaseException] = []

        def create() -> None:
            try:
                opened(s, "any", ["memexsvc-slow"])
            except BaseException as exc:
                out.append(exc)

        t = threading.Thread(target=create)
        t.start()
        while index.sent.get(big.name, 0) == 0 and t.is_alive():
            threading.Event().wait(0.01)  # the download has started
        s.stop()
        t.join(60)
        assert not t.is_alive() and out, out
        assert index.sent[big.name] < big.stat().st_size, index.sent
        log = s.log.read_text()
        assert '"status": 422' in log and '"event": "shutdown"' in log, log[-2000:]
