"""``python -m memex.integrations.jupyter -f CONNECTION_FILE [settings]``: a MemEx kernel."""

from ._spec import launch

launch()
