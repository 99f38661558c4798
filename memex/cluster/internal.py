"""What ``memex serve``'s fronts (``memex.service``) use of the cluster: the control actor
(``Control``, its Ray name, its answers as typed records), the slab's lease, the storage
with its keys and a front's batches of rate tokens. Not a public surface: names here may
change in any release. Pinned in tests/test_public_api.py (``INTERNAL``) so that a change is
still deliberate."""

from ._control import CONTROL_NAME, TOKEN_LEASE, Control, checkpoint_key
from ._leases import FRONT_LEASE
from ._replies import Admitted, Failed, Granted, Refused, Reply, Tokens, Wait
from ._slab import SLAB_LEASE, Slab, session_key
from ._storage import Storage
from ._tokens import RateTokens

__all__ = ["CONTROL_NAME", "FRONT_LEASE", "SLAB_LEASE", "TOKEN_LEASE", "Admitted", "Control",
           "Failed", "Granted", "RateTokens", "Refused", "Reply", "Slab", "Storage", "Tokens",
           "Wait", "checkpoint_key", "session_key"]
