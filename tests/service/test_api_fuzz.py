"""Bounded fuzzing of the service's API with hypothesis, driven by its committed OpenAPI
document: any JSON body, path id, query or key on any operation gets an answer below 500, and
every error answer has the typed body. A real server on 127.0.0.1 (tests/conftest.py); each
created session is closed again."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lanes import examples

EXAMPLES = int(os.environ.get("MEMEX_FUZZ_EXAMPLES") or examples(100))

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=40))
json_values = st.recursive(scalars, lambda kids: st.one_of(
    st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=12), kids, max_size=4)),
    max_leaves=12)
limit_fields = st.sampled_from(["timeout", "memory", "fuel", "stdout_bytes", "disk_files",
                                "idle_timeout", "open_files", "nope"])
create_bodies = st.fixed_dictionaries({}, optional={
    "limits": st.one_of(json_values, st.dictionaries(limit_fields, scalars, max_size=3)),
    "preload": st.one_of(json_values, st.lists(st.text(max_size=12), max_size=3)),
    "mounts": st.one_of(json_values, st.lists(st.fixed_dictionaries(
        {"host": st.sampled_from(["/", "/etc", "relative", "/nonexistent"]),
         "guest": st.text(max_size=10)}), max_size=2)),
    "env": json_values,
    "extra": scalars,
})
run_bodies = st.one_of(json_values, st.fixed_dictionaries({"code": st.one_of(
    st.text(max_size=60), scalars)}, optional={"timeout": scalars, "filename": scalars}))
paths = st.one_of(st.sampled_from(["/tmp/x", "/etc/passwd", "../x", "", "/tmp/../..", "/"]),
                  st.text(max_size=30))


def check(r: httpx2.Response) -> None:
    assert r.status_code < 500, (r.status_code, r.text[:300])
    if r.status_code >= 400:
        err = r.json()["error"]
        assert isinstance(err["code"], str) and isinstance(err["message"], str)


@pytest.fixture
def api(memex_server: Any) -> Any:
    client = httpx2.Client(base_url=memex_server.url, timeout=60,
                           headers={"Authorization": f"Bearer {memex_server.keys['b']}"})
    sid = client.post("/v1/sessions", json={"limits": {"timeout": 5}}).json()["id"]
    yield client, sid
    for s in client.get("/v1/sessions").json()["sessions"]:
        client.delete(f"/v1/sessions/{s['id']}")
    client.close()


FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


@FUZZ
@given(body=create_bodies)
def test_create_with_any_body(api: Any, body: dict[str, Any]) -> None:
    client, _ = api
    r = client.post("/v1/sessions", json=body)
    check(r)
    if r.status_code == 201:
        assert client.delete(f"/v1/sessions/{r.json()['id']}").status_code == 204


@FUZZ
@given(body=run_bodies)
def test_run_with_any_body(api: Any, body: Any) -> None:
    client, sid = api
    if isinstance(body, dict) and isinstance(body.get("timeout"), int | float) and \
            body["timeout"] > 5:
        body["timeout"] = 5  # a bounded example, not a 10**70-second turn
    check(client.post(f"/v1/sessions/{sid}/run", json=body))


# every operation of the committed OpenAPI document (a route added to the app is fuzzed
# without touching this file; the document is kept current by test_service.py)
OPENAPI = json.loads((Path(__file__).resolve().parents[2] / "docs" /
                      "service-openapi.json").read_text())
OPERATIONS = sorted((path, method.upper(), tuple(
    (p["name"], p["in"]) for p in op.get("parameters", ())))
    for path, ops in OPENAPI["paths"].items() for method, op in ops.items())
words = st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126,
                                       exclude_characters="/?#%"), min_size=1, max_size=20)


@FUZZ
@given(operation=st.sampled_from(OPERATIONS),
       method=st.one_of(st.none(), st.sampled_from(["GET", "PUT", "POST", "DELETE", "PATCH"])),
       ours=st.booleans(), text=words,
       query=st.dictionaries(st.sampled_from(["path", "limit", "x"]),
                             st.one_of(paths, st.integers(-5, 10**6).map(str)), max_size=3),
       body=st.one_of(json_values, st.binary(max_size=64)),
       auth=st.sampled_from(["ok", "ok", "none", "junk"]))
def test_any_request_on_any_operation(api: Any, operation: tuple[str, str, Any],
                                      method: str | None, ours: bool, text: str,
                                      query: dict[str, str], body: Any, auth: str) -> None:
    """The documented operations with any path ids, query, body and key, and with methods
    they do not take: an answer below 500, with a typed body when it is an error."""
    client, sid = api
    template, documented, _ = operation
    verb = method or documented
    url = template.replace("{sid}", sid if ours else text).replace("{cid}", text)
    if verb == "DELETE" and url == f"/v1/sessions/{sid}":
        return  # keep the session the other requests use
    headers = {"none": {"Authorization": ""}, "junk": {"Authorization": "Bearer " + text},
               "ok": {}}[auth]
    kwargs: dict[str, Any] = {"params": query, "headers": headers}
    if verb in ("PUT", "POST", "PATCH"):
        kwargs["content" if isinstance(body, bytes) else "json"] = body
    r = client.request(verb, url, **kwargs)
    if template in ("/metrics", "/healthz", "/readyz") and r.status_code == 200:
        return  # not JSON errors: text and plain answers
    check(r)


def test_every_operation_is_in_the_document() -> None:
    assert len(OPERATIONS) >= 18 and ("/v1/sessions/{sid}/run", "POST", (("sid", "path"),)) \
        in OPERATIONS
