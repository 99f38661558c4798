"""`memex serve` on a real multi-node Ray cluster on 127.0.0.1 (docs/scaling.md): a head and
two worker nodes with their own resources (``ray.cluster_utils.Cluster``), two fronts (real
`memex serve` processes joined to it, each with its own copy of serve.toml, as on two
machines) and the cluster's storage in a local folder."""

from __future__ import annotations

import ast
import concurrent.futures
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from package_index import PackageIndex, build_wheel, hostile_wheel
from served import DRIVER, Served, launch, loopback_cluster, tenant_table

from memex import Door, Limits, RemoteBackend
from memex.backends import LOOPBACK_NODE
from memex.errors import NotGranted, PackageError, SandboxClosed, ServiceError
from memex.host_tools import Tool, ToolHost
from memex.service import hash_key

pytestmark = [pytest.mark.ray, pytest.mark.slow]
ray = pytest.importorskip("ray")
pytest.importorskip("fsspec")

OPS = textwrap.dedent('''
    import os
    from pathlib import Path

    from memex.host_tools import ToolSet

    TOOLS = ToolSet()


    @TOOLS.tool
    def where() -> list[str]:
        """The Ray actor and the process that ran this call, and the folder its module
        was loaded from."""
        import ray
        return [str(ray.get_runtime_context().get_actor_name()), str(os.getpid()),
                Path(__file__).parent.parent.name]
''')
POLICY = '[[rules]]\nname = "local"\naction = "allow"\nip = "127.0.0.1"\npath = "/ok"\n'
GiB = 1 << 30
EVIL_MARKER = Path("/tmp") / f"memex-cluster-evil-{os.getpid()}"
NODE = {"num_cpus": 2, "memory": 2 * GiB}  # each worker node: two slabs of 1 GiB
METRICS_KEY = "metrics-key-" + "m" * 20


class ClusterRig:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.cluster = loopback_cluster({})
        self.nodes = [self.cluster.add_node(**NODE, **LOOPBACK_NODE) for _ in range(2)]
        self.cluster.wait_for_nodes()
        self.keys: dict[str, str] = {}
        self.tenants: dict[str, str] = {}
        self.fronts: list[Served] = []

    def config(self, name: str, tenants: dict[str, str], keys: dict[str, str]) -> Path:
        path = self.folder / name / "serve.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / "ops_tools.py").write_text(OPS)  # each front's own copy (its machine's)
        (path.parent / "policy.toml").write_text(POLICY)
        path.write_text(
            "[server]\nport = 0\nwarm_timeout = 20\n"
            f'metrics_keys = ["{hash_key(METRICS_KEY)}"]\n'
            f'[cluster]\naddress = "{self.cluster.address}"\n'
            f'storage = "{self.folder / "storage"}"\nslab_memory = {GiB}\nslab_cpus = 1\n'
            "save_interval = 0\nplace_timeout = 30\n"
            + "".join(tenant_table(n, keys[n], extra) for n, extra in tenants.items()))
        return path

    def close(self) -> None:
        for f in self.fronts:
            f.stop()
        self.cluster.shutdown()


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterRig]:
    wheels = tmp_path_factory.mktemp("wheels")  # guest packages, from an index on 127.0.0.1
    build_wheel(wheels, "memexclu-dep", "1.0", {"memexclu_dep.py": "WORD = 'from a wheel'\n"})
    hostile_wheel(wheels, "memexclu-evil", EVIL_MARKER)  # its dependency: a source tree by path
    index = PackageIndex(wheels)
    mp = pytest.MonkeyPatch()
    mp.setenv("PIP_INDEX_URL", index.url)  # the fronts' pip (the slabs find the pinned set)
    rig = ClusterRig(tmp_path_factory.mktemp("cluster"))
    keys = {"a": "key-a-" + "x" * 20, "small": "key-small-" + "y" * 20,
            "one": "key-one-" + "w" * 20, "gone": "key-gone-" + "z" * 20,
            "ops": "key-ops-" + "v" * 20, "pkg": "key-pkg-" + "u" * 20,
            "two": "key-two-" + "t" * 20, "rated": "key-rated-" + "r" * 20,
            "lots": "key-lots-" + "l" * 20, "pair": "key-pair-" + "p" * 20,
            "capped": "key-capped-" + "c" * 20}
    tenants = {"a": "max_sessions = 50\n[tenants.a.ceiling]\nmemory = 536870912\n",
               "small": "max_sessions = 3\n[tenants.small.ceiling]\nmemory = 268435456\n",
               "one": "max_running = 1\n[tenants.one.ceiling]\nmemory = 268435456\n",
               "ops": 'tools = ["ops_tools.py:TOOLS"]\negress = "policy.toml"\n'
                      "[tenants.ops.ceiling]\nmemory = 268435456\n",
               "pkg": 'packages = ["memexclu-dep", "memexclu-evil", "memexevil"]\n'
                      '[tenants.pkg.ceiling]\nmemory = 268435456\n',
               "two": "max_sessions = 2\n[tenants.two.ceiling]\nmemory = 268435456\n",
               "gone": "max_sessions = 5\n[tenants.gone.ceiling]\nmemory = 268435456\n",
               "rated": "turns_per_second = 2\n[tenants.rated.ceiling]\n"
                        "memory = 268435456\n",
               "lots": "turns_per_second = 1000\n[tenants.lots.ceiling]\n"
                       "memory = 268435456\n",
               "pair": "max_running = 2\n[tenants.pair.ceiling]\nmemory = 268435456\n",
               "capped": "max_running = 1\nturns_per_second = 100\n"
                         "[tenants.capped.ceiling]\nmemory = 268435456\n"}
    rig.keys, rig.tenants = keys, tenants
    try:
        for name in ("front-a", "front-b"):
            rig.fronts.append(launch(rig.config(name, tenants, keys), keys))
        yield rig
    finally:
        rig.close()
        index.close()
        mp.undo()


def backend(front: Served, key: str) -> RemoteBackend:
    return RemoteBackend(url=front.url, api_key=key)


