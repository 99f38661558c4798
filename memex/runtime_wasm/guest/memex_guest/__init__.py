# Runs inside the guest. Imports nothing from the host packages.
"""MemEx's guest-side package: the client end of the door to the host.

Submodules: ``door`` (door frames), ``codec`` (typed values), ``tools`` (records, tool errors,
``tools.call``), ``aio`` (the guest's asyncio event loop; imports asyncio, ~270 ms), ``net``
(HTTP through the host's egress policy: ``fetch``; importing this package routes
``http.client`` and ``urllib.request`` through it as soon as they are imported).

Importing this package arranges for asyncio, whenever it is imported, to use
``memex_guest.aio.EventLoop`` (the stock loop cannot start in the guest), without importing
asyncio itself.
"""

import sys as _sys

from . import net as _net
from .door import DoorError, call

__all__ = ["DoorError", "call", "install_asyncio"]


class _PatchingLoader:
    """Wraps asyncio's loader: once the package has run, install the guest loop."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        try:
            from . import aio

            aio.install()
        except Exception as exc:  # never break `import asyncio` itself
            _sys.stderr.write("memex_guest: could not install the guest event loop: %r\n"
                              % (exc,))

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _AsyncioFinder:
    """A one-shot meta path finder that wraps asyncio's loader."""

    def find_spec(self, name, path=None, target=None):
        if name != "asyncio":
            return None
        try:
            _sys.meta_path.remove(self)
        except ValueError:
            pass
        for finder in _sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


def install_asyncio():
    """Make asyncio use the guest event loop: now if asyncio is imported, else as soon as it
    is. Cheap; idempotent."""
    if "asyncio" in _sys.modules:
        from . import aio

        aio.install()
        return
    if not any(type(f).__name__ == "_AsyncioFinder" for f in _sys.meta_path):
        _sys.meta_path.insert(0, _AsyncioFinder())


install_asyncio()
_net.install()
