"""One contract, every backend: the same runtime and host-tool behaviour, with the same
results, errors and limits, whether the sandbox lives in this process, in a worker process,
in a pool or in a Ray actor (``backend`` runs each test once per backend)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import pytest

from memex import (
    ConfigError,
    Door,
    GuestFileError,
    Limits,
    Sandbox,
    SandboxClosed,
    SandboxError,
    TurnResult,
    TurnStatus,
)
from memex.backends import Backend, get_backend
from memex.host_tools import ToolHost
from memex.runtime_wasm import SandboxAPI

OpenSandbox = Callable[..., SandboxAPI[Any]]

# Fields of a TurnResult that depend on the machine, not on the contract.
_VARYING = {"duration", "memory_bytes", "fuel_used"}


def _same(a: TurnResult, b: TurnResult) -> None:
    da = {k: v for k, v in a.to_dict().items() if k not in _VARYING}
    db = {k: v for k, v in b.to_dict().items() if k not in _VARYING}
    assert da == db


# ---- the contract itself ------------------------------------------------------------------------
def test_handle_satisfies_the_protocol(open_sandbox: OpenSandbox, backend: Backend) -> None:
    sb = open_sandbox()
    assert isinstance(sb, SandboxAPI)
    assert isinstance(sb.door, Door)
    assert sb.limits.timeout == 10.0
    assert sb.turns == 0
    assert sb.closed is False
    assert get_backend(backend) is backend


def test_state_persists_across_turns(open_sandbox: OpenSandbox) -> None:
    sb = open_sandbox()
    r = sb.run("x = 21\nprint('set')")
    assert r.status is TurnStatus.OK, r
    assert r.stdout == "set\n"
    r = sb.run("def double(v):\n    return v * 2\ndouble(x)")
    assert r.value == "42"
    assert sb.turns == 2


SCRIPT = [
    "x = 1\nprint('hello')",
    "x + 1",
    "1 / 0",
    "import sys\nsys.stderr.write('warn\\n')\nx",
    "raise SystemExit(3)",
    "[i * i for i in range(5)]",
    "undefined_name",
    "import os\nos._exit(4)",
    "x",
]


def test_results_are_identical_to_in_process(open_sandbox: OpenSandbox) -> None:
    ours = open_sandbox()
    with Sandbox(limits=Limits(timeout=10.0)) as ref:
        for code in SCRIPT:
            _same(ours.run(code), ref.run(code))
    assert ours.turns == len(SCRIPT)


def test_guest_error_is_data(open_sandbox: OpenSandbox) -> None:
    sb = open_sandbox()
    sb.run("keep = 'kept'")
    r = sb.run("def f():\n    raise KeyError('missing')\nf()")
    assert r.status is TurnStatus.ERROR
    assert r.exception is not None
    assert r.exception.type == "KeyError"
    assert "missing" in r.exception.message
    assert "line 2" in r.exception.traceback
    assert sb.run("keep").value == "'kept'"


def test_exit_is_data(open_sandbox: OpenSandbox) -> None:
    sb = open_sandbox()
    r = sb.run("import sys\nsys.exit(7)")
    assert r.status is TurnStatus.EXIT
    assert r.exit_code == 7


# ---- limits -------------------------------------------------------------------------------------
@pytest.mark.slow
def test_deadline_kills_and_rolls_back(open_sandbox: OpenSandbox) -> None:
    sb = open_sandbox(limits=Limits(timeout=1.0))
    sb.run("x = 1")
    r = sb.run("x = 2\nwhile True:\n    pass")
    assert r.status is TurnStatus.KILLED
    assert r.limit == "deadline"
    assert r.rolled_back is True
    assert sb.run("x").value == "1"


def test_per_turn_timeout(open_sandbox: OpenSandbox) -> None:
    sb = open_sandbox()
    r = sb.run("import time\ntime.sleep(3600)", timeout=0.5)
    assert r.status is TurnStatus.KILLED
    assert r.limit == "deadline"


def test_memory_cap_is_memory_error(open_sandbox: OpenSandbox) -> None:
    sb = open_sandbox(limits=Limits(timeout=10, memory=128 << 20))
    sb.run("keep = list(range(10))")
    r = sb.run("b = bytearray(1 << 30)")
    assert r.status is TurnStatus.ERROR
    assert r.exception is not None and r.exception.type == "MemoryError"
    assert r.limit == "memory"
    assert r.memory_bytes <= 128 << 20
    assert sb.run("sum(keep)").value == "45"


def test_output_cap_truncates(open_sandbox: OpenSandbox) -> None:
    sb = open_sandbox(limits=Limits(timeout=10, stdout_bytes=1000))
    r = sb.run("for i in range(1000):\n    print('a' * 50)")
    assert r.status is TurnStatus.OK
    assert r.truncated == ("stdout",)
    assert "truncated" in r.stdout
    assert len(r.stdout) < 1500


def test_fuel_limit(open_sandbox: OpenSandbox) -> None:
    sb = open_sandbox(limits=Limits(timeout=20, fuel=30_000_000))
    ok = sb.run("x = 1")
    assert ok.fuel_used is not None and ok.fuel_used > 0
    r = sb.run("while True:\n    pass")
    assert r.status is TurnStatus.KILLED
    assert r.limit == "fuel"
    assert r.rolled_back is True
    assert sb.run("x").value == "1"


# ---- checkpoints, forks, files ------------------------------------------------------------------
def test_checkpoint_and_restore(open_sandbox: OpenSandbox) -> None:
    sb = open_sandbox()
    sb.run("x = [1]")
    cp = sb.checkpoint()
    sb.run("x.append(2)\ny = 'later'")
    sb.restore(cp)
    assert sb.run("x, 'y' in globals()").value == "([1], False)"
    sb.run("x.append(3)")
    sb.restore(cp)  # a checkpoint can be restored more than once
    assert sb.run("x").value == "[1]"


def test_many_held_checkpoints_each_restore(open_sandbox: OpenSandbox) -> None:
    """Twelve checkpoints held at once: deltas on deltas where the host tracks written pages,
    a chain deeper than one frame's descriptors would carry if it were not folded."""
    sb = open_sandbox()
    held = []
    for i in range(12):
        sb.run(f"log = globals().get('log', []) + [{i}]\nblob{i} = bytes([{i}]) * 50000")
        held.append(sb.checkpoint())
    sb.run("log = 'gone'")
    for i in (11, 0, 7, 3):
        sb.restore(held[i])
        r = sb.run(f"log, len(blob{i}), 'blob{i + 1}' in globals()")
        assert r.value == f"({list(range(i + 1))}, 50000, False)", r


