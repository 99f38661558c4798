"""Shared fixtures for the MemEx test suite.

Every test runs real guests (CPython on WASI under wasmtime) from the precompiled modules in
the cache. Tests never compile a module: a missing module stops the session with the command
that builds it, and ``compile_module`` is replaced by a tripwire for the whole session.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from lanes import (
    HANG_GUARDS,
    LANE_BUDGETS,
    lane_of,
    load_hypothesis_profile,
    unit_of,
    uses_cluster,
)
from served import (
    LAUNCHED,
    Served,
    close_test_clients,
    cluster_toml,
    loopback_cluster,
    start_server,
    stop_launched_since,
)

import memex.runtime_wasm.engine._engine as _engine
import memex.runtime_wasm.internal as rw
from memex import Limits, ModuleCacheMissing, Sandbox
from memex.backends import Backend, get_backend
from memex.runtime_wasm import SandboxAPI

HAVE_RAY = importlib.util.find_spec("ray") is not None
load_hypothesis_profile()  # before a test module makes its settings

# Short per-turn deadline for ordinary tests: a hung guest fails a test in seconds, not 30 s.
DEFAULT_TIMEOUT = 10.0


# ---- lanes and budgets (tests/lanes.py) -----------------------------------------------------
_TIMES: list[tuple[float, str, str]] = []  # (seconds, lane, test) of each test's call


# The node ids of the tests that use Ray, written by each worker as it collects and read by
# the controller's scheduler (which sees node ids, not markers or fixtures): the file's path
# is set by the controller before it starts the workers, which inherit its environment.
RAY_TESTS_FILE = "MEMEX_RAY_TESTS_FILE"


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        _own_session()
    if not hasattr(config, "workerinput") and getattr(config.option, "numprocesses", None):
        folder = tempfile.mkdtemp(prefix="memex-units-")
        config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))
        os.environ[RAY_TESTS_FILE] = os.path.join(folder, "ray-tests.json")


def _own_session() -> None:
    """Put this xdist worker, and every server, Ray node and guest it starts, in a session of
    its own, as a deployed server is (a systemd unit, a container, a terminal of its own).

    Servers run their guests some ``nice`` steps below their own threads (``guest_nice``).
    Under Linux's autogroup scheduling a session is one scheduling group and nice counts only
    inside it; in the session of whatever started pytest, those guests were instead ranked
    below every other process there: the other worker's tests, or a CPU hog started beside
    the run (nice 10 weighs about a tenth of nice 0). Beside two busy loops, 4 cluster tests
    of tests/security/test_attacks.py: 3 failed past their 10 s deadline in the shared
    session, 4 passed in their own. A worker already leading its process group stays where
    it is (setsid refuses a group leader).
    """
    with contextlib.suppress(PermissionError):
        os.setsid()


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    ray_tests = []
    for item in items:
        lane = lane_of(item)
        if uses_cluster(item) and not item.get_closest_marker("ray"):
            item.add_marker(pytest.mark.ray)
        if lane == "slow" and not item.get_closest_marker("slow"):  # on a server's fixture
            item.add_marker(pytest.mark.slow)
        if lane in HANG_GUARDS and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(HANG_GUARDS[lane]))
        if item.get_closest_marker("ray"):
            ray_tests.append(item.nodeid)
        item.user_properties.append(("lane", lane))  # in the JUnit XML (tests/times.py)
    path = os.environ.get(RAY_TESTS_FILE)
    if path and hasattr(config, "workerinput"):  # each worker writes the same list, whole
        part = f"{path}.{config.workerinput['workerid']}"
        with open(part, "w") as f:
            json.dump(ray_tests, f)
        os.replace(part, path)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Under the scheduler below, the tests that use Ray run one after another on one worker:
    after the last of them, that worker ends what holds Ray (the Ray and cluster backends, the
    cluster's front, the Ray cluster) rather than keep it until the session ends. An idle Ray
    cluster of a head and a node used 0.37 s of CPU a second (measured): the rest of the
    worker's run would pay it. A Ray test after that (a run not grouped) starts them again."""
    yield
    if (os.environ.get(RAY_TESTS_FILE) and hasattr(item.config, "workerinput")
            and nextitem is not None and item.get_closest_marker("ray")
            and not nextitem.get_closest_marker("ray")):
        _end_ray_fixtures(item)


