"""A part of a cluster that is restarting (Ray's actor errors) is answered 503 with
Retry-After, never 500 (issue 47: a live session's turns got ``500 internal error
(ActorUnavailableError)`` for 18-32 s while the control actor restarted). The app's last
handler is called here with Ray's own exception types; the control: any other exception is
still the 500 of a bug."""

from __future__ import annotations

import asyncio
import json

import pytest
from starlette.requests import Request

from memex.service import ServiceConfig, create_app

ray = pytest.importorskip("ray")


@pytest.mark.parametrize("exc", [
    ray.exceptions.ActorUnavailableError("the control actor is restarting", None),
    ray.exceptions.ActorDiedError(),
    ray.exceptions.GetTimeoutError("no answer within 2 s"),
], ids=lambda e: type(e).__name__)
def test_an_actor_away_is_a_503_with_retry_after(exc: Exception) -> None:
    handler = create_app(ServiceConfig()).exception_handlers[Exception]
    request = Request({"type": "http", "method": "POST", "path": "/v1/sessions/s/run",
                       "headers": []})
    answer = asyncio.run(handler(request, exc))
    assert (answer.status_code, answer.headers["retry-after"]) == (503, "1")
    body = json.loads(answer.body)["error"]
    assert body["code"] == "unavailable" and type(exc).__name__ in body["message"]
    bug = asyncio.run(handler(request, RuntimeError("a bug")))
    assert bug.status_code == 500 and "retry-after" not in bug.headers