def test_a_session_made_through_one_front_is_used_through_another(rig: ClusterRig) -> None:
    a, b = rig.fronts
    with backend(a, rig.keys["a"]) as ba, backend(b, rig.keys["a"]) as bb:
        sb = ba.open()
        assert sb.run("x = 41").ok
        other = bb.attach(sb.id)
        r = other.run("x + 1")
        assert r.value == "42", r
        assert sb.run("x = x + 100; x").value == "141"  # the same session, either way
        assert other.run("x").value == "141"
        sb.write_file("/tmp/in.txt", b"through a")  # files too
        assert other.read_file("/tmp/in.txt") == b"through a"
        assert [f.name for f in other.list_files("/tmp")] == ["in.txt"]
        sb.close()
        time.sleep(0.1)
        with pytest.raises(Exception, match="no session"):
            bb.attach(sb.id)


def cluster_stats(front: Served, key: str) -> dict[str, Any]:
    """The cluster's slabs and nodes from /metrics (what the control actor reports)."""
    text = get(front, "/metrics", key).text
    slabs: dict[str, dict[str, float]] = {}
    for node, slab, what, value in re.findall(
            r'memex_cluster_slab\{node="([^"]+)",slab="([^"]+)",what="([^"]+)"\} (\S+)', text):
        slabs.setdefault(slab, {"node": node})[what] = float(value)  # type: ignore[assignment]
    nodes = dict(re.findall(r'memex_cluster_nodes\{state="([^"]+)"\} (\S+)', text))
    return {"slabs": slabs, "nodes": {k: float(v) for k, v in nodes.items()}}


def metric_lines(front: Served, prefix: str) -> list[str]:
    """The lines of the front's /metrics that start with ``prefix``."""
    return [ln for ln in get(front, "/metrics", METRICS_KEY).text.splitlines()
            if ln.startswith(prefix)]


def ask_control(rig: ClusterRig, code: str) -> list[str]:
    """The words ``code`` prints, run in a Ray driver of its own with ``ray`` imported and the
    control actor as ``control`` (asked through Ray as a front does; this process may be a
    driver of another cluster already)."""
    # what ``code`` prints goes to a file of its own: the driver's stdout also gets what Ray
    # says to every driver (a "(raylet) The node ... has been marked dead" after an earlier
    # test killed a node)
    head = (DRIVER + "import builtins, functools\n"
            "print = functools.partial(builtins.print, file=open(sys.argv[3], 'w'), "
            "flush=True)\n"
            "from memex.cluster.internal import CONTROL_NAME\n"
            "control = ray.get_actor(CONTROL_NAME)\n")
    with tempfile.TemporaryDirectory() as tmp:
        said = Path(tmp) / "said"
        subprocess.run([sys.executable, "-c", head + textwrap.dedent(code),
                        rig.cluster.address, "memex", str(said)],
                       capture_output=True, text=True, timeout=120, check=True)
        return said.read_text().split()


def get(front: Served, path: str, key: str) -> Any:
    import urllib.request

    req = urllib.request.Request(front.url + path, headers={"Authorization": f"Bearer {key}"})

    class Answer:
        def __init__(self, status: int, text: str) -> None:
            self.status, self.text = status, text

    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return Answer(r.status, r.read().decode())
    except urllib.error.HTTPError as e:
        return Answer(e.code, e.read().decode())


def test_sessions_spread_over_nodes_and_metrics_show_the_cluster(rig: ClusterRig) -> None:
    """Four sessions of 512 MiB fill two slabs of 1 GiB, which Ray places on different
    nodes; /metrics (any front) reports the slabs and the live nodes."""
    a, b = rig.fronts
    with backend(a, rig.keys["a"]) as ba, backend(b, rig.keys["a"]) as bb:
        made = [(ba if i % 2 else bb).open(limits=Limits(memory=512 << 20, timeout=20))
                for i in range(4)]
        for i, sb in enumerate(made):
            assert sb.run(f"n = {i}").ok
        stats = cluster_stats(a, METRICS_KEY)
        busy = {s["node"] for s in stats["slabs"].values() if s["sessions"] > 0}
        assert len(busy) == 2, stats
        assert all(s["used"] <= s["capacity"] for s in stats["slabs"].values()), stats
        assert stats["nodes"]["alive"] == 3, stats  # the head and two workers
        assert cluster_stats(b, METRICS_KEY)["slabs"].keys() == stats["slabs"].keys()
        for sb in made:
            sb.close()


def test_a_tenant_quota_holds_across_fronts_under_racing_creates(rig: ClusterRig) -> None:
    """Eight creates race through both fronts for a tenant of max_sessions 3: three are
    made, five refused with 429, and the count is the cluster's, not a front's."""
    fronts = [backend(f, rig.keys["small"]) for f in rig.fronts]
    try:
        def create(i: int) -> Any:
            try:
                return fronts[i % 2].open(limits=Limits(memory=128 << 20, timeout=20))
            except ServiceError as exc:
                return exc

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            got = list(pool.map(create, range(8)))
        made = [g for g in got if not isinstance(g, Exception)]
        refused = [g for g in got if isinstance(g, Exception)]
        assert len(made) == 3, got
        assert all(getattr(e, "status", None) == 429 for e in refused), refused
        made[0].close()
        again = fronts[1].open(limits=Limits(memory=128 << 20, timeout=20))  # room again
        for sb in [*made[1:], again]:
            sb.close()
    finally:
        for f in fronts:
            f.close()


def test_a_tenant_runs_max_running_turns_across_the_cluster(rig: ClusterRig) -> None:
    """Two turns of a tenant of max_running 1, sent at once through two fronts to two
    sessions (in different slabs or not), run one after the other; the same turns of a
    tenant without the bound overlap (the positive control)."""
    def spans(tenant: str) -> list[tuple[float, float]]:
        fronts = [backend(f, rig.keys[tenant]) for f in rig.fronts]
        sbs = [f.open(limits=Limits(memory=128 << 20, timeout=20)) for f in fronts]
        code = "import time\nt0 = time.time(); time.sleep(1.0); (t0, time.time())"
        try:
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                got = list(pool.map(lambda sb: sb.run(code), sbs))
            return [ast.literal_eval(str(r.value)) for r in got]
        finally:
            for sb in sbs:
                sb.close()
            for f in fronts:
                f.close()

    (a0, a1), (b0, b1) = sorted(spans("one"))
    assert b0 >= a1 - 0.05, ((a0, a1), (b0, b1))  # one after the other
    (c0, c1), (d0, d1) = sorted(spans("a"))
    assert d0 < c1, ((c0, c1), (d0, d1))  # at once