def _end_ray_fixtures(item: pytest.Item) -> None:
    manager = item.session._fixturemanager
    backends = manager.getfixturedefs("_session_backends", item)
    made = backends[-1].cached_result if backends else None
    if made is not None and isinstance(made[0], dict):  # (value, key, exception)
        for kind in RAY_BACKENDS:
            b = made[0].pop(kind, None)
            if b is not None:
                b.close()
    for name in ("cluster_server", "ray_cluster"):  # the front, then the cluster it joined
        defs = manager.getfixturedefs(name, item)
        if defs and defs[-1].cached_result is not None:
            defs[-1].finish(item._request)  # type: ignore[attr-defined]


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's ``load`` scheduling, but a document's blocks go to one worker in order, and
    the tests that use Ray go to one worker (``lanes.unit_of``). (Its own ``--dist
    loadgroup`` groups nothing under pytest 9: it marks a group by renaming
    ``item._nodeid``, which pytest 9 no longer reads, so a document's blocks were spread over
    both workers and a skipped excerpt ran on the worker that missed its directive.)"""
    from xdist.scheduler import LoadScopeScheduling

    class Units(LoadScopeScheduling):
        ray_tests: frozenset[str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.ray_tests is None:  # read once the workers have collected
                path = os.environ.get(RAY_TESTS_FILE)
                try:
                    with open(path or "") as f:
                        self.ray_tests = frozenset(json.load(f))
                except FileNotFoundError:
                    self.ray_tests = frozenset()
            return unit_of(nodeid, self.ray_tests)

        def remove_node(self, node: Any) -> str | None:
            """A worker that died (a hang guard's timeout ends its process): its unfinished
            units go back to the queue, less the test it died in, which xdist reports failed
            and is not run again (as xdist's ``load`` scheduling does: a retry would hide a
            flake and pay a hang twice). xdist's own keeps every unit the worker was ever
            sent, finished ones too, and puts them all back: a worker then sent a finished
            unit is sent no test, finishes none, and so is never sent another: the run
            hung on the surviving worker with the replacement idle (found by a CPU-hog run;
            tests/test_times.py checks it)."""
            workload = self.assigned_work.pop(node)
            unfinished = {scope: unit for scope, unit in workload.items()
                          if not all(unit.values())}
            if not unfinished:
                return None
            crashed: str = next(nodeid for unit in unfinished.values()
                           for nodeid, done in unit.items() if not done)
            for unit in unfinished.values():
                if crashed in unit:
                    unit[crashed] = True
            self.workqueue.update((scope, unit) for scope, unit in unfinished.items()
                                  if not all(unit.values()))
            for other in self.assigned_work:
                self._reschedule(other)
            return crashed

    return Units(config, log)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call":
        lane = dict(report.user_properties).get("lane", "fast")
        _TIMES.append((report.duration, str(lane), report.nodeid))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    over = sorted((t for t in _TIMES if t[0] > LANE_BUDGETS.get(t[1], 5.0)), reverse=True)
    if over:
        terminalreporter.section("tests over their lane's budget (reported, not failed)")
        for seconds, lane, test in over:
            terminalreporter.write_line(f"{seconds:7.1f}s  {lane} (budget "
                                        f"{LANE_BUDGETS[lane]:g}s)  {test}")


def _no_compile(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("tests must never compile the guest module (compile_module called)")


@pytest.fixture(autouse=True)
def _test_clients() -> Iterator[None]:
    """The test's clients (served.client_for_test) closed when it ends."""
    yield
    close_test_clients()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """A server the test's body launched and left running (it failed before its own stop)
    is stopped as the body ends, not left to the rest of the run (fixtures, set up before
    and torn down after the body, stop their own)."""
    count = len(LAUNCHED)
    try:
        return (yield)
    finally:
        stop_launched_since(count)


@pytest.fixture(scope="session", autouse=True)
def _precompiled_modules_only() -> Iterator[None]:
    """Refuse to compile and require both precompiled flavours before any test runs."""
    mp = pytest.MonkeyPatch()
    mp.setattr(_engine, "compile_module", _no_compile)
    mp.setattr(rw, "compile_module", _no_compile)
    try:
        for flavour in ("plain", "metered"):
            if not _engine.module_path(flavour).is_file():
                pytest.exit(
                    f"no precompiled {flavour} guest module in the cache: run `memex prepare` "
                    "once on this machine before running the tests",
                    returncode=4,
                )
            try:
                _engine.load_module(flavour)
            except ModuleCacheMissing as exc:  # pragma: no cover - guarded above
                pytest.exit(str(exc), returncode=4)
        yield
    finally:
        mp.undo()


@pytest.fixture
def make_sandbox() -> Iterator[Callable[..., Sandbox]]:
    """Factory for sandboxes that are all closed when the test ends (default timeout 10 s)."""
    created: list[Sandbox] = []

    def make(**kwargs: Any) -> Sandbox:
        kwargs.setdefault("limits", Limits(timeout=DEFAULT_TIMEOUT))
        sb = Sandbox(**kwargs)
        created.append(sb)
        return sb

    yield make
    for sb in created:
        sb.close()


@pytest.fixture
def sandbox(make_sandbox: Callable[..., Sandbox]) -> Sandbox:
    """A fresh sandbox with a 10 s turn deadline, closed after the test."""
    return make_sandbox()


@pytest.fixture(scope="module")
def shared_sandbox() -> Iterator[Sandbox]:
    """One sandbox for a whole module, for tests that only read from a fresh-enough guest."""
    sb = Sandbox(limits=Limits(timeout=DEFAULT_TIMEOUT))
    yield sb
    sb.close()


# ---- every backend (tests/backends, tests/security) ------------------------------------------
# ``backend`` runs a test once per backend (in-process, subprocess, pool, a `memex serve`
# service through RemoteBackend and, when Ray is installed, Ray);
# ``open_sandbox`` opens sandboxes on it that are closed when the test ends.
# Backends are made once per session (starting worker processes or a Ray cluster is the slow
# part) and closed at its end; a test that needs a backend of its own (fault tests) builds one.
# The fast lane runs the contract on the in-process and subprocess backends (one sandbox in
# this process, one in a worker process of its own); the pool, a server and Ray are the full
# run's (marked slow or ray: their processes and servers are what makes a lane slow).
BACKEND_KINDS = [
    "inprocess",
    "subprocess",
    pytest.param("pool", marks=pytest.mark.slow),
    pytest.param("ray", marks=[pytest.mark.ray, pytest.mark.skipif(
        not HAVE_RAY, reason="Ray is not installed (pip install 'memex[ray]')")]),
    # a real `memex serve` on 127.0.0.1 (the memex_server fixture)
    pytest.param("remote", marks=pytest.mark.slow),
    # a front of `memex serve` on a real Ray cluster on 127.0.0.1 (the cluster_server fixture)
    pytest.param("cluster", marks=[pytest.mark.ray, pytest.mark.skipif(
        not HAVE_RAY, reason="Ray is not installed (pip install 'memex[cluster]')")]),
]

RAY_BACKENDS = tuple(p.values[0] for p in BACKEND_KINDS
                     if not isinstance(p, str) and any(m.name == "ray" for m in p.marks))
"""The backends of BACKEND_KINDS that hold Ray (ended with the Ray fixtures)."""

# Small but real settings: one or two workers (the machine has two cores).
BACKEND_OPTIONS: dict[str, dict[str, Any]] = {
    "inprocess": {},
    "subprocess": {"workers": 1},
    "pool": {"workers": 2, "warm": 2, "limits": Limits(timeout=DEFAULT_TIMEOUT)},
    "ray": {"actors": 2, "address": "local", "init_options": {"num_cpus": 2}},
}

OpenSandbox = Callable[..., SandboxAPI[Any]]


@pytest.fixture(scope="session")
def _session_backends() -> Iterator[dict[str, Backend]]:
    made: dict[str, Backend] = {}
    yield made
    for b in made.values():
        b.close()


@pytest.fixture(params=BACKEND_KINDS)
def backend(request: pytest.FixtureRequest, _session_backends: dict[str, Backend]) -> Backend:
    """Each backend in turn (shared for the session; do not close it in a test)."""
    kind = str(request.param)
    b = _session_backends.get(kind)
    if b is None or b.closed:
        options = BACKEND_OPTIONS.get(kind, {})
        if kind in ("remote", "cluster"):
            served = request.getfixturevalue("memex_server" if kind == "remote"
                                             else "cluster_server")
            options = {"url": served.url, "api_key": served.keys["a"]}
            kind = "remote"
        b = _session_backends[str(request.param)] = get_backend(kind, **options)
    return b


@pytest.fixture
def open_sandbox(backend: Backend) -> Iterator[OpenSandbox]:
    """Open sandboxes on ``backend`` (default turn deadline 10 s); all closed at the end."""
    made: list[SandboxAPI[Any]] = []

    def open_(**kwargs: Any) -> SandboxAPI[Any]:
        kwargs.setdefault("limits", Limits(timeout=DEFAULT_TIMEOUT))
        sb = backend.open(**kwargs)
        made.append(sb)
        return sb

    yield open_
    for sb in made:
        sb.close()


# ---- a real `memex serve` on 127.0.0.1 (tests/service, the backend "remote") ---------------
@pytest.fixture(scope="session")
def memex_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One server for the session: tenants ``a`` and ``b`` (generous), ``small`` (2 sessions,
    1 GiB of disk over them, a 512 MiB memory ceiling and 20 s timeout ceiling)."""
    served = start_server(tmp_path_factory.mktemp("serve"), {
        "a": 'max_sessions = 200\nmounts = [{host = "/", writable = true}]',
        "b": "max_sessions = 200",
        "small": "max_sessions = 2\nmax_disk = 1073741824\n[tenants.small.ceiling]\n"
                 "memory = 536870912\ntimeout = 20",
    })
    yield served
    served.stop()


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """A Ray cluster on 127.0.0.1 for the session (a head and one worker node of 4 CPUs and
    8 GiB) that fronts join, each server in a namespace of its own (``cluster_toml``)."""
    cluster = loopback_cluster({}, {"num_cpus": 4, "memory": 8 << 30})
    yield cluster
    cluster.shutdown()


@pytest.fixture(scope="session")
def cluster_server(tmp_path_factory: pytest.TempPathFactory, ray_cluster: Any
                   ) -> Iterator[Served]:
    """A front of `memex serve` joined to the session's Ray cluster, with memex_server's
    tenants: the backend "cluster" of the contract suites."""
    folder = tmp_path_factory.mktemp("cluster-serve")
    served = start_server(folder, {
        "a": 'max_sessions = 200\nmounts = [{host = "/", writable = true}]\n'
             "[tenants.a.ceiling]\nmemory = 1073741824",
        "b": "max_sessions = 200\n[tenants.b.ceiling]\nmemory = 1073741824",
        "small": "max_sessions = 2\nmax_disk = 1073741824\n[tenants.small.ceiling]\n"
                 "memory = 536870912\ntimeout = 20",
    }, server=cluster_toml(ray_cluster, folder))
    yield served
    served.stop()


# ---- an S3-compatible store on 127.0.0.1 (moto's server mode) -------------------------------
@pytest.fixture(scope="session")
def s3_server() -> Iterator[dict[str, Any]]:
    """A real S3 API on 127.0.0.1 (moto's server, a thread of this process) with one bucket
    ``memex``; the fsspec storage options that reach it."""
    pytest.importorskip("s3fs")
    server_mod = pytest.importorskip("moto.server")
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    options = {"key": "testing", "secret": "testing", "skip_instance_cache": True,
               "client_kwargs": {"endpoint_url": f"http://{host}:{port}",
                                 "region_name": "us-east-1"}}
    import boto3  # moto's own dependency

    boto3.client("s3", endpoint_url=f"http://{host}:{port}", region_name="us-east-1",
                 aws_access_key_id="testing",
                 aws_secret_access_key="testing").create_bucket(Bucket="memex")
    yield {"uri": "s3://memex", "options": options, "endpoint": f"http://{host}:{port}"}
    server.stop()
