"""Fixtures for the host-tools tests: real sandboxes, a ToolHost per test.

Most tests drive the door ops with frames the guest builds with plain msgpack (the ABI's
bytes, nothing of the guest-side tool client); test_tool_stubs.py and the last test of
test_abi.py install the generated ``tools`` module, which imports ``memex_guest.tools`` (the
guest side of docs/abi.md).
"""

from __future__ import annotations

import ast
import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from memex import Limits, Sandbox, TurnStatus
from memex.host_tools import ToolHost

# Guest helpers: door frames built and read with the guest's plain msgpack straight over
# `_host.call` (independent of the guest's own codec and tool client); typed values in replies
# are shown as ('ext', code, payload) tuples.
RAW_HELPERS = r'''
import _host, msgpack
_ids = [0]
def _plain(v):
    if isinstance(v, msgpack.ExtType):
        return ('ext', v.code, _plain(msgpack.unpackb(v.data, raw=False, strict_map_key=False)))
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {_plain(k): _plain(x) for k, x in v.items()}
    return v
def ext(code, payload):
    return msgpack.ExtType(code, msgpack.packb(payload, use_bin_type=True))
def door(op, *args):
    _ids[0] += 1
    frame = msgpack.packb({'v': 1, 'id': _ids[0], 'op': op, 'args': list(args), 'kwargs': {}},
                          use_bin_type=True)
    return msgpack.unpackb(_host.call(frame), raw=False, strict_map_key=False)
def tcall(name, args):
    r = door('tools.call', name, args)
    if not r['ok']:
        return ('error', r['error'])
    return ('ok', _plain(r['value']))
def tbatch(calls):
    r = door('tools.batch', calls)
    return _plain(r['value']) if r['ok'] else ('error', r['error'])
'''


def _guest_eval(sb: Sandbox, code: str) -> Any:
    r = sb.run(code)
    assert r.status is TurnStatus.OK, r
    assert r.value is not None, r
    return ast.literal_eval(r.value)


@pytest.fixture
def guest_eval() -> Callable[[Sandbox, str], Any]:
    """``guest_eval(sb, code)``: run ``code`` whose last expression is a literal-safe value
    and return that value."""
    return _guest_eval


@pytest.fixture(scope="module")
def tool_sandbox() -> Iterator[Sandbox]:
    """One sandbox per module with the raw helpers loaded; each test attaches its own host."""
    sb = Sandbox(limits=Limits(timeout=10))
    r = sb.run(RAW_HELPERS)
    assert r.status is TurnStatus.OK, r
    yield sb
    sb.close()


@pytest.fixture
def serve(tool_sandbox: Sandbox) -> Iterator[Callable[..., ToolHost]]:
    """``serve(tools, **ToolHost kwargs)``: a host serving the module's sandbox (no stubs)."""
    hosts: list[ToolHost] = []

    def make(tools: Any, **kwargs: Any) -> ToolHost:
        host = ToolHost(tools, **kwargs).attach(tool_sandbox, install=False)
        hosts.append(host)
        return host

    yield make
    for h in hosts:
        h.close()


class Rendezvous:
    """Proof that calls run at the same time, without timing them: ``arm(n)``, then each call
    (sync ``meet`` on a thread, async ``ameet`` on the host's loop) waits until ``n`` calls
    are inside at once; one that waits 10 s in vain fails. Calls run one after another can
    never all be inside together."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._n = 1
        self._inside = 0

    def arm(self, n: int) -> None:
        with self._cond:
            self._n, self._inside = n, 0

    def _enter(self) -> None:
        with self._cond:
            self._inside += 1
            self._cond.notify_all()

    def _all_in(self) -> bool:
        return self._inside >= self._n

    def meet(self) -> None:
        self._enter()
        with self._cond:
            if not self._cond.wait_for(self._all_in, timeout=10):
                raise RuntimeError(f"only {self._inside} of {self._n} calls ran at once")

    async def ameet(self) -> None:
        self._enter()
        for _ in range(2000):
            with self._cond:
                if self._all_in():
                    return
            await asyncio.sleep(0.005)
        raise RuntimeError(f"only {self._inside} of {self._n} calls ran at once")


@pytest.fixture
def together() -> Rendezvous:
    """A fresh :class:`Rendezvous` (``arm(n)`` it before the calls)."""
    return Rendezvous()
