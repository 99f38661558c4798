"""Turns in a persistent guest: state, REPL echo, output, exceptions, exits and lifecycle."""

from __future__ import annotations

import re

import pytest

from memex import ConfigError, Limits, Sandbox, SandboxClosed, TurnStatus

CELL_FRAME = re.compile(r'^  File "([^"]+)", line \d+')


def frames(traceback: str) -> list[str]:
    """The file names of the frames a formatted traceback lists."""
    return [m.group(1) for line in traceback.splitlines() if (m := CELL_FRAME.match(line))]


# ---- state across turns -------------------------------------------------------------------
def test_variables_persist_across_turns(sandbox: Sandbox) -> None:
    assert sandbox.run("x = 21").status is TurnStatus.OK
    r = sandbox.run("x * 2")
    assert r.status is TurnStatus.OK
    assert r.value == "42"


def test_functions_and_classes_persist_across_turns(sandbox: Sandbox) -> None:
    sandbox.run("def square(n):\n    return n * n\n")
    sandbox.run("class Box:\n    def __init__(self, v):\n        self.v = v\n")
    r = sandbox.run("square(Box(7).v)")
    assert r.status is TurnStatus.OK, r
    assert r.value == "49"


def test_imports_persist_across_turns(sandbox: Sandbox) -> None:
    sandbox.run("import json, collections")
    r = sandbox.run("json.dumps(collections.Counter('aab'), sort_keys=True)")
    assert r.status is TurnStatus.OK, r
    assert r.value == repr('{"a": 2, "b": 1}')


def test_ok_property_and_to_dict(sandbox: Sandbox) -> None:
    r = sandbox.run("1 + 1")
    assert r.ok
    d = r.to_dict()
    assert d["status"] == "ok"
    assert d["value"] == "2"
    assert d["exception"] is None
    assert d["truncated"] == []
    assert not sandbox.run("1/0").ok


# ---- REPL echo ----------------------------------------------------------------------------
def test_final_expression_is_echoed_as_repr(sandbox: Sandbox) -> None:
    r = sandbox.run("a = 'hi'\na + '!'")
    assert r.value == "'hi!'"
    assert r.stdout == ""  # the echo is data, not printed output


def test_final_expression_none_and_statements_give_no_value(sandbox: Sandbox) -> None:
    assert sandbox.run("None").value is None
    assert sandbox.run("y = 3").value is None
    assert sandbox.run("for i in range(3):\n    i\n").value is None
    assert sandbox.run("print('x')").value is None


def test_only_the_last_expression_is_echoed(sandbox: Sandbox) -> None:
    r = sandbox.run("1\n2\n3")
    assert r.value == "3"


def test_last_value_is_bound_to_underscore(sandbox: Sandbox) -> None:
    sandbox.run("6 * 7")
    assert sandbox.run("_ + 0").value == "42"


def test_top_level_await_runs(sandbox: Sandbox) -> None:
    sandbox.run("async def f():\n    return 5\n")
    r = sandbox.run("await f()")
    assert r.status is TurnStatus.OK, r
    assert r.value == "5"


@pytest.mark.parametrize(
    ("code", "value"),
    [
        ("", None),
        ("# only a comment", None),
        ("if True:\n\tt = 'tab\\tindented'\nt", repr("tab\tindented")),
        ("s = 'back\\\\slash \\n newline'\ns", repr("back\\slash \n newline")),
        ("é = 'ünïcödé ✓'\né", repr("ünïcödé ✓")),
        ("a = 1\r\nb = 2\r\na + b", "3"),
        ("'\\ud800'", repr("\ud800")),
        ("'a\\x00b'", repr("a\x00b")),
        ('"""multi\nline"""', repr("multi\nline")),
        ("'__memex_turn__()'", repr("__memex_turn__()")),
        ("x = '\t'\nlen(x)", "1"),
        ("# -*- coding: latin-1 -*-\n'ok'", "'ok'"),
    ],
    ids=["empty", "comment", "tabs", "backslashes", "unicode", "crlf", "surrogate", "nul",
         "multiline-string", "driver-name", "literal-tab", "coding-line"],
)
def test_cell_source_survives_the_trip_to_the_guest(
    shared_sandbox: Sandbox, code: str, value: str | None
) -> None:
    r = shared_sandbox.run(code)
    assert r.status is TurnStatus.OK, r
    assert r.value == value


