"""A tenant's operator tools and egress policy as data (``DoorKit``): read from a serve.toml's
folder, carried as plain data, built again where none of its files are, and served on a real
guest's door by ``SlabDoors`` (what a cluster's slab does); anything else is refused."""

from __future__ import annotations

import json
import pickle
import shutil
import textwrap
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from memex import ConfigError, Sandbox, TurnStatus
from memex.backends.internal import ClientDoor
from memex.serving.internal import KIT_BYTES, DoorKit, SlabDoors

TOOLS = textwrap.dedent('''
    from pathlib import Path
    from memex.host_tools import ToolSet

    TOOLS = ToolSet()

    @TOOLS.tool
    def where(word: str) -> str:
        """Which folder this module was loaded from, and the word."""
        return f"{Path(__file__).parent.parent.name}:{word}"
''')
POLICY = '[[rules]]\nname = "local"\naction = "allow"\nip = "127.0.0.1"\npath = "/ok"\n'


def kit_in(folder: Path, tenant: str = "t") -> DoorKit:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ops.py").write_text(TOOLS)
    (folder / "policy.toml").write_text(POLICY)
    kit = DoorKit.read(tenant, ["ops.py:TOOLS"], "policy.toml", folder)
    assert kit is not None
    return kit


def test_a_kit_crosses_as_data_and_builds_where_its_files_are_not(tmp_path: Path) -> None:
    kit = kit_in(tmp_path / "front")
    wire = kit.to_wire()
    json.dumps({**wire, "files": [[n, d.decode()] for n, d in wire["files"]]})  # plain data
    shutil.rmtree(tmp_path / "front")  # the node that builds it has none of the files
    again = DoorKit.from_wire(wire)
    assert again == kit and hash(again) == hash(kit)
    tools, policy = again.build()
    assert tools is not None and tools.names == ("where",)
    assert tools["where"].handler("x").startswith("memex-kit-t-")
    assert policy is not None and policy.check("http://127.0.0.1:1/ok").allowed
    assert not policy.check("http://127.0.0.1:1/no").allowed
    assert DoorKit.read("t", [], None, tmp_path) is None  # nothing to serve: no kit


@pytest.mark.parametrize("wire", [
    None, {}, {"tenant": "t", "tools": 3, "files": [], "egress": None},
    {"tenant": "t", "tools": [], "files": [["a.py"]], "egress": None},
    {"tenant": "t", "tools": [], "files": [], "egress": ["p.toml"]},
    {"tenant": "t", "tools": [], "files": [["a.py", b"x" * (KIT_BYTES + 1)]], "egress": None},
])
def test_a_malformed_or_oversized_kit_is_refused(wire: Any) -> None:
    with pytest.raises(ConfigError):
        DoorKit.from_wire(wire)


def test_an_oversized_tool_file_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "big.py").write_bytes(b"#" * (KIT_BYTES + 1))
    with pytest.raises(ConfigError, match="over"):
        DoorKit.read("t", ["big.py:TOOLS"], None, tmp_path)
    with pytest.raises(ConfigError, match="cannot read"):
        DoorKit.read("t", [], "missing.toml", tmp_path)


class _Ok(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def target() -> Iterator[int]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.01},
                     daemon=True).start()
    yield int(srv.server_address[1])
    srv.shutdown()
    srv.server_close()


def test_slab_doors_serve_a_kit_on_a_guest_s_door(tmp_path: Path, target: int,
                                                  make_sandbox: Callable[..., Sandbox]
                                                  ) -> None:
    """What a slab does with the kit the control actor hands it: the tools' module in a new
    guest (not in one opened from an image: it holds it), its calls answered on the door,
    the policy deciding the guest's requests; what it returns stops both."""
    wire = kit_in(tmp_path / "front").to_wire()
    doors = pickle.loads(pickle.dumps(SlabDoors()))  # as the control actor ships it
    door = ClientDoor()
    sb = make_sandbox(door=door)
    stop = doors(wire, "s1", sb, door, True)
    r = sb.run("where('hi')")
    assert r.status is TurnStatus.OK and r.value is not None, r
    assert r.value.strip("'").startswith("memex-kit-t-") and r.value.endswith(":hi'")
    fetch = ("import urllib.request, urllib.error\n"
             "def get(u):\n    try:\n        return urllib.request.urlopen(u).read()\n"
             "    except urllib.error.URLError as e:\n        return type(e).__name__\n")
    sb.run(fetch)
    r = sb.run(f"get('http://127.0.0.1:{target}/ok'), get('http://127.0.0.1:{target}/no')")
    assert r.value == "(b'ok', 'EgressDenied')", r
    stop()
    r = sb.run(f"get('http://127.0.0.1:{target}/ok')")
    assert r.value == "'EgressDenied'", r  # no policy served: no network
    # a guest opened from an image gets no second install: served on its door only
    cp = sb.checkpoint()
    door2 = ClientDoor()
    sb2 = make_sandbox(door=door2)
    sb2.restore(cp)
    stop2 = doors(wire, "s2", sb2, door2, False)
    assert sb2.run("where('again')").value.endswith(":again'")  # type: ignore[union-attr]
    stop2()
    stop2()  # twice: nothing more
