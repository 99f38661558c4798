"""fastmcp's CodeMode with its code run in MemEx:
``CodeMode(sandbox_provider=MemexSandboxProvider(limits=..., policy=..., backend=...))``.
Needs the ``fastmcp`` extra."""

from ._provider import MemexSandboxProvider

__all__ = ["MemexSandboxProvider"]
