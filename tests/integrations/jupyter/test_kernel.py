"""The MemEx Jupyter kernel through the real ``jupyter_client`` (KernelManager + blocking
client) and a notebook executed by ``nbclient``: state across cells, streamed output, rich
reprs, figures, errors, an interrupted infinite loop followed by a working cell, a memory bomb,
and the kernelspec's sandbox settings."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager, KernelManager
from nbclient import NotebookClient

from memex.integrations.jupyter import install_kernelspec, kernelspec

MEMEX = shutil.which("memex", path=str(Path(sys.executable).parent)) or "memex"


@pytest.fixture(scope="module")
def specs(tmp_path_factory: pytest.TempPathFactory) -> KernelSpecManager:
    prefix = tmp_path_factory.mktemp("jupyter")
    data = tmp_path_factory.mktemp("data")
    (data / "table.csv").write_text("a,b\n1,2\n3,4\n")
    # a cell's time limit well above a fresh guest's pandas import (3.3 s measured with the
    # suite running beside it), which the nbclient test's first cell does
    install_kernelspec("memex-test", prefix=str(prefix), timeout=20, memory=256 << 20,
                       mounts=[f"{data}:/data"])
    # the limits test's: a time limit it waits out, with cells of microseconds beside it
    install_kernelspec("memex-limits", prefix=str(prefix), timeout=3, memory=256 << 20,
                       mounts=[f"{data}:/data"])
    ksm = KernelSpecManager()
    ksm.kernel_dirs = [str(prefix / "share" / "jupyter" / "kernels")]
    return ksm


def _started(specs: KernelSpecManager, name: str) -> Iterator[tuple[KernelManager, Any]]:
    km = KernelManager(kernel_name=name, kernel_spec_manager=specs)
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=120)
    yield km, kc
    kc.stop_channels()
    km.shutdown_kernel(now=False)


@pytest.fixture(scope="module")
def kernel(specs: KernelSpecManager) -> Iterator[tuple[KernelManager, Any]]:
    yield from _started(specs, "memex-test")


@pytest.fixture
def limits_kernel(specs: KernelSpecManager) -> Iterator[tuple[KernelManager, Any]]:
    yield from _started(specs, "memex-limits")


def printed(msgs: list[dict[str, Any]]) -> str:
    """What a cell's stream messages said, joined (a line may come in one or several)."""
    return "".join(m["content"]["text"] for m in msgs if m["msg_type"] == "stream")


