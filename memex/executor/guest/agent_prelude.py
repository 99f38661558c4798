# Runs inside the guest (exec'd by memex.executor's session). Imports nothing from the host.
"""The agent's guest prelude: typed inputs in globals, a lenient submit(), and a preview of
the variables each block creates (for the model's observation). ``hooks`` (from the
sub-agent API, when spawning is on): ``rebuild(name, value)`` turns the values of an input
that travelled pickled back into objects; ``prepare(answer)`` readies a sub-agent's answer
for its parent."""


def __memex_agent_prelude__(input_names, submit_doc, record_types, hooks=None, explain=True,
                            wide=True):
    import sys

    import __main__
    import memex_guest.door as door
    import memex_guest.tools as tools

    g = __main__.__dict__
    pd = sys.modules.get("pandas")
    if wide and pd is not None:
        # pandas' defaults fold a frame wider than 80 columns into "..." (names and values
        # hidden): the model then reads nothing it can use and prints again
        for key, value in (("display.width", 160), ("display.max_columns", 12),
                           ("display.max_colwidth", 50), ("display.max_rows", 40)):
            try:
                pd.set_option(key, value)
            except Exception:
                pass
    # Typed record classes (e.g. Trajectory, Step) for inputs, registered by type name.
    for type_name, fields in record_types.items():
        type(type_name, (tools.Record,), {"__fields__": tuple(fields), "__slots__": (),
                                          "__module__": "memex"})
    hooks = hooks or {}
    rebuild = hooks.get("rebuild")
    prepare = hooks.get("prepare")
    for name in input_names:
        g[name] = door.request("agent.input", [name], {}, True)
        if rebuild is not None:
            g[name] = rebuild(name, g[name])

    missing = object()

    def submit(answer=missing, /, **fields):
        if answer is missing:
            if not fields:
                raise TypeError("submit() needs the answer: submit(answer) or submit(field=...)")
            answer = fields
        elif fields:
            raise TypeError("submit() takes the answer or its fields as keywords, not both")
        if prepare is not None:
            answer = prepare(answer)
        # A blocking call even inside the guest's event loop (tools.call would return an
        # awaitable there, and an un-awaited submit must not vanish).
        try:
            door.request("tools.call", ["submit", {"answer": answer}], {}, True)
        except TypeError as exc:  # a value the door cannot carry (an object, ``...``)
            if not explain:
                raise
            raise TypeError("%s\nYou sent: %s" % (exc, sent(answer))) from None
        except door.DoorError as exc:
            err = exc.error
            if explain and isinstance(err, dict) and isinstance(err.get("message"), str):
                err = dict(err, message=err["message"] + "\nYou sent: " + sent(answer))
            raise tools.error_from_map(err, "submit") from None
        print("[answer accepted]")

    def sent(v, depth=0):
        """What a rejected answer held, type by type, with how to turn pandas and numpy
        values into the plain ones a schema takes."""
        t = type(v)
        mod = t.__module__.partition(".")[0]
        if mod == "pandas" and t.__name__ == "Series":
            return ("a pandas Series of %d value%s (use .to_dict() for a dict, .tolist() for a "
                    "list, .iloc[0] for one value)" % (len(v), "" if len(v) == 1 else "s"))
        if mod == "pandas" and t.__name__ == "DataFrame":
            return ("a pandas DataFrame of %d rows x %d columns (use df.to_dict('records'), "
                    "df[column].tolist(), dict(zip(df[a], df[b])) or df.iloc[0, 0])"
                    % (len(v), len(v.columns)))
        if mod == "numpy":
            if getattr(v, "shape", None) == ():
                return "a numpy %s scalar (use .item())" % t.__name__
            return "a numpy array (use .tolist())"
        if isinstance(v, dict) and depth < 2:
            items = ["%r: %s" % (k, sent(x, depth + 1)) for k, x in list(v.items())[:12]]
            return "{" + ", ".join(items) + (", ..." if len(v) > 12 else "") + "}"
        if isinstance(v, (list, tuple)) and v and depth < 2:
            return "a %s of %d items, the first %s" % (t.__name__, len(v), sent(v[0], depth + 1))
        if v is Ellipsis:
            return "... (a placeholder: compute this value from your results)"
        r = repr(v)
        return "%s %s" % (t.__name__, r if len(r) <= 40 else r[:37] + "...")

    submit.__doc__ = submit_doc
    g["submit"] = submit

    seen = {}

    def describe(v):
        t = type(v)
        mod = t.__module__.partition(".")[0]
        if mod == "pandas" and t.__name__ == "DataFrame":
            cols = ", ".join(str(c) for c in list(v.columns)[:8])
            more = ", ..." if len(v.columns) > 8 else ""
            return "DataFrame %d rows x %d cols [%s%s]" % (len(v), len(v.columns), cols, more)
        if mod == "numpy" and t.__name__ == "ndarray":
            return "ndarray %s %s" % (v.dtype, tuple(v.shape))
        if mod == "pandas" and t.__name__ == "Series":
            return "Series %d values (%s)" % (len(v), v.dtype)
        if isinstance(v, (list, tuple, dict, set, frozenset, str, bytes)):
            return "%s len %d" % (t.__name__, len(v))
        if isinstance(v, (int, float, bool, complex)) or v is None:
            r = repr(v)
            return "%s = %s" % (t.__name__, r if len(r) <= 40 else r[:37] + "...")
        if callable(v):
            return "function" if t.__name__ == "function" else t.__name__
        return t.__name__

    def new_variables():
        out = []
        for name, v in list(g.items()):
            if name.startswith("_") or type(v).__name__ == "module":
                continue
            key = (id(v), type(v))
            if seen.get(name) != key:
                seen[name] = key
                try:
                    out.append([name, describe(v)])
                except Exception:
                    out.append([name, type(v).__name__])
        for name in [n for n in seen if n not in g]:
            del seen[name]
        return out

    def report():
        door.request("agent.vars", [new_variables()], {}, False)

    # The tools, submit() and the ``tools`` namespace as bound now: a reply that rebinds one
    # (``orders = orders()``) keeps its value under another name, and the tool comes back.
    ns = g.get("tools")
    protected = {n: g[n] for n in getattr(ns, "__main_exports__", ()) if n in g}
    protected["submit"] = submit
    if ns is not None:
        protected["tools"] = ns
    moved = set()  # the names keep_tools() made: a later value may replace theirs

    def keep_tools():
        out = []
        for name, tool in protected.items():
            v = g.get(name, missing)
            if v is tool:
                continue
            g[name] = tool
            if v is missing:
                out.append([name, ""])
                continue
            new, k = name + "_result", 2
            while new in g and new not in moved and g[new] is not v:
                new, k = "%s_result%d" % (name, k), k + 1
            g[new] = v
            moved.add(new)
            out.append([name, new])
        door.request("agent.kept", [out], {}, False)

    new_variables()  # everything present now (tools, inputs, submit) is not new
    g["__memex_new_variables__"] = report
    g["__memex_keep_tools__"] = keep_tools
