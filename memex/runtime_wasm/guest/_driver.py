# Runs inside the guest (CPython on WASI). Imports nothing from the host packages.
# The host execs this file once per fresh guest; it installs `__memex_turn__` in builtins.
# Each turn runs the cell in __main__ (a final expression is evaluated and its repr reported,
# like a REPL) and reports the outcome through the door's control channel.
#
# The cell reaches the driver in one of two ways:
# * the turn's source is `__memex_turn__()` and the driver pulls the cell with a control
#   request (`B`: reply u32 filename length, filename, code; all UTF-8);
# * the turn's source is `__memex_turn__()` + "\n#" + filename + TAB + code, both with the
#   `unicode_escape` codec (one ASCII line: no tab or newline can occur inside). A driver of
#   an older image runs the first line and ignores the comment, so hosts may always send it.
# The reactor's `_reactor._run_turn` is wrapped so that such a source goes straight to the
# driver, without the reactor parsing and compiling `__memex_turn__()` first.
# The report (`E` + `o` ok, `v` + repr of the value, `j` + a JSON record) ends the turn; an
# inline cell that ran without error and has no value sends none (the host takes a turn that
# returned 0 without a report as that).
import builtins as _b


def _install():
    import _codecs
    import _host
    import ast
    import sys
    import warnings  # noqa: F401 - imported so that compile warnings go through it

    main = sys.modules["__main__"]
    ctl = b"\x00MX"
    inline = "__memex_turn__()\n#"
    end_ok = ctl + b"Eo"  # not sent for an inline cell: its turn returning normally says it
    max_repr = 65536
    counter = [0]
    flags = getattr(ast, "PyCF_ALLOW_TOP_LEVEL_AWAIT", 0)

    def _short(text, limit):
        if len(text) > limit:
            return text[:limit] + "... [%d characters elided]" % (len(text) - limit)
        return text

    def _drive(coro):
        # A cell with top-level await runs on MemEx's guest event loop (asyncio.run's own loop
        # needs a socketpair that WASI lacks); concurrent tool calls there go out as one batch.
        from memex_guest.aio import run_cell

        return run_cell(coro)

    def _run(code, mode, ns):
        if code.co_flags & 0x80:  # CO_COROUTINE: the cell used top-level await
            return _drive(eval(code, ns))
        if mode == "eval":
            return eval(code, ns)
        exec(code, ns)
        return None

    def _user_tb(tb):
        # The traceback without the driver's own frames: the ones that run the cell (at the
        # start) and the ones of its helpers the cell can reach (e.g. the socket refusal, at
        # the end), so that tracebacks show only the cell's code and what it called.
        kept = []
        while tb is not None:
            if tb.tb_frame.f_code.co_filename != __file__:
                kept.append(tb)
            tb = tb.tb_next
        for i in range(len(kept) - 1):
            if kept[i].tb_next is not kept[i + 1]:
                kept[i].tb_next = kept[i + 1]
        if kept and kept[-1].tb_next is not None:
            kept[-1].tb_next = None
        return kept[0] if kept else None

    def _clean(exc):
        # ... for the exception and every one chained to it or grouped in it.
        todo = [exc]
        seen = set()
        while todo:
            exc = todo.pop()
            if exc is None or id(exc) in seen:
                continue
            seen.add(id(exc))
            try:
                exc.__traceback__ = _user_tb(exc.__traceback__)
            except BaseException:
                pass
            if isinstance(exc, BaseExceptionGroup):
                todo.extend(exc.exceptions)
            todo.append(exc.__cause__)
            if not exc.__suppress_context__:
                todo.append(exc.__context__)

    def _exc_record(exc):
        _clean(exc)
        import traceback  # ~50 ms the first time: paid only when a cell raises

        lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
        name = type(exc).__qualname__
        mod = type(exc).__module__
        if mod not in ("builtins", "__main__"):
            name = mod + "." + name
        try:
            message = str(exc)
        except BaseException:
            message = "<unprintable %s>" % name
        return {
            "type": name,
            "message": _short(message, 8192),
            "traceback": _short("".join(lines), 65536),
        }

    # Compiled cells by source, so that running the same cell again skips the parser and the
    # compiler (most of a small turn's cost). Only compiles that showed no warning are kept,
    # under the warning filters they ran with: a hit then behaves exactly like a recompile
    # (code objects are immutable; only co_filename differs and is replaced).
    cache = {}
    # Cell sources for tracebacks (linecache), the last `sources_max` cells.
    import linecache
    sources = []
    sources_max = 256
    cache_max = 256
    cache_src_max = 1 << 16
    code_type = type(_short.__code__)

    def _refile(code, filename):
        consts = code.co_consts
        for c in consts:
            if type(c) is code_type:
                consts = tuple(_refile(c, filename) if type(c) is code_type else c
                               for c in consts)
                return code.replace(co_filename=filename, co_consts=consts)
        return code.replace(co_filename=filename)

    def _compile(src, filename):
        try:
            w = sys.modules["warnings"]
            state = (tuple(w.filters), getattr(w, "defaultaction", None))
            show = w._showwarnmsg
        except BaseException:  # an unusual warnings module: no cache, no spy
            w = state = None
        hit = cache.get(src) if state is not None else None
        if hit is not None and hit[3] == state:
            name, body, tail = hit[0], hit[1], hit[2]
            if name != filename:
                body = _refile(body, filename)
                tail = _refile(tail, filename) if tail is not None else None
            return body, tail
        shown = []
        if w is not None:
            def spy(msg):
                shown.append(1)
                return show(msg)

            w._showwarnmsg = spy
        try:
            tree = ast.parse(src, filename, "exec", type_comments=False)
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            body = compile(tree, filename, "exec", flags=flags)
            tail = compile(last, filename, "eval", flags=flags) if last else None
        finally:
            if w is not None and w._showwarnmsg is spy:
                w._showwarnmsg = show
        if w is not None and not shown and len(src) <= cache_src_max:
            if len(cache) >= cache_max:
                del cache[next(iter(cache))]
            cache[src] = (filename, body, tail, state)
        return body, tail

    def _cell():
        reply = _host.call(ctl + b"B")
        n = int.from_bytes(reply[:4], "little")
        return (reply[4 : 4 + n].decode("utf-8", "surrogatepass"),
                reply[4 + n :].decode("utf-8", "surrogatepass"))

    def turn(cell=None, silent_ok=False):
        counter[0] += 1
        filename, src = cell if cell is not None else _cell()
        filename = filename or "<cell-%d>" % counter[0]
        report = None
        value = None
        ns = main.__dict__
        try:
            try:
                body, tail = _compile(src, filename)
            except Exception as exc:
                # Nothing of the cell ran, so no frame is the cell's: a SyntaxError shows only
                # where in the cell it is (as in the REPL), not the parser's frames.
                exc.__traceback__ = None
                report = {"status": "error", "exception": _exc_record(exc)}
            else:
                if filename not in linecache.cache:
                    sources.append(filename)
                    if len(sources) > sources_max:
                        linecache.cache.pop(sources.pop(0), None)
                linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
                _run(body, "exec", ns)
                if tail is not None:
                    value = _run(tail, "eval", ns)
                    if value is not None:
                        _b._ = value
                        try:
                            value = _short(repr(value), max_repr)
                        except BaseException as exc:
                            value = "<repr failed: %s>" % type(exc).__name__
        except SystemExit as exc:
            code = exc.code
            if code is None:
                code = 0
            elif not isinstance(code, int):
                try:
                    sys.stderr.write(str(code) + "\n")
                except BaseException:
                    pass
                code = 1
            report = {"status": "exit", "exit_code": code}
        except BaseException as exc:
            report = {"status": "error", "exception": _exc_record(exc)}
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except BaseException:
                    pass
        if report is None:
            if value is not None:
                _host.call(ctl + b"Ev" + value.encode("utf-8", "surrogatepass"))
            elif not silent_ok:
                _host.call(end_ok)
            return
        import json

        try:
            payload = json.dumps(report, default=repr)
        except BaseException as exc:
            payload = json.dumps({"status": "error", "exception": {
                "type": "ValueError", "message": "unreportable result: %r" % exc,
                "traceback": ""}})
        _host.call(ctl + b"Ej" + payload.encode("utf-8", "replace"))

    def _unescape(text):
        return _codecs.unicode_escape_decode(text)[0]

    try:
        import _reactor

        reactor_run_turn = _reactor._run_turn
    except (ImportError, AttributeError):
        _reactor = None

    if _reactor is not None:
        def _run_turn(text, name):
            if text.startswith(inline):
                filename, _, src = text[len(inline):].partition("\t")
                turn((_unescape(filename), _unescape(src)), silent_ok=True)
            elif text == "__memex_turn__()":
                turn()
            else:
                return reactor_run_turn(text, name)
            sys.displayhook(None)  # what the reactor does with the call's value
            return None

        _reactor._run_turn = _run_turn

    _b.__memex_turn__ = turn
    _no_network()
    try:
        import memex_guest  # noqa: F401  installs the asyncio hook (asyncio itself stays lazy)
    except ImportError:
        pass


