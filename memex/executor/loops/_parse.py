"""Reading a model's reply: fenced Python blocks, and tool calls written as text.

Small local models rarely produce clean output: fences without a language tag, a missing
closing fence at the end of a reply, tool calls written as fenced JSON or ``<tool_call>`` tags
instead of native calls. These parsers are lenient on purpose and never raise.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["TextToolCall", "cut_after_code", "extract_code", "extract_tool_calls"]

_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([\w+.-]*)[^\n]*\n", re.MULTILINE)
_PY_TAGS = frozenset({"python", "py", "python3", "ipython", "pycon"})
_CODE_TAGS = _PY_TAGS | {""}


def _fences(text: str) -> list[tuple[str, str, bool]]:
    """Every fenced block as (language tag, body, closed)."""
    return [(tag, body, closed) for tag, body, closed, _end in _spans(text)]


def _spans(text: str) -> list[tuple[str, str, bool, int]]:
    """Every fenced block as (language tag, body, closed, where it ends)."""
    out: list[tuple[str, str, bool, int]] = []
    pos = 0
    while True:
        m = _FENCE.search(text, pos)
        if m is None:
            return out
        fence, tag = m.group(1), m.group(2).lower()
        close = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$", re.MULTILINE)
        c = close.search(text, m.end())
        if c is None:
            out.append((tag, text[m.end():], False, len(text)))
            return out
        out.append((tag, text[m.end():c.start()], True, c.end()))
        pos = c.end()


def cut_after_code(text: str) -> str:
    """The reply up to the end of its last code block: what follows never runs, and in a
    small model's reply it is often the model going on to write the user's side (an
    invented output, "Your answer is correct."), which misleads every later turn once it
    is in the context. A reply without a code block is kept whole."""
    ends = [end for tag, _body, _closed, end in _spans(text) if tag in _CODE_TAGS]
    return text[:ends[-1]] if ends else text


def extract_code(text: str) -> list[str]:
    """The Python blocks of a reply, in order.

    Blocks tagged ``python``/``py`` (or untagged, when the reply has no tagged block) count;
    an unclosed last block counts too (models often stop at the stop sequence). ``>>>``
    prompts are stripped from pasted sessions. Blocks that are only whitespace are dropped.
    """
    blocks = _fences(text)
    tagged = [b for b in blocks if b[0] in _PY_TAGS]
    chosen = tagged if tagged else [b for b in blocks if b[0] == "" and not _looks_json(b[1])]
    out = []
    for tag, body, _closed in chosen:
        code = _strip_prompts(body) if tag == "pycon" or body.lstrip().startswith(">>>") else body
        code = code.strip("\n")
        if code.strip():
            out.append(code + "\n")
    return out


def _strip_prompts(body: str) -> str:
    lines = []
    for line in body.splitlines():
        if line.startswith(">>> ") or line.startswith("... "):
            lines.append(line[4:])
        elif line in (">>>", "..."):
            lines.append("")
        else:
            continue  # printed output in a pasted session
    return "\n".join(lines)


def _looks_json(body: str) -> bool:
    s = body.strip()
    return bool(s) and s[0] in "{[" and _loads(s) is not None


def _loads(s: str) -> Any:
    try:
        return json.loads(s)
    except (ValueError, RecursionError):
        return None


@dataclass(frozen=True, kw_only=True)
class TextToolCall:
    """A tool call a model wrote as text. ``arguments`` is the JSON text of the arguments
    (as native calls carry it); ``error`` says why it could not be read, if it could not."""

    name: str
    arguments: str
    source: str  # "json_fence" | "tool_call_tag" | "bare_json"
    error: str | None = None


_TAG = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def extract_tool_calls(text: str) -> list[TextToolCall]:
    """Tool calls written as text: ``<tool_call>{...}</tool_call>`` tags, fenced JSON blocks
    (```json / untagged), or a reply that is one bare JSON object. Each object needs
    ``name`` and ``arguments`` (or ``parameters``); a list of such objects gives several calls.
    ``arguments`` may be an object or a JSON string. Text without any gives ``[]``.
    """
    found: list[tuple[Any, str]] = []
    broken: list[TextToolCall] = []  # marked as calls, but unreadable: told, never dropped
    for m in _TAG.finditer(text):
        found.append((_marked(m.group(1), "tool_call_tag", broken), "tool_call_tag"))
    if not found:
        for tag, body, _closed in _fences(text):
            if tag == "tool_call":
                found.append((_marked(body.strip(), "json_fence", broken), "json_fence"))
            elif tag in ("json", "") and _loads(body.strip()) is not None:
                found.append((_loads(body.strip()), "json_fence"))
    if not found:
        s = text.strip()
        if s[:1] in "{[" and _loads(s) is not None:
            found.append((_loads(s), "bare_json"))
    calls: list[TextToolCall] = []
    for obj, source in found:
        for item in obj if isinstance(obj, list) else [obj]:
            call = _as_call(item, source)
            if call is None and source == "tool_call_tag" and item is not None:
                call = TextToolCall(name="", arguments=_brief(item), source=source,
                                    error="a tool call needs a \"name\" and \"arguments\"")
            if call is not None:
                calls.append(call)
    return broken + calls


def _marked(body: str, source: str, broken: list[TextToolCall]) -> Any:
    """What a body marked as a tool call holds; when it is not JSON, an error call the
    model is told about instead."""
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as exc:
        broken.append(TextToolCall(name="", arguments=body[:300], source=source,
                                   error=f"the tool call is not valid JSON ({exc})"))
        return None


def _brief(item: object) -> str:
    try:
        return json.dumps(item)[:300]
    except (TypeError, ValueError):
        return repr(item)[:300]


def _as_call(obj: object, source: str) -> TextToolCall | None:
    if not isinstance(obj, dict):
        return None
    if "function" in obj and isinstance(obj["function"], dict):  # OpenAI-shaped
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        parsed = _loads(args) if args.strip() else {}
        if not isinstance(parsed, dict):
            return TextToolCall(name=name, arguments=args, source=source,
                                error="the arguments are not a JSON object")
        return TextToolCall(name=name, arguments=json.dumps(parsed), source=source)
    if not isinstance(args, dict):
        return TextToolCall(name=name, arguments=json.dumps(args), source=source,
                            error="the arguments are not a JSON object")
    return TextToolCall(name=name, arguments=json.dumps(args), source=source)
