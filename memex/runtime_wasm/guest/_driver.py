# Runs inside the guest (CPython on WASI). Imports nothing from the host packages.
# The host execs this file once per fresh guest; it installs `__memex_turn__` in builtins.
# Each turn the host asks the guest to evaluate `__memex_turn__()`, which pulls the cell's
# source through the door's control channel, runs it in __main__ (a final expression is
# evaluated and its repr reported, like a REPL), and reports a JSON record of the outcome.
import builtins as _b


def _install():
    import _host
    import ast
    import json
    import sys
    import traceback

    main = sys.modules["__main__"]
    ctl = b"\x00MX"
    max_repr = 65536
    counter = [0]
    flags = getattr(ast, "PyCF_ALLOW_TOP_LEVEL_AWAIT", 0)

    def _short(text, limit):
        if len(text) > limit:
            return text[:limit] + "... [%d characters elided]" % (len(text) - limit)
        return text

    def _drive(coro):
        # A coroutine from top-level await, driven by hand: the guest has no event loop
        # of its own (asyncio.run needs a socketpair that WASI lacks).
        try:
            while True:
                coro.send(None)
        except StopIteration as stop:
            return stop.value

    def _run(code, mode, ns):
        if code.co_flags & 0x80:  # CO_COROUTINE: the cell used top-level await
            return _drive(eval(code, ns))
        if mode == "eval":
            return eval(code, ns)
        exec(code, ns)
        return None

    def _user_tb(tb):
        # Drop the driver's own frames so tracebacks show only the cell's code.
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next
        return tb

    def _exc_record(exc):
        exc.__traceback__ = _user_tb(exc.__traceback__)
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

    def turn():
        counter[0] += 1
        cell = json.loads(_host.call(ctl + b'{"op":"begin"}'))
        src = cell["code"]
        filename = cell.get("filename") or "<cell-%d>" % counter[0]
        report = {"status": "ok", "value": None}
        ns = main.__dict__
        try:
            try:
                tree = ast.parse(src, filename, "exec", type_comments=False)
                last = None
                if tree.body and isinstance(tree.body[-1], ast.Expr):
                    last = ast.Expression(tree.body.pop().value)
                body = compile(tree, filename, "exec", flags=flags)
                tail = compile(last, filename, "eval", flags=flags) if last else None
            except SyntaxError as exc:
                report = {"status": "error", "exception": _exc_record(exc)}
            else:
                _run(body, "exec", ns)
                if tail is not None:
                    value = _run(tail, "eval", ns)
                    if value is not None:
                        _b._ = value
                        try:
                            report["value"] = _short(repr(value), max_repr)
                        except BaseException as exc:
                            report["value"] = "<repr failed: %s>" % type(exc).__name__
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
        try:
            payload = json.dumps(report, default=repr)
        except BaseException as exc:
            payload = json.dumps({"status": "error", "exception": {
                "type": "ValueError", "message": "unreportable result: %r" % exc,
                "traceback": ""}})
        _host.call(ctl + b'{"op":"end","report":' + payload.encode("utf-8", "replace") + b"}")

    _b.__memex_turn__ = turn
    _no_network()


def _no_network():
    # No sockets in the sandbox: a clear PermissionError instead of WASI's "Not supported".
    import errno

    try:
        import _socket
    except ImportError:
        return
    message = ("network access is disabled in this sandbox: the guest has no sockets "
               "(network egress goes through the host under a policy)")

    def refuse(*args, **kwargs):
        raise PermissionError(errno.EACCES, message)

    class socket(_socket.socket):
        __slots__ = ()

        def __init__(self, *args, **kwargs):
            refuse()

    _socket.socket = socket
    _socket.SocketType = socket
    for name in ("getaddrinfo", "gethostbyname", "gethostbyname_ex", "gethostbyaddr",
                 "getnameinfo", "socketpair", "fromfd"):
        setattr(_socket, name, refuse)


_install()
del _install
