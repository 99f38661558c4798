"""Prompts: one core shared by both action spaces, so a comparison measures the action space
and not the wording; one-line descriptions of inputs, which never enter the context whole."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Mapping
from typing import Any

__all__ = [
    "CODE_EXAMPLE",
    "CODE_RULES",
    "CORE",
    "NUDGE",
    "PYTHON_TOOL",
    "PYTHON_TOOL_RULE",
    "REMOVED",
    "REPEAT",
    "STOP",
    "TEXT_CALL_HINT",
    "TOOLS_EXAMPLE",
    "TOOLS_NUDGE",
    "TOOLS_RULES",
    "describe_value",
    "render_schema",
]

CORE = """\
You are a careful data analyst agent. Solve the task using the tools and the data you are given.
Never invent data: every number in your answer must come from a result you have seen."""

CODE_RULES = """\
You act by writing Python code. Each reply: one short sentence of reasoning, then ONE ```python
code block. The block runs in a persistent Python session: variables, imports and functions stay
defined for later blocks. You see only what the code prints and the value of its last line, so
keep results in variables and print only what you need (a count, df.head(), a few values).
The tools below are Python functions already defined in the session; call them from code.
When you know the answer, call submit(...) in a code block; the task ends when it is accepted.
If submit() reports an error, fix the answer and submit again."""

TOOLS_RULES = """\
You act by calling the functions you are given, one or more per reply. Their results come back
to you as text. python_exec runs Python code in a persistent session and returns what it prints.
When you know the answer, call the submit function; the task ends when it is accepted.
If submit reports an error, fix the answer and submit again."""

CODE_EXAMPLE = """\
Example of the format (a different task: "How many orders are above 100?", tool
`orders() -> DataFrame`):
Assistant: I will load the orders and count the large ones.
```python
df = orders()
big = df[df["amount"] > 100]
print(len(big))
```
User: Output:
42
Assistant: There are 42 such orders, so I submit.
```python
submit({"count": 42})
```"""

TOOLS_EXAMPLE = """\
Example of the format (a different task: "How many orders are above 100?", function
`orders`): call `orders` with {}, read the rows it returns, count those with amount > 100
(use python_exec for arithmetic on long lists), then call `submit` with
{"answer": {"count": 42}}."""

TEXT_CALL_HINT = """\
If you cannot make a native function call, write each call as a fenced JSON block:
```json
{"name": "FUNCTION_NAME", "arguments": {...}}
```"""


# What the loops say to the model between turns.
NUDGE = ("Your reply had no ```python code block, so nothing ran. Reply with one ```python "
         "block; call submit(...) in it when you know the answer.")
TOOLS_NUDGE = ("Your reply had no function call, so nothing ran. Call one of the functions; "
               "call submit when you know the answer.")
STOP = ["```output", "\nOutput:", "\nUser:"]
REMOVED = "MemEx removed a turn here"
REPEAT = ("Note: this reply repeats an earlier reply word for word; its output is above. "
          "Do something different, or submit the answer if you have it.")

PYTHON_TOOL = {"type": "function", "function": {
    "name": "python", "description": "Run a Python code block in the persistent session.",
    "parameters": {"type": "object", "properties": {"code": {"type": "string"}},
                   "required": ["code"]}}}
PYTHON_TOOL_RULE = ("Send each code block as a call of the `python` function (argument `code`) "
                    "instead of a fenced block.")


def render_schema(schema: Any) -> str:
    """A compact description of a submit schema: ``{field: type — description, ...}``."""
    if schema is None:
        return "any value"
    js: Any = None
    if isinstance(schema, Mapping):
        js = schema
    else:
        try:
            from pydantic import TypeAdapter

            js = TypeAdapter(schema).json_schema()
        except Exception:
            return getattr(schema, "__name__", repr(schema))
    return _render(js, js.get("$defs", {}) if isinstance(js, Mapping) else {}, 0)


