"""``memex selftest``: the containment checks of SECURITY.md, run on the operator's machine.

Each check opens real sandboxes (on the backend chosen), tries one thing a hostile tenant
would, and says ``pass`` or ``fail`` (``warn`` for a host setting the threat model advises
against, such as running as root). The table is printed as it goes; ``--json`` prints one
record instead; the exit status is 1 when any check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["Check", "CheckResult", "add_parser", "run_checks"]

MiB = 1 << 20
Opener = Callable[..., Any]


class _Failed(Exception):
    pass


class _Warn(Exception):
    pass


@dataclass(frozen=True, kw_only=True)
class CheckResult:
    check: str
    result: str  # pass | fail | warn
    seconds: float
    detail: str


@dataclass(frozen=True, kw_only=True)
class Check:
    name: str
    run: Callable[[Opener, Path], str]


def _need(cond: bool, detail: str) -> None:
    if not cond:
        raise _Failed(detail)


def _turn(opener: Opener, code: str, **open_kw: Any) -> Any:
    sb = opener(**open_kw)
    try:
        return sb, sb.run(code)
    except BaseException:
        sb.close()
        raise


def _outcomes(opener: Opener, attempts: str, **open_kw: Any) -> Any:
    """Run each lambda of the guest expression ``attempts``; the turn's value lists what each
    returned, or the name of the exception it raised."""
    sb, r = _turn(opener, f"out = []\nfor f in ({attempts}):\n    try:\n"
                  "        out.append(f())\n    except Exception as e:\n"
                  "        out.append(type(e).__name__)\nout", **open_kw)
    sb.close()
    return r


def _limits(**kw: Any) -> Any:
    from ..runtime_wasm import Limits

    base: dict[str, Any] = dict(timeout=10, memory=256 * MiB, disk_bytes=4 * MiB,
                                disk_files=50, open_files=32)
    base.update(kw)
    return Limits(**base)


# ---- the checks ---------------------------------------------------------------------------------
def _files_outside(opener: Opener, work: Path) -> str:
    secret = work / "outside" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("selftest-secret")
    rel = os.path.relpath(secret, "/tmp")
    paths = [str(secret), "/tmp/" + rel, "/proc/self/environ", "/etc/passwd"]
    r = _outcomes(opener, ", ".join(f"lambda: open({p!r}).read()" for p in paths),
                  limits=_limits())
    _need(r.ok and "selftest-secret" not in (r.value or ""), f"guest read {r.value!r}")
    return "host paths, .. and /proc are out of reach"


def _descriptors(opener: Opener, work: Path) -> str:
    with open(work / "held.txt", "w+") as held:
        held.write("selftest-held")
        held.flush()
        sb, r = _turn(opener, "import os\nseen = []\nfor fd in range(4096):\n    try:\n"
                      "        os.lseek(fd, 0, 0); seen.append(os.read(fd, 32))\n"
                      "    except OSError:\n        pass\nseen", limits=_limits())
        sb.close()
    _need(r.ok and "selftest-held" not in (r.value or ""), "a host descriptor was readable")
    return "guessing descriptors 0-4095 reaches none of the host's"


def _links(opener: Opener, work: Path) -> str:
    from ..runtime_wasm import Mount

    mount = work / "mount"
    mount.mkdir()
    sb, r = _turn(opener, "import os\nout = []\nfor a, b in [('../../../etc/passwd', '/data/l'),"
                  " ('/etc/passwd', '/tmp/l')]:\n    try:\n        os.symlink(a, b)\n"
                  "        out.append('made')\n    except OSError as e:\n"
                  "        out.append(e.strerror)\nout", limits=_limits(),
                  mounts=[Mount(host_path=mount, guest_path="/data", writable=True)])
    sb.close()
    _need(r.ok and "made" not in (r.value or "") and not any(mount.iterdir()),
          f"a link was created: {r.value}")
    return "symlinks and hard links refused in writable places"


def _disk(opener: Opener, work: Path) -> str:
    sb, r = _turn(opener, "f = open('/tmp/fill', 'wb')\nwhile True:\n    f.write(b'x' * (1 << 20))",
                  limits=_limits())
    try:
        _need(r.limit == "disk" and r.disk_bytes <= 4 * MiB, f"limit={r.limit} "
              f"disk_bytes={r.disk_bytes}")
        r2 = sb.run("import os\nos.remove('/tmp/fill')\nopen('/tmp/f', 'wb').write(b'ok')")
        _need(r2.ok, "the sandbox was not usable after deleting")
    finally:
        sb.close()
    sb, r = _turn(opener, "i = 0\nwhile True:\n    open(f'/tmp/{i}', 'w').close(); i += 1",
                  limits=_limits())
    sb.close()
    _need(r.limit == "disk" and r.disk_files <= 50, f"file count: limit={r.limit}")
    return "byte and file quotas refuse with EDQUOT; deleting frees"


def _open_files(opener: Opener, work: Path) -> str:
    sb, r = _turn(opener, "open('/tmp/x', 'w').close()\nfs = []\ntry:\n    while True:\n"
                  "        fs.append(open('/tmp/x'))\nexcept OSError as e:\n"
                  "    print(len(fs), e.errno)\n", limits=_limits())
    sb.close()
    _need(r.ok and r.limit == "open_files", f"limit={r.limit} {r.stdout!r}")
    return f"EMFILE after {r.stdout.split()[0]} descriptors (cap 32)"


def _memory_cpu_stack(opener: Opener, work: Path) -> str:
    sb = opener(limits=_limits(timeout=1.0))
    try:
        sb.run("kept = 1")
        mem = sb.run("x = bytearray(1 << 29)")
        _need(mem.limit == "memory", f"memory: {mem.limit}")
        cpu = sb.run("while True:\n    pass")
        _need(cpu.limit == "deadline" and cpu.rolled_back, f"cpu: {cpu.limit}")
        stack = sb.run("def f(n):\n    return f(n + 1)\nf(0)")
        _need(stack.status.value in ("error", "killed"), "stack: no error")
        _need(sb.run("kept").value == "1", "state lost after the bombs")
    finally:
        sb.close()
    return "MemoryError, deadline with rollback, stack overflow: the sandbox lives on"


def _processes(opener: Opener, work: Path) -> str:
    attempts = ("__import__('os').fork()",
                "__import__('threading').Thread(target=print).start()",
                "__import__('subprocess').run(['id'])")
    r = _outcomes(opener, ", ".join(f"lambda: ({a}, 'ran')[1]" for a in attempts),
                  limits=_limits())
    _need(r.ok and "ran" not in (r.value or ""), f"{r.value or r.exception}")
    return "no fork, threads or subprocesses"


def _network(opener: Opener, work: Path) -> str:
    from ..host_tools import Egress, EgressPolicy

    sb, r = _turn(opener, "import socket, urllib.request\nout = []\n"
                  "for f in (lambda: socket.socket(), lambda: urllib.request.urlopen("
                  "'http://127.0.0.1:9/')):\n    try:\n        f(); out.append('open')\n"
                  "    except OSError as e:\n        out.append(type(e).__name__)\nout",
                  limits=_limits())
    sb.close()
    _need(r.ok and r.value == "['EgressDenied', 'EgressDenied']", f"{r.value or r.exception}")
    sb = opener(limits=_limits())
    try:
        Egress(EgressPolicy.from_dict({"rules": [{"action": "allow", "host": "*"}]})).attach(sb)
        r = sb.run("from memex_guest import net\nout = []\nfor u in ('http://127.0.0.1:9/', "
                   "'http://[::ffff:127.0.0.1]:9/', 'http://169.254.169.254/', "
                   "'http://0x7f000001:9/'):\n    try:\n        net.fetch(u); out.append(u)\n"
                   "    except net.EgressDenied:\n        pass\nout")
    finally:
        sb.close()
    _need(r.ok and r.value == "[]", f"reached {r.value or r.exception}")
    return "no sockets; loopback and metadata refused under an allow-all policy"


def _engine(opener: Opener, work: Path) -> str:
    from ..runtime_wasm import engine_support

    support = engine_support()
    if not support.supported:
        raise _Warn(support.describe())
    return support.describe()


def _host_settings(opener: Opener, work: Path) -> str:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    notes = [f"RLIMIT_NOFILE {soft}/{hard}"]
    if os.geteuid() == 0:
        raise _Warn("running as root: run backends as an unprivileged user (SECURITY.md)")
    return "; ".join(notes)


CHECKS = (
    Check(name="files outside the sandbox", run=_files_outside),
    Check(name="host descriptors", run=_descriptors),
    Check(name="links out of a mount", run=_links),
    Check(name="disk quotas", run=_disk),
    Check(name="open-file cap", run=_open_files),
    Check(name="memory, CPU and stack bombs", run=_memory_cpu_stack),
    Check(name="processes and threads", run=_processes),
    Check(name="network", run=_network),
    Check(name="engine support window", run=_engine),
    Check(name="host settings", run=_host_settings),
)


def run_checks(opener: Opener, checks: tuple[Check, ...] = CHECKS,
               report: Callable[[CheckResult], None] | None = None) -> list[CheckResult]:
    """Run ``checks`` with sandboxes from ``opener`` (``Backend.open`` or ``Sandbox``)."""
    out = []
    for check in checks:
        work = Path(tempfile.mkdtemp(prefix="memex-selftest-"))
        start = time.monotonic()
        try:
            result, detail = "pass", check.run(opener, work)
        except _Failed as exc:
            result, detail = "fail", str(exc)
        except _Warn as exc:
            result, detail = "warn", str(exc)
        except Exception as exc:  # a check that cannot run is a failed check
            result, detail = "fail", f"{type(exc).__name__}: {exc}"
        finally:
            from ..runtime_wasm.internal import remove_tree  # a guest wrote there: iteratively

            remove_tree(str(work))
        res = CheckResult(check=check.name, result=result,
                          seconds=round(time.monotonic() - start, 3), detail=detail[:300])
        out.append(res)
        if report is not None:
            report(res)
    return out


def cmd_selftest(args: argparse.Namespace) -> int:
    from ..backends import get_backend

    backend = get_backend(args.backend)
    try:
        def row(r: CheckResult) -> None:
            if not args.json:
                print(f"{r.check:30s} {r.result:5s} {r.seconds:7.2f}s  {r.detail}", flush=True)

        if not args.json:
            print(f"{'check':30s} {'result':5s} {'seconds':>8s}  detail")
        results = run_checks(backend.open, report=row)
    finally:
        backend.close()
    failed = [r for r in results if r.result == "fail"]
    if args.json:
        json.dump({"backend": args.backend, "ok": not failed,
                   "checks": [asdict(r) for r in results]}, sys.stdout, indent=2)
        print()
    else:
        warned = sum(r.result == "warn" for r in results)
        print(f"\n{len(results)} checks: {len(results) - len(failed) - warned} passed, "
              f"{warned} warned, {len(failed)} failed"
              + (f" ({', '.join(r.check for r in failed)})" if failed else ""))
    return 1 if failed else 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("selftest", help="run the sandbox containment checks on this machine")
    p.add_argument("--backend", default="inprocess",
                   choices=("inprocess", "subprocess", "pool"),
                   help="where the sandboxes run (default: in this process)")
    p.add_argument("--json", action="store_true", help="print one JSON record")
    p.set_defaults(func=cmd_selftest)
