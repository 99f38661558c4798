"""The part of IPython a notebook from elsewhere leans on, in the MemEx kernel: its syntax
(``%magic``, ``%%cell magic``, ``!cmd``, ``obj?``) read by IPython's own input transformer
on the host, and a small IPython in the guest that answers what that syntax becomes
(``get_ipython().run_line_magic(...)``), with ``IPython.display``'s common objects.

What runs in a sandbox does: ``%time``, ``%timeit`` (and their cell forms), ``%who``,
``%whos``, ``%pwd``, ``%env``, ``%matplotlib inline`` (figures are inline already),
``%%writefile``, ``obj?`` and ``obj??`` (the front end's pager). What cannot (``!cmd``,
``%pip``, ``%%bash``, any other magic) raises ``UsageError`` naming what to do instead.
The guest never sees IPython syntax: a cell holding none is passed through unchanged.
"""

from __future__ import annotations

__all__ = ["IPYTHON_PRELUDE", "check_complete", "ipython_syntax"]

_MARKS = ("%", "!", "?")


def ipython_syntax(code: str) -> str:
    """``code`` with IPython's syntax turned into calls of the guest's ``get_ipython()``
    (IPython's own transformer, which tokenizes: a ``%`` or ``?`` inside a string or an
    expression is left alone); unchanged when it holds none."""
    if not any(mark in code for mark in _MARKS):
        return code
    from IPython.core.inputtransformer2 import TransformerManager

    try:
        out: str = TransformerManager().transform_cell(code)  # type: ignore[no-untyped-call]
    except Exception:  # what it cannot read, the guest's compiler reports
        return code
    return code if out.rstrip("\n") == code.rstrip("\n") else out


def check_complete(code: str) -> tuple[str, int | None]:
    """IPython's answer to "is this cell complete?" (``complete``, ``incomplete`` with the
    indent the next line takes, or ``invalid``), which knows its own syntax."""
    from IPython.core.inputtransformer2 import TransformerManager

    manager = TransformerManager()  # type: ignore[no-untyped-call]
    status, indent = manager.check_complete(code)
    return str(status), indent if isinstance(indent, int) else None


