"""``memex repl`` driven through a real pseudo-terminal (pexpect), as a person at a terminal
uses it: prompts, continuation lines, Ctrl-C while a cell runs and at a prompt, history and
line editing, Ctrl-D and exit()."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest

from memex.cli._repl import needs_more

MEMEX = shutil.which("memex", path=str(Path(sys.executable).parent)) or "memex"
UP = "\x1b[A"


@pytest.fixture
def histfile(tmp_path: Path) -> Path:
    return tmp_path / "history"


def _as_a_shell_starts_it() -> None:
    """SIGINT at its default and unblocked in the child, as a shell at a terminal starts a
    program. A child inherits an ignored or blocked SIGINT across exec and the REPL, like
    python's, honours it: spawned from a test process in that state, every Ctrl-C test here
    fails exactly as the unexplained full-run failures did (no output at all). Whether that
    was their cause is not known: a Ray run before a probe left the state clean."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


_SPAWNED_FROM: dict[int, str] = {}  # child pid -> the spawning thread's signal state


def _spawn(histfile: Path, *args: str) -> pexpect.spawn:
    env = dict(os.environ, MEMEX_HISTFILE=str(histfile), TERM="dumb")
    child = pexpect.spawn(MEMEX, ["repl", "--timeout", "30", *args], encoding="utf-8",
                          timeout=120, env=env, dimensions=(40, 200),
                          preexec_fn=_as_a_shell_starts_it)
    _SPAWNED_FROM[child.pid] = _signal_state("thread-self")  # for a failure's message
    child.expect_exact(">>> ")
    return child


@pytest.fixture
def repl(histfile: Path) -> Iterator[pexpect.spawn]:
    child = _spawn(histfile)
    yield child
    if child.isalive():
        child.terminate(force=True)


# the system calls readline waits in (poll, select, pselect6, ppoll), by architecture
_WAITING = {"x86_64": ("7", "23", "270", "271"), "aarch64": ("72", "73")}


def _interrupt_at_prompt(child: pexpect.spawn) -> None:
    """Ctrl-C once the REPL waits for a key, then its next prompt. readline prints the prompt
    before it starts waiting (select), and a SIGINT that lands between the two is only seen
    at the next key, in CPython's own REPL as well. That window does not explain every lost
    Ctrl-C seen in full runs (two, 120 s with no output, not reproduced alone): when the
    prompt does not come, the failure carries each thread's signal state to find out why."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with open(f"/proc/{child.pid}/syscall") as f:  # the main thread's system call
            if f.read().split()[0] in _WAITING.get(os.uname().machine, ()):
                break
        time.sleep(0.01)
    child.sendintr()
    try:
        child.expect_exact(">>> ")
    except pexpect.TIMEOUT as exc:
        raise AssertionError(f"no prompt after Ctrl-C; threads:\n{_threads(child.pid)}\n"
                             f"the thread that spawned it: {_SPAWNED_FROM.get(child.pid)}") from exc


def _signal_state(task: str) -> str:
    """A thread's pending, blocked, ignored and caught signal masks, from /proc."""
    keys = ("SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")
    status = dict(line.split(":\t", 1) for line in
                  Path(f"/proc/{task}/status").read_text().splitlines() if ":\t" in line)
    return " ".join(f"{k}={status.get(k, '?').strip()}" for k in keys)


def _threads(pid: int) -> str:
    """Each thread's signal masks, wait channel and system call, from /proc."""
    out = []
    for task in sorted(Path(f"/proc/{pid}/task").iterdir()):
        out.append(f"{task.name} {(task / 'comm').read_text().strip()} "
                   + _signal_state(f"{pid}/task/{task.name}")
                   + f" wchan={(task / 'wchan').read_text()} "
                   + f"syscall={(task / 'syscall').read_text().split()[0]}")
    return "\n".join(out)


def _cell(child: pexpect.spawn, *lines: str) -> str:
    """Type ``lines`` (each answered by the prompt it should get) and return what the cell
    printed before the next ``>>>``."""
    for line in lines[:-1]:
        child.sendline(line)
        child.expect_exact("... ")
    child.sendline(lines[-1])
    child.expect_exact(">>> ")
    out: str = child.before
    return out.replace("\r\n", "\n")


def test_continuation_prompts_wait_for_the_blank_line_like_python(repl: pexpect.spawn) -> None:
    out = _cell(repl, "for i in range(2):", "    print(i)", "    print(i * 10)", "")
    assert out.split("\n")[1:-1] == ["0", "0", "1", "10"]
    # an unclosed bracket keeps asking, a blank line inside it included
    assert _cell(repl, "total = (1 +", "", "2)").strip() == "2)"
    assert _cell(repl, "total").split("\n")[1] == "3"


