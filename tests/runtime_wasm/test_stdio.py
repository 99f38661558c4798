"""The guest's stdout and stderr (runtime_wasm/files/_disk.py, ``GuestFiles.fd_write``): a
write reaches its sink on the thread running the guest, never on a thread of the engine's
async runtime, where a Python callback run while the interpreter finalizes aborted the
whole process; a guest's list of buffers costs the host a bounded copy; a descriptor the
guest closed stops being its stdout."""

from __future__ import annotations

import struct
import subprocess
import sys
import textwrap
import threading
from typing import Any, cast

from memex import Sandbox, TurnStatus
from memex.runtime_wasm.engine._ffi import MemoryRef
from memex.runtime_wasm.files._disk import (
    EFAULT,
    EINVAL,
    IOV_MAX,
    STDIO_WRITE_MAX,
    DiskLedger,
    DiskUse,
    GuestFiles,
)

MiB = 1 << 20


def test_the_listener_hears_output_on_the_thread_running_the_turn(sandbox: Sandbox) -> None:
    threads: set[threading.Thread] = set()
    r = sandbox.run("import sys\nprint('out', flush=True)\nsys.stderr.write('err')",
                    on_output=lambda _s, _t: threads.add(threading.current_thread()))
    assert r.ok and r.stdout == "out\n" and r.stderr == "err"
    (thread,) = threads  # one, which Python started (a tokio worker's was a _DummyThread)
    assert not isinstance(thread, threading._DummyThread), thread
    assert thread in threading.enumerate()


# Every ctypes callback made after this runs is wrapped, so a call from a thread Python did
# not start (which current_thread() names a _DummyThread) is written down.
_WATCH = textwrap.dedent("""
    import ctypes, threading
    foreign = []
    _made = ctypes.CFUNCTYPE

    def watched(*types, **kw):
        proto = _made(*types, **kw)

        def make(fn):
            def call(*args):
                if isinstance(threading.current_thread(), threading._DummyThread):
                    foreign.append(getattr(fn, "__name__", "?"))
                return fn(*args)
            return proto(call)
        return make

    ctypes.CFUNCTYPE = watched
    from memex import Sandbox

    with Sandbox() as sb:
        r = sb.run("import sys\\nprint('x' * 100_000)\\nsys.stderr.write('e')\\n"
                   "open('/tmp/f', 'w').write('y')")
        assert r.ok and len(r.stdout) == 100_001 and r.stderr == 'e', r
        child = sb.fork()
        assert child.run("print(1)").stdout == "1\\n"
        child.close()
    print(sorted(set(foreign)))
""")


def test_the_engine_calls_no_python_on_a_thread_of_its_own() -> None:
    out = subprocess.run([sys.executable, "-c", _WATCH], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[]"  # before: ['_finalize_nothing', '_write_output']


def test_a_file_opened_where_stdout_was_gets_the_writes_counted(sandbox: Sandbox) -> None:
    r = sandbox.run("import os\nos.close(1)\nfd = os.open('/tmp/f', os.O_WRONLY | os.O_CREAT)\n"
                    "os.write(fd, b'to the file')\n"
                    "os.write(2, f'{fd} {open(\"/tmp/f\").read()}'.encode())")
    assert r.status is TurnStatus.OK, r
    assert r.stderr == "1 to the file" and r.stdout == ""
    assert r.disk_bytes == len("to the file")


def test_a_long_write_is_a_short_one_and_the_rest_follows(sandbox: Sandbox) -> None:
    r = sandbox.run(f"import os\nn = os.write(1, b'y' * {STDIO_WRITE_MAX + MiB})\n"
                    "os.write(2, str(n).encode())")
    assert r.stderr == str(STDIO_WRITE_MAX)
    r = sandbox.run(f"import sys\nsys.stdout.write('q' * {STDIO_WRITE_MAX + MiB})")
    assert r.ok and r.truncated == ("stdout",)  # kept: the first MiB (stdout_bytes)
    assert f"{STDIO_WRITE_MAX} more bytes dropped" in r.stdout  # the short write's rest came


class _Memory:
    """A guest memory for GuestFiles: ``read``/``write`` as MemoryRef's."""

    def __init__(self, size: int) -> None:
        self.buf = bytearray(size)

    def read(self, ptr: int, n: int) -> bytes | None:
        if ptr < 0 or n < 0 or ptr + n > len(self.buf):
            return None
        return bytes(self.buf[ptr:ptr + n])

    def write(self, ptr: int, data: bytes) -> bool:
        if ptr < 0 or ptr + len(data) > len(self.buf):
            return False
        self.buf[ptr:ptr + len(data)] = data
        return True


def _files(mem: _Memory, sink: list[bytes]) -> GuestFiles:
    use = DiskUse(DiskLedger((), max_bytes=1 << 62, max_entries=1 << 62, max_open=1 << 30))

    def engine() -> dict[str, Any]:
        raise AssertionError("a write to stdout never reaches the engine")

    return GuestFiles(use, (), lambda: cast(MemoryRef, mem), engine, 0, stdio={1: sink.append})


def _iovecs(mem: _Memory, at: int, bufs: list[tuple[int, int]]) -> None:
    mem.write(at, b"".join(struct.pack("<II", p, n) for p, n in bufs))


def test_a_list_naming_one_buffer_a_thousand_times_costs_one_write_max() -> None:
    mem, got = _Memory(2 * MiB + 64 * 1024), list[bytes]()
    files = _files(mem, got)
    _iovecs(mem, 2 * MiB, [(0, 2 * MiB)] * IOV_MAX)  # 2 GiB named, 2 MiB of memory
    assert files.fd_write(1, 2 * MiB, IOV_MAX, 2 * MiB + 60_000) == 0
    assert sum(map(len, got)) == STDIO_WRITE_MAX
    assert max(len(piece) for piece in got) <= 1 << 16  # copied a piece at a time
    assert struct.unpack_from("<I", mem.buf, 2 * MiB + 60_000)[0] == STDIO_WRITE_MAX


def test_a_list_past_iov_max_or_past_the_memory_writes_nothing() -> None:
    mem, got = _Memory(1 << 16), list[bytes]()
    files = _files(mem, got)
    _iovecs(mem, 0, [(100, 10)])
    assert files.fd_write(1, 0, IOV_MAX + 1, 200) == EINVAL
    _iovecs(mem, 0, [(100, 10), ((1 << 16) - 5, 10)])  # the second runs off the end
    assert files.fd_write(1, 0, 2, 200) == EFAULT
    assert files.fd_write(1, 0, 1, 1 << 16) == EFAULT  # nowhere to say how much was written
    assert got == []
    assert files.fd_write(1, 0, 1, 200) == 0 and got == [bytes(10)]

