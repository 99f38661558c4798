"""What the model sees after a block ran: printed output, the echoed final expression and
errors, bounded. Nothing else about guest state reaches the context."""

from __future__ import annotations

from ...runtime_wasm import TurnResult, TurnStatus

__all__ = ["bound_text", "render_observation", "trim_traceback"]


def bound_text(text: str, limit: int) -> str:
    """``text`` cut to about ``limit`` characters, keeping head and tail around an explicit
    ``[... N characters elided ...]`` marker (the tail often holds the error)."""
    if limit <= 0 or len(text) <= limit:
        return text
    head = int(limit * 0.6)
    tail = limit - head
    elided = len(text) - head - tail
    return f"{text[:head]}\n[... {elided} characters elided ...]\n{text[len(text) - tail:]}"


NO_OUTPUT = "[no output]"  # the observation of a block that showed nothing

_LIMIT_WORDS = {
    "deadline": "the turn's time limit",
    "fuel": "the turn's instruction budget",
    "fuel_total": "the sandbox's instruction budget",
    "memory": "the memory limit",
    "stack": "the stack limit",
    "lifetime": "the sandbox's lifetime",
    "cancelled": "cancellation",
    "trap": "a crash of the interpreter",
}


_CHAIN = ("\nThe above exception was the direct cause of the following exception:\n",
          "\nDuring handling of the above exception, another exception occurred:\n")


# MemEx's own guest plumbing (tool stubs, the door client, submit): a failed tool call's
# message says what went wrong, the frames that carried it say nothing to the model.
_PLUMBING = ("/memex_guest/", '"<memex-')


def trim_traceback(tb: str) -> str:
    """The part of a guest traceback worth the model's context: the last exception of a
    chain, with the agent's own cell frames and the frame that raised (library frames in
    between are dropped with a count; MemEx's own guest frames are dropped silently)."""
    for marker in _CHAIN:
        if marker in tb:
            tb = tb.rsplit(marker, 1)[1].lstrip("\n")
    lines = tb.rstrip("\n").split("\n")
    if not lines or not lines[0].startswith("Traceback"):
        return tb
    frames: list[list[str]] = []
    tail: list[str] = []
    for line in lines[1:]:
        if line.startswith("  File "):
            frames.append([line])
        elif line.startswith("    ") and frames and not tail:
            frames[-1].append(line)
        else:
            tail.append(line)
    frames = [f for f in frames if not any(p in f[0] for p in _PLUMBING)]
    keep = [f for i, f in enumerate(frames)
            if '"<cell-' in f[0] or i == len(frames) - 1]
    out = [lines[0]]
    dropped = 0
    for f in frames:
        if f in keep:
            if dropped:
                out.append(f"  [... {dropped} library frame{'s' if dropped > 1 else ''} ...]")
                dropped = 0
            out.extend(f)
        else:
            dropped += 1
    return "\n".join(out + tail)


def render_observation(result: TurnResult, *, limit: int = 4000) -> str:
    """One block's outcome as text for the model.

    Streams appear as printed (stderr marked), then ``Out: <repr>`` for a final expression,
    then the error: the traceback (already trimmed to the agent's own cell), an exit code,
    or which limit stopped the turn and that its state changes were undone.
    """
    parts: list[str] = []
    if result.stdout:
        parts.append(result.stdout.rstrip("\n"))
    if result.stderr:
        parts.append("[stderr]\n" + result.stderr.rstrip("\n"))
    if result.value is not None:
        parts.append(f"Out: {result.value}")
    if result.status is TurnStatus.ERROR and result.exception is not None:
        exc = result.exception
        parts.append(trim_traceback(exc.traceback).rstrip("\n") if exc.traceback
                     else f"{exc.type}: {exc.message}")
    elif result.status is TurnStatus.EXIT:
        parts.append(f"[the code called exit({result.exit_code}); the session continues]")
    elif result.status is TurnStatus.KILLED:
        what = _LIMIT_WORDS.get(result.limit or "", result.limit or "a limit")
        undone = (" Variables are as they were before this block."
                  if result.rolled_back else "")
        parts.append(f"[stopped by {what}.{undone}]")
    text = "\n".join(parts) if parts else NO_OUTPUT
    return bound_text(text, limit)
