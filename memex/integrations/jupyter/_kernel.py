"""A Jupyter kernel whose cells run in one MemEx sandbox per kernel (ipykernel's kernel base),
so JupyterLab, nbclient, papermill and every tool that speaks the kernel protocol can use a
capped, persistent CPython-on-WASI session.

A cell's stdout and stderr are streamed as the guest writes them; its final value is an
``execute_result`` with the rich reprs the value offers (a DataFrame's HTML table); matplotlib
figures left open are ``display_data`` PNGs; an exception is an ``error`` with the trimmed
traceback; a cell a limit stopped is an error naming the limit (the session is as it was
before the cell). An interrupt (the kernelspec asks for interrupts as messages; SIGINT works
too) cancels the running cell with rollback: the kernel stays up with its state.
"""

from __future__ import annotations

import asyncio
import base64
import codeop
import contextlib
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

from ipykernel.kernelbase import Kernel

from ...executor.loops import trim_traceback
from ...host_tools import Egress, EgressPolicy
from ...runtime_wasm import KERNEL_LIMITS, Door, Limits, Mount, Sandbox, TurnResult, TurnStatus
from .._display import BUNDLE_CALL, FIGURES_CALL, MAX_FIGURES, PRELUDE
from .._sandbox import LIMIT_WORDS

__all__ = ["KernelSettings", "MemexKernel"]

_LIMIT_WORDS = {**LIMIT_WORDS, "cancelled": "an interrupt"}  # a kernel is interrupted


@dataclass(frozen=True, kw_only=True)
class KernelSettings:
    """The sandbox a kernel runs its cells in (from the kernelspec's arguments)."""

    limits: Limits = KERNEL_LIMITS
    mounts: tuple[Mount, ...] = ()
    preload: tuple[str, ...] = ()
    policy: str | None = None


SETTINGS = KernelSettings()  # set by the launcher before the kernel starts