# Runs in the guest after the kernel's prelude (display, clear_output, __memex_describe__).
IPYTHON_PRELUDE = r'''
def __memex_ipython_prelude__():
    import builtins, os, sys, time, types
    import memex_guest
    main = sys.modules["__main__"].__dict__
    hidden = set(main)  # what the kernel put there: %who does not list it

    class UsageError(Exception):
        """A magic used wrongly, or one the sandbox does not run (as IPython's)."""

    NO_SHELL = ("the sandbox runs no shell commands (it has no processes): use Python "
                "instead, e.g. os.listdir(), pathlib.Path(...).read_text(), shutil")
    NO_PIP = ("packages are not installed from a cell: the sandbox's interpreter has "
              "numpy, pandas, scipy and matplotlib; others come with the session when "
              "it is opened (docs/packages.md)")
    LINE = ("time", "timeit", "who", "whos", "pwd", "env", "matplotlib", "pinfo", "pinfo2")
    CELL = ("time", "timeit", "writefile")

    def _clock():
        try:
            return time.process_time()
        except OSError:
            return None

    def _seconds(s):
        for unit, scale in (("s", 1.0), ("ms", 1e3), ("us", 1e6), ("ns", 1e9)):
            if s * scale >= 1 or unit == "ns":
                return "%.3g %s" % (s * scale, unit)

    def _time(source):
        try:
            code, value_of = compile(source, "<timed>", "eval"), True
        except SyntaxError:
            code, value_of = compile(source, "<timed>", "exec"), False
        cpu, wall = _clock(), time.perf_counter()
        out = eval(code, main) if value_of else (exec(code, main), None)[1]
        wall, cpu_end = time.perf_counter() - wall, _clock()
        if cpu is not None and cpu_end is not None:
            print("CPU times: total: %s" % _seconds(cpu_end - cpu))
        print("Wall time: %s" % _seconds(wall))
        return out

    def _timeit(source, setup="pass"):
        import statistics, timeit
        timer = timeit.Timer(source, setup, globals=main)
        loops, _ = timer.autorange()
        runs = [t / loops for t in timer.repeat(7, loops)]
        spread = statistics.stdev(runs) if len(runs) > 1 else 0.0
        print("%s +- %s per loop (mean +- std. dev. of %d runs, %d loop%s each)" % (
            _seconds(statistics.mean(runs)), _seconds(spread), len(runs), loops,
            "" if loops == 1 else "s"))

    def _user_names():
        return sorted(n for n in main if not n.startswith("_") and n not in hidden
                      and not isinstance(main[n], types.ModuleType))

    def _who(line):
        names = _user_names()
        if line.split():
            wanted = set(line.split())
            names = [n for n in names if type(main[n]).__name__ in wanted]
        print("\t".join(names) if names else "Interactive namespace is empty.")

    def _whos(line):
        names = _user_names()
        if not names:
            print("Interactive namespace is empty.")
            return
        rows = []
        for n in names:
            text = repr(main[n]).replace("\n", " ")
            rows.append((n, type(main[n]).__name__, text if len(text) <= 60 else text[:57] + "..."))
        w1 = max(8, *(len(r[0]) for r in rows))
        w2 = max(4, *(len(r[1]) for r in rows))
        print("%-*s   %-*s   Data/Info" % (w1, "Variable", w2, "Type"))
        print("-" * (w1 + w2 + 18))
        for r in rows:
            print("%-*s   %-*s   %s" % (w1, r[0], w2, r[1], r[2]))

    def _env(line):
        line = line.strip()
        if not line:
            return dict(os.environ)
        if "=" in line or " " in line:
            name, _, value = line.partition("=") if "=" in line else line.partition(" ")
            os.environ[name.strip()] = value.strip()
            print("env: %s=%s" % (name.strip(), value.strip()))
            return None
        if line not in os.environ:
            raise UsageError("Environment does not have key: %s" % line)
        return os.environ[line]

    def _pinfo(name, detail):
        text = builtins.__memex_describe__(name.strip(), detail)
        if text is None:
            print("Object `%s` not found." % name.strip())
        else:
            memex_guest.call("display.page", text)

    class Events:
        """IPython's pre_execute and post_execute callbacks (matplotlib registers one), fired
        by the kernel around each cell once one is registered."""
        def __init__(self):
            self.callbacks = {"pre_execute": [], "post_execute": []}
        def register(self, name, fn):
            if name not in self.callbacks:
                raise UsageError("the MemEx kernel fires pre_execute and post_execute only, "
                                 "not %s" % name)
            self.callbacks[name].append(fn)
            memex_guest.call("kernel.events", name)
        def unregister(self, name, fn):
            self.callbacks.get(name, []).remove(fn)
        def trigger(self, name):
            import traceback
            for fn in list(self.callbacks.get(name, [])):
                try:
                    fn()
                except Exception:
                    print("Error in callback %r (for %s):" % (fn, name), file=sys.stderr)
                    traceback.print_exc()

    class Shell:
        """What ``get_ipython()`` gives in the MemEx kernel: the magics a sandbox runs."""
        user_ns = main
        config = {}  # no IPKernelApp here: libraries that look for widgets fall back
        events = Events()

        def enable_gui(self, gui=None):
            return None  # no GUI event loop in a sandbox; figures are shown inline

        def run_line_magic(self, name, line, _stack_depth=1):
            if name == "time":
                return _time(line)
            if name == "timeit":
                return _timeit(line)
            if name == "who":
                return _who(line)
            if name == "whos":
                return _whos(line)
            if name == "pwd":
                return os.getcwd()
            if name == "env":
                return _env(line)
            if name in ("pinfo", "pinfo2"):
                return _pinfo(line, name == "pinfo2")
            if name == "matplotlib":
                if line.strip() in ("", "inline"):
                    return None  # figures left open are shown after each cell already
                raise UsageError("%%matplotlib %s: the MemEx kernel shows figures inline "
                                 "only (as PNG images after the cell)" % line.strip())
            if name in ("pip", "conda", "mamba", "uv"):
                raise UsageError("%%%s: %s" % (name, NO_PIP))
            if name in ("sx", "system", "sc"):
                raise UsageError("%%%s: %s" % (name, NO_SHELL))
            raise UsageError("Line magic function `%%%s` not found: the MemEx kernel runs "
                             "%s" % (name, ", ".join("%" + m for m in LINE[:-2])))

        def run_cell_magic(self, name, line, cell):
            if name == "time":
                return _time(cell)
            if name == "timeit":
                return _timeit(cell, line.strip() or "pass")
            if name == "writefile":
                parts = line.split()
                append = "-a" in parts or "--append" in parts
                path = [p for p in parts if not p.startswith("-")]
                if len(path) != 1:
                    raise UsageError("%%writefile [-a] PATH")
                with open(path[0], "a" if append else "w") as f:
                    f.write(cell)
                print("%s %s" % ("Appending to" if append else "Writing", path[0]))
                return None
            if name in ("bash", "sh", "script", "system", "sx", "perl", "ruby", "js",
                        "javascript", "html", "svg", "latex", "markdown", "capture"):
                if name in ("html", "svg", "latex", "markdown"):
                    from IPython import display as d
                    cls = {"html": d.HTML, "svg": d.SVG, "latex": d.Latex,
                           "markdown": d.Markdown}[name]
                    builtins.display(cls(cell))
                    return None
                raise UsageError("%%%%%s: %s" % (name, NO_SHELL if name != "capture" else
                                 "output capture is not available; redirect with "
                                 "contextlib.redirect_stdout"))
            raise UsageError("Cell magic `%%%%%s` not found: the MemEx kernel runs %s" % (
                name, ", ".join("%%" + m for m in CELL)))

        def system(self, cmd):
            raise UsageError("!%s: %s" % (cmd, NO_SHELL))

        def getoutput(self, cmd, split=True, depth=0):
            raise UsageError("!%s: %s" % (cmd, NO_SHELL))

        def __repr__(self):
            return "<MemEx kernel shell>"

    shell = Shell()

    def get_ipython():
        return shell

    # IPython.display: the objects notebooks build, each a value display() shows
    class _Data:
        def __init__(self, data=None, url=None, filename=None, metadata=None):
            if data is None and filename is not None:
                with open(filename, "rb" if self._binary else "r") as f:
                    data = f.read()
            self.data, self.url, self.filename, self.metadata = data, url, filename, metadata
        _binary = False
        def __repr__(self):
            return "<%s object>" % type(self).__name__
    class HTML(_Data):
        def _repr_html_(self):
            return self.data
    class Markdown(_Data):
        def _repr_markdown_(self):
            return self.data
    class Latex(_Data):
        def _repr_latex_(self):
            return self.data
    class Math(_Data):
        def _repr_latex_(self):
            text = (self.data or "").strip().strip("$")
            return "$\\displaystyle %s$" % text
    class SVG(_Data):
        def _repr_svg_(self):
            return self.data
    class JSON(_Data):
        def __init__(self, data=None, url=None, filename=None, expanded=False, **kwargs):
            if isinstance(data, str) and filename is None:
                import json
                data = json.loads(data)
            super().__init__(data, url, filename)
            if filename is not None:
                import json
                self.data = json.loads(self.data)
        def _repr_json_(self):
            return self.data
    class Pretty(_Data):
        def __repr__(self):
            return str(self.data)
    class Image(_Data):
        _binary = True
        def __init__(self, data=None, url=None, filename=None, format=None, width=None,
                     height=None, **kwargs):
            if isinstance(data, str) and filename is None and url is None:
                filename, data = data, None  # IPython takes a path as its first argument
            super().__init__(data, url, filename)
            fmt = (format or (filename or "").rsplit(".", 1)[-1] or "png").lower()
            self.format = "jpeg" if fmt in ("jpg", "jpeg") else fmt
            self.width, self.height = width, height
        def _repr_png_(self):
            return self.data if self.format == "png" else None
        def _repr_jpeg_(self):
            return self.data if self.format == "jpeg" else None

    def display_html(*objs, raw=False):
        builtins.display(*(HTML(o) if raw else o for o in objs))
    def display_markdown(*objs, raw=False):
        builtins.display(*(Markdown(o) if raw else o for o in objs))

    ipython = types.ModuleType("IPython", "The MemEx kernel's IPython: the display "
                               "objects and the magics a sandbox runs.")
    display = types.ModuleType("IPython.display")
    for name, obj in (("display", builtins.display), ("clear_output", builtins.clear_output),
                      ("HTML", HTML), ("Markdown", Markdown), ("Latex", Latex),
                      ("Math", Math), ("SVG", SVG), ("JSON", JSON), ("Pretty", Pretty),
                      ("Image", Image), ("display_html", display_html),
                      ("display_markdown", display_markdown)):
        setattr(display, name, obj)
    core = types.ModuleType("IPython.core")
    error = types.ModuleType("IPython.core.error")
    error.UsageError = UsageError
    core.error, core.display = error, display
    ipython.display, ipython.core, ipython.get_ipython = display, core, get_ipython
    # the IPython API level its parts follow (matplotlib asks, to choose how to find a GUI)
    ipython.version_info, ipython.__version__ = (9, 0, 0, "memex"), "9.0.0+memex"
    sys.modules.update({"IPython": ipython, "IPython.display": display,
                        "IPython.core": core, "IPython.core.display": display,
                        "IPython.core.error": error})
    builtins.get_ipython = get_ipython
__memex_ipython_prelude__()
del __memex_ipython_prelude__
'''