def run(kc: Any, code: str, timeout: float = 60) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(reply content, iopub messages other than status and execute_input) of one cell."""
    seen: list[dict[str, Any]] = []
    reply = kc.execute_interactive(code, timeout=timeout, output_hook=seen.append)
    return reply["content"], [m for m in seen if m["msg_type"] not in ("status",
                                                                         "execute_input")]


@pytest.mark.slow
def test_state_streams_and_results(kernel: tuple[KernelManager, Any]) -> None:
    _, kc = kernel
    reply, msgs = run(kc, "x = 41\nprint('hi')\nimport sys\nsys.stderr.write('careful\\n')\n"
                          "x + 1")
    assert reply["status"] == "ok"
    kinds = [(m["msg_type"], m["content"].get("name")) for m in msgs]
    assert kinds == [("stream", "stdout"), ("stream", "stderr"), ("execute_result", None)]
    assert msgs[0]["content"]["text"] == "hi\n"
    result = msgs[-1]["content"]
    assert result["data"]["text/plain"] == "42"
    assert result["execution_count"] == reply["execution_count"]
    _, msgs = run(kc, "x")
    assert msgs[-1]["content"]["data"]["text/plain"] == "41"


@pytest.mark.slow
def test_output_is_streamed_while_the_cell_runs(kernel: tuple[KernelManager, Any]) -> None:
    _, kc = kernel
    stamps: list[float] = []
    start = time.monotonic()

    def hook(m: dict[str, Any]) -> None:
        if m["msg_type"] == "stream":
            stamps.append(time.monotonic() - start)

    kc.execute_interactive("import time\nfor i in range(3):\n    print(i, flush=True)\n"
                           "    time.sleep(0.4)", timeout=60, output_hook=hook)
    assert len(stamps) == 3 and stamps[1] - stamps[0] > 0.25  # one message per line, in time


@pytest.mark.slow
def test_rich_reprs_and_figures(kernel: tuple[KernelManager, Any]) -> None:
    _, kc = kernel
    _, msgs = run(kc, "import pandas as pd\npd.read_csv('/data/table.csv')")
    data = msgs[-1]["content"]["data"]
    assert "<table" in data["text/html"] and "a  b" in data["text/plain"]
    reply, msgs = run(kc, "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nNone")
    shown = [m for m in msgs if m["msg_type"] == "display_data"]
    assert reply["status"] == "ok" and len(shown) == 1
    png = base64.b64decode(shown[0]["content"]["data"]["image/png"])
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    _, msgs = run(kc, "len(plt.get_fignums())")  # shown figures are closed
    assert msgs[-1]["content"]["data"]["text/plain"] == "0"


def test_errors_carry_the_trimmed_traceback(kernel: tuple[KernelManager, Any]) -> None:
    _, kc = kernel
    reply, msgs = run(kc, "def f():\n    return 1 / 0\nf()")
    assert reply["status"] == "error" and reply["ename"] == "ZeroDivisionError"
    err = next(m for m in msgs if m["msg_type"] == "error")["content"]
    tb = "\n".join(err["traceback"])
    assert "return 1 / 0" in tb and "memex" not in tb.lower().replace("memexlimit", "")
    reply, _ = run(kc, "def broken(:")
    assert reply["ename"] == "SyntaxError"


@pytest.mark.slow
def test_interrupt_cancels_the_cell_and_keeps_the_session(
        kernel: tuple[KernelManager, Any]) -> None:
    km, kc = kernel
    run(kc, "counter = 7")
    threading.Timer(1.0, km.interrupt_kernel).start()
    reply, _ = run(kc, "while True:\n    counter += 1")
    # the interrupt, not the 20 s time limit (that one is a MemexLimit)
    assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt"
    assert "interrupt" in reply["evalue"]
    _, msgs = run(kc, "counter")  # rolled back to the end of the previous cell
    assert msgs[-1]["content"]["data"]["text/plain"] == "7"


@pytest.mark.slow
def test_limits_from_the_kernelspec(limits_kernel: tuple[KernelManager, Any]) -> None:
    _, kc = limits_kernel
    started = time.monotonic()
    reply, _ = run(kc, "while True: pass")
    assert reply["ename"] == "MemexLimit" and "time limit" in reply["evalue"]
    assert time.monotonic() - started >= 3  # the kernelspec's limit, not another's
    reply, _ = run(kc, "hog = bytearray(1 << 30)")  # the kernelspec caps memory at 256 MiB
    assert reply["ename"] == "MemoryError"
    reply, _ = run(kc, "open('/data/new.txt', 'w')")  # the mount is read-only
    assert reply["status"] == "error"
    reply, msgs = run(kc, "2 + 2")
    assert reply["status"] == "ok" and msgs[-1]["content"]["data"]["text/plain"] == "4"


@pytest.mark.slow
def test_a_notebook_runs_with_nbclient(specs: KernelSpecManager, tmp_path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in (
        "import pandas as pd\ndf = pd.DataFrame({'n': [1, 2, 3]})",
        "import matplotlib.pyplot as plt\nplt.bar(df.n, df.n)\nNone",
        "while True:\n    df['n'] += 1",  # interrupted by nbclient's cell timeout
        "int(df.n.sum())",
    )]
    km = AsyncKernelManager(kernel_name="memex-test", kernel_spec_manager=specs)
    def timeout(cell: Any) -> int:  # only the loop is meant to hit it; a loaded CI is slow
        return 3 if cell.source.startswith("while") else 120

    client = NotebookClient(nb, km=km, timeout_func=timeout, interrupt_on_timeout=True,
                            allow_errors=True)
    client.execute()
    outs = [c.outputs for c in nb.cells]
    assert outs[0] == []
    assert outs[1][0]["output_type"] == "display_data" and "image/png" in outs[1][0]["data"]
    assert outs[2][0]["output_type"] == "error" and outs[2][0]["ename"] == "KeyboardInterrupt"
    assert outs[3][0]["data"]["text/plain"] == "6"  # the loop's changes were rolled back


def test_kernel_install_command_writes_the_kernelspec(tmp_path: Path) -> None:
    out = subprocess.run([MEMEX, "kernel", "install", "--name", "mx-cli", "--prefix",
                          str(tmp_path), "--timeout", "9", "--memory", "1G", "--mount",
                          f"{tmp_path}:/data"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    spec = json.loads((tmp_path / "share/jupyter/kernels/mx-cli/kernel.json").read_text())
    assert spec["interrupt_mode"] == "message" and spec["language"] == "python"
    assert spec["argv"][1:4] == ["-m", "memex.integrations.jupyter", "-f"]
    assert spec["argv"][5:7] == ["--timeout", "9.0"]
    assert str(1 << 30) in spec["argv"] and f"{tmp_path}:/data" in spec["argv"]
    assert kernelspec(timeout=9)["metadata"]["memex"]["timeout"] == 9


def test_tab_and_shift_tab_answer_from_the_sessions_state(kernel: tuple[KernelManager, Any]
                                                          ) -> None:
    """Completion sees the cells' variables and their attributes; inspection inside a call's
    parentheses shows the called function's signature and docstring; neither is a turn the
    history or the cell count sees."""
    _, kc = kernel
    reply, _ = run(kc, "def area(width, height=2):\n    'The area of a box.'\n"
                       "    return width * height\nbox_size = {'w': 3}")
    assert reply["status"] == "ok"
    count = reply["execution_count"]
    got = kc.complete("box_size.ke", 11, reply=True, timeout=30)["content"]
    assert got["matches"] == ["box_size.keys"] and got["cursor_start"] == 0, got
    got = kc.complete("x = are", 7, reply=True, timeout=30)["content"]
    assert "area" in got["matches"] and got["cursor_start"] == 4, got
    got = kc.inspect("area(3, ", 8, reply=True, timeout=30)["content"]
    assert got["found"] and "Signature: area(width, height=2)" in got["data"]["text/plain"]
    assert "The area of a box." in got["data"]["text/plain"]
    assert not kc.inspect("no_such_name", 5, reply=True, timeout=30)["content"]["found"]
    reply, _ = run(kc, "area(3)")
    assert reply["execution_count"] == count + 1  # the helpers were not cells


@pytest.mark.slow
def test_ipython_magics_shell_escapes_and_help_as_a_notebook_uses_them(
        kernel: tuple[KernelManager, Any]) -> None:
    """IPython's syntax, read by IPython's own transformer: the magics a sandbox runs answer
    as IPython's do; a shell escape, %pip and an unknown magic are a UsageError naming what
    to do instead; ``obj?`` opens the pager; help(obj) prints into the cell's output."""
    _, kc = kernel
    reply, msgs = run(kc, "%time total = sum(range(10))\ntotal")
    assert reply["status"] == "ok", reply
    assert "Wall time:" in printed(msgs) and msgs[-1]["content"]["data"]["text/plain"] == "45"
    reply, msgs = run(kc, "%timeit total + 1")
    assert "per loop (mean +- std. dev. of 7 runs" in printed(msgs), msgs
    reply, msgs = run(kc, "%%time\nsquares = [n * n for n in range(5)]")
    assert reply["status"] == "ok" and "Wall time:" in printed(msgs)
    _, msgs = run(kc, "%who int")  # the kernel is shared: other tests' ints are listed too
    names = printed(msgs).split()
    assert "total" in names and "squares" not in names, names
    _, msgs = run(kc, "%whos")
    text = printed(msgs)
    assert text.startswith("Variable") and "squares" in text and "[0, 1, 4, 9, 16]" in text
    _, msgs = run(kc, "%pwd")
    assert msgs[-1]["content"]["data"]["text/plain"].startswith("'/")
    run(kc, "%env MEMEX_NOTE=kept")
    _, msgs = run(kc, "%env MEMEX_NOTE")
    assert msgs[-1]["content"]["data"]["text/plain"] == "'kept'"
    reply, _ = run(kc, "%matplotlib inline\nx_inline = 1")
    assert reply["status"] == "ok"
    reply, _ = run(kc, "%%writefile /tmp/kept.txt\nfrom a cell\n")
    _, msgs = run(kc, "open('/tmp/kept.txt').read()")
    assert msgs[-1]["content"]["data"]["text/plain"] == "'from a cell\\n'"
    for code, words in (("!ls /tmp", "runs no shell commands"),
                        ("files = !ls", "runs no shell commands"),
                        ("%pip install humanize", "packages are not installed from a cell"),
                        ("%%bash\necho hi", "runs no shell commands"),
                        ("%nosuchmagic", "the MemEx kernel runs %time, %timeit")):
        reply, _ = run(kc, code)
        assert reply["status"] == "error" and reply["ename"] == "UsageError", (code, reply)
        assert words in reply["evalue"], (code, reply["evalue"])
    reply, _ = run(kc, "len?")
    (page,) = reply["payload"]
    assert page["source"] == "page" and "Return the number of items" in \
        page["data"]["text/plain"]
    reply, msgs = run(kc, "help(len)")
    assert reply["payload"] == [] and "Return the number of items" in printed(msgs)
    assert run(kc, "1 % 2")[1][-1]["content"]["data"]["text/plain"] == "1"  # not a magic


