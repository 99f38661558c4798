"""``ToolSet``: a named collection of tools (prefixes, filters, merges) and everything the
guest is shown of it, all built from one model so they cannot disagree: the stub module (real
functions with signatures, annotations, defaults and docstrings, record classes), the compact
catalogue for a system prompt, and the ``tools.list`` answer."""

from __future__ import annotations

import dataclasses
import inspect
import keyword
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol, overload

from ..errors import ConfigError, ServiceError, ToolDefinitionError
from ._params import ToolParam
from ._tool import NO_RETURN, Tool
from ._types import (
    GUEST_MODULE,
    RESERVED,
    RecordDef,
    Rendered,
    TypeRenderer,
    render_default,
    safe_identifier,
)

__all__ = ["ToolSet"]

_ERRORS = ("ToolError", "ToolArgumentError", "ToolExecutionError", "ToolReturnError",
           "ToolNotFoundError", "ToolDeniedError", "ToolBudgetError", "ToolTimeoutError")
_KIND = {"positional_only": inspect.Parameter.POSITIONAL_ONLY,
         "positional_or_keyword": inspect.Parameter.POSITIONAL_OR_KEYWORD,
         "keyword_only": inspect.Parameter.KEYWORD_ONLY}
MISSING_REPR = "..."  # repr of memex_guest.tools.MISSING (docs/abi.md)


class _Shown:
    """An object whose repr is given text: lets the host's ``inspect`` lay out a signature
    exactly as the guest's does for the real objects."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


@dataclass(frozen=True, kw_only=True)
class _Param:
    param: ToolParam
    ann: Rendered
    default: tuple[str, str] | None  # (source, repr) of a default the stub carries
    missing: bool  # default is the MISSING sentinel (host applies its default, if any)


@dataclass(frozen=True, kw_only=True)
class _Stub:
    tool: Tool
    alias: str
    params: tuple[_Param, ...]
    ret: Rendered | None
    signature: str  # what str(inspect.signature(f)) prints in the guest
    doc: str


def _served_elsewhere(definition: Mapping[str, Any]) -> Callable[..., Any]:
    name = definition.get("function", definition).get("name", "?")

    def handler(**_: Any) -> Any:
        raise ServiceError(
            f"tool {name!r} runs on the memex serve service: call it from a guest of one of "
            "its sessions")
    return handler


def _literal_doc(text: str) -> str:
    if '"""' not in text and "\\" not in text and not text.endswith('"'):
        return '"""' + text + '"""'
    return repr(text)


def _indent(text: str, pad: str = "    ") -> str:
    return "\n".join(pad + line if line else line for line in text.splitlines())


class _Closeable(Protocol):
    def close(self) -> None: ...


