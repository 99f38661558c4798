"""One turn of the code action space: the model's reply -> blocks run in order -> what they
printed, bounded, back to the model."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from ...runtime_wasm import GuestException, TurnStatus
from .._prompt import NUDGE, PYTHON_TOOL, REPEAT, STOP
from .._trajectory import Step
from ..llm import Completion
from ._context import TurnContext, TurnSession
from ._observe import bound_text, render_observation
from ._order import defined_by_later, missing_name
from ._parse import cut_after_code, extract_code

__all__ = ["code_turn"]

_TIMEOUTS = ("TimeoutError", "asyncio.TimeoutError", "concurrent.futures.TimeoutError")


def _native_blocks(c: Completion) -> list[tuple[str, str]]:
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


def _blocks(c: Completion, native: bool) -> list[str]:
    calls = _native_blocks(c) if native else []
    return [code for _, code in calls] or extract_code(c.content or "")


def _key(blocks: list[str]) -> str | None:
    """What two replies share when they would run the same code."""
    return "\n".join(b.strip() for b in blocks) if blocks else None


def _outcome(status: str, error: str | None, outputs: list[str]) -> str:
    """How a turn's code ended, in a few words, for the note on a repeat."""
    if status in ("error", "killed", "rejected"):
        lines = [ln for ln in "\n".join(outputs).splitlines() if ln.strip()]
        last = next((ln for ln in reversed(lines) if error and error.split(".")[-1] in ln),
                    error or status)
        return f"it failed with {bound_text(last.strip(), 300)}"
    return "its output is in the conversation above"


@dataclass(kw_only=True)
class _Ran:
    """What running a reply's blocks gave."""

    outputs: list[str] = field(default_factory=list)
    status: str = "ok"
    error: str | None = None
    code: list[str] = field(default_factory=list)  # the blocks that ran, in the order they ran
    seconds: float = 0.0


def _run_blocks(ctx: TurnContext, session: TurnSession, blocks: list[str]) -> _Ran:
    """Run the blocks in order, stopping at the first that fails or submits; a block that
    fails on a name a later block defines runs again after that block
    (``Aids.defer_forward_use``)."""
    out = _Ran()
    t1 = time.monotonic()
    queue = list(range(len(blocks)))
    again: dict[int, int] = {}  # a deferred block -> the block it runs after
    while queue:
        i = queue.pop(0)
        r = session.run(blocks[i], timeout=ctx.turn_timeout())
        out.code.append(blocks[i])
        label = f"block {i + 1}" + (f", again after block {again[i] + 1}" if i in again else "")
        failed = r.status is not TurnStatus.OK
        name = _missing(r.exception) if failed and ctx.aids.defer_forward_use else None
        j = defined_by_later(blocks, i, name) if name else None
        if name and j is not None and j in queue:  # j has not run: each deferral moves i on
            again[i] = j
            queue.insert(queue.index(j) + 1, i)
            out.outputs.append(f"[{label}] [it uses {name} before block {j + 1} defines it: "
                               f"run again after block {j + 1}]")
            continue
        text = render_observation(r, limit=ctx.observation_chars)
        out.outputs.append(text if len(blocks) == 1 else f"[{label}]\n{text}")
        if failed:
            out.status = "killed" if r.status is TurnStatus.KILLED else "error"
            out.error = r.exception.type if r.exception else (r.limit or r.status.value)
            if queue:
                out.outputs.append(f"[{len(queue)} later block(s) not run]")
            break
        if session.submitted:
            break
    out.seconds = time.monotonic() - t1
    return out


def _missing(exc: GuestException | None) -> str | None:
    """The name a failed block's NameError says is not defined yet, if that is how it failed."""
    return missing_name(exc.type, exc.message) if exc is not None else None


def _kept(name: str, new: str) -> str:
    """The note for a tool the reply rebound (``Aids.keep_tool_names``)."""
    if not new:
        return f"[{name} is a tool, so it is back]"
    return f"[{name} is a tool, so it stays one: the value this reply assigned to it is now {new}]"


def code_turn(ctx: TurnContext, session: TurnSession) -> Step:
    native = ctx.native_code
    kwargs: dict[str, Any] = {"tools": [PYTHON_TOOL], "tool_choice": "auto"} if native else {}
    if ctx.aids.stop_sequences and not native:
        kwargs["stop"] = STOP
    c, usage = ctx.complete(lambda c: _key(_blocks(c, native)), **kwargs)
    reply = c.content or ""
    index = ctx.turn
    calls = _native_blocks(c) if native else []
    blocks = _blocks(c, native)
    kept = cut_after_code(reply) if ctx.aids.cut_after_code and not native else reply
    assistant: dict[str, Any] = {"role": "assistant", "content": kept}
    if calls:
        assistant["tool_calls"] = [
            {"id": cid, "type": "function",
             "function": {"name": "python", "arguments": json.dumps({"code": code})}}
            for cid, code in calls]
    ctx.messages.append(assistant)
    if not blocks:
        obs = (NUDGE if ctx.aids.nudge else "No code ran.") + ctx.reminder()
        ctx.messages.append({"role": "user", "content": obs})
        return Step(index=index, reply=reply, action="none", observation=obs,
                    status="no_action", **usage)

    key = _key(blocks) or ""
    repeated = ctx.seen(key)
    ran = _run_blocks(ctx, session, blocks)
    tool_calls = ctx.take_calls("code")
    status, error, outputs = ran.status, ran.error, ran.outputs
    if session.submitted:
        status = "submitted"
    elif any(tc.name == "submit" and tc.outcome != "ok" for tc in tool_calls):
        status = "rejected"
    restored, new_vars = ([], []) if session.submitted else session.after_turn(
        keep_tools=ctx.aids.keep_tool_names, variables=ctx.aids.preview_variables)
    outputs.extend(_kept(name, new) for name, new in restored)
    hint = ctx.explain(status, error, "\n".join(outputs))  # from the names known before it
    if hint:
        outputs.append(hint)
    if new_vars:
        ctx.variables.update(new_vars)
        outputs.append("[new variables: " + "; ".join(f"{n}: {d}" for n, d in new_vars) + "]")
    if not repeated:
        ctx.remember(key, _outcome(status, error, outputs), assistant,
                     failed=status in ("error", "rejected") and error not in _TIMEOUTS)
    body = bound_text("\n".join(outputs), ctx.observation_chars)
    if repeated and ctx.aids.repeat_note:
        body = f"{REPEAT}\n{body}"
        if status == "ok":  # stuck after a result: say how that result would be submitted
            offer = ctx.submit_hint(ran.code)
            body += f"\n{offer}" if offer else ""
        status = "repeated" if status == "ok" else status
    obs = "Output:\n" + body + ctx.reminder(rejected=status == "rejected")
    if calls:
        for j, (cid, _code) in enumerate(calls):
            content = obs if j == 0 else "(output included in the first call's result)"
            ctx.messages.append({"role": "tool", "tool_call_id": cid, "content": content})
    else:
        ctx.messages.append({"role": "user", "content": obs})
    return Step(index=index, reply=reply, action="native_code" if calls else "code",
                code=tuple(ran.code), observation=obs, status=status,
                tool_calls=tool_calls, exec_seconds=ran.seconds, error=error,
                new_variables=tuple(n for n, _ in new_vars), **usage)
