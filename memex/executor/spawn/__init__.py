"""Sub-agents: ``spawn_agent()`` in a guest starts a full rollout on the host, in parallel with
its parent, under one :class:`TreeBudget` for the whole tree (docs/spawn.md). ``_tree`` holds
the tree and its nodes (the door ops the guest calls), ``_spec`` checks a spawn request and
carries inputs and answers with their types, ``_template`` keeps the pre-built sandboxes a
child's is forked from, ``_budget`` the budget and what a child's ending means. The guest half
is ``guest/boot.py`` (loaded in every session of a tree) and ``guest/api.py`` (fetched on first
use). The tree starts child rollouts through the function it is given (``StartRollout``), so
it never imports the agent."""

from ._budget import TreeBudget

__all__ = [
    "TreeBudget",
]