class ToolSet:
    """Tools under unique names. ``prefix`` is put in front of every tool added.

    ``resources`` are what the tools' handlers need alive (an MCP connection for
    :meth:`from_mcp`): :meth:`close` (or leaving a ``with`` block) closes them. Sets made from
    this one (``prefixed``, ``filter``, ``merge``) share them: closing either closes them."""

    def __init__(self, tools: Iterable[Tool | Callable[..., Any]] = (), *, prefix: str = "",
                 resources: Iterable[_Closeable] = ()) -> None:
        self.prefix = prefix
        self._tools: dict[str, Tool] = {}
        self._model: tuple[list[_Stub], list[RecordDef], dict[type, str]] | None = None
        self._resources = list(resources)
        for t in tools:
            self.add(t)

    @classmethod
    def from_service(cls, entries: Iterable[Mapping[str, Any]]) -> ToolSet:
        """The tools a ``memex serve`` operator runs for the tenant (``Client.tools()``), as
        a set to offer a model next to this process's own tools: the guest stubs and the
        prompt's catalogue are theirs, and the server answers their calls (their handlers
        here only say so, if ever called outside a remote session)."""
        tools = []
        for entry in entries:
            if not isinstance(entry, Mapping) or not isinstance(entry.get("definition"),
                                                                 Mapping):
                raise ToolDefinitionError("a service tool entry is {definition, returns, "
                                          f"catalogue}}, got {entry!r:.80}")
            t = Tool.from_openai(entry["definition"], _served_elsewhere(entry["definition"]))
            returns = entry.get("returns")
            tools.append(dataclasses.replace(t, returns_doc=returns) if isinstance(
                returns, str) and returns else t)
        return cls(tools)

    @classmethod
    def from_mcp(cls, command: str | None = None, *, args: Sequence[str] = (),
                 env: Mapping[str, str] | None = None, cwd: str | None = None,
                 url: str | None = None, headers: Mapping[str, str] | None = None,
                 prefix: str = "", include: Sequence[str] | None = None,
                 timeout: float | None = 30.0, connect_timeout: float = 30.0) -> ToolSet:
        """The tools of an MCP server, started as ``command args`` (stdio; ``env`` merged
        over a minimal environment) or reached at ``url`` (streamable HTTP, with
        ``headers``), as typed guest functions (``include``: only these). ``timeout`` bounds
        one call. The set holds the connection (reopened if the server restarts) until
        :meth:`close`. Needs the ``mcp`` extra (``pip install 'memex[mcp]'``)."""
        try:
            from ._mcp import McpConnection, mcp_tools  # the optional mcp SDK, on first use
        except ImportError as exc:
            raise ConfigError("ToolSet.from_mcp needs the MCP SDK: pip install 'memex[mcp]' "
                              f"({exc})") from exc
        conn = McpConnection(command, args=args, env=env, cwd=cwd, url=url, headers=headers,
                             connect_timeout=connect_timeout)
        try:
            return cls(mcp_tools(conn, timeout=timeout, include=include), prefix=prefix,
                       resources=[conn])
        except BaseException:
            conn.close()
            raise

    def close(self) -> None:
        """Close the resources the tools need (idempotent)."""
        resources, self._resources = self._resources, []
        for r in resources:
            r.close()

    def __enter__(self) -> ToolSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- collection -------------------------------------------------------------------------
    def add(self, tool: Tool | Callable[..., Any], *, name: str | None = None) -> Tool:
        """Add a Tool or a typed callable; returns the tool as stored (with the prefix)."""
        t = tool if isinstance(tool, Tool) else Tool.from_function(tool, name=name)
        full = self.prefix + (name if name is not None else t.name)
        if full != t.name:
            t = t.renamed(full)
        if full in self._tools:
            raise ToolDefinitionError(f"two tools named {full!r}")
        self._tools[full] = t
        self._model = None
        return t

    @overload
    def tool(self, fn: Callable[..., Any], /) -> Tool: ...
    @overload
    def tool(self, /, *, name: str | None = None, description: str | None = None,
             timeout: float | None = None, inline: bool = False
             ) -> Callable[[Callable[..., Any]], Tool]: ...
    def tool(self, fn: Callable[..., Any] | None = None, /, *, name: str | None = None,
             description: str | None = None, timeout: float | None = None,
             inline: bool = False) -> Tool | Callable[[Callable[..., Any]], Tool]:
        """Decorator adding a function to this set (``@ts.tool`` or ``@ts.tool(...)``)."""
        def make(f: Callable[..., Any]) -> Tool:
            return self.add(Tool.from_function(f, name=name, description=description,
                                               timeout=timeout, inline=inline))
        return make(fn) if fn is not None else make

    def prefixed(self, prefix: str) -> ToolSet:
        """A new set with every name prefixed."""
        return ToolSet([t.renamed(prefix + t.name) for t in self], resources=self._resources)

    def filter(self, names: Iterable[str] | None = None,
               predicate: Callable[[Tool], bool] | None = None) -> ToolSet:
        """A new set of the tools named in ``names`` (all unknown names are an error) and/or
        for which ``predicate(tool)`` is true."""
        keep = list(self)
        if names is not None:
            wanted = list(names)
            unknown = [n for n in wanted if n not in self._tools]
            if unknown:
                raise ToolDefinitionError(f"no tools named {unknown}")
            keep = [t for t in keep if t.name in set(wanted)]
        if predicate is not None:
            keep = [t for t in keep if predicate(t)]
        return ToolSet(keep, resources=self._resources)

    def merge(self, *others: ToolSet | Iterable[Tool]) -> ToolSet:
        """A new set holding these tools and the others' (a name clash is an error)."""
        shared = [*self._resources]
        for other in others:
            shared += [r for r in getattr(other, "_resources", ()) if r not in shared]
        out = ToolSet(self, resources=shared)
        for other in others:
            for t in other:
                out.add(t)
        return out

    def __or__(self, other: ToolSet) -> ToolSet:
        return self.merge(other)

    def __iter__(self) -> Iterator[Tool]:
        return iter(list(self._tools.values()))

    def __len__(self) -> int:
        return len(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __getitem__(self, name: str) -> Tool:
        return self._tools[name]

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._tools)

    def __repr__(self) -> str:
        return f"ToolSet({list(self._tools)})"

    # ---- the guest's view -------------------------------------------------------------------
    @property
    def aliases(self) -> dict[str, str]:
        """Tool name -> guest function name, for the names that are not usable as is."""
        return {s.tool.name: s.alias for s in self._build()[0] if s.alias != s.tool.name}

    @property
    def record_names(self) -> Mapping[type, str]:
        """Record classes (models, dataclasses, TypedDicts) -> guest class names."""
        return MappingProxyType(self._build()[2])

    def describe(self) -> list[dict[str, str]]:
        """The ``tools.list`` answer: ``[{name, alias, signature, doc}]``."""
        return [{"name": s.tool.name, "alias": s.alias, "signature": s.signature,
                 "doc": s.doc} for s in self._build()[0]]

    def catalogue(self) -> str:
        """One line per tool, ``alias(params) -> Return: summary Returns: what``, then one
        per record class and the aliases; the signatures are what ``inspect.signature``
        shows in the guest. What a tool returns is part of the line: a model that is not
        told a DataFrame's columns guesses them."""
        stubs, records, _ = self._build()
        lines = [f"{s.alias}{s.signature}" + (f": {s.tool.summary}" if s.tool.summary else "")
                 + (f" Returns: {' '.join(s.tool.returns_doc.split())}"
                    if s.tool.returns_doc.strip() else "")
                 for s in stubs]
        for r in records:
            fields = ", ".join(f"{n}: {a.display}" for n, a, _ in r.fields)
            first = r.doc.splitlines()[0] if r.doc else ""
            lines.append(f"class {GUEST_MODULE}.{r.name}({fields})" + (f": {first}" if first
                                                                         else ""))
        aliases = [f"{n!r} -> {a}" for n, a in self.aliases.items()]
        if aliases:
            lines.append("aliases: " + ", ".join(aliases))
        return "\n".join(lines)

    def guest_module(self) -> str:
        """Python source of the guest module ``tools`` (exec'd in the guest)."""
        stubs, records, _ = self._build()
        out = [_literal_doc("Host tools: typed functions that call the host through the "
                            "door.\n\n" + self.catalogue()),
               "from typing import Any, Literal, Optional, TypedDict, Union",
               "import datetime, decimal",
               "import memex_guest.tools as _mx", ""]
        out += [f"{e} = _mx.{e}" for e in _ERRORS]
        for r in records:
            out += ["", "", *_record_source(r)]
        for s in stubs:
            out += ["", "", *_function_source(s)]
        exports = [s.alias for s in stubs] + [r.name for r in records]
        out += ["", "", f"ALIASES = {self.aliases!r}",
                f"__main_exports__ = {tuple(exports)!r}",
                f"__all__ = {[*exports, *_ERRORS, 'ALIASES']!r}", ""]
        return "\n".join(out)

    def install_source(self, *, pin: bool = False) -> str:
        """A cell that installs :meth:`guest_module` as ``sys.modules['tools']``, binds
        ``tools`` and each tool and record class in ``__main__`` (dropping the names a
        previous install bound) and leaves nothing else behind.

        ``pin=True`` makes these tools a layer that every later install keeps under its own
        (a service operator's tools stay when a client installs its own); a later tool of
        the same name replaces a pinned one."""
        return (
            "def __memex_install_tools__(src, pin):\n"
            "    import sys, types, __main__\n"
            "    old = sys.modules.get('tools')\n"
            "    for n in getattr(old, '__main_exports__', ()):\n"
            "        if getattr(__main__, n, None) is getattr(old, n, None):\n"
            "            delattr(__main__, n)\n"
            "    base = src if pin else getattr(old, '__memex_pinned__', None)\n"
            "    m = types.ModuleType('tools')\n"
            "    keep, doc, alias = (), None, {}\n"
            "    if base is not None and not pin:\n"
            "        exec(compile(base, '<memex-tools-pinned>', 'exec'), m.__dict__)\n"
            "        keep, doc, alias = m.__main_exports__, m.__doc__, m.ALIASES\n"
            "    exec(compile(src, '<memex-tools>', 'exec'), m.__dict__)\n"
            "    if keep:\n"
            "        m.__main_exports__ = tuple(dict.fromkeys(keep + m.__main_exports__))\n"
            "        m.__all__ = list(dict.fromkeys(m.__all__ + list(keep)))\n"
            "        m.ALIASES = {**alias, **m.ALIASES}\n"
            "        m.__doc__ = (m.__doc__ or '') + '\\n\\n' + (doc or '')\n"
            "    if base is not None:\n"
            "        m.__memex_pinned__ = base\n"
            "    sys.modules['tools'] = m\n"
            "    __main__.tools = m\n"
            "    for n in m.__main_exports__:\n"
            "        setattr(__main__, n, getattr(m, n))\n"
            f"__memex_install_tools__({self.guest_module()!r}, {pin!r})\n"
            "del __memex_install_tools__\n"
        )

    # ---- the model --------------------------------------------------------------------------
    def _build(self) -> tuple[list[_Stub], list[RecordDef], dict[type, str]]:
        if self._model is not None:
            return self._model
        tools = list(self._tools.values())
        alias: dict[str, str] = {}
        taken: set[str] = set()
        for t in tools:  # names usable as they are keep them
            if t.name.isidentifier() and not keyword.iskeyword(t.name) and (
                    t.name not in RESERVED and not t.name.startswith("__")):
                alias[t.name] = t.name
                taken.add(t.name)
        for t in tools:
            if t.name not in alias:
                alias[t.name] = safe_identifier(t.name.strip("_") or "tool", taken)
                taken.add(alias[t.name])
        renderer = TypeRenderer(taken)
        stubs = [self._stub(t, alias[t.name], renderer) for t in tools]
        for t in tools:
            for record in t.records:
                renderer.render(record)
        self._model = (stubs, renderer.records, renderer.names)
        return self._model

    @staticmethod
    def _stub(t: Tool, alias: str, renderer: TypeRenderer) -> _Stub:
        params: list[_Param] = []
        for p in t.params:
            default = None if p.required else render_default(p.default)
            params.append(_Param(param=p, ann=renderer.render(p.annotation), default=default,
                                 missing=not p.required and default is None))
        ret = None if t.returns is NO_RETURN else renderer.render(t.returns)
        sig = inspect.Signature(
            [inspect.Parameter(
                x.param.py_name, _KIND[x.param.kind], annotation=_Shown(x.ann.display),
                default=(inspect.Parameter.empty if x.param.required else
                         _Shown(MISSING_REPR if x.default is None else x.default[1])))
             for x in params],
            return_annotation=inspect.Signature.empty if ret is None else _Shown(ret.display))
        return _Stub(tool=t, alias=alias, params=tuple(params), ret=ret, signature=str(sig),
                     doc=_docstring(t, alias, params, ret))


