"""One log format for ``memex serve``: every line on stderr is one JSON object (access and
audit lines, errors with their traceback, uvicorn's own messages), and every line written while
a request is served carries its ``request_id``: the client's ``X-Request-ID`` when it sends a
sane one, else one made here, echoed in the answer's ``X-Request-ID`` header."""

from __future__ import annotations

import contextvars
import json
import logging
import re
import sys
import time
import uuid

__all__ = ["REQUEST_ID", "JsonLines", "configure", "request_id_from"]

REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "memex_request_id", default=None)
"""The id of the request being served (threads started for it inherit the context)."""

_SANE_ID = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")


def request_id_from(headers: list[tuple[bytes, bytes]]) -> str:
    """The client's ``X-Request-ID`` if it is 1-128 token characters, else a new id (a log
    line must not carry what a client wrote unchecked)."""
    for name, value in headers:
        if name.lower() == b"x-request-id":
            text = value.decode("latin-1")
            if _SANE_ID.fullmatch(text):
                return text
            break
    return uuid.uuid4().hex


class JsonLines(logging.Formatter):
    """A record as one JSON object: ``ts``, ``level``, ``logger``, the request id, then the
    message's own fields when it is a MemEx logger's JSON object (the access and audit lines
    are), else ``message``; an exception as ``exc`` (its traceback, one string)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": round(record.created, 3), "level": record.levelname.lower(),
            "logger": record.name}
        rid = REQUEST_ID.get()
        if rid is not None:
            out["request_id"] = rid
        text = record.getMessage()
        fields = None
        # only MemEx's own lines are JSON to merge: another library's message may carry text
        # a client chose, which must not become fields of the line (a forged "tenant")
        if text.startswith("{") and record.name.startswith("memex"):
            try:
                fields = json.loads(text)
            except ValueError:
                fields = None
        if isinstance(fields, dict):
            out.update({k: v for k, v in fields.items() if k not in out})
        else:
            out["message"] = text
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)

    def formatTime(self, record: logging.LogRecord,
                   datefmt: str | None = None) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))


def configure(level: int | str = logging.INFO, *, access: bool = True) -> None:
    """Send MemEx's and uvicorn's log records to stderr as JSON lines (``access=False``:
    no access or audit lines, errors still)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines())
    for name in ("memex", "uvicorn", "uvicorn.error"):
        log = logging.getLogger(name)
        for h in list(log.handlers):
            log.removeHandler(h)
        log.addHandler(handler)
        log.setLevel(level)
        log.propagate = False
    for name in ("memex.service.access", "memex.service.audit"):
        log = logging.getLogger(name)
        for h in list(log.handlers):
            log.removeHandler(h)
        log.propagate = True
        log.setLevel(logging.INFO if access else logging.WARNING)
