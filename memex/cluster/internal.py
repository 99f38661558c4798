"""What ``memex serve``'s fronts (``memex.service``) use of the cluster: the control actor
(``Control``, its Ray name, its answers as typed records), the slab's lease, its outcomes and
its direct path's messages as typed records with their one codec, the storage with its
keys, and a front's running slots and batches of rate tokens. Not a public surface: names here may
change in any release. Pinned in tests/test_public_api.py (``INTERNAL``) so that a change is
still deliberate."""

from ._control import CONTROL_NAME, TOKEN_LEASE, Control, checkpoint_key
from ._direct import (
    Answer,
    Call,
    Done,
    Hello,
    NotHeld,
    Outcome,
    Raised,
    Started,
    Welcome,
    from_wire,
    to_wire,
)
from ._leases import FRONT_LEASE
from ._replies import Failed, Granted, Heard, Refused, Reply, Slots, Tokens, Wait
from ._slab import SLAB_LEASE, Slab, session_key
from ._slots import RunningSlots
from ._storage import Storage
from ._tokens import RateTokens

__all__ = ["CONTROL_NAME", "FRONT_LEASE", "SLAB_LEASE", "TOKEN_LEASE", "Answer", "Call",
           "Control", "Done", "Failed", "Granted", "Heard", "Hello", "NotHeld", "Outcome",
           "Raised", "RateTokens", "Refused", "Reply", "RunningSlots", "Slab", "Slots",
           "Started", "Storage", "Tokens", "Wait", "Welcome", "checkpoint_key", "from_wire",
           "session_key", "to_wire"]
