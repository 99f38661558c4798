"""smolagents' ``CodeAgent`` with its code run in MemEx:
``CodeAgent(tools=..., model=..., executor=MemexExecutor(limits=..., mounts=..., policy=...,
backend=...))``. Needs the ``smolagents`` extra."""

from ._executor import MemexExecutor, tool_from_smolagents

__all__ = ["MemexExecutor", "tool_from_smolagents"]