def control_calls(front: Served, kind: str) -> int:
    """How many calls of ``kind`` the control actor answered since it started (/metrics)."""
    [line] = metric_lines(front, f'memex_cluster_control_calls{{kind="{kind}"}}')
    return int(float(line.split()[-1]))


def test_a_tenants_rate_holds_across_fronts_with_tokens_taken_in_batches(
        rig: ClusterRig) -> None:
    """Turns of a tenant with a rate (and no ``max_running``) take tokens from the control
    actor's one bucket in batches that each front spends itself. A tenant of 2 turns a
    second (burst 2) runs turns as fast as it can through both fronts at once until each
    has been answered 429 three times: the turns that ran stay within its burst plus its
    rate times the seconds, and the burst itself ran (the positive control). A tenant well
    within its rate (1,000 a second) runs 48 turns, four sessions at once on each front:
    every one runs, and the control actor was asked for tokens fewer times than turns ran
    (before, once a turn; how much fewer depends on how many turns a front runs within a
    batch's lease, so on the machine's speed: 18 and 28 asks in two runs here;
    tests/cluster/test_control_leases.py counts them exactly)."""
    def hammer(sb: Any) -> tuple[int, int]:
        ran = refused = 0
        while refused < 3:
            try:
                assert sb.run("1").ok
                ran += 1
            except ServiceError as exc:
                assert exc.status == 429, exc
                refused += 1
            assert ran + refused < 1_000, "never refused"
        return ran, refused

    def sessions(tenant: str, each: int) -> tuple[list[RemoteBackend], list[Any]]:
        fronts = [backend(f, rig.keys[tenant]) for f in rig.fronts]
        return fronts, [f.open(limits=Limits(memory=64 << 20, timeout=20))
                        for _ in range(each) for f in fronts]

    fronts, sbs = sessions("rated", 1)
    try:
        began = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(len(sbs)) as pool:
            got = list(pool.map(hammer, sbs))
        took = time.monotonic() - began
        ran = sum(g[0] for g in got)
        print(f"at 2 a second: {ran} turns ran in {took:.2f}s, each front refused 3 times")
        assert 2 <= ran <= 2 + 2 * took, (ran, took)
    finally:
        for sb in sbs:
            sb.close()
        for f in fronts:
            f.close()

    fronts, sbs = sessions("lots", 4)
    try:
        asked = control_calls(rig.fronts[0], "token_batches")
        with concurrent.futures.ThreadPoolExecutor(len(sbs)) as pool:
            assert all(pool.map(lambda sb: all(sb.run("1").ok for _ in range(6)), sbs))
        asked = control_calls(rig.fronts[0], "token_batches") - asked
        print(f"within the rate: 48 turns, the control actor asked for tokens {asked} times")
        assert 0 < asked < 48, asked
    finally:
        for sb in sbs:
            sb.close()
        for f in fronts:
            f.close()


def test_a_bounded_tenants_fronts_keep_their_running_slots(rig: ClusterRig) -> None:
    """A tenant of ``max_running = 2`` runs 16 turns through one front, four sessions at
    once (the front runs two at once: its fair share of its own two cores): the front takes
    a slot from the control actor only while it holds fewer than its turns at once, then
    keeps them, so the actor was asked for slots far fewer times than turns ran (before,
    twice a turn: to begin it and to end it). Then two turns through that front hold both
    slots while a turn through the other front waits for one: it runs once one of them ends
    (the first front's poll said the tenant is wanted, so its slot goes back as its turn
    ends), never while both run (the bound holds across the fronts), and it is not
    refused."""
    a, b = rig.fronts
    key = rig.keys["pair"]
    code = "import time\nt0 = time.time(); time.sleep(1.5); (t0, time.time())"
    with backend(a, key) as fa, backend(b, key) as fb:
        sbs = [fa.open(limits=Limits(memory=64 << 20, timeout=20)) for _ in range(4)]
        other = fb.open(limits=Limits(memory=64 << 20, timeout=20))
        asked = control_calls(a, "slot_batches")
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            assert all(pool.map(lambda sb: all(sb.run("1").ok for _ in range(4)), sbs))
        asked = control_calls(a, "slot_batches") - asked
        print(f"16 turns of a max_running = 2 tenant: the control actor asked for slots "
              f"{asked} times")
        assert 0 < asked < 16, asked  # (a turn a slot, as before: 16)
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            held = [pool.submit(sb.run, code) for sb in sbs[:2]]
            time.sleep(0.5)  # the two run through front a
            waiting = pool.submit(other.run, code)
            spans = [ast.literal_eval(str(f.result().value)) for f in held]
            w0, _ = ast.literal_eval(str(waiting.result().value))
        first_end = min(end for _, end in spans)
        print(f"the turn through front b began {w0 - first_end:+.3f}s after the first of "
              "the two ended")
        assert w0 >= first_end - 0.05, (w0, spans)  # never a third at once
        for sb in [*sbs, other]:
            sb.close()