def test_restore_refuses_a_foreign_object(open_sandbox: OpenSandbox) -> None:
    sb = open_sandbox()
    with pytest.raises(ConfigError):
        sb.restore("not a checkpoint")


def test_fork_is_independent(open_sandbox: OpenSandbox) -> None:
    sb = open_sandbox()
    sb.run("x = 1")
    sb.write_file("/tmp/note.txt", b"from parent")
    child = sb.fork()
    try:
        assert child.door is sb.door
        assert child.run("x").value == "1"
        assert child.run("open('/tmp/note.txt').read()").value == "'from parent'"
        child.run("x = 2")
        assert sb.run("x").value == "1"
        assert child.run("x").value == "2"
        cp = child.checkpoint()
        sb.restore(cp)  # a fork's checkpoint fits its parent
        assert sb.run("x").value == "2"
    finally:
        child.close()
    assert sb.run("x").value == "2"


def test_fork_many_makes_independent_children(open_sandbox: OpenSandbox) -> None:
    sb = open_sandbox()
    sb.run("x = [0]")
    sb.write_file("/tmp/note.txt", b"from parent")
    kids = list(sb.fork_many(3))
    try:
        assert len(kids) == 3 and len({id(k) for k in kids}) == 3
        for k, kid in enumerate(kids):
            assert kid.door is sb.door
            assert kid.run(f"x.append({k + 1})\nx").value == f"[0, {k + 1}]"
            kid.write_file("/tmp/note.txt", f"kid {k}".encode())
        for k, kid in enumerate(kids):  # each from its first write on its own
            assert kid.run("x").value == f"[0, {k + 1}]"
            assert kid.read_file("/tmp/note.txt") == f"kid {k}".encode()
        assert sb.run("x").value == "[0]"
        assert sb.read_file("/tmp/note.txt") == b"from parent"
        r = kids[0].run("import os\nos.abort()")  # a trap in one child
        assert r.status is TurnStatus.KILLED, r
        assert kids[0].run("x").value == "[0, 1]" and kids[1].run("x").value == "[0, 2]"
    finally:
        for kid in kids:
            kid.close()
    assert sb.run("x").value == "[0]"
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ConfigError):
            sb.fork_many(bad)  # type: ignore[arg-type]


def test_files_both_ways(open_sandbox: OpenSandbox) -> None:
    sb = open_sandbox()
    sb.write_file("/tmp/in/data.bin", b"\x00\x01payload")
    r = sb.run("d = open('/tmp/in/data.bin', 'rb').read()\n"
               "open('/tmp/out.txt', 'w').write(d[2:].decode())\nlen(d)")
    assert r.value == "9"
    assert sb.read_file("/tmp/out.txt") == b"payload"


