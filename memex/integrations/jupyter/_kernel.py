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
import contextlib
import fnmatch
import re
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

from ipykernel.kernelbase import Kernel

from ...executor.internal import trim_traceback
from ...host_tools import Egress, EgressPolicy
from ...runtime_wasm import KERNEL_LIMITS, Door, Limits, Mount, Sandbox, TurnResult, TurnStatus
from .._display import BUNDLE_CALL, FIGURES_CALL, MAX_FIGURES, PRELUDE
from .._sandbox import LIMIT_WORDS
from ._ipython import IPYTHON_PRELUDE, check_complete, ipython_syntax

__all__ = ["KernelSettings", "MemexKernel"]

_LIMIT_WORDS = {**LIMIT_WORDS, "cancelled": "an interrupt"}  # a kernel is interrupted
MAX_HISTORY = 10_000  # cells kept for history requests
HISTORY_SESSION = 1


@dataclass(frozen=True, kw_only=True)
class KernelSettings:
    """The sandbox a kernel runs its cells in (from the kernelspec's arguments)."""

    limits: Limits = KERNEL_LIMITS
    mounts: tuple[Mount, ...] = ()
    preload: tuple[str, ...] = ()
    policy: str | None = None


SETTINGS = KernelSettings()  # set by the launcher before the kernel starts

# The kernel's own builtins in the guest: completion and inspection (names resolved by lookups
# and getattr only, nothing called), display() and clear_output() as in IPython, and help(obj)
# printed. Each answers over the door; the host runs them between cells. IPython's syntax and
# its display objects are _ipython.py's.
KERNEL_PRELUDE = r'''
def __memex_kernel_prelude__():
    import builtins, keyword, sys
    import memex_guest
    def resolve(dotted, imports=None):
        # a dotted name, by lookups and getattr only (nothing is called or indexed); a name
        # the code being edited imports but that has not run yet is imported for it
        parts = dotted.split(".")
        ns = sys.modules["__main__"].__dict__
        if parts[0] in ns:
            obj = ns[parts[0]]
        elif hasattr(builtins, parts[0]):
            obj = getattr(builtins, parts[0])
        elif imports and parts[0] in imports:
            import importlib
            module, _, attr = imports[parts[0]].partition(":")
            obj = importlib.import_module(module)
            if attr:
                obj = getattr(obj, attr)
        else:
            raise LookupError(parts[0])
        for part in parts[1:]:
            obj = getattr(obj, part)
        return obj
    def visible(name, stem):
        return name.startswith(stem) and (stem.startswith("_") or not name.startswith("_"))
    def complete(token, modules, imports=None):
        if modules:
            import pkgutil
            base, _, stem = token.rpartition(".")
            if base:
                try:
                    names = [m.name for m in pkgutil.iter_modules(
                        getattr(__import__(base, fromlist=["_"]), "__path__", []))]
                except Exception:
                    names = []
                found = [base + "." + n for n in names if visible(n, stem)]
            else:
                names = {m.name for m in pkgutil.iter_modules()}
                names.update(sys.builtin_module_names)
                found = [n for n in names if visible(n, stem)]
        elif "." in token:
            base, _, stem = token.rpartition(".")
            try:
                names = dir(resolve(base, imports))
            except Exception:
                names = []
            found = [base + "." + n for n in names if visible(n, stem)]
        else:
            names = set(sys.modules["__main__"].__dict__) | set(dir(builtins))
            names.update(keyword.kwlist)
            found = [n for n in names if visible(n, token)]
        memex_guest.call("kernel.reply", sorted(found)[:MAX_MATCHES])
    def inspect_(token, detail, imports=None):
        memex_guest.call("kernel.reply", describe(token, detail, imports))
    def describe(token, detail, imports=None):
        import inspect
        try:
            obj = resolve(token, imports)
        except Exception:
            return None
        lines = []
        try:
            lines.append("Signature: " + token + str(inspect.signature(obj)))
        except (TypeError, ValueError):
            pass
        lines.append("Type: " + type(obj).__name__)
        if not callable(obj) or isinstance(obj, type):
            text = repr(obj)
            lines.append("Value: " + (text if len(text) < 400 else text[:400] + "..."))
        doc = inspect.getdoc(obj)
        if doc:
            lines.append("Docstring:\n" + doc)
        if detail:
            try:
                lines.append("Source:\n" + inspect.getsource(obj))
            except (OSError, TypeError):
                pass
        return "\n".join(lines)[:MAX_TEXT]
    def display(*objs):
        for obj in objs:
            data = builtins.__memex_bundle_of__(obj)
            data["text/plain"] = repr(obj)[:MAX_TEXT]
            memex_guest.call("display.data", data)
    def clear_output(wait=False):
        memex_guest.call("display.clear", bool(wait))
    original = builtins.help
    class Help:
        """help(obj) prints obj's documentation as the cell's output (as in IPython, so it
        lands in an executed notebook; obj? opens the pager); help() as ever."""
        def __repr__(self):
            return repr(original)
        def __call__(self, *args, **kwargs):
            if len(args) != 1 or kwargs:
                return original(*args, **kwargs)
            import pydoc
            text = pydoc.render_doc(args[0], title="%s", renderer=pydoc.plaintext)
            print(text[:MAX_TEXT])
    builtins.__memex_complete__ = complete
    builtins.__memex_inspect__ = inspect_
    builtins.__memex_describe__ = describe
    builtins.display = display
    builtins.clear_output = clear_output
    builtins.help = Help()
__memex_kernel_prelude__()
del __memex_kernel_prelude__
'''.replace("MAX_MATCHES", "500").replace("MAX_TEXT", "65536")
EVENTS_CALL = "get_ipython().events.trigger(%r)\npass"
"""The guest's IPython callbacks of an event (_ipython.py), each one's error printed."""
HELPER_TIMEOUT = 5.0  # seconds a completion or an inspection may take in the guest
_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*$")
_IMPORT = re.compile(r"^\s*(?:import\s+|from\s+)[A-Za-z0-9_.]*$")
_IMPORT_LINE = re.compile(r"(?m)^[ \t]*import[ \t]+([\w. \t,]+)$")
_FROM_LINE = re.compile(r"(?m)^[ \t]*from[ \t]+([\w.]+)[ \t]+import[ \t]+([\w \t,()]+)$")