def test_a_turn_refused_for_want_of_a_slot_spends_none_of_the_rate(rig: ClusterRig) -> None:
    """A tenant of ``max_running = 1`` and a rate: a long turn through front a holds its
    slot while a turn through front b waits for it and is refused (429, its timeout); the
    refused turn took none of the tenant's rate tokens (front b never asked the control
    actor for a batch: a turn takes its slot before its token). The control: the long turn
    through front a did ask for one."""
    a, b = rig.fronts
    key = rig.keys["capped"]
    with backend(a, key) as fa, backend(b, key) as fb:
        holder = fa.open(limits=Limits(memory=64 << 20, timeout=20))
        waiter = fb.open(limits=Limits(memory=64 << 20, timeout=1))
        asked = control_calls(a, "token_batches")
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            long = pool.submit(holder.run, "import time; time.sleep(3)")
            time.sleep(0.5)  # it runs, holding the one slot and a token
            took = control_calls(a, "token_batches") - asked
            with pytest.raises(ServiceError) as waited:
                waiter.run("1")
            assert waited.value.status == 429, waited.value
            refused_took = control_calls(a, "token_batches") - asked - took
            assert long.result().ok
        assert took == 1, took  # the control: the turn that ran asked for its batch
        assert refused_took == 0, refused_took
        holder.close()
        waiter.close()


def test_turns_of_a_bounded_tenant_run_on_while_the_control_actor_is_frozen(
        rig: ClusterRig) -> None:
    """The control actor's process is stopped (SIGSTOP) for 2 s, within the slabs' lease:
    turns of a ``max_running = 2`` tenant through a front that holds its slots run on at
    their pace meanwhile (none asks the actor), while a request that needs the actor (the
    tenant's listing: the positive control that it was away) is answered only after it is
    let go (SIGCONT)."""
    a = rig.fronts[0]
    key = rig.keys["pair"]
    [pid] = ask_control(rig, "print(ray.get(control.stats.remote())['pid'])")
    with backend(a, key) as fa:
        sb = fa.open(limits=Limits(memory=64 << 20, timeout=20))
        assert sb.run("n = 0").ok  # the front takes a slot, and keeps it while turns run
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            os.kill(int(pid), signal.SIGSTOP)
            try:
                listing = pool.submit(get, a, "/v1/sessions", key)
                ran, until = 0, time.monotonic() + 2.0
                while time.monotonic() < until:
                    assert sb.run("n += 1").ok
                    ran += 1
                answered_while_frozen = listing.done()
            finally:
                os.kill(int(pid), signal.SIGCONT)
            listed = listing.result(timeout=60)
        print(f"{ran} turns ran in the 2 s the control actor was stopped")
        assert not answered_while_frozen and listed.status == 200, listed.status
        assert ran >= 2 and sb.run("n").value == str(ran)
        sb.close()


def test_a_front_killed_mid_turn_gives_back_its_turn_and_its_sessions_lifetime(
        rig: ClusterRig) -> None:
    """A third front runs a long turn of the ``max_running = 1`` tenant and is killed -9
    mid-turn: within its lease (FRONT_LEASE, 5 s) the control actor takes the turn back, so
    the tenant's next turn through another front runs (it waited, it was not refused), and
    the session whose turn ran through the dead front ends by its lifetime. The control:
    while the third front lives, that next turn is refused with 429."""
    doomed = launch(rig.config("front-c", rig.tenants, rig.keys), rig.keys)
    a = rig.fronts[0]
    key = rig.keys["one"]
    bc = backend(doomed, key)  # not closed: its front is killed under it
    long = bc.open(limits=Limits(memory=128 << 20, timeout=60, lifetime=8))

    def run_long() -> None:
        with contextlib.suppress(Exception):  # its front dies under it
            long.run("import time; time.sleep(50)")

    threading.Thread(target=run_long, daemon=True).start()
    with backend(a, key) as ba:
        short = ba.open(limits=Limits(memory=128 << 20, timeout=1))
        deadline, refused = time.monotonic() + 30, None
        while refused is None and time.monotonic() < deadline:
            try:
                short.run("1")  # runs until the long turn is admitted
            except ServiceError as exc:
                refused = exc
        assert refused is not None and refused.status == 429, refused  # the control
        doomed.stop(signal.SIGKILL)
        patient = ba.open(limits=Limits(memory=128 << 20, timeout=30))
        began = time.monotonic()
        r = patient.run("'ran'")  # waits at the control actor until the turn comes back
        waited = time.monotonic() - began
        assert r.value == "'ran'", r
        print(f"the next turn ran {waited:.1f}s after the front was killed")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and \
                get(a, f"/v1/sessions/{long.id}", key).status != 404:
            time.sleep(0.2)
        assert get(a, f"/v1/sessions/{long.id}", key).status == 404  # its lifetime ended
        for sb in (short, patient):
            sb.close()


def test_a_key_rotated_out_is_refused_on_every_front(rig: ClusterRig) -> None:
    """The tenant ``gone`` is removed from one front's serve.toml only: within seconds
    both fronts refuse its key (the cluster serves the newest config any front published)."""
    key = rig.keys["gone"]
    for f in rig.fronts:
        assert get(f, "/v1/tools", key).status == 200
    path = rig.fronts[0].config
    text = path.read_text()
    start = text.index("[tenants.gone]")
    path.write_text(text[:start])  # ``gone`` is the last table
    deadline = time.monotonic() + 15
    status = [200, 200]
    while time.monotonic() < deadline and status != [401, 401]:
        status = [get(f, "/v1/tools", key).status for f in rig.fronts]
        time.sleep(0.2)
    assert status == [401, 401]
    assert get(rig.fronts[1], "/v1/tools", rig.keys["a"]).status == 200  # the others stay


def test_a_fork_of_a_session_in_a_full_slab_opens_elsewhere(rig: ClusterRig) -> None:
    """Two 512 MiB sessions fill a 1 GiB slab; a fork of one has no room there, so the
    parent is saved and the child opened in another slab from that save, with its state
    and files; the parent goes on unchanged."""
    a, b = rig.fronts
    with backend(a, rig.keys["a"]) as ba, backend(b, rig.keys["a"]) as bb:
        lim = Limits(memory=512 << 20, timeout=20)
        first = ba.open(limits=lim)
        parent = ba.open(limits=lim)
        for sb in (first, parent):
            sb.run("1")
        stats = cluster_stats(a, METRICS_KEY)
        assert any(s["sessions"] == 2 and s["used"] == s["capacity"]
                   for s in stats["slabs"].values()), stats  # the fullest slab took both
        parent.run("kept = 'parent state'\nopen('/tmp/p.txt', 'w').write('p')")
        child = parent.fork()
        other = bb.attach(child.id)
        assert other.run("kept, open('/tmp/p.txt').read()").value == "('parent state', 'p')"
        other.run("kept = 'child'")
        assert parent.run("kept").value == "'parent state'"
        for sb in (child, parent, first):
            sb.close()


