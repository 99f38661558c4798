"""The agent loop, LLM client, backends, trajectories and sub-agents."""

__all__: list[str] = []
