"""Egress policies (and policy test tables) from TOML, YAML or plain mappings.

Every problem is reported as ``file:line: path: reason`` and all of a file's problems come at
once (one :class:`~memex.errors.PolicyError` whose ``issues`` lists them). YAML lines come
from the parser's nodes (duplicate keys are an error, not a silent overwrite); TOML is parsed
by ``tomllib`` and its lines found by a scan of table headers and keys.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ...errors import PolicyError
from ._match import DEFAULT_STRIP_HEADERS, parse_seconds, parse_size
from ._rules import EgressLimits, EgressRule, EgressSecret

if TYPE_CHECKING:
    from ._policy import EgressPolicy

__all__ = ["Locator", "load_document", "load_policy_file", "load_policy_text", "parse_text",
           "policy_from_data"]

PathKey = tuple[str | int, ...]
P = TypeVar("P", bound="EgressPolicy")
Locator = Callable[[PathKey], int | None]

_TOP = ("version", "rules", "limits", "headers", "secrets")
_RULE = ("action", "name", "scheme", "host", "ip", "port", "method", "path", "allow_headers",
         "max_request_bytes", "max_response_bytes", "timeout", "comment")
_LIMITS = ("max_request_bytes", "max_response_bytes", "timeout", "requests_per_turn",
           "requests_per_sandbox", "rate", "burst", "max_redirects")
_HEADERS = ("strip",)
_SECRET = ("name", "host", "scheme", "port", "path", "header", "query", "format", "env", "file",
           "value", "comment")


def fmt_path(path: PathKey) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _locator(lines: Mapping[PathKey, int]) -> Locator:
    def locate(path: PathKey) -> int | None:
        for n in range(len(path), -1, -1):
            line = lines.get(tuple(path[:n]))
            if line is not None:
                return line
        return None

    return locate


# ---- TOML ---------------------------------------------------------------------------------------
_KEY = r'(?:[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|\'[^\']*\')'
_DOTTED = re.compile(rf"\s*({_KEY}(?:\s*\.\s*{_KEY})*)\s*")


def _key_parts(text: str) -> tuple[str, ...]:
    parts = re.findall(_KEY, text)
    return tuple(p[1:-1] if p[:1] in "\"'" else p for p in parts)


def _toml_lines(text: str) -> dict[PathKey, int]:
    """Where each table, array-of-tables element and key starts (best effort: keys inside
    multi-line values are not told apart from real ones)."""
    lines: dict[PathKey, int] = {(): 1}
    prefix: PathKey = ()
    counters: dict[PathKey, int] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        s = raw.strip()
        if not s or s.startswith("#"):
            continue
        if s.startswith("[["):
            end = s.find("]]")
            key = _key_parts(s[2:end]) if end != -1 else ()
            idx = counters.get(key, -1) + 1
            counters[key] = idx
            lines.setdefault(key, n)
            prefix = (*key, idx)
            lines[prefix] = n
            continue
        if s.startswith("["):
            end = s.find("]")
            prefix = _key_parts(s[1:end]) if end != -1 else ()
            lines.setdefault(prefix, n)
            continue
        m = _DOTTED.match(s)
        if m and s[m.end():].startswith("="):
            lines.setdefault((*prefix, *_key_parts(m.group(1))), n)
    return lines


def _parse_toml(text: str, source: str) -> tuple[Any, Locator]:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        msg = str(exc)
        m = re.search(r"\(at line (\d+), column \d+\)", msg)
        line = int(m.group(1)) if m else getattr(exc, "lineno", None)
        reason = re.sub(r"\s*\(at line \d+, column \d+\)", "", msg)
        raise PolicyError(f"TOML syntax error: {reason}", source=source, line=line) from None
    return data, _locator(_toml_lines(text))


# ---- YAML ---------------------------------------------------------------------------------------
def _parse_yaml(text: str, source: str) -> tuple[Any, Locator]:
    import yaml

    lines: dict[PathKey, int] = {}
    issues: list[PolicyError] = []

    def walk(node: Any, path: PathKey) -> None:
        lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            seen: dict[str, int] = {}
            for knode, vnode in node.value:
                if not isinstance(knode, yaml.ScalarNode):
                    continue
                key = knode.value
                line = knode.start_mark.line + 1
                if key in seen and key != "<<":
                    issues.append(PolicyError(
                        f"duplicate key {key!r} (first on line {seen[key]})", source=source,
                        line=line, path=fmt_path((*path, key))))
                seen.setdefault(key, line)
                lines.setdefault((*path, key), line)
                walk(vnode, (*path, key))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, (*path, i))

    try:
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return None, _locator(lines)
            walk(node, ())
            data = loader.construct_document(node)
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise PolicyError(f"YAML syntax error: {exc.problem or exc.context}", source=source,
                          line=mark.line + 1 if mark else None) from None
    except yaml.YAMLError as exc:
        raise PolicyError(f"YAML error: {exc}", source=source) from None
    if issues:
        raise PolicyError(f"{len(issues)} problems in {source}", issues=tuple(issues))
    return data, _locator(lines)


def parse_text(text: str, *, format: str, source: str) -> tuple[Any, Locator]:
    """The document and a locator (path -> line) of TOML or YAML text."""
    if format == "toml":
        return _parse_toml(text, source)
    if format == "yaml":
        return _parse_yaml(text, source)
    raise PolicyError(f"unknown policy format {format!r} (toml or yaml)", source=source)


def load_document(path: str | os.PathLike[str]) -> tuple[Any, Locator, str]:
    """Read a ``.toml``, ``.yaml`` or ``.yml`` file: ``(data, locate, source)``."""
    p = Path(path)
    source = str(path)
    suffix = p.suffix.lower()
    fmt = {".toml": "toml", ".yaml": "yaml", ".yml": "yaml"}.get(suffix)
    if fmt is None:
        raise PolicyError("unknown file type (expected .toml, .yaml or .yml)", source=source)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(f"cannot read the file: {exc.strerror or exc}", source=source) from None
    except UnicodeDecodeError:
        raise PolicyError("the file is not UTF-8 text", source=source) from None
    data, locate = parse_text(text, format=fmt, source=source)
    return data, locate, source


# ---- the policy schema --------------------------------------------------------------------------
class _Issues:
    def __init__(self, source: str, locate: Locator | None) -> None:
        self.source, self.locate = source, locate
        self.items: list[PolicyError] = []

    def line(self, path: PathKey) -> int | None:
        return self.locate(path) if self.locate else None

    def add(self, path: PathKey, reason: str) -> None:
        self.items.append(PolicyError(reason, source=self.source, line=self.line(path),
                                      path=fmt_path(path)))

    def from_error(self, base: PathKey, exc: PolicyError) -> None:
        """Re-anchor an error of a dataclass (path ``name.field[i]``) at ``base``."""
        for e in exc.issues:
            tail = (e.path or "").rpartition(".")[2] if e.path and "." in e.path else ""
            m = re.fullmatch(r"([A-Za-z_]+)(?:\[(\d+)\])?", tail)
            path = base
            if m:
                path = (*base, m.group(1)) + ((int(m.group(2)),) if m.group(2) else ())
            self.add(path, e.reason)

    def keys(self, table: object, path: PathKey, allowed: tuple[str, ...], what: str) -> bool:
        if not isinstance(table, Mapping):
            self.add(path, f"{what} must be a table/mapping, got {type(table).__name__}")
            return False
        for k in table:
            if k not in allowed:
                near = difflib.get_close_matches(str(k), allowed, n=1)
                hint = f"; did you mean {near[0]!r}?" if near else \
                    f" (known keys: {', '.join(a for a in allowed if a != 'comment')})"
                self.add((*path, str(k)), f"unknown key {k!r} in {what}{hint}")
        return True


def _converted(table: Mapping[str, Any], iss: _Issues, path: PathKey) -> dict[str, Any]:
    out = {k: v for k, v in table.items() if k != "comment"}
    for k in ("max_request_bytes", "max_response_bytes"):
        if out.get(k) is not None:
            try:
                out[k] = parse_size(out[k], k, None)
            except PolicyError as exc:
                iss.add((*path, k), exc.reason)
                out.pop(k)
    if out.get("timeout") is not None:
        try:
            out["timeout"] = parse_seconds(out["timeout"], "timeout", None)
        except PolicyError as exc:
            iss.add((*path, "timeout"), exc.reason)
            out.pop("timeout")
    return out


def policy_from_data(cls: type[P], data: object, *, source: str = "<dict>",
                     locate: Locator | None = None) -> P:
    """Build and validate a policy of class ``cls`` (``EgressPolicy``) from a mapping shaped
    like the file format; every problem is collected before one PolicyError is raised."""
    iss = _Issues(source, locate)
    if not isinstance(data, Mapping):
        raise PolicyError("a policy must be a table/mapping at the top level"
                          if data is not None else "the policy is empty", source=source,
                          line=iss.line(()))
    iss.keys(data, (), _TOP, "the policy")
    version = data.get("version", 1)
    if version != 1 or isinstance(version, bool):
        iss.add(("version",), f"unsupported policy version {version!r} (this MemEx reads 1)")
    limits = _limits(data.get("limits", {}), iss, source)
    strip = _strip(data.get("headers", {}), iss)
    rules = _rules(data.get("rules", []), iss, source)
    secrets = _secrets(data.get("secrets", []), iss, source)
    if iss.items:
        if len(iss.items) == 1:
            raise iss.items[0]
        raise PolicyError(f"{len(iss.items)} problems in the egress policy {source}",
                          issues=tuple(iss.items))
    try:
        return cls(rules=tuple(rules), limits=limits, strip_headers=tuple(strip),
                   secrets=tuple(secrets), source=source)
    except PolicyError as exc:
        iss.from_error(("headers",), exc)
        raise iss.items[0] from None


def _limits(raw: Any, iss: _Issues, source: str) -> EgressLimits:
    if iss.keys(raw, ("limits",), _LIMITS, "limits"):
        try:
            return EgressLimits(**{k: v for k, v in raw.items() if k in _LIMITS}, source=source)
        except PolicyError as exc:
            iss.from_error(("limits",), exc)
    return EgressLimits()


def _strip(raw: Any, iss: _Issues) -> Any:
    if not iss.keys(raw, ("headers",), _HEADERS, "headers"):
        return DEFAULT_STRIP_HEADERS
    strip = raw.get("strip", DEFAULT_STRIP_HEADERS)
    if not isinstance(strip, (list, tuple)) or not all(isinstance(h, str) for h in strip):
        iss.add(("headers", "strip"), "must be a list of header names")
        return DEFAULT_STRIP_HEADERS
    return strip


def _rules(raw_rules: object, iss: _Issues, source: str) -> list[EgressRule]:
    rules: list[EgressRule] = []
    names: dict[str, int] = {}
    if not isinstance(raw_rules, list):
        iss.add(("rules",), "rules must be a list of tables ([[rules]] in TOML)")
        return rules
    for i, raw in enumerate(raw_rules):
        path: PathKey = ("rules", i)
        if not iss.keys(raw, path, _RULE, "a rule"):
            continue
        if "action" not in raw:
            iss.add(path, "a rule needs an action ('allow' or 'deny')")
            continue
        fields = _converted({k: v for k, v in raw.items() if k in _RULE}, iss, path)
        line = iss.line(path)
        where = f"{source}:{line}" if line else f"{source} rules[{i}]"
        try:
            rule = EgressRule(**fields, source=where)
        except PolicyError as exc:
            iss.from_error(path, exc)
            continue
        except TypeError as exc:
            iss.add(path, str(exc))
            continue
        if rule.name is not None:
            if rule.name in names:
                iss.add((*path, "name"), f"duplicate rule name {rule.name!r} (also "
                        f"rules[{names[rule.name]}])")
            names.setdefault(rule.name, i)
        rules.append(rule)
    return rules


def _secrets(raw_secrets: object, iss: _Issues, source: str) -> list[EgressSecret]:
    secrets: list[EgressSecret] = []
    if not isinstance(raw_secrets, list):
        iss.add(("secrets",), "secrets must be a list of tables ([[secrets]] in TOML)")
        return secrets
    for i, raw in enumerate(raw_secrets):
        path: PathKey = ("secrets", i)
        if not iss.keys(raw, path, _SECRET, "a secret"):
            continue
        missing = [k for k in ("name", "host") if k not in raw]
        if missing:
            iss.add(path, f"a secret needs {' and '.join(missing)}")
            continue
        line = iss.line(path)
        try:
            secrets.append(EgressSecret(**{k: v for k, v in raw.items() if k in _SECRET
                                           and k != "comment"},
                                        source=f"{source}:{line}" if line else source))
        except PolicyError as exc:
            iss.from_error(path, exc)
    return secrets


def load_policy_text(cls: type[P], text: str, *, format: str, source: str = "<policy>") -> P:
    data, locate = parse_text(text, format=format, source=source)
    return policy_from_data(cls, data, source=source, locate=locate)


def load_policy_file(cls: type[P], path: str | os.PathLike[str]) -> P:
    data, locate, source = load_document(path)
    return policy_from_data(cls, data, source=source, locate=locate)