@pytest.mark.parametrize("path", ["relative.txt", "/etc/passwd", "/tmp/../etc/passwd"])
def test_file_paths_outside_the_sandbox_are_refused(open_sandbox: OpenSandbox,
                                                    path: str) -> None:
    sb = open_sandbox()
    with pytest.raises(GuestFileError) as ours:
        sb.read_file(path)
    with Sandbox() as ref, pytest.raises(GuestFileError) as theirs:
        ref.read_file(path)
    assert str(ours.value) == str(theirs.value)


def test_missing_file_is_guest_file_error(open_sandbox: OpenSandbox) -> None:
    sb = open_sandbox()
    with pytest.raises(GuestFileError):
        sb.read_file("/tmp/nothing-here")


# ---- misuse and lifecycle -----------------------------------------------------------------------
@pytest.mark.parametrize(("code", "kwargs"), [(123, {}), ("1", {"timeout": -1.0}),
                                              ("1", {"timeout": float("inf")})])
def test_bad_arguments_are_config_errors(open_sandbox: OpenSandbox, code: Any,
                                         kwargs: dict[str, Any]) -> None:
    sb = open_sandbox()
    with pytest.raises(ConfigError) as ours:
        sb.run(code, **kwargs)
    with Sandbox() as ref, pytest.raises(ConfigError) as theirs:
        ref.run(code, **kwargs)
    assert str(ours.value) == str(theirs.value)
    assert sb.turns == 0


def test_close_twice_and_use_after_close(open_sandbox: OpenSandbox) -> None:
    sb = open_sandbox()
    sb.run("1")
    sb.close()
    sb.close()
    assert sb.closed
    with pytest.raises(SandboxClosed):
        sb.run("1")
    with pytest.raises(SandboxClosed):
        sb.checkpoint()
    with pytest.raises(SandboxClosed):
        sb.read_file("/tmp/x")


def test_context_manager_closes(backend: Backend) -> None:
    with backend.open(limits=Limits(timeout=10)) as sb:
        assert sb.run("2 + 2").value == "4"
    assert sb.closed


def test_bad_open_arguments(backend: Backend) -> None:
    with pytest.raises(ConfigError):
        backend.open(mounts=["not a mount"])  # type: ignore[list-item]
    with pytest.raises(ConfigError):
        backend.open(preload=["not a module!"])


def test_close_interrupts_a_running_turn(open_sandbox: OpenSandbox) -> None:
    door = Door()
    started = threading.Event()
    door.register("started", started.set)
    sb = open_sandbox(limits=Limits(timeout=60), door=door)
    out: list[TurnResult] = []
    t = threading.Thread(target=lambda: out.append(
        sb.run("import memex_guest\nmemex_guest.call('started')\nwhile True:\n    pass")))
    t.start()
    assert started.wait(30)
    sb.close()
    t.join(30)
    assert not t.is_alive()
    assert out and out[0].status is TurnStatus.KILLED
    assert out[0].limit == "cancelled"


# ---- host tools through the door ----------------------------------------------------------------
def test_tool_runs_in_the_callers_process(open_sandbox: OpenSandbox) -> None:
    seen: list[tuple[int, int]] = []

    def record(a: int, b: int) -> int:
        """Add two numbers and remember where it ran."""
        seen.append((os.getpid(), a + b))
        return a + b

    sb = open_sandbox()
    with ToolHost([record]).attach(sb) as host:
        r = sb.run("record(2, 3) + record(a=1, b=1)")
        assert r.value == "7", r
        assert seen == [(os.getpid(), 5), (os.getpid(), 2)]
        assert [c.tool for c in host.calls] == ["record", "record"]
        assert all(c.turn == 2 for c in host.calls)  # the install cell was turn 1


def test_tool_error_reaches_the_guest(open_sandbox: OpenSandbox) -> None:
    def explode(reason: str) -> str:
        """Fail on purpose."""
        raise RuntimeError(f"boom: {reason}")

    sb = open_sandbox()
    with ToolHost([explode]).attach(sb) as host:
        r = sb.run("try:\n    explode('why')\nexcept tools.ToolError as e:\n"
                   "    out = (type(e).__name__, e.kind, e.message)\nout")
        assert r.value == "('ToolExecutionError', 'tool_failed', 'boom: why')", r
        assert host.calls[-1].outcome == "tool_failed"
        assert "RuntimeError" in (host.calls[-1].traceback or "")