def test_repeated_cell_reports_its_own_filename(sandbox: Sandbox) -> None:
    sandbox.run("def f():\n    return 1 / 0\n", filename="<def>")
    for name in ("<first>", "<second>", "<first>"):
        r = sandbox.run("f()", filename=name)
        assert r.exception is not None
        assert frames(r.exception.traceback) == [name, "<def>"]


# ---- output -------------------------------------------------------------------------------
def test_stdout_and_stderr_are_captured_per_turn(sandbox: Sandbox) -> None:
    r = sandbox.run("import sys\nprint('out')\nprint('err', file=sys.stderr)")
    assert r.status is TurnStatus.OK
    assert r.stdout == "out\n"
    assert r.stderr == "err\n"
    r2 = sandbox.run("print('again')")
    assert r2.stdout == "again\n"  # nothing carried over from the previous turn
    assert r2.stderr == ""


def test_output_flushed_even_without_newline(sandbox: Sandbox) -> None:
    r = sandbox.run("import sys\nsys.stdout.write('partial')\nprint('e', end='', file=sys.stderr)")
    assert r.stdout == "partial"
    assert r.stderr == "e"


def test_unicode_output(sandbox: Sandbox) -> None:
    r = sandbox.run("print('héllo ✓ 日本')")
    assert r.stdout == "héllo ✓ 日本\n"


def test_stdout_before_exception_is_kept(sandbox: Sandbox) -> None:
    r = sandbox.run("print('before')\nraise ValueError('bad')")
    assert r.status is TurnStatus.ERROR
    assert r.stdout == "before\n"


# ---- exceptions ---------------------------------------------------------------------------
def test_exception_type_message_and_traceback(sandbox: Sandbox) -> None:
    r = sandbox.run("x = 1\nraise ValueError('bad value')")
    assert r.status is TurnStatus.ERROR
    assert r.exception is not None
    assert r.exception.type == "ValueError"
    assert r.exception.message == "bad value"
    assert r.exception.traceback.startswith("Traceback (most recent call last):")
    assert r.exception.traceback.rstrip().endswith("ValueError: bad value")
    assert r.value is None
    assert r.limit is None
    assert not r.rolled_back
    # a Python exception is not a trap: the state before the raise is kept
    assert sandbox.run("x").value == "1"


def test_traceback_shows_only_cell_frames(sandbox: Sandbox) -> None:
    sandbox.run("def inner():\n    raise KeyError('k')\n")
    sandbox.run("def outer():\n    return inner()\n")
    r = sandbox.run("outer()")
    assert r.status is TurnStatus.ERROR
    assert r.exception is not None
    assert r.exception.type == "KeyError"
    tb = r.exception.traceback
    names = frames(tb)
    assert len(names) == 3, tb  # <module>, outer, inner: nothing of the driver
    assert all(re.fullmatch(r"<cell-\d+>", n) for n in names), tb
    assert "memex" not in tb.lower()
    assert "in outer" in tb and "in inner" in tb


def test_exception_from_stdlib_lists_cell_first(sandbox: Sandbox) -> None:
    r = sandbox.run("import json\njson.loads('{')")
    assert r.exception is not None
    assert r.exception.type == "json.decoder.JSONDecodeError"
    names = frames(r.exception.traceback)
    assert names[0].startswith("<cell-")
    assert not any("driver" in n for n in names)


def test_exception_with_unprintable_message(sandbox: Sandbox) -> None:
    r = sandbox.run(
        "class Weird(Exception):\n    def __str__(self):\n        raise RuntimeError\n"
        "raise Weird()"
    )
    assert r.status is TurnStatus.ERROR
    assert r.exception is not None
    assert r.exception.type == "Weird"
    assert "unprintable" in r.exception.message
    # and the sandbox still works
    assert sandbox.run("2 + 2").value == "4"


def test_keyboard_interrupt_in_guest_is_an_error_not_a_host_exception(sandbox: Sandbox) -> None:
    r = sandbox.run("raise KeyboardInterrupt")
    assert r.status is TurnStatus.ERROR
    assert r.exception is not None and r.exception.type == "KeyboardInterrupt"
    assert sandbox.run("1").value == "1"


def test_custom_filename_appears_in_traceback(sandbox: Sandbox) -> None:
    r = sandbox.run("1/0", filename="<my-cell>")
    assert r.exception is not None
    assert frames(r.exception.traceback) == ["<my-cell>"]


def test_syntax_error_is_reported_and_state_kept(sandbox: Sandbox) -> None:
    sandbox.run("kept = 'yes'")
    r = sandbox.run("x = 1\ndef f(:\n    pass")
    assert r.status is TurnStatus.ERROR
    assert r.exception is not None
    assert r.exception.type == "SyntaxError"
    assert "line 2" in r.exception.message
    assert "SyntaxError" in r.exception.traceback
    # a cell that does not compile runs nothing of itself
    assert sandbox.run("'x' in globals(), kept").value == "(False, 'yes')"


