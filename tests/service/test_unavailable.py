"""A part of a cluster that is restarting (Ray's actor errors) is answered 503 with
Retry-After, never 500 (issue 47: a live session's turns got ``500 internal error
(ActorUnavailableError)`` for 18-32 s while the control actor restarted). The access
middleware answers it, with Ray's own exception types raised by the app inside it: the answer
sent, the access log and the metrics all say 503, and nothing is raised on to the server
(which would log a traceback as an error: Starlette's last handler sends its answer and then
raises). The control: any other exception still goes on, to be the 500 of a bug."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest

from memex.service._http import Access
from memex.service._metrics import Metrics

ray = pytest.importorskip("ray")


def serve_once(exc: Exception) -> tuple[list[dict[str, Any]], Metrics]:
    """One GET through ``Access`` whose app raises ``exc``: the messages sent."""
    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise exc

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    sent: list[dict[str, Any]] = []

    async def send(msg: dict[str, Any]) -> None:
        sent.append(msg)

    metrics = Metrics()
    scope = {"type": "http", "method": "POST", "path": "/v1/sessions/s/run", "headers": []}
    asyncio.run(Access(app, metrics=metrics, log=True)(scope, receive, send))
    return sent, metrics


def answered(metrics: Metrics, status: int) -> float:
    return metrics.registry.get_sample_value("memex_http_responses_total",
                                             {"status": str(status)}) or 0.0


@pytest.mark.parametrize("exc", [
    ray.exceptions.ActorUnavailableError("the control actor is restarting", None),
    ray.exceptions.ActorDiedError(),
    ray.exceptions.GetTimeoutError("no answer within 2 s"),
], ids=lambda e: type(e).__name__)
def test_an_actor_away_is_a_503_with_retry_after(exc: Exception,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="memex.service"):
        sent, metrics = serve_once(exc)  # not raised on
    start, body = sent[0], sent[1]
    headers = dict(start["headers"])
    assert (start["status"], headers[b"retry-after"]) == (503, b"1")
    assert b"x-request-id" in headers
    error = json.loads(body["body"])["error"]
    assert error["code"] == "unavailable" and type(exc).__name__ in error["message"]
    assert answered(metrics, 503) == 1 and answered(metrics, 500) == 0
    access = [json.loads(r.getMessage()) for r in caplog.records
              if r.name == "memex.service.access"]
    assert [a["status"] for a in access] == [503]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_any_other_exception_goes_on_to_be_a_500() -> None:
    with pytest.raises(RuntimeError, match="a bug"):
        serve_once(RuntimeError("a bug"))


def test_try_again_from_an_actor_is_answered_from_its_cause() -> None:
    """The cluster's control actor raises BackendBusy ``unavailable`` when its storage does
    not answer (tests/cluster/test_control_restart.py); Ray raises it at the front as
    ``RayTaskError(BackendBusy)``, which no route translates: the app answers 503 with
    Retry-After and the cause's own message (not the remote traceback). The control: a
    BackendBusy of a full queue is still a 429."""
    from starlette.requests import Request

    from memex.errors import BackendBusy
    from memex.service import ServiceConfig, create_app

    handler = create_app(ServiceConfig()).exception_handlers[BackendBusy]
    request = Request({"type": "http", "method": "GET", "path": "/v1/sessions", "headers": []})
    cause = BackendBusy("unavailable", "the cluster's storage did not give this tenant's "
                        "saved sessions")
    raised = ray.exceptions.RayTaskError("of", "Traceback (remote) ...", cause
                                         ).as_instanceof_cause()
    assert isinstance(raised, BackendBusy)  # as the app's handlers look it up
    answer = asyncio.run(handler(request, raised))
    assert (answer.status_code, answer.headers["retry-after"]) == (503, "1")
    error = json.loads(answer.body)["error"]
    assert error["message"] == str(cause) and error["reason"] == "unavailable"
    full = asyncio.run(handler(request, BackendBusy("queue_full", "3 turns waiting")))
    assert full.status_code == 429
