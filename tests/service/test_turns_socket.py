"""The turns WebSocket (``/v1/sessions/{id}/turns``), which RemoteSandbox.run uses for a turn
without streamed output: the same answers as ``POST .../run``, every bad message a typed
error on a connection that stays usable, keys checked on every message, and a client that
falls back to HTTP when the socket cannot be opened. A real server on 127.0.0.1."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lanes import examples
from served import Served, client_for_test, start_server
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect

from memex import ServiceError, TurnStatus
from memex.backends import get_backend
from memex.client import Client
from memex.service import hash_key


def turns_socket(served: Served, sid: str, key: str) -> ClientConnection:
    return connect("ws" + served.url[4:] + f"/v1/sessions/{sid}/turns",
                   additional_headers={"Authorization": f"Bearer {key}"}, proxy=None,
                   open_timeout=10, max_size=None)


def ask(ws: ClientConnection, message: bytes) -> Any:
    ws.send(message)
    return msgpack.unpackb(ws.recv(timeout=30), raw=False)


def access_paths(served: Served) -> list[str]:
    out = []
    for line in served.log.read_text().splitlines():
        if line.startswith("{") and '"path"' in line:
            out.append(str(json.loads(line)["path"]))
    return out


def logged(served: Served, path: str, at_least: int) -> int:
    """How many access-log lines name ``path``, once there are ``at_least`` (or 10 s passed)."""
    served.wait_for_log(f'"path": "{path}"', count=at_least)
    return access_paths(served).count(path)


def test_remote_turns_go_over_the_socket_with_the_same_answers(memex_server: Served) -> None:
    with get_backend("remote", url=memex_server.url, api_key=memex_server.keys["a"]) as b:
        sb = b.open()
        before = access_paths(memex_server).count(f"/v1/sessions/{sb.id}/run")
        assert sb.run("x = 20").status is TurnStatus.OK
        r = sb.run("x + 22")
        assert (r.status, r.value, sb.turns) == (TurnStatus.OK, "42", 2)
        r = sb.run("1 / 0")
        assert r.status is TurnStatus.ERROR and r.exception is not None
        assert r.exception.type == "ZeroDivisionError"
        r = sb.run("while True: pass", timeout=0.5)
        assert (r.status, r.limit) == (TurnStatus.KILLED, "deadline")
        assert sb.run("x").value == "20"  # rolled back past the killed turn
        assert access_paths(memex_server).count(f"/v1/sessions/{sb.id}/run") == before
        client_for_test(memex_server.url, memex_server.keys["a"]).run(sb.id, "x")  # HTTP: logged
        assert logged(memex_server, f"/v1/sessions/{sb.id}/run", before + 1) == before + 1
        sid = sb.id
        sb.close()
        sb.close()
    with pytest.raises(InvalidStatus):  # a closed session's socket is refused
        turns_socket(memex_server, sid, memex_server.keys["a"])


def test_bad_turn_messages_are_typed_errors_and_the_socket_stays(memex_server: Served
                                                                 ) -> None:
    a = client_for_test(memex_server.url, memex_server.keys["a"])
    sid = a.create()["id"]
    for key in ("wrong-key-wrong-key", memex_server.keys["b"]):  # no key; not b's session
        with pytest.raises(InvalidStatus):
            turns_socket(memex_server, sid, key)
    with turns_socket(memex_server, sid, memex_server.keys["a"]) as ws:
        cases = [
            (b"\xc1 not msgpack", 422, "invalid_request"),
            (msgpack.packb(["fly", {"code": "1"}]), 422, "invalid_request"),
            (msgpack.packb(["run", {"code": 7}]), 422, "invalid_request"),
            (msgpack.packb(["run", {"code": "1", "extra": True}]), 422, "invalid_request"),
            (msgpack.packb(["run", {"code": "1", "timeout": -1}]), 422, "invalid_request"),
            (msgpack.packb(["run", {"code": "1", "timeout": True}]), 422, "invalid_request"),
            (msgpack.packb({"run": 1}), 422, "invalid_request"),
        ]
        for message, status, code in cases:
            kind, got, body = ask(ws, message)
            assert (kind, got, body["error"]["code"]) == ("error", status, code), body
        kind, answer = ask(ws, msgpack.packb(["run", {"code": "6 * 7"}]))
        assert kind == "result" and answer["result"]["value"] == "42"
        a.close_session(sid)
        kind, status, body = ask(ws, msgpack.packb(["run", {"code": "1"}]))
        assert (kind, status, body["error"]["code"]) == ("error", 404, "not_found")


@pytest.mark.slow
def test_a_key_rotated_out_stops_an_open_socket(tmp_path: Any) -> None:
    served = start_server(tmp_path, {"a": ""})
    try:
        key = served.keys["a"]
        sid = client_for_test(served.url, key).create()["id"]
        with turns_socket(served, sid, key) as ws:
            assert ask(ws, msgpack.packb(["run", {"code": "1"}]))[0] == "result"
            text = served.config.read_text()
            served.config.write_text(text.replace(hash_key(key), hash_key("new-" + key)))
            kind, status, body = ask(ws, msgpack.packb(["run", {"code": "1"}]))
            assert (kind, status, body["error"]["code"]) == ("error", 401, "unauthorized")
    finally:
        served.stop()


@pytest.mark.slow
def test_an_oversized_turn_is_refused(tmp_path: Any) -> None:
    served = start_server(tmp_path, {"a": ""}, server="max_body_bytes = 4096")
    try:
        with get_backend("remote", url=served.url, api_key=served.keys["a"]) as b:
            sb = b.open()
            with pytest.raises(ServiceError, match="capped at 4096 bytes") as err:
                sb.run("x = '" + "a" * 5000 + "'")
            assert err.value.status == 413
            assert sb.run("1 + 1").value == "2"
            assert access_paths(served).count(f"/v1/sessions/{sb.id}/run") == 0
            with pytest.raises(ServiceError, match="capped at 4096 bytes"):  # a big cell
                sb.run("x = '" + "a" * (1 << 20) + "'")                 # goes over HTTP
            assert logged(served, f"/v1/sessions/{sb.id}/run", 1) == 1
            assert sb.run("2 + 2").value == "4"
            sb.close()
    finally:
        served.stop()


@pytest.mark.slow
def test_a_server_that_dies_mid_turn_is_a_service_error(tmp_path: Any) -> None:
    served = start_server(tmp_path, {"a": ""})
    b = get_backend("remote", url=served.url, api_key=served.keys["a"])
    sb = b.open()
    assert sb.run("1").value == "1"
    served.proc.kill()
    served.proc.wait(30)
    with pytest.raises(ServiceError):  # over the socket, then over HTTP: nothing answers
        sb.run("2")
    b.close()


messages = st.one_of(
    st.binary(max_size=64),
    st.builds(lambda k, f: msgpack.packb([k, f]), st.sampled_from(["run", "x", ""]),
              st.dictionaries(st.sampled_from(["code", "timeout", "filename", "z"]),
                              st.one_of(st.none(), st.integers(-5, 5), st.text(max_size=8),
                                        st.floats(allow_nan=False)), max_size=3)))


@pytest.fixture(scope="module")
def fuzz_socket(memex_server: Served) -> Iterator[ClientConnection]:
    # the module's fixture outlives a test, so not client_for_test (closed as a test ends)
    with Client(memex_server.url, memex_server.keys["a"]) as a:
        sid = a.create()["id"]
        with turns_socket(memex_server, sid, memex_server.keys["a"]) as ws:
            yield ws
        a.close_session(sid)


@settings(max_examples=examples(100), deadline=None)
@given(message=messages)
def test_any_message_gets_a_typed_answer(fuzz_socket: ClientConnection, message: bytes
                                         ) -> None:
    reply = ask(fuzz_socket, message)
    assert reply[0] in ("result", "error"), reply
    if reply[0] == "error":
        assert 400 <= reply[1] < 500 and isinstance(reply[2]["error"]["code"], str), reply
