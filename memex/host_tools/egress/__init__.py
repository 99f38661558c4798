"""Network egress for guests under a policy (docs/egress.md): the policy as data and its
decisions (``EgressPolicy``, rules, caps, host-held secrets), loading it from TOML/YAML with
every problem located (``_load``), URL and address parsing (``_addr``) and matching
(``_match``), the host-side HTTP client that pins checked addresses and re-checks redirects
(``Fetcher``), and the door op that serves guests' requests with an audit record each
(``Egress``). Its guest half is ``memex_guest.net`` in the runtime's guest bundle. The policy's
records and ``Egress`` are ``memex.host_tools``' names (their one public home); this
package's own are the fetcher, URL parsing and the loader."""

from ._addr import BadURL, parse_url
from ._fetch import Fetcher, FetchRequest, system_resolver
from ._load import fmt_path, load_document

__all__ = [
    "BadURL",
    "FetchRequest",
    "Fetcher",
    "fmt_path",
    "load_document",
    "parse_url",
    "system_resolver",
]
