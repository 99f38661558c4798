"""Guest packages through `memex serve`: a create asks for requirements, the server resolves
them (pip, from the index it is configured with: a package index on 127.0.0.1 here) within
what the tenant's operator allows, every dependency included; refusals are 422 naming the
package (raised by the client as the ConfigError the server raised)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from package_index import build_wheel, package_index
from served import Served, start_server

from memex import ConfigError, Limits
from memex.backends import get_backend


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    wheels = tmp_path_factory.mktemp("wheels")
    build_wheel(wheels, "memexsvc-app", "1.0",
                {"memexsvc_app.py": "from memexsvc_dep import N\nTOTAL = N + 1\n"},
                requires=("memexsvc-dep",))
    build_wheel(wheels, "memexsvc-dep", "1.0", {"memexsvc_dep.py": "N = 41\n"})
    build_wheel(wheels, "memexsvc-extra", "1.0", {"memexsvc_extra.py": ""})
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
])
def test_what_the_tenant_may_not_have_is_refused_with_422(served: Served, tenant: str,
                                                          packages: list[str], says: str
                                                          ) -> None:
    with pytest.raises(ConfigError) as err:  # the server's 422, raised as what it was
        opened(served, tenant, packages)
    assert says in str(err.value), err.value


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