def test_sessions_end_by_their_ttl_across_the_cluster(rig: ClusterRig) -> None:
    """A session whose lifetime or idle timeout passed is ended by the control actor within
    about a second, its quota place freed on every front; one in use is left to finish
    (the positive control: a session without a TTL stays and runs)."""
    a, b = rig.fronts
    with backend(a, rig.keys["small"]) as ba, backend(b, rig.keys["small"]) as bb:
        short = ba.open(limits=Limits(memory=128 << 20, timeout=20, lifetime=2))
        kept = ba.open(limits=Limits(memory=128 << 20, timeout=20))
        # its idle clock runs from its slab's open: beside a CPU hog the open's answer and
        # the turn took over 2 s to come and it was ended first, rightly (checked); then
        # another is opened with twice the idle timeout, its turn past that timeout
        for idle_s in (2, 4, 8, 16):
            began = time.monotonic()
            idle = bb.open(limits=Limits(memory=128 << 20, timeout=40, idle_timeout=idle_s))
            try:
                busy = idle.run(f"import time; time.sleep({idle_s + 1.5}); 'done'")
                break
            except SandboxClosed as exc:
                assert "idle" in str(exc) and time.monotonic() - began >= idle_s, exc
        else:
            pytest.fail("sessions of a 2-16 s idle timeout each ended before their turn came")
        assert busy.value == "'done'", busy  # a running turn is not idle: left to finish
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and {
                get(f, f"/v1/sessions/{sid}", rig.keys["small"]).status
                for f in (a, b) for sid in (short.id, idle.id)} != {404}:
            time.sleep(0.2)
        for f in (a, b):
            for sid in (short.id, idle.id):
                assert get(f, f"/v1/sessions/{sid}", rig.keys["small"]).status == 404
        assert kept.run("1 + 1").value == "2"
        more = [bb.open(limits=Limits(memory=128 << 20, timeout=20)) for _ in range(2)]
        for sb in [kept, *more]:  # three live again: the ended two freed their places
            sb.close()


def test_checkpoints_and_forks_work_from_any_front(rig: ClusterRig) -> None:
    """A checkpoint taken through one front restores through the other; a fork made
    through one is used through the other."""
    a, b = rig.fronts
    with backend(a, rig.keys["a"]) as ba, backend(b, rig.keys["a"]) as bb:
        sb = ba.open(limits=Limits(memory=256 << 20, timeout=20))
        sb.run("v = 'before'")
        cp = sb.checkpoint()
        sb.run("v = 'after'")
        other = bb.attach(sb.id)
        other.restore(cp)
        assert sb.run("v").value == "'before'"
        child = sb.fork()
        assert bb.attach(child.id).run("v").value == "'before'"
        child.close()
        sb.close()


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.path)))
        self.end_headers()
        self.wfile.write(self.path.encode())

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def target() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.01},
                     daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def audit_of(front: Served) -> list[dict[str, Any]]:
    out = []
    for line in front.log.read_text().splitlines():
        start = line.find("{")
        if start >= 0:
            with contextlib.suppress(ValueError):
                out.append(json.loads(line[start:]))
    return out


FETCH = ("import urllib.request, urllib.error\n"
         "def get(u):\n    try:\n        return urllib.request.urlopen(u).read().decode()\n"
         "    except urllib.error.URLError as e:\n        return type(e).__name__\n")


def test_operator_tools_and_egress_are_served_in_the_slab(rig: ClusterRig, target: str
                                                          ) -> None:
    """A tenant's operator tools run, and its egress policy decides, in the slab that holds
    the session (on its node), built there from what the front published (the slab's node
    has none of the front's files); beside the client's own tools, which the client cannot
    use to stand in for the operator's; a fork shares them; every front describes them and
    other tenants see none."""
    a, b = rig.fronts
    door = Door()
    door.register("twice", lambda x: 2 * x)

    def impostor() -> list[str]:
        """A client's impostor of the operator's tool."""
        return ["client"]

    with backend(a, rig.keys["ops"]) as ba, backend(b, rig.keys["ops"]) as bb:
        sb = ba.open(limits=Limits(memory=256 << 20, timeout=20), door=door)
        assert sb.turns == 0  # installing the operator's module is not one of its turns
        actor, pid, folder = ast.literal_eval(sb.run("where()").value or "")
        assert actor.startswith("memex-slab-") and folder.startswith("memex-kit-ops-")
        assert int(pid) not in {a.proc.pid, b.proc.pid}
        with ToolHost([Tool.from_function(impostor, name="where")]).attach(sb) as host:
            r = sb.run("from memex_guest import call\nwhere()[0], call('twice', 4)")
            assert r.value == f"({actor!r}, 8)", r
            assert host.calls == []  # the shared name went to the slab, never here
        other = bb.attach(sb.id)  # through the other front: the same door services
        other.run(FETCH)
        r = other.run(f"get('{target}/ok'), get('{target}/secret')")
        assert r.value == "('/ok', 'EgressDenied')", r
        child = sb.fork()
        assert ast.literal_eval(child.run("where()").value or "")[0].startswith("memex-slab-")
        assert child.run(f"get('{target}/ok')").value == "'/ok'"
        child.close()
        sb.close()
    # their audit events reach the log of the front each turn went through
    tools = [e for e in audit_of(a) if e.get("event") == "tool" and e.get("tenant") == "ops"]
    assert {e["tool"] for e in tools} == {"where"} and len(tools) >= 2, tools
    egress = [(e["decision"], e["url"].rsplit("/", 1)[1]) for e in audit_of(b)
              if e.get("event") == "egress"]
    assert egress[:2] == [("allow", "ok"), ("deny", "secret")], egress
    for f in rig.fronts:
        listed = json.loads(get(f, "/v1/tools", rig.keys["ops"]).text)["tools"]
        assert [t["definition"]["function"]["name"] for t in listed] == ["where"]
        assert json.loads(get(f, "/v1/tools", rig.keys["a"]).text)["tools"] == []
    with backend(a, rig.keys["a"]) as ba:
        sb = ba.open(limits=Limits(memory=256 << 20, timeout=20))
        sb.run(FETCH)
        assert sb.run("'where' in globals()").value == "False"
        assert sb.run(f"get('{target}/ok')").value == "'EgressDenied'"  # no policy: none
        sb.close()


