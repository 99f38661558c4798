"""One turn of the code action space: the model's reply -> blocks run in order -> what they
printed, bounded, back to the model."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from ..runtime_wasm import TurnStatus
from ._observe import bound_text, render_observation
from ._parse import extract_code
from ._trajectory import Step

if TYPE_CHECKING:
    from ._agent import _Run
    from ._session import AgentSession

__all__ = ["code_turn"]


def _native_blocks(c: Any) -> list[tuple[str, str]]:
    """(call id, code) of each native ``python`` call."""
    out = []
    for tc in c.tool_calls or ():
        if tc.name != "python":
            continue
        try:
            args = json.loads(tc.arguments or "{}")
        except ValueError:
            args = {"code": tc.arguments}  # some servers send the code itself
        code = args.get("code") if isinstance(args, dict) else None
        if isinstance(code, str):
            out.append((tc.id, code))
    return out


def _blocks(c: Any, native: bool) -> list[str]:
    calls = _native_blocks(c) if native else []
    return [code for _, code in calls] or extract_code(c.content or "")


def _key(blocks: list[str]) -> str | None:
    """What two replies share when they would run the same code."""
    return "\n".join(b.strip() for b in blocks) if blocks else None


_TIMEOUTS = ("TimeoutError", "asyncio.TimeoutError", "concurrent.futures.TimeoutError")


def _outcome(status: str, error: str | None, outputs: list[str]) -> str:
    """How a turn's code ended, in a few words, for the note on a repeat."""
    if status in ("error", "killed", "rejected"):
        lines = [ln for ln in "\n".join(outputs).splitlines() if ln.strip()]
        last = next((ln for ln in reversed(lines) if error and error.split(".")[-1] in ln),
                    error or status)
        return f"it failed with {bound_text(last.strip(), 300)}"
    return "its output is in the conversation above"


def code_turn(run: _Run, session: AgentSession) -> Step:
    from ._agent import NUDGE, PYTHON_TOOL, REPEAT, STOP

    a = run.a
    native = a.code_via == "tool_call"
    kwargs: dict[str, Any] = {"tools": [PYTHON_TOOL], "tool_choice": "auto"} if native else {}
    if a.aids.stop_sequences and not native:
        kwargs["stop"] = STOP
    c, usage = run._complete_fresh(lambda c: _key(_blocks(c, native)), **kwargs)
    reply = c.content or ""
    index = len(run.steps)
    calls = _native_blocks(c) if native else []
    blocks = _blocks(c, native)
    action = "native_code" if calls else ("code" if blocks else "none")
    assistant: dict[str, Any] = {"role": "assistant", "content": reply}
    if calls:
        assistant["tool_calls"] = [
            {"id": cid, "type": "function",
             "function": {"name": "python", "arguments": json.dumps({"code": code})}}
            for cid, code in calls]
    run.messages.append(assistant)
    if not blocks:
        obs = (NUDGE if a.aids.nudge else "No code ran.") + run._reminder()
        run.messages.append({"role": "user", "content": obs})
        return Step(index=index, reply=reply, action="none", observation=obs,
                    status="no_action", **usage)

    key = _key(blocks) or ""
    repeated = key in run.replies
    outputs: list[str] = []
    status, error = "ok", None
    t1 = time.monotonic()
    ran = 0
    for i, code in enumerate(blocks):
        r = session.run(code, timeout=run._turn_timeout())
        ran += 1
        text = render_observation(r, limit=a.observation_chars)
        outputs.append(text if len(blocks) == 1 else f"[block {i + 1}]\n{text}")
        if r.status is not TurnStatus.OK:
            status = "killed" if r.status is TurnStatus.KILLED else "error"
            error = r.exception.type if r.exception else (r.limit or r.status.value)
            if i + 1 < len(blocks):
                outputs.append(f"[{len(blocks) - i - 1} later block(s) not run]")
            break
        if session.submitted:
            break
    exec_s = time.monotonic() - t1
    tool_calls = run.take_calls("code")
    if session.submitted:
        status = "submitted"
    elif any(tc.name == "submit" and tc.outcome != "ok" for tc in tool_calls):
        status = "rejected"
    new_vars: list[tuple[str, str]] = []
    if a.aids.preview_variables and not session.submitted:
        new_vars = session.new_variables()
        if new_vars:
            outputs.append("[new variables: " + "; ".join(f"{n}: {d}" for n, d in new_vars)
                           + "]")
    if not repeated:
        run.replies[key] = (index, _outcome(status, error, outputs), assistant)
        if status in ("error", "rejected") and error not in _TIMEOUTS:
            run.failed.add(key)
    body = bound_text("\n".join(outputs), a.observation_chars)
    if repeated and a.aids.repeat_note:
        body = f"{REPEAT}\n{body}"
        status = "repeated" if status == "ok" else status
    obs = "Output:\n" + body + run._reminder()
    if calls:
        for j, (cid, _code) in enumerate(calls):
            content = obs if j == 0 else "(output included in the first call's result)"
            run.messages.append({"role": "tool", "tool_call_id": cid, "content": content})
    else:
        run.messages.append({"role": "user", "content": obs})
    return Step(index=index, reply=reply, action=action, code=tuple(blocks[:ran]),
                observation=obs, status=status, tool_calls=tool_calls, exec_seconds=exec_s,
                error=error, new_variables=tuple(n for n, _ in new_vars), **usage)
