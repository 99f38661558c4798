"""Operator tools: functions serve.toml gives a tenant, which its guests call and the server
runs. They work for a client that serves no tool of its own, sit beside a client's tools
(one call each, and a batch that mixes both, answered in order), cannot be answered by the
client in the operator's place, are seen by no other tenant, survive a fork and a restart,
and are described at ``GET /v1/tools`` for a client to offer its model. Real `memex serve`
processes on 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from pydantic import BaseModel
from served import Served, client_for_test, launch, start_server

from memex import ConfigError, Limits, ServiceError, TurnStatus
from memex.backends import get_backend
from memex.executor import MemexAgent, SandboxSpec
from memex.executor.llm import LLMClient, ScriptedLLM
from memex.host_tools import ToolHost, ToolSet
from memex.service import load_config

OPS = textwrap.dedent('''
    import os
    from dataclasses import dataclass

    from memex.host_tools import ToolSet

    TOOLS = ToolSet()


    @dataclass
    class Hit:
        """One search result."""
        title: str
        score: float


    @TOOLS.tool
    def search(query: str, limit: int = 3) -> list[Hit]:
        """Search the operator's index.

        Args:
            query: the words to look for
            limit: at most this many hits
        """
        return [Hit(title=f"{query} #{i}", score=1.0 / (i + 1)) for i in range(limit)]


    @TOOLS.tool
    def server_pid() -> int:
        """The process id of the server that ran this call."""
        return os.getpid()


    @TOOLS.tool
    def explode(x: int) -> int:
        """Always fails."""
        raise ValueError(f"operator tool failed on purpose with {x}")
''')


def with_tools(folder: Path, server: str = "", port: int = 0) -> Served:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ops_tools.py").write_text(OPS)
    return start_server(folder, {"a": 'tools = ["ops_tools.py:TOOLS"]', "b": ""},
                        server=server, port=port)


@pytest.fixture(scope="module")
def ops_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    served = with_tools(tmp_path_factory.mktemp("ops"))
    yield served
    served.stop()


def audit(served: Served) -> list[dict[str, object]]:
    out = []
    for line in served.log.read_text().splitlines():
        start = line.find("{")
        if start >= 0:
            with contextlib.suppress(ValueError):
                out.append(json.loads(line[start:]))
    return out


@pytest.mark.slow
def test_a_guest_calls_operator_tools_the_server_runs(ops_server: Served) -> None:
    with get_backend("remote", url=ops_server.url, api_key=ops_server.keys["a"]) as b:
        sb = b.open()
        assert sb.turns == 0  # installing the operator's module is not one of its turns
        r = sb.run("hits = search('cats', limit=2)\n"
                   "[(type(h).__name__, h.title, h.score) for h in hits]")
        assert r.value == "[('Hit', 'cats #0', 1.0), ('Hit', 'cats #1', 0.5)]", r
        r = sb.run("server_pid()")
        assert int(r.value) == ops_server.proc.pid != os.getpid()
        r = sb.run("try:\n    explode(3)\nexcept tools.ToolError as e:\n"
                   "    print(type(e).__name__, e.kind, e)")
        assert r.status is TurnStatus.OK, r
        assert r.stdout.startswith("ToolExecutionError tool_failed"), r.stdout
        assert "failed on purpose with 3" in r.stdout
        r = sb.run("search('q', limit='many')")  # checked by the operator's own schema
        assert r.status is TurnStatus.ERROR and r.exception is not None
        assert r.exception.type.endswith("ToolArgumentError"), r.exception
        assert sb.run("print(search.__doc__.splitlines()[0])").stdout == \
            "Search the operator's index.\n"
        sb.close()
    events = [e for e in audit(ops_server) if e.get("event") == "tool"]
    assert {"search", "server_pid", "explode"} <= {e["tool"] for e in events}
    assert any(e["tool"] == "explode" and e["outcome"] == "tool_failed" for e in events)


def test_operator_and_client_tools_share_a_turn_and_a_batch(ops_server: Served) -> None:
    def local_pid() -> int:
        """The process id of the client."""
        return os.getpid()

    client = client_for_test(ops_server.url, ops_server.keys["a"])
    served = ToolSet.from_service(client.tools())
    assert served.names == ("search", "server_pid", "explode")
    with pytest.raises(ServiceError, match="runs on the memex serve service"):
        served["server_pid"].handler()  # here, outside a session, it can only say so
    with get_backend("remote", url=ops_server.url, api_key=ops_server.keys["a"]) as b:
        sb = b.open()
        with ToolHost(ToolSet([local_pid]) | served).attach(sb) as host:
            r = sb.run("server_pid(), local_pid(), search('x', limit=1)[0].title")
            assert r.value == f"({ops_server.proc.pid}, {os.getpid()}, 'x #0')", r
            # one tools.batch holding calls of both kinds: each side answers its own,
            # in the order the guest sent them
            r = sb.run("import asyncio\n"
                       "out = await asyncio.gather(search('a', limit=1), local_pid(),\n"
                       "                           server_pid(), local_pid(), explode(1),\n"
                       "                           return_exceptions=True)\n"
                       "[type(o).__name__ for o in out], out[1], out[2]")
            assert r.value == (f"(['list', 'int', 'int', 'int', 'ToolExecutionError'], "
                               f"{os.getpid()}, {ops_server.proc.pid})"), r
            assert [c.tool for c in host.calls] == ["local_pid", "local_pid", "local_pid"]
            # the guest's tools.list: the operator's, then the client's
            r = sb.run("import memex_guest.door as d\n"
                       "[t['name'] for t in d.request('tools.list', [], {})]")
            assert r.value == "['search', 'server_pid', 'explode', 'local_pid']", r
        child = sb.fork()  # a fork shares the door, hence the operator's tools
        assert int(child.run("server_pid()").value) == ops_server.proc.pid
        child.close()
        sb.close()


def test_the_client_cannot_answer_in_the_operators_place(ops_server: Served) -> None:
    def server_pid() -> int:
        """A client's impostor of the operator's tool."""
        return -1

    with get_backend("remote", url=ops_server.url, api_key=ops_server.keys["a"]) as b:
        sb = b.open()
        with ToolHost([server_pid]).attach(sb) as host:
            # its install kept the operator's layer (search), and the call of the shared
            # name went to the server, never to this process
            r = sb.run("server_pid(), search('k', limit=1)[0].title")
            assert r.value == f"({ops_server.proc.pid}, 'k #0')", r
            assert host.calls == []
        sb.close()


def test_other_tenants_see_none_of_them(ops_server: Served) -> None:
    b_client = client_for_test(ops_server.url, ops_server.keys["b"])
    assert b_client.tools() == []
    entries = client_for_test(ops_server.url, ops_server.keys["a"]).tools()
    assert [e["definition"]["function"]["name"] for e in entries] == [
        "search", "server_pid", "explode"]
    assert entries[0]["catalogue"].startswith(
        "search(query: str, limit: int = 3) -> list[tools.Hit]: Search")
    r = httpx2.get(ops_server.url + "/v1/tools", timeout=30)
    assert r.status_code == 401
    with get_backend("remote", url=ops_server.url, api_key=ops_server.keys["b"]) as b:
        sb = b.open()
        r = sb.run("'search' in globals(), 'tools' in globals()")
        assert r.value == "(False, False)", r
        r = sb.run("import memex_guest.tools as t\nt.call('server_pid', {})")
        assert r.status is TurnStatus.ERROR and r.exception is not None
        assert str(ops_server.proc.pid) not in (r.exception.message or "")
        sb.close()


@pytest.mark.slow
def test_operator_tools_come_back_after_a_restart(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    served = with_tools(tmp_path, server="state_dir = 'state'\nsave_interval = 0", port=port)
    a = client_for_test(served.url, served.keys["a"])
    sid = a.create()["id"]
    assert a.run(sid, "kept = search('q', limit=1)[0].title")["result"]["status"] == "ok"
    deadline = time.monotonic() + 30
    while a.session(sid)["saved_turns"] != 1:  # the save after that turn is on disk
        assert time.monotonic() < deadline, a.session(sid)
        time.sleep(0.05)
    served.stop(signal.SIGKILL)
    again = launch(served.config, served.keys)
    try:
        a = client_for_test(again.url, again.keys["a"])
        out = a.run(sid, "kept, server_pid()")
        assert out["result"]["value"] == f"('q #0', {again.proc.pid})", out
        assert out["restored"]["lost_turns"] == 0
    finally:
        again.stop()


@pytest.mark.parametrize(("spec", "match"), [
    ("nothing_here.py:TOOLS", "no Python file"),
    ("ops_tools.py:MISSING", "no attribute 'MISSING'"),
    ("broken.py:TOOLS", "running .* failed: ZeroDivisionError"),
    ("ops_tools.py:os", "not a ToolSet, a Tool, a function"),
    ("no.such.module:x", "cannot import 'no.such.module'"),
    ("just-a-name", "is not 'file.py:NAME' or 'module:NAME'"),
])
def test_bad_tool_entries_are_config_errors(tmp_path: Path, spec: str, match: str) -> None:
    (tmp_path / "ops_tools.py").write_text(OPS)
    (tmp_path / "broken.py").write_text("TOOLS = 1 / 0\n")
    config = tmp_path / "serve.toml"
    config.write_text(f'[tenants.a]\nkeys = []\ntools = ["{spec}"]\n')
    with pytest.raises(ConfigError, match=match) as err:
        load_config(config)
    assert "[tenants.a] tools" in str(err.value)


def test_a_good_tool_entry_loads(tmp_path: Path) -> None:
    (tmp_path / "ops_tools.py").write_text(OPS)
    config = tmp_path / "serve.toml"
    config.write_text('[tenants.a]\nkeys = []\ntools = ["ops_tools.py:TOOLS", '
                      '"ops_tools.py:search"]\n')
    with pytest.raises(ConfigError, match="search"):  # the same tool twice
        load_config(config)
    config.write_text('[tenants.a]\nkeys = []\ntools = ["ops_tools.py:TOOLS"]\n')
    tools = load_config(config).tenants["a"].tools
    assert tools is not None and tools.names == ("search", "server_pid", "explode")
    config.write_text('[tenants.a]\nkeys = []\ntools = ["ops_tools.py:search"]\n')
    one = load_config(config).tenants["a"].tools  # a single Tool is a set of one
    assert one is not None and one.names == ("search",)


class Found(BaseModel):
    title: str
    pid: int


def test_an_agent_offers_and_calls_operator_tools(ops_server: Served) -> None:
    """MemexAgent on RemoteBackend with ``ToolSet.from_service``: the model is shown the
    operator's tools beside the client's, and its code calls both."""
    def local_pid() -> int:
        """The process id of the client."""
        return os.getpid()

    script = ["Searching.\n```python\nhit = search('alpha', limit=1)[0]\nprint(hit.title)\n```",
              "```python\nsubmit(title=hit.title, pid=server_pid() + 0 * local_pid())\n```"]
    backend = get_backend("remote", url=ops_server.url, api_key=ops_server.keys["a"])
    tools = ToolSet([local_pid]) | ToolSet.from_service(backend.client.tools())
    with backend, ScriptedLLM(script) as srv:
        llm = LLMClient("scripted", base_url=srv.base_url, max_retries=0, timeout=30)
        with MemexAgent(model=llm, tools=tools, submit=Found,
                        sandbox=SandboxSpec(backend=backend, limits=Limits(timeout=20))) as agent:
            r = agent.run("find alpha")
    assert r.answer == Found(title="alpha #0", pid=ops_server.proc.pid), r
    system = srv.requests[0].messages[0]["content"]
    assert "search(query: str, limit: int = 3)" in system and "local_pid()" in system
    assert "alpha #0" in r.trajectory.steps[0].observation