def memex(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memex", *args], capture_output=True,
                          text=True, timeout=180)


def test_guest_packages_are_resolved_by_the_front_and_opened_in_the_slab(rig: ClusterRig
                                                                          ) -> None:
    """A create's packages are resolved by the front (within the tenant's grant) and the
    slab opens its session with the same wheels, pinned; a tenant without the grant is
    refused before anything is placed."""
    a, b = rig.fronts
    with backend(a, rig.keys["pkg"]) as ba, backend(b, rig.keys["pkg"]) as bb:
        sb = ba.open(limits=Limits(memory=256 << 20, timeout=20), packages=["memexclu-dep"])
        assert sb.run("import memexclu_dep; memexclu_dep.WORD").value == "'from a wheel'"
        assert bb.attach(sb.id).run("memexclu_dep.WORD").value == "'from a wheel'"
        sb.close()
    with backend(a, rig.keys["a"]) as other, pytest.raises(NotGranted):
        other.open(limits=Limits(memory=256 << 20, timeout=20), packages=["memexclu-dep"])
    with backend(a, rig.keys["pkg"]) as ba, pytest.raises(PackageError) as err:
        ba.open(limits=Limits(memory=256 << 20, timeout=20), packages=["memexclu-evil"])
    assert "memexclu-evil 1.0 depends on memexevil @ file://" in str(err.value)
    assert not EVIL_MARKER.exists()  # granted or not, nothing of it was fetched or built


def test_check_reads_a_cluster_config_and_its_storage(rig: ClusterRig) -> None:
    out = memex("serve", "--check", "--config", str(rig.fronts[0].config))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "a Ray cluster" in out.stdout and "storage" in out.stdout and "reachable" in \
        out.stdout, out.stdout
    bad = rig.fronts[0].config.with_name("bad.toml")  # beside the files it names
    bad.write_text(rig.fronts[0].config.read_text().replace(
        f'storage = "{rig.folder / "storage"}"', 'storage = "nosuchproto://x"'))
    out = memex("serve", "--check", "--config", str(bad))
    assert out.returncode != 0 and "storage" in out.stdout + out.stderr, out


def test_a_drained_node_hands_its_sessions_over_seamlessly(rig: ClusterRig) -> None:
    """``memex serve --drain NODE`` moves a live session (its state, its /tmp files, its
    client's tools) to the other node: the client's next turn just works, with no restore
    notice; new slabs avoid the node until ``--undrain``."""
    a, b = rig.fronts
    door = Door()
    door.register("twice", lambda x: 2 * x)
    def slab(s: Any) -> str:  # the slab holding it (the tenant ops's tool says)
        return str(ast.literal_eval(s.run("where()").value or "")[0])

    with backend(a, rig.keys["ops"]) as ba, backend(b, rig.keys["ops"]) as bb:
        sb = ba.open(limits=Limits(memory=256 << 20, timeout=20), door=door)
        sb.run("kept = 21\nopen('/tmp/f', 'w').write('file')")
        node = node_of_slab(a, slab(sb))  # (its slab may hold earlier tests' sessions too)
        out = memex("serve", "--drain", node, "--config", str(a.config))
        moved = re.search(r"(\d+) session\(s\) moved", out.stdout)
        assert out.returncode == 0 and moved and int(moved[1]) >= 1, out.stdout
        other = bb.attach(sb.id)
        r = other.run("from memex_guest import call\ncall('twice', kept), open('/tmp/f').read()")
        assert r.value == "(42, 'file')", r
        assert other.restored is None and sb.restored is None  # nothing lost, nothing said
        assert node_of_slab(a, slab(other)) != node
        fresh = bb.open(limits=Limits(memory=256 << 20, timeout=20))
        fresh.run("1")
        stats = cluster_stats(a, METRICS_KEY)
        assert all(s["node"] != node or s["sessions"] == 0 for s in stats["slabs"].values())
        fresh.close()
        sb.close()
        out = memex("serve", "--undrain", node, "--config", str(a.config))
        assert out.returncode == 0, out


def test_a_slab_answers_only_a_front_that_knows_its_secret(rig: ClusterRig) -> None:
    """A slab's direct path closes a connection that does not open with its secret before
    reading anything else (a call sent without it does not run); with the secret (the
    positive control), the same call runs."""
    from memex.backends.internal import Channel, ChannelClosed
    from memex.cluster.internal import (
        Answer,
        Call,
        Done,
        Hello,
        Started,
        Welcome,
        from_wire,
        to_wire,
    )

    with backend(rig.fronts[0], rig.keys["a"]) as ba:
        sb = ba.open(limits=Limits(memory=256 << 20, timeout=20))
        host, port, hexed = ask_control(rig, f"""
            e = ray.get(control.lookup.remote("a", {sb.id!r}))
            print(e["endpoint"][0], e["endpoint"][1], e["secret"].hex())
        """)[-3:]
        endpoint, secret = (host, int(port)), bytes.fromhex(hexed)
        call = to_wire(Call(1, "run", [sb.id, "x = 'ran'", None, None]))

        def exchange(first: list[Any]) -> list[Any]:
            # 60 s bounds a hang: each exchange ends on the slab's answer or its close (a
            # 10 s bound timed out beside a CPU hog, the slab's guests running at nice 15)
            ch = Channel(socket.create_connection(endpoint, timeout=60))
            try:
                ch.send(first)
                ch.send(call)
                return [ch.recv(60)[0] for _ in range(3)]
            finally:
                ch.close()

        for first in (to_wire(Hello(b"\0" * 32)), ["hello", secret[:-1]], call):
            with pytest.raises(ChannelClosed):
                exchange(first)
        assert sb.run("'x' in globals()").value == "False"  # nothing ran
        got = [from_wire(m) for m in exchange(to_wire(Hello(secret)))]
        assert got[:2] == [Welcome(), Started(1)], got
        assert isinstance(got[2], Answer) and isinstance(got[2].outcome, Done), got
        assert sb.run("x").value == "'ran'"
        sb.close()