class MemexKernel(Kernel):
    implementation = "memex"
    implementation_version = version("memex")
    banner = ("MemEx: sandboxed CPython 3.15 on WebAssembly (numpy, pandas, matplotlib); "
              "state persists across cells; interrupts roll a cell back")
    # Python, with the IPython syntax notebooks use (_ipython.py turns it into calls)
    language_info = {  # noqa: RUF012 - the shape ipykernel's base class reads
        "name": "python", "version": "3.15", "mimetype": "text/x-python",
        "file_extension": ".py", "pygments_lexer": "python3",
        "codemirror_mode": {"name": "python", "version": 3}, "nbconvert_exporter": "python"}

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
        door.register("display.data", self._on_data, inline=True)
        door.register("display.clear", self._on_clear, inline=True)
        door.register("display.page", self._on_page, inline=True)
        door.register("kernel.reply", self._on_reply, inline=True)
        door.register("kernel.events", self._on_events, inline=True)
        self._events: set[str] = set()  # IPython events a guest callback waits for
        self._loop: asyncio.AbstractEventLoop | None = None  # the cell's, for its messages
        self._payload: list[dict[str, Any]] = []
        self._reply: Any = None
        self._history: list[tuple[int, str, str | None]] = []  # (line, input, output)
        self.sandbox = Sandbox(limits=self.settings.limits, mounts=self.settings.mounts,
                               preload=self.settings.preload, door=door)
        self.egress: Egress | None = None
        if self.settings.policy:
            self.egress = Egress(EgressPolicy.load(self.settings.policy),
                                 label="jupyter").attach(self.sandbox)
        # a front end shows output line by line, as a terminal does
        r = self.sandbox.run(PRELUDE + KERNEL_PRELUDE + IPYTHON_PRELUDE + "import sys\n"
                             "sys.stdout.reconfigure(line_buffering=True)\n",
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

    def _send_soon(self, kind: str, content: dict[str, Any]) -> None:
        """A message to the front end from the guest's thread, sent by the kernel's loop."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.send_response, self.iopub_socket, kind,
                                            content)

    def _on_data(self, bundle: object) -> None:
        if isinstance(bundle, dict):
            self._send_soon("display_data", {"data": _jsonable(bundle, keep_text=True),
                                             "metadata": {}})

    def _on_clear(self, wait: object) -> None:
        self._send_soon("clear_output", {"wait": bool(wait)})

    def _on_page(self, text: object) -> None:
        if isinstance(text, str):
            self._payload = [{"source": "page", "data": {"text/plain": text}, "start": 0}]

    def _on_reply(self, value: object) -> None:
        self._reply = value

    def _on_events(self, name: object) -> None:
        if name in ("pre_execute", "post_execute"):
            self._events.add(name)

    # ---- execution --------------------------------------------------------------------------
    async def do_execute(self, code: str, silent: bool, store_history: bool = True,
                         user_expressions: object = None, allow_stdin: bool = False, *,
                         cell_meta: object = None, cell_id: object = None) -> dict[str, Any]:
        count = self.execution_count  # the base class counts (and announces) the cell
        loop = self._loop = asyncio.get_running_loop()
        self._payload = []

        def on_output(stream: str, text: str) -> None:
            if not silent:
                loop.call_soon_threadsafe(self._stream, stream, text)

        with self._sigint_interrupts():
            source = ipython_syntax(code)  # %magics, !cmd, obj? as calls the guest answers
            r, figures, bundle = await loop.run_in_executor(
                None, lambda: self._run(source, f"<cell-{count}>", on_output))
        if not silent:
            for png in figures:
                self.send_response(self.iopub_socket, "display_data", {
                    "data": {"image/png": _b64(png), "text/plain": "<Figure>"},
                    "metadata": {}})
            if r.ok and r.value is not None:
                data = {"text/plain": r.value, **_jsonable(bundle)}
                self.send_response(self.iopub_socket, "execute_result", {
                    "execution_count": count, "data": data, "metadata": {}})
        if store_history and not silent:
            self._history.append((count, code, r.value if r.ok else None))
            del self._history[:-MAX_HISTORY]
        if r.ok:
            return {"status": "ok", "execution_count": count, "payload": self._payload,
                    "user_expressions": {}}
        error = _error_content(r)
        if not silent:
            self.send_response(self.iopub_socket, "error", error)
        return {"status": "error", "execution_count": count, **error}

    def _run(self, code: str, filename: str, on_output: Any
             ) -> tuple[TurnResult, list[bytes], dict[str, Any]]:
        with self._lock:
            self._figures, self._bundle = [], {}
            if "pre_execute" in self._events:
                self.sandbox.run(EVENTS_CALL % "pre_execute", filename="<memex-events>",
                                 on_output=on_output)
            r = self.sandbox.run(code, filename=filename, on_output=on_output)
            if r.status is not TurnStatus.KILLED:
                if "post_execute" in self._events:
                    self.sandbox.run(EVENTS_CALL % "post_execute", filename="<memex-events>",
                                     on_output=on_output)
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
        """IPython's own answer (it knows ``obj?`` and ``%magic`` lines are complete)."""
        status, indent = check_complete(code)
        if status == "incomplete":
            return {"status": "incomplete", "indent": " " * (indent or 0)}
        return {"status": status if status in ("complete", "invalid") else "unknown"}

    async def do_complete(self, code: str, cursor_pos: int) -> dict[str, Any]:
        cursor = len(code) if cursor_pos is None else max(0, min(cursor_pos, len(code)))
        line = code[code.rfind("\n", 0, cursor) + 1:cursor]
        found = _TOKEN.search(line)
        token = found.group(0) if found else ""
        matches: list[str] = []
        if token or _IMPORT.match(line):
            got = await self._helper(f"__memex_complete__({token!r}, "
                                     f"{bool(_IMPORT.match(line))}, {_imports(code)!r})\npass")
            matches = [m for m in got if isinstance(m, str)] if isinstance(got, list) else []
        return {"status": "ok", "matches": matches, "cursor_start": cursor - len(token),
                "cursor_end": cursor, "metadata": {}}

    async def do_inspect(self, code: str, cursor_pos: int, detail_level: int = 0,
                         omit_sections: object = ()) -> dict[str, Any]:
        token = _name_at(code, len(code) if cursor_pos is None else cursor_pos)
        text = await self._helper(f"__memex_inspect__({token!r}, {bool(detail_level)}, "
                                  f"{_imports(code)!r})\npass") if token else None
        found = isinstance(text, str)
        return {"status": "ok", "found": found, "metadata": {},
                "data": {"text/plain": text} if found else {}}

    async def _helper(self, call: str) -> Any:
        """What a kernel builtin answered over the door (None when it could not run: a cell
        holds the guest, or it ran past HELPER_TIMEOUT)."""
        def go() -> Any:
            if not self._lock.acquire(timeout=HELPER_TIMEOUT):
                return None
            try:
                self._reply = None
                r = self.sandbox.run(call, timeout=HELPER_TIMEOUT, filename="<memex-kernel>")
                return self._reply if r.ok else None
            finally:
                self._lock.release()
        return await asyncio.get_running_loop().run_in_executor(None, go)

    async def do_history(self, hist_access_type: str, output: bool, raw: bool,
                         session: int | None = None, start: int | None = None,
                         stop: int | None = None, n: int | None = None,
                         pattern: str | None = None, unique: bool = False
                         ) -> dict[str, Any]:
        """The cells of this kernel's session (one session, numbered 1), newest last."""
        rows = list(self._history)
        if hist_access_type == "range":
            lo = 1 if start is None else start
            rows = [h for h in rows if h[0] >= lo and (stop is None or h[0] < stop)]
        elif hist_access_type == "search":
            rows = [h for h in rows if fnmatch.fnmatchcase(h[1], pattern or "*")]
            if unique:
                last = {h[1]: h for h in rows}
                rows = [h for h in rows if last[h[1]] is h]
        if hist_access_type in ("tail", "search") and n is not None:
            rows = rows[-n:] if n > 0 else []
        return {"status": "ok", "history": [
            (HISTORY_SESSION, line, (text, out) if output else text)
            for line, text, out in rows]}

    async def do_shutdown(self, restart: bool) -> dict[str, Any]:
        if self.egress is not None:
            self.egress.detach()
        self.sandbox.close()
        return {"status": "ok", "restart": restart}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _jsonable(bundle: dict[str, Any], keep_text: bool = False) -> dict[str, Any]:
    """A mime bundle as the protocol carries it: binary images as base64 text."""
    return {k: _b64(v) if isinstance(v, bytes) else v for k, v in bundle.items()
            if isinstance(k, str) and (keep_text or k != "text/plain")}


def _imports(code: str) -> dict[str, str]:
    """The names the code's import statements bind: alias -> ``module`` or ``module:attr``
    (read from its lines, as code being edited need not parse)."""
    out: dict[str, str] = {}
    for m in _IMPORT_LINE.finditer(code):
        for item in m.group(1).split(","):
            parts = item.split()
            if not parts or not re.fullmatch(r"[A-Za-z_][\w.]*", parts[0]):
                continue
            if len(parts) == 3 and parts[1] == "as":  # import a.b as x: x is a.b
                out[parts[2]] = parts[0]
            elif len(parts) == 1:  # import a.b: a is a
                root = parts[0].split(".")[0]
                out[root] = root
    for m in _FROM_LINE.finditer(code):
        for item in m.group(2).split(","):
            parts = item.strip(" ()").split()
            if parts and parts[0].isidentifier():
                alias = parts[2] if len(parts) == 3 and parts[1] == "as" else parts[0]
                out[alias] = f"{m.group(1)}:{parts[0]}"
    return dict(list(out.items())[:64])


def _name_at(code: str, cursor: int) -> str:
    """The dotted name under the cursor, else the one called by the innermost open call
    before it (``print(`` inspects print), as front ends expect for Shift-Tab."""
    cursor = max(0, min(cursor, len(code)))
    left = re.search(r"[A-Za-z_][A-Za-z0-9_.]*$", code[:cursor])
    right = re.match(r"[A-Za-z0-9_]*", code[cursor:])
    name = (left.group(0) if left else "") + (right.group(0) if right and left else "")
    if name:
        return name.rstrip(".")
    depth, i = 0, cursor - 1
    while i >= 0:
        ch = code[i]
        if ch == ")":
            depth += 1
        elif ch == "(":
            if depth == 0:
                called = re.search(r"[A-Za-z_][A-Za-z0-9_.]*$", code[:i])
                return called.group(0) if called else ""
            depth -= 1
        i -= 1
    return ""


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
