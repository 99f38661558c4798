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
    "CONVERT_HINT",
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
    "answer_fields",
    "answer_is_object",
    "code_example",
    "describe_value",
    "placeholder",
    "render_schema",
    "tools_example",
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
# At most four: the OpenAI API refuses more. "Assistant:" is where a model goes on to write
# the next turn itself (the worked example's format), after inventing the user's.
STOP = ["```output", "\nOutput:", "\nUser:", "\nAssistant:"]
REMOVED = "MemEx removed a turn here"
REPEAT = ("Note: this reply repeats an earlier reply word for word; its output is above. "
          "Do something different, or submit the answer if you have it.")

PYTHON_TOOL = {"type": "function", "function": {
    "name": "python", "description": "Run a Python code block in the persistent session.",
    "parameters": {"type": "object", "properties": {"code": {"type": "string"}},
                   "required": ["code"]}}}
PYTHON_TOOL_RULE = ("Send each code block as a call of the `python` function (argument `code`) "
                    "instead of a fenced block.")

CONVERT_HINT = ("submit() takes plain Python values (dict, list, str, int, float, bool): "
                "turn pandas and numpy results into them first (series.to_dict(), "
                "series.tolist(), series.iloc[0], float(x), int(x), str(x)).")


def code_example(call: str | None, schema: object) -> str:
    """The worked example of the code action space, built from the rollout's own first tool
    call (``call``, e.g. ``sql(query="...")``) and answer ``schema``: a small model copies
    the example's names and shapes, so they must be ones that exist (a fixed example made
    models call functions named after tables and submit the example's fields). The answer
    is submitted from variables named after its fields and their computation is left to a
    comment: small models copy an example block verbatim, and a value (or ``...``) in it
    would be submitted as is."""
    first = (f"Assistant: I will call {call.partition('(')[0]} first and keep its result in a "
             f"variable.\n```python\nresult = {call}\nprint(result)\n```\nUser: Output:\n"
             "(what the code printed)\n") if call else ""
    fields = answer_fields(schema)
    if fields:
        names = " and ".join(", ".join(n for n, _ in fields).rsplit(", ", 1))
        kinds = "; ".join(f"{n}: {k}" for n, k in fields)
        value = "{" + ", ".join(f'"{name}": {name}' for name, _ in fields) + "}"
    else:
        names, kinds, value = "answer", f"answer: {render_schema(schema)}", "answer"
    return ("Example of the format (made up: your task and data differ):\n" + first
            + f"Assistant: I compute {names} from the results and submit them.\n"
            f"```python\n# first compute {names} from the results ({kinds})\n"
            f"submit({value})\n```\n" + CONVERT_HINT)


def tools_example(call: str | None, schema: object) -> str:
    """The tool-calling twin of :func:`code_example` (``call`` as ``name`` with JSON
    arguments); the answer's values are described, not given."""
    first = f"call {call}, read what it returns, " if call else ""
    fields = answer_fields(schema)
    shape = ("{" + ", ".join(f'"{n}": <{k}>' for n, k in fields) + "}" if fields
             else f"<{render_schema(schema)}>")
    return (f"Example of the format (made up: your task and data differ): {first}"
            "use python_exec for arithmetic on long results, then call `submit` with "
            f'{{"answer": {shape}}}, each value taken from the results.')


def answer_fields(schema: object) -> list[tuple[str, str]]:
    """(name, rendered type) of each top-level field of an object schema whose field names
    are identifiers; [] for any other schema."""
    js = _json_schema(schema)
    props = js.get("properties") if isinstance(js, Mapping) else None
    if js.get("type") != "object" or not isinstance(props, Mapping) or not props:
        return []
    if not all(isinstance(n, str) and n.isidentifier() for n in props):
        return []
    defs = js.get("$defs", {})
    return [(n, _render(sub, defs, 1)) for n, sub in props.items()]


def answer_is_object(schema: object) -> bool:
    """The schema describes an object with named fields (a model, a TypedDict...)."""
    return _json_schema(schema).get("type") == "object"


def _json_schema(schema: Any) -> Mapping[str, Any]:
    if schema is None:
        return {}
    if isinstance(schema, Mapping):
        return schema
    try:
        from pydantic import TypeAdapter

        js: Mapping[str, Any] = TypeAdapter(schema).json_schema()
    except Exception:
        return {}
    if "$ref" in js:  # a model at the top: its own definition
        name = str(js["$ref"]).rsplit("/", 1)[-1]
        return {**js.get("$defs", {}).get(name, {}), "$defs": js.get("$defs", {})}
    return js


def placeholder(schema: object, *, style: str = "python") -> str:
    """A made-up value in the shape of ``schema`` (a type or JSON Schema), as a Python
    literal (``style="python"``) or JSON text (``"json"``): for tool arguments in the
    worked example."""
    js = _json_schema(schema)
    value = _example(js, js.get("$defs", {}), 0) if js else "..."
    return json.dumps(value) if style == "json" else repr(value)


def _example(js: object, defs: Mapping[str, Any], depth: int) -> Any:
    if not isinstance(js, Mapping) or depth > 4:
        return "..."
    if "$ref" in js:
        return _example(defs.get(str(js["$ref"]).rsplit("/", 1)[-1], {}), defs, depth + 1)
    if js.get("enum"):
        return js["enum"][0]
    if "const" in js:
        return js["const"]
    for key in ("anyOf", "oneOf"):
        if key in js:
            subs = [s for s in js[key] if not (isinstance(s, Mapping)
                                               and s.get("type") == "null")]
            return _example(subs[0] if subs else {}, defs, depth + 1)
    t = js.get("type")
    t = next((x for x in t if x != "null"), None) if isinstance(t, list) else t
    if t == "object":
        props = js.get("properties")
        if isinstance(props, Mapping) and props:
            return {k: _example(v, defs, depth + 1) for k, v in props.items()}
        extra = js.get("additionalProperties")
        return {"key": _example(extra if isinstance(extra, Mapping) else {}, defs, depth + 1)}
    if t == "array":
        return [_example(js.get("items", {}), defs, depth + 1)]
    return {"string": "abc", "integer": 3, "number": 0.25, "boolean": True}.get(str(t), "...")


def render_schema(schema: object) -> str:
    """A compact description of a submit schema: ``{field: type — description, ...}``."""
    if schema is None:
        return "any value"
    js = _json_schema(schema)
    if not js and not isinstance(schema, Mapping):  # no JSON Schema for this type
        return getattr(schema, "__name__", repr(schema))
    return _render(js, js.get("$defs", {}), 0)


def _render(js: object, defs: Mapping[str, Any], depth: int) -> str:
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
        extra = js.get("additionalProperties")
        if isinstance(extra, Mapping) and extra:
            return f"dict of str -> {_render(extra, defs, depth + 1)}"
        return "object"
    names = {"string": "str", "integer": "int", "number": "float", "boolean": "bool",
             "null": "null"}
    if isinstance(t, list):
        return " | ".join(names.get(x, str(x)) for x in t)
    return names.get(str(t), "value")


def _n(x: int) -> str:
    return f"{x:,}"


def describe_value(value: object, *, limit: int = 160) -> str:
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


def _short(v: object) -> str:
    if isinstance(v, list | tuple | set | frozenset | Mapping) or (
            type(v).__module__.partition(".")[0] in ("pandas", "numpy")):
        return _describe(v)
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return f"{type(v).__name__} record"
    return repr(v)[:60]