def test_a_front_s_word_does_not_move_a_session_whose_slab_answers(rig: ClusterRig) -> None:
    """A front that says a slab is lost (as one that could not reach it, or was refused by a
    slab whose lease ran out) is checked: the slab answers the control actor, so the session
    stays where it is, with its state, and is not opened a second time from its save on
    another slab (two slabs would serve it). The positive control, a node that really dies,
    is test_a_killed_node_s_sessions_resume_elsewhere_flagged."""
    with backend(rig.fronts[0], rig.keys["ops"]) as ba:
        sb = ba.open(limits=Limits(memory=256 << 20, timeout=20))
        assert sb.run("kept = 'here'").ok
        before = ast.literal_eval(sb.run("where()").value or "")[0]
        moved = "memex_cluster_control_calls{kind=\"recoveries\"}"
        recoveries = metric_lines(rig.fronts[0], moved)
        said, moving, after = ask_control(rig, f"""
            import time
            e = ray.get(control.recover.remote({sb.id!r}, {before!r}, 2))
            time.sleep(2.0)  # a recovery, were one started, runs in the background
            print(e["slab"], e["moving"], ray.get(control.lookup.remote("ops", {sb.id!r}))["slab"])
        """)[-3:]
        assert said == before and moving == "False" and after == before, (said, moving, after)
        assert sb.run("kept, where()[0]").value == repr(("here", before))
        assert sb.restored is None  # nothing was lost, nothing is said
        assert metric_lines(rig.fronts[0], moved) == recoveries
        sb.close()


def lose_machine(rig: ClusterRig, node: Any) -> None:
    """The node as a machine that dies: its Ray processes and the workers they started
    (which would otherwise outlive their raylet for a while, still answering)."""
    import psutil

    raylet = node.all_processes["raylet"][0].process.pid
    workers = psutil.Process(raylet).children(recursive=True)
    rig.cluster.remove_node(node, allow_graceful=False)
    for w in workers:
        with contextlib.suppress(psutil.NoSuchProcess):
            w.kill()


def node_of_slab(front: Served, slab: str) -> str:
    """The node of the slab named ``slab`` (an operator tool's ``where()`` says which holds
    a session)."""
    return str(cluster_stats(front, METRICS_KEY)["slabs"][slab]["node"])


def replace_node(rig: ClusterRig, node_id: str) -> None:
    """The worker node ``node_id`` dies as a machine does; a fresh one joins (room for its
    sessions elsewhere)."""
    victim = next(n for n in rig.nodes if n.node_id == node_id)
    lose_machine(rig, victim)
    rig.nodes.remove(victim)
    rig.nodes.append(rig.cluster.add_node(**NODE, **LOOPBACK_NODE))


def test_a_killed_node_s_sessions_resume_elsewhere_flagged(rig: ClusterRig,
                                                          caplog: pytest.LogCaptureFixture
                                                          ) -> None:
    """A worker node dies with a session on it: the session comes back on the other node
    from its last save, its next answer says what was restored, and the client's tools
    still answer its guest (the door follows the session), as do the operator's (now run
    in the slab that holds it)."""
    a, b = rig.fronts
    door = Door()
    door.register("twice", lambda x: 2 * x)
    with backend(a, rig.keys["ops"]) as ba, backend(b, rig.keys["ops"]) as bb:
        sb = ba.open(limits=Limits(memory=256 << 20, timeout=20), door=door)
        assert sb.run("from memex_guest import call\nkept = call('twice', 21)").ok
        before = ast.literal_eval(sb.run("where()").value or "")[0]
        node = node_of_slab(a, before)  # its own slab (others may hold earlier tests')
        replace_node(rig, node)
        other = bb.attach(sb.id)
        # until its lease runs out the dying node's slab may still answer (its process can
        # outlive the node for a moment); then the session moves, and the first answer after
        # says what its save held and how many answered turns that lost
        seen, deadline = 2, time.monotonic() + 60
        while other.restored is None and time.monotonic() < deadline:
            r = other.run("kept")
            assert r.value == "42" or (r.limit == "lost" and r.rolled_back), r
            if other.restored is None:
                seen += 1  # answered by the old slab, before the move
            time.sleep(0.05)
        notice = other.restored
        assert notice is not None and notice["files_kept"], (notice, seen, r)
        assert f"session {sb.id} was restored" in caplog.text  # said to the client's log,
        assert "/tmp files kept" in caplog.text  # as it was
        assert notice["from_turn"] + notice["lost_turns"] == seen + (0 if r.ok else 1), \
            (notice, seen, r)
        assert other.run("kept").value == "42"  # the state of its last save
        r = sb.run("call('twice', kept)")  # the client's tools follow it
        assert r.value == "84", r
        after = ast.literal_eval(sb.run("where()").value or "")[0]  # the operator's too
        assert after.startswith("memex-slab-") and after != before
        stats = cluster_stats(b, METRICS_KEY)
        assert node not in {s["node"] for s in stats["slabs"].values()}, stats
        sb.close()