class MemexKernel(Kernel):
    implementation = "memex"
    implementation_version = version("memex")
    banner = ("MemEx: sandboxed CPython 3.15 on WebAssembly (numpy, pandas, matplotlib); "
              "state persists across cells; interrupts roll a cell back")
    language_info = {  # noqa: RUF012 - the shape ipykernel's base class reads
        "name": "python", "version": "3.15", "mimetype": "text/x-python",
        "file_extension": ".py", "pygments_lexer": "ipython3",
        "codemirror_mode": {"name": "ipython", "version": 3}, "nbconvert_exporter": "python"}

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.settings = SETTINGS
        self._figures: list[bytes] = []
        self._bundle: dict[str, Any] = {}
        self._pyplot = False
        door = Door()
        door.register("display.figure", self._on_figure, inline=True)
        door.register("display.pyplot", self._on_pyplot, inline=True)
        door.register("display.bundle", self._on_bundle, inline=True)
        self.sandbox = Sandbox(limits=self.settings.limits, mounts=self.settings.mounts,
                               preload=self.settings.preload, door=door)
        self.egress: Egress | None = None
        if self.settings.policy:
            self.egress = Egress(EgressPolicy.load(self.settings.policy),
                                 label="jupyter").attach(self.sandbox)
        # a front end shows output line by line, as a terminal does
        r = self.sandbox.run(PRELUDE + "import sys\nsys.stdout.reconfigure(line_buffering=True)\n",
                             filename="<memex-kernel-prelude>")
        if r.status is not TurnStatus.OK:
            raise RuntimeError(f"the kernel's guest could not be prepared: {r.exception}")
        self._lock = threading.Lock()

    # ---- door ops the guest calls after a cell ------------------------------------------------
    def _on_figure(self, png: object) -> None:
        if isinstance(png, bytes) and len(self._figures) < MAX_FIGURES:
            self._figures.append(png)

    def _on_pyplot(self) -> None:
        self._pyplot = True

    def _on_bundle(self, bundle: object) -> None:
        if isinstance(bundle, dict):
            self._bundle = bundle

    # ---- execution --------------------------------------------------------------------------
    async def do_execute(self, code: str, silent: bool, store_history: bool = True,
                         user_expressions: object = None, allow_stdin: bool = False, *,
                         cell_meta: object = None, cell_id: object = None) -> dict[str, Any]:
        count = self.execution_count  # the base class counts (and announces) the cell
        loop = asyncio.get_running_loop()

        def on_output(stream: str, text: str) -> None:
            if not silent:
                loop.call_soon_threadsafe(self._stream, stream, text)

        with self._sigint_interrupts():
            r, figures, bundle = await loop.run_in_executor(
                None, lambda: self._run(code, f"<cell-{count}>", on_output))
        if not silent:
            for png in figures:
                self.send_response(self.iopub_socket, "display_data", {
                    "data": {"image/png": _b64(png), "text/plain": "<Figure>"},
                    "metadata": {}})
            if r.ok and r.value is not None:
                data = {"text/plain": r.value, **_jsonable(bundle)}
                self.send_response(self.iopub_socket, "execute_result", {
                    "execution_count": count, "data": data, "metadata": {}})
        if r.ok:
            return {"status": "ok", "execution_count": count, "payload": [],
                    "user_expressions": {}}
        error = _error_content(r)
        if not silent:
            self.send_response(self.iopub_socket, "error", error)
        return {"status": "error", "execution_count": count, **error}

    def _run(self, code: str, filename: str, on_output: Any
             ) -> tuple[TurnResult, list[bytes], dict[str, Any]]:
        with self._lock:
            self._figures, self._bundle = [], {}
            r = self.sandbox.run(code, filename=filename, on_output=on_output)
            if r.status is not TurnStatus.KILLED:
                if self._pyplot:
                    self.sandbox.run(FIGURES_CALL, filename="<memex-figures>")
                if r.ok and r.value is not None:
                    self.sandbox.run(BUNDLE_CALL, filename="<memex-bundle>")
            return r, list(self._figures), dict(self._bundle)

    def _stream(self, name: str, text: str) -> None:
        self.send_response(self.iopub_socket, "stream", {"name": name, "text": text})

    # ---- interrupts -------------------------------------------------------------------------
    async def interrupt_request(self, stream: Any, ident: Any, parent: Any) -> None:
        """An interrupt message (the kernelspec's interrupt_mode): cancel the running cell."""
        self.sandbox.interrupt()
        if self.session is not None:
            self.session.send(stream, "interrupt_reply", {"status": "ok"}, parent, ident=ident)

    @contextlib.contextmanager
    def _sigint_interrupts(self) -> Iterator[None]:
        """While a cell runs, SIGINT (a front end using signals) cancels it too."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.signal(signal.SIGINT, lambda *_: self.sandbox.interrupt())
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    # ---- the rest of the protocol ----------------------------------------------------------
    async def do_is_complete(self, code: str) -> dict[str, Any]:
        try:
            done = codeop.compile_command(code, "<cell>", "single") is not None
        except (SyntaxError, ValueError, OverflowError):
            return {"status": "invalid"}
        return {"status": "complete"} if done else {"status": "incomplete", "indent": "    "}

    async def do_shutdown(self, restart: bool) -> dict[str, Any]:
        if self.egress is not None:
            self.egress.detach()
        self.sandbox.close()
        return {"status": "ok", "restart": restart}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _jsonable(bundle: dict[str, Any]) -> dict[str, Any]:
    """A mime bundle as the protocol carries it: binary images as base64 text."""
    return {k: _b64(v) if isinstance(v, bytes) else v for k, v in bundle.items()
            if k != "text/plain"}


def _error_content(r: TurnResult) -> dict[str, Any]:
    exc = r.exception
    if exc is not None:
        tb = trim_traceback(exc.traceback) if exc.traceback else f"{exc.type}: {exc.message}"
        return {"ename": exc.type.rsplit(".", 1)[-1], "evalue": exc.message,
                "traceback": tb.rstrip("\n").splitlines()}
    if r.status is TurnStatus.EXIT:
        return {"ename": "SystemExit", "evalue": str(r.exit_code),
                "traceback": [f"SystemExit: {r.exit_code} (the session goes on)"]}
    what = _LIMIT_WORDS.get(r.limit or "", r.limit or "a limit")
    name = "KeyboardInterrupt" if r.limit == "cancelled" else "MemexLimit"
    undone = " Variables are as they were before it." if r.rolled_back else ""
    return {"ename": name, "evalue": f"the cell was stopped by {what}",
            "traceback": [f"{name}: the cell was stopped by {what}.{undone}"]}
