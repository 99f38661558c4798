"""What MemEx's other layers use of the serving core and an application does not: the door
kits that carry a session's tools between a cluster's front and the slab holding it. Not a
public surface: names here may change in any release. Pinned in tests/test_public_api.py
(``INTERNAL``) so that a change is still deliberate."""

from ._doorkit import KIT_BYTES, DoorKit, SlabDoors

__all__ = ["KIT_BYTES", "DoorKit", "SlabDoors"]