def test_syntax_error_traceback_shows_only_cell_frames(sandbox: Sandbox) -> None:
    r = sandbox.run("def f(:\n    pass")
    assert r.exception is not None
    tb = r.exception.traceback
    assert "ast.py" not in tb, tb
    assert all(n.startswith("<cell-") for n in frames(tb)), tb


def test_syntax_error_traceback_is_like_the_repl(sandbox: Sandbox) -> None:
    r = sandbox.run("x = 1\ny = (", filename="<bad>")
    assert r.exception is not None and r.exception.type == "SyntaxError"
    tb = r.exception.traceback
    # nothing of the cell ran, so there is no frame: only where the error is, as in the REPL
    assert frames(tb) == ["<bad>"], tb
    assert "Traceback (most recent call last)" not in tb, tb
    assert "memex" not in tb.lower() and "ast.py" not in tb, tb
    assert tb.rstrip().splitlines()[-1].startswith("SyntaxError: ")


def test_syntax_error_raised_by_the_cell_keeps_its_frames(sandbox: Sandbox) -> None:
    r = sandbox.run("compile('1 +', '<inner>', 'exec')")
    assert r.exception is not None and r.exception.type == "SyntaxError"
    assert frames(r.exception.traceback) == ["<cell-1>", "<inner>"], r.exception.traceback


# The driver refuses sockets with helpers of its own; their frames must not show either.
NO_SOCKET_CELLS = {
    "socket": ("import socket\nsocket.socket()", ["<cell-1>", "socket.py"]),
    "getaddrinfo": ("import _socket\n_socket.getaddrinfo('example.com', 80)", ["<cell-1>"]),
    "create_connection": (
        "import socket\nsocket.create_connection(('example.com', 80))",
        ["<cell-1>", "socket.py", "socket.py"],
    ),
}


@pytest.mark.parametrize("case", sorted(NO_SOCKET_CELLS))
def test_socket_refusal_traceback_ends_in_user_code(sandbox: Sandbox, case: str) -> None:
    code, expected = NO_SOCKET_CELLS[case]
    r = sandbox.run(code)
    # the one answer for "no network" (SECURITY.md): EgressDenied, a PermissionError
    assert r.exception is not None and r.exception.type == "memex_guest.net.EgressDenied", r
    assert r.exception.message.startswith("egress denied: socket.")
    assert "network access is disabled" in r.exception.message
    tb = r.exception.traceback
    assert "<memex-driver>" not in tb and "driver" not in tb, tb
    assert [n.rsplit("/", 1)[-1] for n in frames(tb)] == expected, tb
    assert tb.rstrip().splitlines()[-1].startswith("memex_guest.net.EgressDenied: "), tb


def test_chained_exceptions_lose_driver_frames_too(sandbox: Sandbox) -> None:
    r = sandbox.run(
        "import _socket\n"
        "def connect():\n"
        "    try:\n"
        "        _socket.getaddrinfo('example.com', 80)\n"
        "    except OSError as exc:\n"
        "        raise RuntimeError('no network') from exc\n"
        "connect()",
        filename="<chain>",
    )
    assert r.exception is not None and r.exception.type == "RuntimeError"
    tb = r.exception.traceback
    assert "<memex-driver>" not in tb, tb
    assert "direct cause" in tb
    assert frames(tb) == ["<chain>", "<chain>", "<chain>"], tb


# ---- exits --------------------------------------------------------------------------------
def test_exit_builtin_is_exit_status(sandbox: Sandbox) -> None:
    sandbox.run("x = 5")
    r = sandbox.run("exit()")
    assert r.status is TurnStatus.EXIT
    assert r.exit_code == 0
    assert r.exception is None
    # exit() ends the turn, not the sandbox
    assert sandbox.run("x").value == "5"


@pytest.mark.parametrize(("code", "expected"), [(0, 0), (3, 3), (255, 255)])
def test_sys_exit_code(sandbox: Sandbox, code: int, expected: int) -> None:
    r = sandbox.run(f"import sys\nprint('bye')\nsys.exit({code})")
    assert r.status is TurnStatus.EXIT
    assert r.exit_code == expected
    assert r.stdout == "bye\n"
    assert not r.rolled_back