@pytest.mark.slow
def test_ipython_display_objects_are_display_data(kernel: tuple[KernelManager, Any]) -> None:
    _, kc = kernel
    png = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNk"
                           "YAAAAAYAAjCB0C8AAAAASUVORK5CYII=")
    run(kc, f"PNG = {png!r}")
    _, msgs = run(kc, "from IPython.display import HTML, JSON, Image, Markdown, Math, SVG, "
                      "display, clear_output\n"
                      "display(HTML('<b>x</b>'), Markdown('*y*'), Math('x^2'), JSON({'k': 1}),"
                      " Image(data=PNG), SVG('<svg/>'))\nclear_output(wait=True)")
    shown = [m["content"]["data"] for m in msgs if m["msg_type"] == "display_data"]
    assert [sorted(set(d) - {"text/plain"}) for d in shown] == [
        ["text/html"], ["text/markdown"], ["text/latex"], ["application/json"],
        ["image/png"], ["image/svg+xml"]]
    assert shown[2]["text/latex"] == "$\\displaystyle x^2$" and shown[3][
        "application/json"] == {"k": 1}
    assert base64.b64decode(shown[4]["image/png"]) == png
    assert [m["content"] for m in msgs if m["msg_type"] == "clear_output"] == [{"wait": True}]
    _, msgs = run(kc, "import IPython\nIPython.get_ipython() is get_ipython()")
    assert msgs[-1]["content"]["data"]["text/plain"] == "True"


@pytest.mark.slow
def test_help_output_lands_in_an_executed_notebook(specs: KernelSpecManager) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("help(len)"),
                nbformat.v4.new_code_cell("%time n = 2 ** 10\nn")]
    km = AsyncKernelManager(kernel_name="memex-test", kernel_spec_manager=specs)
    NotebookClient(nb, km=km, timeout=120).execute()
    outs = nb.cells[0].outputs
    assert {o["output_type"] for o in outs} == {"stream"}
    assert "Return the number of items" in "".join(o["text"] for o in outs)
    outs = nb.cells[1].outputs
    assert "Wall time" in "".join(o.get("text", "") for o in outs)
    assert outs[-1]["data"]["text/plain"] == "1024"
