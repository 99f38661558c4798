# Runs inside the guest. Imports nothing from the host packages.
"""MemEx's guest-side package: the client end of the door to the host."""

from .door import DoorError, call

__all__ = ["DoorError", "call"]