def test_sys_exit_with_message_is_code_1_and_message_on_stderr(sandbox: Sandbox) -> None:
    r = sandbox.run("import sys\nsys.exit('fatal: nope')")
    assert r.status is TurnStatus.EXIT
    assert r.exit_code == 1
    assert "fatal: nope" in r.stderr


def test_sys_exit_inside_function_keeps_earlier_effects(sandbox: Sandbox) -> None:
    r = sandbox.run("import sys\nstate = 'set'\ndef quit_now():\n    sys.exit(7)\nquit_now()")
    assert r.status is TurnStatus.EXIT
    assert r.exit_code == 7
    assert sandbox.run("state").value == "'set'"


# ---- lifecycle ----------------------------------------------------------------------------
def test_close_is_idempotent() -> None:
    sb = Sandbox(limits=Limits(timeout=5))
    sb.run("1")
    sb.close()
    sb.close()
    assert sb.closed


def test_run_after_close_raises_sandbox_closed() -> None:
    sb = Sandbox(limits=Limits(timeout=5))
    sb.close()
    with pytest.raises(SandboxClosed) as info:
        sb.run("1")
    assert "closed" in info.value.reason
    with pytest.raises(SandboxClosed):
        sb.checkpoint()
    with pytest.raises(SandboxClosed):
        sb.fork()


def test_context_manager_closes() -> None:
    with Sandbox(limits=Limits(timeout=5)) as sb:
        assert isinstance(sb, Sandbox)
        assert sb.run("40 + 2").value == "42"
        assert not sb.closed
    assert sb.closed
    with pytest.raises(SandboxClosed):
        sb.run("1")


def test_context_manager_closes_on_host_exception() -> None:
    with pytest.raises(RuntimeError, match="host side"), Sandbox(limits=Limits(timeout=5)) as sb:
        sb.run("x = 1")
        raise RuntimeError("host side")
    assert sb.closed


@pytest.mark.parametrize("code", [b"print(1)", None, 42, ["x = 1"]])
def test_non_str_code_raises_config_error(sandbox: Sandbox, code: object) -> None:
    with pytest.raises(ConfigError):
        sandbox.run(code)  # type: ignore[arg-type]
    # the sandbox is unaffected
    assert sandbox.run("1").value == "1"


@pytest.mark.parametrize("timeout", [0, -1.0])
def test_non_positive_turn_timeout_raises_config_error(sandbox: Sandbox, timeout: float) -> None:
    with pytest.raises(ConfigError):
        sandbox.run("1", timeout=timeout)


def test_config_error_is_a_value_error(sandbox: Sandbox) -> None:
    with pytest.raises(ValueError):
        sandbox.run(b"1")  # type: ignore[arg-type]


def test_sandboxes_are_isolated_from_each_other(make_sandbox) -> None:  # type: ignore[no-untyped-def]
    a, b = make_sandbox(), make_sandbox()
    a.run("only_in_a = 1")
    r = b.run("only_in_a")
    assert r.status is TurnStatus.ERROR
    assert r.exception is not None and r.exception.type == "NameError"


def test_env_is_visible_in_guest(make_sandbox) -> None:  # type: ignore[no-untyped-def]
    sb = make_sandbox(env={"MEMEX_TEST_VAR": "v1"})
    assert sb.run("import os\nos.environ.get('MEMEX_TEST_VAR')").value == "'v1'"


def test_host_environment_does_not_leak(sandbox: Sandbox) -> None:
    import os

    assert "PATH" in os.environ  # the host has it; the guest must not
    r = sandbox.run("import os\nsorted(os.environ)")
    assert r.status is TurnStatus.OK
    assert r.value is not None and "'HOME'" in r.value
    assert "'PATH'" not in r.value


def test_exception_group_members_lose_driver_frames(sandbox: Sandbox) -> None:
    r = sandbox.run(
        "import _socket\n"
        "errors = []\n"
        "for host in ('a.example', 'b.example'):\n"
        "    try:\n"
        "        _socket.getaddrinfo(host, 80)\n"
        "    except OSError as exc:\n"
        "        errors.append(exc)\n"
        "raise ExceptionGroup('no network', errors)",
        filename="<group>",
    )
    assert r.exception is not None and r.exception.type == "ExceptionGroup", r
    tb = r.exception.traceback
    assert "<memex-driver>" not in tb, tb
    assert tb.count("EgressDenied: egress denied") == 2, tb
    # group tracebacks are drawn with "|" margins: look for frames anywhere on a line
    assert re.findall(r'File "([^"]+)", line \d+', tb) == ["<group>"] * 3, tb