def _no_network():
    # No sockets in the sandbox. Every way out that is not the host's egress fails like a
    # request the policy refused: memex_guest.net.EgressDenied (a PermissionError and a
    # urllib URLError), "egress denied: <what>: <why>" (docs/egress.md, "One answer").
    try:
        import _socket
    except ImportError:
        return
    why = ("network access is disabled in this sandbox: the guest has no sockets; HTTP(S) "
           "goes through the host's egress policy (urllib.request, http.client, "
           "memex_guest.net.fetch)")

    def refusing(what):
        def refuse(*args, **kwargs):
            text = "egress denied: %s: %s" % (what, why)
            try:
                from memex_guest.net import EgressDenied
            except ImportError:  # no bundle on sys.path: the family's base class
                EgressDenied = None
            if EgressDenied is None:
                import errno

                raise PermissionError(errno.EACCES, text)
            raise EgressDenied(text, kind="no_socket", url=what)
        return refuse

    class socket(_socket.socket):
        __slots__ = ()

        def __init__(self, *args, **kwargs):
            refusing("socket.socket()")()

    _socket.socket = socket
    _socket.SocketType = socket
    for name in ("getaddrinfo", "gethostbyname", "gethostbyname_ex", "gethostbyaddr",
                 "getnameinfo", "socketpair", "fromfd"):
        setattr(_socket, name, refusing("socket.%s()" % name))


_install()
del _install