@pytest.mark.slow
def test_ctrl_c_interrupts_a_running_cell_and_keeps_the_session(repl: pexpect.spawn) -> None:
    _cell(repl, "x = 41")
    repl.sendline("while True: x += 1")
    repl.expect_exact("... ")
    repl.sendline("")
    time.sleep(1.0)  # the loop is running
    repl.sendintr()
    repl.expect_exact(">>> ")
    shown = repl.before.replace("\r\n", "\n")
    assert "KeyboardInterrupt" in shown
    assert "cell interrupted; the session is as it was before it" in shown
    # rolled back to the end of the previous cell: x is 41, not whatever the loop reached
    assert _cell(repl, "x + 1").split("\n")[1] == "42"
    assert _cell(repl, "import sys; print(sys.version_info[:2] >= (3, 15))").split("\n")[1] == \
        "True"


def test_ctrl_c_at_a_prompt_discards_the_input_like_python(repl: pexpect.spawn) -> None:
    _interrupt_at_prompt(repl)
    assert "KeyboardInterrupt" in repl.before
    _interrupt_at_prompt(repl)  # a second one at the empty prompt: the same, and the REPL stays
    assert "KeyboardInterrupt" in repl.before
    repl.sendline("if True:")
    repl.expect_exact("... ")
    _interrupt_at_prompt(repl)  # at a continuation prompt: the unfinished statement is dropped
    assert _cell(repl, "print('still here')").split("\n")[1] == "still here"


@pytest.mark.slow
def test_history_and_line_editing(histfile: Path) -> None:
    child = _spawn(histfile)
    assert _cell(child, "y = 6 * 7").strip() == "y = 6 * 7"
    recalled = _cell(child, UP)  # the up arrow brings the line back; Enter runs it again
    assert recalled.strip() == "y = 6 * 7", recalled
    child.send("y")
    child.send("\x01")  # Ctrl-A: to the start of the line
    child.sendline("print(")  # the line is now: print(y
    child.expect_exact("... ")
    assert _cell(child, ")").split("\n")[1] == "42"
    assert _cell(child, "print('from history')").split("\n")[1] == "from history"
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert "y = 6 * 7" in histfile.read_text()
    again = _spawn(histfile)  # the next session starts with this one's history...
    assert _cell(again, UP).split("\n")[1] == "from history"
    assert "NameError" in _cell(again, "y")  # ...but not its state
    again.terminate(force=True)


def test_ctrl_d_and_exit_end_the_repl_with_their_codes(histfile: Path) -> None:
    child = _spawn(histfile)
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    child = _spawn(histfile)
    child.sendline("import sys; sys.exit(3)")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 3


def test_errors_and_limits_keep_the_session(repl: pexpect.spawn) -> None:
    out = _cell(repl, "1 / 0")
    assert "ZeroDivisionError" in out
    out = _cell(repl, "def f(:")
    assert "SyntaxError" in out
    assert _cell(repl, "2 + 2").split("\n")[1] == "4"


def test_piped_input_keeps_prompts_off_stdout() -> None:
    out = subprocess.run([MEMEX, "repl"], input="x = 2\nfor i in range(2):\n    print(i * x)\n\n",
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "0\n2\n"
    assert ">>> " in out.stderr and "... " in out.stderr


@pytest.mark.parametrize("command", ["", "run", "repl", "agent", "policy", "model"])
def test_help_is_plain_text(command: str) -> None:
    args = [MEMEX, *([command] if command else []), "--help"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "``" not in out.stdout and ":class:" not in out.stdout and ":mod:" not in out.stdout


@pytest.mark.parametrize(("source", "more"), [
    ("x = 1", False),
    ("for i in range(3):", True),
    ("for i in range(3):\n    print(i)", True),
    ("for i in range(3):\n    print(i)\n", False),
    ("while True: pass", True),
    ("(1 +", True),
    ("(1 +\n", True),
    ("def f(:", False),  # a syntax error is complete: the guest reports it
    ("'''open", True),
])
def test_needs_more_decides_like_the_python_repl(source: str, more: bool) -> None:
    assert needs_more(source) is more


def test_history_follows_the_xdg_state_rule(monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path) -> None:
    from memex.cli._repl import _history_file

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("MEMEX_HISTFILE", raising=False)
    assert _history_file() == str(tmp_path / "state" / "memex" / "history")
    monkeypatch.setenv("MEMEX_HISTFILE", "")
    assert _history_file() is None  # keep none
    monkeypatch.delenv("MEMEX_HISTFILE")
    monkeypatch.delenv("XDG_STATE_HOME")
    assert _history_file() == str(tmp_path / "home" / ".local" / "state" / "memex" / "history")
    # an earlier version's file is still read while it is the only one
    (tmp_path / "home2").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home2"))
    (tmp_path / "home2" / ".memex_history").write_text("x = 1\n")
    assert _history_file() == str(tmp_path / "home2" / ".memex_history")