def _docstring(t: Tool, alias: str, params: list[_Param], ret: Rendered | None) -> str:
    parts = [x for x in (t.summary, t.description) if x]
    if alias != t.name:
        parts.append(f"Host tool {t.name!r}.")
    if params:
        lines = []
        for x in params:
            p = x.param
            typ = x.ann.display + (", optional" if not p.required else "")
            text = p.description.strip() or ""
            if x.missing and p.default is not inspect.Parameter.empty:
                shown = repr(p.default)
                shown = shown if len(shown) <= 80 else shown[:77] + "..."
                text = (text + " " if text else "") + f"Defaults to {shown} (on the host)."
            elif x.missing:
                text = (text + " " if text else "") + "Omitted unless given."
            lines.append(f"{p.py_name} ({typ})" + (f": {text}" if text else ""))
        parts.append("Args:\n" + _indent("\n".join(lines)))
    if ret is not None:
        parts.append("Returns:\n" + _indent(f"{ret.display}: {t.returns_doc}".rstrip(": ")))
    return "\n\n".join(parts)


def _function_source(s: _Stub) -> list[str]:
    head: list[str] = []
    seen_kw = False
    params = list(s.params)
    for i, x in enumerate(params):
        p = x.param
        if p.kind == "keyword_only" and not seen_kw:
            head.append("*")
            seen_kw = True
        text = f"{p.py_name}: {x.ann.src}"
        if not p.required:
            text += " = " + ("_mx.MISSING" if x.default is None else x.default[0])
        head.append(text)
        nxt = params[i + 1].param.kind if i + 1 < len(params) else None
        if p.kind == "positional_only" and nxt != "positional_only":
            head.append("/")
    ret = f" -> {s.ret.src}" if s.ret is not None else ""
    pairs = [(x.param.name, x.param.py_name) for x in s.params]
    if any(x.missing for x in s.params):
        items = "".join(f"({n!r}, {py}), " for n, py in pairs)
        call = (f"{{_k: _v for _k, _v in ({items}) if _v is not _mx.MISSING}}")
    else:
        call = "{" + ", ".join(f"{n!r}: {py}" for n, py in pairs) + "}"
    return [f"def {s.alias}({', '.join(head)}){ret}:",
            _indent(_literal_doc(s.doc)),
            f"    return _mx.call({s.tool.name!r}, {call})"]


def _record_source(r: RecordDef) -> list[str]:
    lines = [r.doc] if r.doc else []
    described = [f"{n} ({a.display}): {d}" for n, a, d in r.fields if d]
    if described:
        lines.append("Fields:\n" + _indent("\n".join(described)))
    doc = "\n\n".join(lines) or f"Record {r.name}."
    if r.typed_dict and not all(n.isidentifier() and not keyword.iskeyword(n)
                                for n, _, _ in r.fields):
        spec = "{" + ", ".join(f"{n!r}: {a.src}" for n, a, _ in r.fields) + "}"
        return [f"{r.name} = TypedDict({r.name!r}, {spec}, total={r.total})",
                f"{r.name}.__doc__ = {doc!r}"]
    base = (f"TypedDict, total={r.total}" if not r.total else "TypedDict") if r.typed_dict \
        else "_mx.Record"
    body = [_literal_doc(doc)]
    body += [f"{n}: {a.src}" for n, a, _ in r.fields]
    if not r.typed_dict:
        body.append(f"__fields__ = {tuple(n for n, _, _ in r.fields)!r}")
    return [f"class {r.name}({base}):", *(_indent(b) for b in body)]
