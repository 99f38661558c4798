"""One turn of the tool-calling action space (the baseline): the model calls functions, the
host runs them, their results come back serialized to text. Calls written as text (fenced
JSON, ``<tool_call>`` tags) count as well as native ones; each is recorded with its kind."""

from __future__ import annotations

import contextlib
import json
import time
from typing import TYPE_CHECKING, Any

from ._observe import bound_text, render_observation
from ._parse import extract_tool_calls
from ._session import to_text
from ._trajectory import Step, ToolCallInfo

if TYPE_CHECKING:
    from ._agent import _Run
    from ._session import AgentSession

__all__ = ["tools_turn"]


def _run_call(run: _Run, session: AgentSession, name: str, arguments: str,
              parse_error: str | None) -> tuple[str, str]:
    """(outcome, text) of one call."""
    limit = run.a.observation_chars
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
        r = session.run(code, timeout=run._turn_timeout())
        return ("ok" if r.ok else (r.exception.type if r.exception else r.status.value),
                render_observation(r, limit=limit))
    hc = session.call_tool(name, args)
    if hc.ok:
        return "ok", ("accepted" if name == "submit" else to_text(hc.value, limit))
    err = hc.value if isinstance(hc.value, dict) else {}
    kind = str(err.get("kind", "error"))
    return kind, f"Error ({kind}): {err.get('message', '')}"


def _key(c: Any) -> str | None:
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


def tools_turn(run: _Run, session: AgentSession) -> Step:
    from ._agent import TOOLS_NUDGE

    a = run.a
    c, usage = run._complete_fresh(_key, tools=a.tool_definitions(), tool_choice="auto")
    reply = c.content or ""
    index = len(run.steps)
    calls: list[tuple[str | None, str, str, str, str | None]] = [
        (tc.id, tc.name, tc.arguments, "native", None) for tc in c.tool_calls or ()]
    if calls:
        run.messages.append({"role": "assistant", "content": reply, "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": n, "arguments": args}}
            for cid, n, args, _, _ in calls]})
    else:
        calls = [(None, t.name, t.arguments, "text", t.error)
                 for t in extract_tool_calls(reply)]
        run.messages.append({"role": "assistant", "content": reply})
    if not calls:
        obs = (TOOLS_NUDGE if a.aids.nudge else "No function was called.") + run._reminder()
        run.messages.append({"role": "user", "content": obs})
        return Step(index=index, reply=reply, action="none", observation=obs,
                    status="no_action", **usage)
    key = _key(c)
    infos: list[ToolCallInfo] = []
    texts: list[tuple[str | None, str, str]] = []
    status, error = "ok", None
    t1 = time.monotonic()
    for cid, name, arguments, kind, perr in calls:
        s = time.monotonic()
        outcome, text = _run_call(run, session, name, arguments, perr)
        run.pending_calls.clear()  # recorded below with the text the model saw
        infos.append(ToolCallInfo(name=name, arguments=bound_text(arguments, 300),
                                  outcome=outcome, result=bound_text(text, 300),
                                  duration=time.monotonic() - s, kind=kind))
        texts.append((cid, name, text))
        if outcome != "ok":
            status, error = ("rejected" if name == "submit" else "error"), outcome
        if session.submitted:
            status = "submitted"
            break
    exec_s = time.monotonic() - t1
    if key is not None and key not in run.replies:
        run.replies[key] = (index, f"it ended with {error}: {bound_text(texts[-1][2], 300)}"
                            if error else "its results are in the conversation above", None)
        if error is not None and "timeout" not in error.lower():
            run.failed.add(key)
    reminder = run._reminder()
    shown: list[Any] = []
    if calls[0][3] == "native":
        for j, (cid, _name, text) in enumerate(texts):
            content = text + (reminder if j == len(texts) - 1 else "")
            run.messages.append({"role": "tool", "tool_call_id": cid, "content": content})
            shown.append(content)
        for cid, _n, _args, _k, _e in calls[len(texts):]:
            run.messages.append({"role": "tool", "tool_call_id": cid,
                                 "content": "[not run: the answer was already accepted]"})
        obs = "\n".join(shown)
    else:
        obs = "\n".join(f"[{name} result]\n{text}" for _, name, text in texts) + reminder
        run.messages.append({"role": "user", "content": obs})
    return Step(index=index, reply=reply, action="tool_calls", observation=obs,
                status=status, tool_calls=tuple(infos), exec_seconds=exec_s, error=error,
                **usage)
