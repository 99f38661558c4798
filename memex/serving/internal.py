"""What ``memex serve``'s cluster uses of the serving core and an application does not: the
control actor (``Control``, its Ray name, its answers as typed records) and the door kits
that carry a session's tools between a front and the slab holding it. Not a public surface:
names here may change in any release. Pinned in tests/test_public_api.py (``INTERNAL``) so
that a change is still deliberate."""

from ._control import CONTROL_NAME, Control
from ._doorkit import KIT_BYTES, DoorKit, SlabDoors
from ._replies import Admitted, Failed, Granted, Refused, Reply, Wait

__all__ = ["CONTROL_NAME", "KIT_BYTES", "Admitted", "Control", "DoorKit", "Failed", "Granted",
           "Refused", "Reply", "SlabDoors", "Wait"]
