"""schemathesis against `memex serve`'s own OpenAPI document: every operation is called with
requests generated from the document (valid and invalid ones), on a real server on
127.0.0.1, and each answer must be one the document describes (status, content type, body
schema, headers), never a server error. Session routes get the id of a live session about
half the time (a fresh one when a case closed it; never in place of an id that is the case's
invalid part), so they are tested past their 404."""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from lanes import examples
from schemathesis import GenerationMode
from served import Served, start_server

from memex.service._models import REQUIREMENT
from memex.serving import ID_PATTERN


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    s = start_server(tmp_path_factory.mktemp("st"), {"t": "max_sessions = 4\n"})
    try:
        yield s
    finally:
        s.stop()


class Live:
    """A live session of the tenant (a case may close it: then another is made)."""

    def __init__(self, served: Served) -> None:
        self.served, self.sid = served, ""
        self.http = httpx2.Client(base_url=served.url, timeout=30,
                                  headers={"Authorization": f"Bearer {served.keys['t']}"})

    def session(self) -> str:
        if not self.sid or self.http.get(f"/v1/sessions/{self.sid}").status_code != 200:
            for sid in [s["id"] for s in self.http.get("/v1/sessions").json()["sessions"]]:
                self.http.delete(f"/v1/sessions/{sid}")  # room under max_sessions
            r = self.http.post("/v1/sessions", json={})
            assert r.status_code == 201, r.text
            self.sid = r.json()["id"]
        return self.sid


@pytest.fixture(scope="module")
def live(served: Served) -> Iterator[Live]:
    one = Live(served)
    yield one
    one.http.close()


@pytest.mark.slow
def test_every_answer_is_one_the_document_describes(served: Served, live: Live) -> None:
    """Each operation, with cases of both kinds (valid and invalid requests) drawn by
    hypothesis from the document (schemathesis' pytest plugin is not used: it does not run
    on this pytest)."""
    api = schemathesis.openapi.from_url(served.url + "/openapi.json")
    operations = [result.ok() for result in api.get_all_operations()]
    assert len(operations) >= 20  # every route is in the document
    auth = {"Authorization": f"Bearer {served.keys['t']}"}
    for op in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            @given(case=op.as_strategy(generation_mode=mode))
            @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                      suppress_health_check=list(HealthCheck))
            def check(case: Any) -> None:
                sid = (case.path_parameters or {}).get("sid")
                # a live id for half the cases whose id is one (a negative case whose id is
                # its invalid part keeps it: it must be refused as it was drawn)
                if isinstance(sid, str) and re.fullmatch(ID_PATTERN, sid) and \
                        random.Random(repr(case.body)).random() < 0.5:
                    case.path_parameters["sid"] = live.session()
                case.call_and_validate(headers={} if case.path == "/metrics" else auth)

            try:
                check()
            except Unsatisfiable:  # an operation with no input has no invalid request
                assert mode is GenerationMode.NEGATIVE and not op.body and \
                    not op.path_parameters and not op.query, op.label


EXAMPLES = 15


def test_the_documents_limits_bounds_are_the_runtimes() -> None:
    """LimitsIn states Limits' own bounds, so a request the document allows is not refused
    by Limits (and one it refuses is)."""
    from memex.runtime_wasm import Limits
    from memex.service import ServiceConfig, create_app

    props = create_app(ServiceConfig()).openapi()["components"]["schemas"]["LimitsIn"][
        "properties"]
    for field in ("memory", "open_files"):
        lo, hi = int(props[field]["minimum"]), int(props[field]["maximum"])
        Limits(**{field: lo}), Limits(**{field: hi})  # both ends accepted
        for bad in (lo - 1, hi + 1):
            with pytest.raises(ValueError):
                Limits(**{field: bad})


@settings(max_examples=examples(500), deadline=None)
@given(st.text(alphabet="/.a\x00b", max_size=12) | st.text(max_size=40))
def test_the_documents_guest_path_pattern_is_the_servers_check(path: str) -> None:
    """The pattern the document gives a mount's guest path admits exactly what the server's
    check does (the document is what generated clients validate against)."""
    import re

    from memex.service._models import GUEST_PATH, _guest_path

    try:
        _guest_path(path)
        accepted = len(path) <= 1024
    except ValueError:
        accepted = False
    assert bool(re.fullmatch(GUEST_PATH, path)) == accepted, path


@settings(max_examples=examples(500), deadline=None)
@given(st.from_regex(REQUIREMENT, fullmatch=True).filter(lambda s: len(s) <= 200))
def test_every_requirement_the_document_admits_is_one_the_server_reads(text: str) -> None:
    """The pattern the document gives a package requirement is a subset of what the
    server's parser reads (no URL, marker or hash, on purpose): a request the document
    allows is never refused as malformed, which schemathesis' generated requests check."""
    from memex.runtime_wasm.internal import checked_requirements

    assert checked_requirements([text])


def test_the_requirement_pattern_admits_the_usual_forms_and_no_others() -> None:
    import re

    for ok in ("humanize", "tabulate==0.9.0", "a[b,c]>=1.0,<2", "x ~=1.2rc1", "y==1.*",
               "z!=2.0.post1.dev3"):
        assert re.fullmatch(REQUIREMENT, ok), ok
    for no in ("x @ https://e.example/x.whl", "x; python_version>'3'", "-e .", "x==1 --hash="
               "sha256:" + "0" * 64, "x==", "Wiöf", "x~=1", "../x", ""):
        assert not re.fullmatch(REQUIREMENT, no), no
