"""Code mode for pydantic-ai agents: ``Agent(..., capabilities=[MemexCodeMode()])`` gives the
model one ``run_python`` tool whose persistent MemEx sandbox has the agent's other tools bound
as typed Python functions, and ``submit()`` for its output type. Needs the ``pydantic-ai``
extra."""

from ._code_mode import MemexCodeMode, MemexToolset

__all__ = ["MemexCodeMode", "MemexToolset"]
