"""Code mode for OpenAI Agents SDK agents: ``MemexCodeMode().agent(agent)`` moves the agent's
function tools into a persistent MemEx sandbox behind one ``run_python`` tool, with
``submit()`` for its output type. Needs the ``openai-agents`` extra."""

from ._code_mode import MemexCodeMode

__all__ = ["MemexCodeMode"]
