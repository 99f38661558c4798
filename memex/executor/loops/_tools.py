"""One turn of the tool-calling action space (the baseline): the model calls functions, the
host runs them, their results come back serialized to text. Calls written as text (fenced
JSON, ``<tool_call>`` tags) count as well as native ones; each is recorded with its kind."""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

from pydantic_core import to_jsonable_python

from .._prompt import TOOLS_NUDGE
from .._trajectory import Step, ToolCallInfo
from ..llm import Completion
from ._context import TurnContext, TurnSession
from ._observe import bound_text, render_observation
from ._parse import extract_tool_calls

__all__ = ["tools_turn"]


HELD = ("[submit not run: it came in the same reply as calls whose results you had not seen "
        "yet. Read their results above, then submit an answer taken from them.]")

_Call = tuple[str | None, str, str, str, str | None]  # id, name, arguments, kind, parse error


def _run_call(ctx: TurnContext, session: TurnSession, name: str, arguments: str,
              parse_error: str | None) -> tuple[str, str]:
    """(outcome, text) of one call."""
    limit = ctx.observation_chars
    if parse_error is not None:
        return "invalid_arguments", f"Error: {parse_error}"
    try:
        args = json.loads(arguments or "{}")
    except ValueError as exc:
        return "invalid_arguments", f"Error: the arguments are not valid JSON ({exc})"
    if not isinstance(args, dict):
        return "invalid_arguments", "Error: the arguments must be a JSON object"
    if name == "python_exec":
        code = args.get("code")
        if not isinstance(code, str):
            return "invalid_arguments", "Error: python_exec needs a string argument `code`"
        r = session.run(code, timeout=ctx.turn_timeout())
        return ("ok" if r.ok else (r.exception.type if r.exception else r.status.value),
                render_observation(r, limit=limit))
    hc = session.call_tool(name, args)
    if hc.ok:
        return "ok", ("accepted" if name == "submit" else _to_text(hc.value, limit))
    err = hc.value if isinstance(hc.value, dict) else {}
    kind = str(err.get("kind", "error"))
    return kind, f"Error ({kind}): {err.get('message', '')}"


def _key(c: Completion) -> str | None:
    """What two replies share when they make the same calls (native or written as text)."""
    calls = [(tc.name, tc.arguments) for tc in c.tool_calls or ()] or [
        (t.name, t.arguments) for t in extract_tool_calls(c.content or "")]
    if not calls:
        return None
    out = []
    for name, arguments in calls:
        with contextlib.suppress(ValueError):  # the same call however its JSON is spaced
            arguments = json.dumps(json.loads(arguments or "{}"), sort_keys=True)
        out.append(f"{name}:{arguments}")
    return "\n".join(out)


def _calls(ctx: TurnContext, c: Completion) -> list[_Call]:
    """The reply's calls (native ones, else those written as text), with the reply added to
    the conversation."""
    reply = c.content or ""
    calls: list[_Call] = [(tc.id, tc.name, tc.arguments, "native", None)
                          for tc in c.tool_calls or ()]
    if calls:
        ctx.messages.append({"role": "assistant", "content": reply, "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": n, "arguments": args}}
            for cid, n, args, _, _ in calls]})
        return calls
    ctx.messages.append({"role": "assistant", "content": reply})
    return [(None, t.name, t.arguments, "text", t.error) for t in extract_tool_calls(reply)]


def _observe(ctx: TurnContext, calls: list[_Call], texts: list[tuple[str | None, str, str]],
             status: str, error: str | None) -> str:
    """Give the results back (as tool messages for native calls, else as one user message);
    the observation as the trajectory records it."""
    hint = ctx.explain(status, error, texts[-1][2] if texts else "")
    reminder = (f"\n{hint}" if hint else "") + ctx.reminder(rejected=status == "rejected")
    if calls[0][3] != "native":
        obs = "\n".join(f"[{name} result]\n{text}" for _, name, text in texts) + reminder
        ctx.messages.append({"role": "user", "content": obs})
        return obs
    shown: list[str] = []
    for j, (cid, _name, text) in enumerate(texts):
        content = text + (reminder if j == len(texts) - 1 else "")
        ctx.messages.append({"role": "tool", "tool_call_id": cid, "content": content})
        shown.append(content)
    for cid, _n, _args, _k, _e in calls[len(texts):]:
        ctx.messages.append({"role": "tool", "tool_call_id": cid,
                             "content": "[not run: the answer was already accepted]"})
    return "\n".join(shown)


def tools_turn(ctx: TurnContext, session: TurnSession) -> Step:
    c, usage = ctx.complete(_key, tools=ctx.tool_definitions(), tool_choice="auto")
    reply = c.content or ""
    index = ctx.turn
    calls = _calls(ctx, c)
    if not calls:
        obs = (TOOLS_NUDGE if ctx.aids.nudge else "No function was called.") + ctx.reminder()
        ctx.messages.append({"role": "user", "content": obs})
        return Step(index=index, reply=reply, action="none", observation=obs,
                    status="no_action", **usage)
    infos: list[ToolCallInfo] = []
    texts: list[tuple[str | None, str, str]] = []
    status, error = "ok", None
    t1 = time.monotonic()
    for j, (cid, name, arguments, kind, perr) in enumerate(calls):
        s = time.monotonic()
        if name == "submit" and j > 0 and ctx.aids.hold_blind_submit:
            # its arguments were written before the results of the calls before it came
            # back: an answer guessed, not read (the code space computes it from them)
            outcome, text = "held", HELD
        else:
            outcome, text = _run_call(ctx, session, name, arguments, perr)
        ctx.drop_calls()  # recorded below with the text the model saw
        infos.append(ToolCallInfo(name=name, arguments=bound_text(arguments, 300),
                                  outcome=outcome, result=bound_text(text, 300),
                                  duration=time.monotonic() - s, kind=kind))
        texts.append((cid, name, text))
        if outcome not in ("ok", "held"):
            status, error = ("rejected" if name == "submit" else "error"), outcome
        if session.submitted:
            status = "submitted"
            break
    exec_s = time.monotonic() - t1
    key = _key(c)
    if key is not None:
        # the same calls again end the same way, failed or not (their results are above):
        # asked again unless they timed out, where waiting longer is a fair retry
        ctx.remember(key, f"it ended with {error}: {bound_text(texts[-1][2], 300)}"
                     if error else "its results are in the conversation above", None,
                     failed=error is None or "timeout" not in error.lower())
    obs = _observe(ctx, calls, texts, status, error)
    return Step(index=index, reply=reply, action="tool_calls", observation=obs,
                status=status, tool_calls=tuple(infos), exec_seconds=exec_s, error=error,
                **usage)


def _to_text(value: Any, limit: int = 4000) -> str:
    """A tool result as text, the way tool-calling agents serialize results (JSON, with
    DataFrames as records)."""
    t = type(value)
    mod = t.__module__.partition(".")[0]
    try:
        if mod == "pandas" and t.__name__ == "DataFrame":
            text = value.to_json(orient="records", date_format="iso")
        elif mod == "pandas":
            text = value.to_json(date_format="iso")
        elif mod == "numpy":
            text = json.dumps(value.tolist())
        else:
            text = json.dumps(to_jsonable_python(value, serialize_unknown=True),
                              ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return bound_text(str(text), limit)
