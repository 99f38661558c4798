"""Network egress for guests under a policy (docs/egress.md): the policy as data and its
decisions (``EgressPolicy``, rules, caps, host-held secrets), loading it from TOML/YAML with
every problem located (``_load``), URL and address parsing (``_addr``) and matching
(``_match``), the host-side HTTP client that pins checked addresses and re-checks redirects
(``Fetcher``), and the door op that serves guests' requests with an audit record each
(``Egress``). Its guest half is ``memex_guest.net`` in the runtime's guest bundle."""

from ._addr import BadURL, parse_url
from ._fetch import Fetcher, FetchRequest, system_resolver
from ._host import Egress, EgressRecord
from ._load import fmt_path, load_document
from ._policy import EgressPolicy
from ._rules import EgressDecision, EgressLimits, EgressRule, EgressSecret

__all__ = [
    "BadURL",
    "Egress",
    "EgressDecision",
    "EgressLimits",
    "EgressPolicy",
    "EgressRecord",
    "EgressRule",
    "EgressSecret",
    "FetchRequest",
    "Fetcher",
    "fmt_path",
    "load_document",
    "parse_url",
    "system_resolver",
]
