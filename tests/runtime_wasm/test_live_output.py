"""``Sandbox.run(..., on_output=...)``: stdout and stderr heard as the guest writes them, the
same text the result holds (caps included), characters never split, a listener that raises
never stopping the guest."""

from __future__ import annotations

import time
from collections.abc import Callable

from memex import Limits, Sandbox, TurnStatus


def test_output_arrives_while_the_cell_runs(sandbox: Sandbox) -> None:
    seen: list[tuple[float, str, str]] = []
    start = time.monotonic()
    r = sandbox.run("import sys, time\nfor i in range(3):\n    print(i, flush=True)\n"
                    "    time.sleep(0.3)\nsys.stderr.write('done')",
                    on_output=lambda s, t: seen.append((time.monotonic() - start, s, t)))
    assert r.ok
    assert [(s, t) for _, s, t in seen] == [("stdout", "0\n"), ("stdout", "1\n"),
                                           ("stdout", "2\n"), ("stderr", "done")]
    assert seen[0][0] < 0.25 < seen[1][0]  # the first line came before the first sleep ended
    assert "".join(t for _, s, t in seen if s == "stdout") == r.stdout


def test_caps_hold_and_characters_are_never_split(make_sandbox: Callable[..., Sandbox]
                                                  ) -> None:
    sb = make_sandbox(limits=Limits(timeout=10, stdout_bytes=1000))
    heard: list[str] = []
    r = sb.run("import sys\nfor _ in range(400):\n    sys.stdout.write('é')\n    "
               "sys.stdout.flush()\nprint('x' * 5000)",
               on_output=lambda _s, t: heard.append(t))
    text = "".join(heard)
    assert text == r.stdout.split("\n[memex:")[0]  # what was kept, nothing beyond the cap
    assert len(text.encode()) <= 1000 and "\ufffd" not in text
    assert text.startswith("é" * 400)


def test_a_listener_that_raises_does_not_stop_the_guest(sandbox: Sandbox) -> None:
    def boom(_s: str, _t: str) -> None:
        raise RuntimeError("listener failed")

    r = sandbox.run("print('a')\nprint('b')\n40 + 2", on_output=boom)
    assert r.status is TurnStatus.OK and r.value == "42" and r.stdout == "a\nb\n"
    assert sandbox.run("print('c')").stdout == "c\n"  # no listener left behind