def test_concurrent_tool_calls_with_gather(open_sandbox: OpenSandbox) -> None:
    barrier = threading.Barrier(3, timeout=20)

    def meet(i: int) -> int:
        """Wait until three calls run at once (fails if they are serialised)."""
        barrier.wait()
        return i * 10

    sb = open_sandbox(limits=Limits(timeout=30))
    with ToolHost([meet]).attach(sb) as host:
        r = sb.run("import asyncio\nawait asyncio.gather(meet(1), meet(2), meet(3))")
        assert r.status is TurnStatus.OK, r
        assert r.value == "[10, 20, 30]"
        assert [c.batch for c in host.calls] == [True, True, True]


def test_handler_cannot_reenter_its_own_sandbox(open_sandbox: OpenSandbox) -> None:
    box: list[SandboxAPI[Any]] = []

    def reenter() -> str:
        """Try to run code in the sandbox that is calling."""
        try:
            box[0].run("1")
        except SandboxError as exc:
            return f"refused: {type(exc).__name__}"
        return "ran"

    sb = open_sandbox()
    box.append(sb)
    with ToolHost([reenter]).attach(sb):
        assert sb.run("reenter()").value == "'refused: SandboxError'"


def test_handler_may_drive_another_sandbox(open_sandbox: OpenSandbox) -> None:
    inner = open_sandbox()
    inner.run("secret = 41")

    def ask_inner() -> str:
        """Run a cell in another sandbox of the same backend."""
        return inner.run("secret + 1").value or ""

    sb = open_sandbox()
    with ToolHost([ask_inner]).attach(sb):
        assert sb.run("ask_inner()").value == "'42'"


@pytest.mark.slow
def test_door_handler_outliving_the_deadline_traps_the_turn(open_sandbox: OpenSandbox) -> None:
    release = threading.Event()
    door = Door()
    door.register("wait", lambda: release.wait(30))
    sb = open_sandbox(door=door, limits=Limits(timeout=1.0))
    sb.run("x = 1")
    try:
        r = sb.run("import memex_guest\nx = 2\nmemex_guest.call('wait')")
        assert r.status is TurnStatus.KILLED
        assert r.limit == "deadline"
        assert r.rolled_back is True
    finally:
        release.set()
    assert sb.run("x").value == "1"


def test_raw_door_frames(open_sandbox: OpenSandbox) -> None:
    door = Door()
    door.register("echo", lambda *a, **k: {"args": list(a), "kwargs": k})
    sb = open_sandbox(door=door)
    r = sb.run("import memex_guest\nmemex_guest.call('echo', 1, 'two', b'3', k=[4])")
    assert r.value == "{'args': [1, 'two', b'3'], 'kwargs': {'k': [4]}}", r
    r = sb.run("import _host\n_host.call(b'not msgpack at all')")
    assert r.status is TurnStatus.OK
    assert b"protocol" in (r.value or "").encode()
    assert [c.op for c in door.calls] == ["echo", None]


def test_a_door_answers_the_first_turn_of_every_new_session(open_sandbox: OpenSandbox) -> None:
    """A session's first turn reaches the handlers its door had when it opened: a remote
    client is told its door is ready only once the guest's calls are routed to it (the
    cluster's slab answered a first call as an empty door, ``unknown tool``, when the turn
    overtook the relay's attach there)."""
    door = Door()
    door.register("ping", lambda i: i)
    for i in range(12):
        sb = open_sandbox(door=door)
        r = sb.run(f"import memex_guest\nmemex_guest.call('ping', {i})")
        assert r.value == str(i), (i, r.exception)
        sb.close()


def test_disk_caps_and_counts_are_the_same_on_every_backend(open_sandbox: OpenSandbox) -> None:
    sb = open_sandbox(limits=Limits(timeout=10, disk_bytes=1 << 20, disk_files=5,
                                    open_files=24))
    r = sb.run("n = 0\ntry:\n    with open('/tmp/a', 'wb') as f:\n        while True:\n"
               "            f.write(b'x' * (1 << 19)); f.flush(); n += 1\n"
               "except OSError as e:\n    print(n, e.strerror)\n")
    assert r.ok and r.stdout == "2 Quota exceeded\n" and r.limit == "disk", r
    assert (r.disk_bytes, r.disk_files) == (1 << 20, 1)
    r = sb.run("fs = []\ntry:\n    while True:\n        fs.append(open('/tmp/a'))\n"
               "except OSError as e:\n    print(e.strerror)\nfor f in fs:\n    f.close()\n")
    assert r.ok and r.limit == "open_files" and r.stdout == "No file descriptors available\n"
    r = sb.run("import os\nos.remove('/tmp/a')")
    assert r.ok and r.limit is None and (r.disk_bytes, r.disk_files) == (0, 0), r