def _render(js: Any, defs: Mapping[str, Any], depth: int) -> str:
    if not isinstance(js, Mapping) or depth > 4:
        return "value"
    if "$ref" in js:
        return _render(defs.get(str(js["$ref"]).rsplit("/", 1)[-1], {}), defs, depth + 1)
    if "enum" in js:
        return " | ".join(json.dumps(v) for v in js["enum"])
    if "const" in js:
        return json.dumps(js["const"])
    for key in ("anyOf", "oneOf"):
        if key in js:
            return " | ".join(_render(s, defs, depth + 1) for s in js[key])
    t = js.get("type")
    if t == "object" and "properties" in js:
        req = set(js.get("required", ()))
        items = []
        for name, sub in js["properties"].items():
            desc = sub.get("description") if isinstance(sub, Mapping) else None
            opt = "" if name in req else " (optional)"
            items.append(f'"{name}": {_render(sub, defs, depth + 1)}{opt}'
                         + (f" — {desc}" if desc else ""))
        return "{" + ", ".join(items) + "}"
    if t == "array":
        return f"list of {_render(js.get('items', {}), defs, depth + 1)}"
    if t == "object":
        return "object"
    names = {"string": "str", "integer": "int", "number": "float", "boolean": "bool",
             "null": "null"}
    if isinstance(t, list):
        return " | ".join(names.get(x, str(x)) for x in t)
    return names.get(str(t), "value")


def _n(x: int) -> str:
    return f"{x:,}"


def describe_value(value: Any, *, limit: int = 160) -> str:
    """One line about a value for the prompt: type and size, never its contents in bulk."""
    text = _describe(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe(v: Any) -> str:
    t = type(v)
    mod = t.__module__.partition(".")[0]
    if mod == "pandas" and t.__name__ == "DataFrame":
        cols = ", ".join(f"{c} ({v[c].dtype})" for c in list(v.columns)[:12])
        more = f", +{len(v.columns) - 12} more" if len(v.columns) > 12 else ""
        return f"DataFrame, {_n(len(v))} rows x {len(v.columns)} columns: {cols}{more}"
    if mod == "pandas" and t.__name__ == "Series":
        return f"Series {v.name!r}, {_n(len(v))} values ({v.dtype})"
    if mod == "numpy" and t.__name__ == "ndarray":
        return f"ndarray {v.dtype}, shape {tuple(v.shape)}"
    if t.__name__ == "Trajectory" and hasattr(v, "steps"):
        ans = json.dumps(v.answer)[:60] if v.submitted else "none"
        return (f"Trajectory of a {v.action_space} rollout: {len(v.steps)} steps, ended by "
                f"{v.end_reason}, answer {ans}; fields: task, steps (reply, code, observation, "
                f"tool_calls, status), answer, end_reason")
    if isinstance(v, str):
        first = v.strip().splitlines()[0][:50] if v.strip() else ""
        return f"str, {_n(len(v))} characters" + (f', starting "{first}"' if first else "")
    if isinstance(v, bytes | bytearray):
        return f"bytes, {_n(len(v))} bytes"
    if isinstance(v, Mapping):
        keys = ", ".join(map(str, list(v)[:10]))
        return f"dict with {_n(len(v))} keys: {keys}" + (", ..." if len(v) > 10 else "")
    if isinstance(v, list | tuple | set | frozenset):
        kind = type(v).__name__
        if not v:
            return f"empty {kind}"
        first = next(iter(v))
        return f"{kind} of {_n(len(v))} items; first: {_short(first)}"
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        names = [f.name for f in dataclasses.fields(v)]
        return f"{t.__name__} record with fields: {', '.join(names)}"
    pyd = sys.modules.get("pydantic")
    if pyd is not None and isinstance(v, pyd.BaseModel):
        return f"{t.__name__} record with fields: {', '.join(type(v).model_fields)}"
    return f"{t.__name__}: {repr(v)[:80]}"


def _short(v: Any) -> str:
    if isinstance(v, list | tuple | set | frozenset | Mapping) or (
            type(v).__module__.partition(".")[0] in ("pandas", "numpy")):
        return _describe(v)
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return f"{type(v).__name__} record"
    return repr(v)[:60]