def test_a_move_the_door_relay_found_is_said_to_the_next_turn_through_any_front(
        rig: ClusterRig) -> None:
    """Front a holds the client's door, front b runs its turns: the node dies, a's door
    relay finds the session's new slab first, and b's next answer still says what the move
    lost (a relay that took the notice for itself left b's client without it)."""
    a, b = rig.fronts
    door = Door()
    door.register("twice", lambda x: 2 * x)
    with backend(a, rig.keys["ops"]) as ba, backend(b, rig.keys["ops"]) as bb:
        sb = ba.open(limits=Limits(memory=256 << 20, timeout=20), door=door)
        assert sb.run("kept = 7").ok
        other = bb.attach(sb.id)  # b knows the slab that will die
        assert other.run("kept").value == "7"
        node = node_of_slab(a, ast.literal_eval(sb.run("where()").value or "")[0])
        held = sum(x["sessions"] for x in cluster_stats(a, METRICS_KEY)["slabs"].values())
        replace_node(rig, node)
        deadline = time.monotonic() + 60  # a's relay follows the move (b sends nothing)
        while time.monotonic() < deadline and sum(
                x["sessions"] for x in cluster_stats(a, METRICS_KEY)["slabs"].values()
                if x["node"] != node) < held:  # every session open again (others' too)
            time.sleep(0.2)
        if time.monotonic() >= deadline:  # what the cluster held, whole (not a repr cut short)
            pytest.fail(f"not every session was opened again after node {node} died (the "
                        f"slabs held {held} before):\n"
                        + "\n".join(metric_lines(a, "memex_cluster")))
        time.sleep(2.0)  # its relay has found it (it asks every 0.25 s once it moved)
        r = other.run("kept")
        assert r.value == "7", r
        assert other.restored is not None and other.restored["from_turn"] == 3, \
            other.restored
        assert sb.run("kept").value == "7" and sb.restored is None  # said once
        sb.close()


LARGE_STORE = 10_000
"""Saved sessions of other tenants in the store when the control actor is killed: its
restart reads a tenant's records when that tenant asks, never the whole store (the restart
against 100,000 records is a row of bench/control.py)."""


def fill_store(root: Path, n: int, tenants: int = 100) -> None:
    """``n`` saved sessions' records of ``tenants`` tenants no front knows, written as a
    slab writes them at open, with their owners' index entries."""
    from memex.backends.internal import limits_to_wire

    spec = {"limits": limits_to_wire(Limits(memory=64 << 20)), "mounts": [], "preload": []}
    for i in range(n):
        sid, tenant = f"stored-{i}", f"stored-{i % tenants}"
        (root / "sessions" / sid).mkdir(parents=True, mode=0o700)
        (root / "sessions" / sid / "record").write_text(json.dumps(
            {"id": sid, "tenant": tenant, "spec": spec, "turns": 2, "seq": 1, "image": None,
             "files": None, "files_kept": True, "door": False}))
        (root / "owners" / tenant).mkdir(parents=True, exist_ok=True, mode=0o700)
        (root / "owners" / tenant / sid).write_bytes(b"")


def test_a_restarted_control_actor_answers_from_the_live_slabs(rig: ClusterRig) -> None:
    """The control actor is killed (Ray restarts it) with two sessions of a ``max_sessions
    = 2`` tenant open on live slabs and 10,000 other saved sessions in the store. Their
    turns run on through the front that holds them while the actor is away and after it is
    back, every one answered (a turn of a tenant with no running or rate bound never asks
    it), and so do the turns of a ``max_running = 1`` tenant's session through that front
    (its running slot is held by the front, which spends it without asking the actor;
    test_turns_of_a_bounded_tenant_run_on_while_the_control_actor_is_frozen holds the actor
    away for longer than a turn takes);
    whatever needs the actor meanwhile is answered 503, never 500; the restarted
    actor takes each session's entry from the slab that holds it (not moved: no
    ``restored``), so the tenant's bound still holds (a third create is refused, 429), a
    front that never saw a session finds it, and the stored tenants' sessions are theirs
    alone. Last in this module: the actor's restart forgets what only it held."""
    a, b = rig.fronts
    key = rig.keys["two"]
    storage = rig.folder / "storage"
    assert (storage / "owners-indexed").exists()  # the owners' index the fill writes into
    fill_store(storage, LARGE_STORE)
    with backend(a, key) as ba, backend(a, rig.keys["one"]) as b1:
        one = ba.open(limits=Limits(memory=128 << 20, timeout=20))
        two = ba.open(limits=Limits(memory=128 << 20, timeout=20))
        bounded = b1.open(limits=Limits(memory=128 << 20, timeout=20))
        assert one.run("x = 0").ok and two.run("y = 5").ok and bounded.run("z = 0").ok
        stop, bounded_turns = threading.Event(), []

        def keep_busy() -> None:  # its turns one after another: the front keeps its slot
            while not stop.is_set():
                try:
                    r = bounded.run("z += 1; z")
                except Exception as exc:  # a 503 while the actor is away: the failure
                    bounded_turns.append(exc)
                    return
                bounded_turns.append(r.value if r.ok else r)

        busy = threading.Thread(target=keep_busy, daemon=True)
        busy.start()
        assert ask_control(rig, "ray.kill(control, no_restart=False)\nprint('killed')") \
            == ["killed"]
        turns, began = 0, time.monotonic()
        before = len(bounded_turns)
        while True:  # until the restarted actor lists the tenant's sessions again
            r = one.run("x += 1; x")
            turns += 1
            assert r.ok and r.value == str(turns), r
            listed = get(a, "/v1/sessions", key)
            if listed.status == 200:
                break
            assert listed.status == 503, (listed.status, listed.text)  # away: never a 500
            assert time.monotonic() - began < 120, "the control actor did not come back"
        away = len(bounded_turns) - before
        stop.set()
        busy.join(60)
        print(f"the control actor answered again {time.monotonic() - began:.1f}s after "
              f"it was killed; {turns} turns ran meanwhile, and {away} of the max_running "
              "tenant's")
        assert bounded_turns == [str(n) for n in range(1, len(bounded_turns) + 1)], \
            bounded_turns[-3:]  # every one answered, in order (a frozen actor: below)
        assert sorted(s["id"] for s in json.loads(listed.text)["sessions"]) == \
            sorted([one.id, two.id])
        with pytest.raises(ServiceError) as refused:
            ba.open(limits=Limits(memory=128 << 20, timeout=20))
        assert refused.value.status == 429, refused.value
        with backend(b, key) as bb:
            assert bb.attach(two.id).run("y").value == "5"
        assert one.run("x").value == str(turns) and one.restored is None
        one.close()
        ba.open(limits=Limits(memory=128 << 20, timeout=20)).close()  # room again
        two.close()
        bounded.close()
