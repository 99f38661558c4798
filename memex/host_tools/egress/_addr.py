"""URLs and addresses as the egress policy sees them: one strict parser whose result is both
what the policy matches and what the host connects to, so a spelling cannot pass the check
as one thing and reach the network as another.

Hosts are normalised the way browsers do (WHATWG URL): percent-decoding, UTS #46 mapping
(case, full-width forms, ideographic dots) and IDNA to punycode, one trailing dot dropped, and
a host whose last label is a number parsed as IPv4 in all its legacy spellings (``2130706433``,
``0x7f.1``, ``0177.0.0.1``, ``127.1``) or refused. IPv4-mapped IPv6 becomes IPv4. Special
addresses (loopback, private, link-local, multicast, unspecified, reserved, cloud metadata,
and IPv6 forms that embed one of those) are classified with the range that names them.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

import idna

from ...errors import MemexError

__all__ = [
    "DEFAULT_PORTS",
    "METADATA_NAMES",
    "BadURL",
    "IPAddress",
    "IPNetwork",
    "Special",
    "Target",
    "UnsupportedScheme",
    "classify",
    "normalise_host",
    "parse_address",
    "parse_ipv4",
    "parse_url",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

DEFAULT_PORTS = {"http": 80, "https": 443}
MAX_URL = 8192

# Host names of cloud metadata services (their addresses are in _SPECIAL too).
METADATA_NAMES = frozenset({
    "metadata", "metadata.google.internal", "metadata.goog", "instance-data",
    "instance-data.ec2.internal",
})


class BadURL(MemexError, ValueError):
    """A URL the egress cannot check; the message is the reason."""


class UnsupportedScheme(BadURL):
    """A URL of a scheme other than http and https."""


@dataclass(frozen=True, kw_only=True)
class Target:
    """A parsed, normalised http(s) URL: what the policy matches and the host requests."""

    scheme: str
    host: str  # lowercase ASCII name (punycode), or the IP's text (IPv6 without brackets)
    ip: IPAddress | None  # the host as an address when it is an IP literal
    port: int
    path: str  # normalised, starts with "/"
    query: str | None  # without the "?"

    @property
    def authority(self) -> str:
        """``host[:port]`` as the ``Host`` header carries it (the port only when not default)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if DEFAULT_PORTS.get(self.scheme) == self.port else f"{host}:{self.port}"

    @property
    def target(self) -> str:
        """The request target: path and query."""
        return self.path if self.query is None else f"{self.path}?{self.query}"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.authority}{self.target}"

    def origin(self) -> tuple[str, str, int]:
        return (self.scheme, self.host, self.port)


# ---- IPv4 in all its spellings (WHATWG "IPv4 parser") -----------------------------------------
_DIGITS = {10: frozenset("0123456789"), 8: frozenset("01234567"),
           16: frozenset("0123456789abcdefABCDEF")}
_LAST_NUMBER = re.compile(r"(?:^|\.)(?:[0-9]+|0[xX][0-9A-Fa-f]*)\.?\Z")


def _ipv4_number(part: str) -> int | None:
    if part == "":
        return None
    radix = 10
    if part[:2] in ("0x", "0X"):
        part, radix = part[2:], 16
        if part == "":
            return 0
    elif len(part) > 1 and part[0] == "0":
        part, radix = part[1:], 8
    if not _DIGITS[radix].issuperset(part):
        return None
    return int(part, radix)


def _ends_in_number(host: str) -> bool:
    """WHATWG: a host whose last label is a number must be an IPv4 address."""
    return _LAST_NUMBER.search(host) is not None


def parse_ipv4(host: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address a host spells (``127.0.0.1``, ``2130706433``, ``0x7f.1``,
    ``0177.0.0.1``, ``127.1``, a trailing dot), or None if it is not one."""
    parts = host.split(".")
    if parts[-1] == "" and len(parts) > 1:
        parts.pop()
    if not 1 <= len(parts) <= 4:
        return None
    numbers = [_ipv4_number(p) for p in parts]
    if any(n is None for n in numbers):
        return None
    nums = [n for n in numbers if n is not None]
    if any(n > 255 for n in nums[:-1]) or nums[-1] >= 256 ** (5 - len(nums)):
        return None
    value = nums[-1]
    for i, n in enumerate(nums[:-1]):
        value += n * 256 ** (3 - i)
    return ipaddress.IPv4Address(value)


def _ipv6(text: str) -> IPAddress:
    if "%" in text:
        raise BadURL("IPv6 zone identifiers are not allowed")
    try:
        addr = ipaddress.IPv6Address(text)
    except ValueError:
        raise BadURL(f"[{text}] is not an IPv6 address") from None
    return addr.ipv4_mapped or addr


def parse_address(text: str) -> IPAddress:
    """An IP address as a resolver or a caller writes it (IPv4-mapped IPv6 becomes IPv4)."""
    try:
        addr = ipaddress.ip_address(text.strip().strip("[]"))
    except ValueError:
        raise BadURL(f"{text!r} is not an IP address") from None
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.scope_id:
            raise BadURL(f"{text!r}: zone identifiers are not allowed")
        return addr.ipv4_mapped or addr
    return addr


_LABEL = re.compile(r"(?!-)[a-z0-9_-]{1,63}(?<!-)\Z")
_PCT = re.compile(r"%([0-9A-Fa-f]{2})")


def _pct_decode_host(text: str) -> str:
    if "%" not in text:
        return text
    raw = text.encode("utf-8")
    out = bytearray()
    i = 0
    while i < len(raw):
        if raw[i] == 0x25:
            m = _PCT.match(raw[i:i + 3].decode("ascii", "replace"))
            if not m:
                raise BadURL("invalid percent-encoding in the host")
            out.append(int(m.group(1), 16))
            i += 3
        else:
            out.append(raw[i])
            i += 1
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError:
        raise BadURL("the host is not valid UTF-8 after percent-decoding") from None


_FORBIDDEN = re.compile(r"[\x00-\x20/\\?#@\[\]:<>^|%\x7f]")
_CONTROL = re.compile(r"[\x00-\x20\x7f]")


def _forbid(host: str) -> None:
    m = _FORBIDDEN.search(host)
    if m is not None:
        raise BadURL(f"the host contains a forbidden character {m.group()!r}")


def normalise_host(text: str, *, bracketed: bool = False) -> tuple[str, IPAddress | None]:
    """``(canonical host, address if it is an IP literal)``; BadURL if it is no valid host."""
    if bracketed:
        addr = _ipv6(text)
        return str(addr), addr
    host = _pct_decode_host(text)
    if not host:
        raise BadURL("the URL has no host")
    _forbid(host)
    if not host.isascii():  # UTS #46 maps ASCII to its lowercase: only the rest needs it
        try:
            host = idna.uts46_remap(host, std3_rules=False, transitional=False)
        except idna.IDNAError as exc:
            raise BadURL(f"invalid international host name: {exc}") from None
        _forbid(host)
    if not host.isascii():
        try:
            host = idna.encode(host, uts46=False).decode("ascii")
        except (idna.IDNAError, UnicodeError) as exc:
            raise BadURL(f"invalid international host name: {exc}") from None
    host = host.lower()
    if _ends_in_number(host):
        addr4 = parse_ipv4(host)
        if addr4 is None:
            raise BadURL(f"{text!r} ends in a number but is not an IPv4 address")
        return str(addr4), addr4
    if host.endswith("."):
        host = host[:-1]
    if len(host) > 253:
        raise BadURL("the host name is longer than 253 characters")
    for label in host.split("."):
        if not _LABEL.match(label):
            raise BadURL(f"invalid host name label {label!r} in {text!r}")
        if label.startswith("xn--"):
            try:
                idna.decode(label)
            except (idna.IDNAError, UnicodeError):
                raise BadURL(f"invalid punycode label {label!r}") from None
    return host, None


# ---- paths --------------------------------------------------------------------------------------
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_PATH_OK = _UNRESERVED | frozenset("!$&'()*+,;=:@/")
_QUERY_OK = _PATH_OK | frozenset("?")


_PLAIN_PATH = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,;=:@/]*\Z")
_PLAIN_QUERY = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,;=:@/?]*\Z")


def _encode(text: str, allowed: frozenset[str], *, decode_unreserved: bool) -> str:
    if (_PLAIN_QUERY if "?" in allowed else _PLAIN_PATH).match(text):
        return text  # nothing to encode or decode (the common case)
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "%":
            m = _PCT.match(text, i)
            if m:
                ch = chr(int(m.group(1), 16))
                out.append(ch if decode_unreserved and ch in _UNRESERVED
                           else "%" + m.group(1).upper())
                i += 3
                continue
            out.append("%25")
        elif c in allowed:
            out.append(c)
        else:
            out.extend(f"%{b:02X}" for b in c.encode("utf-8", "surrogatepass"))
        i += 1
    return "".join(out)


def _remove_dots(path: str) -> str:
    out: list[str] = []
    segments = path.split("/")[1:]
    for i, seg in enumerate(segments):
        last = i == len(segments) - 1
        if seg == ".":
            if last:
                out.append("")
        elif seg == "..":
            if out:
                out.pop()
            if last:
                out.append("")
        else:
            out.append(seg)
    return "/" + "/".join(out)


def _normalise_path(path: str) -> str:
    path = path.replace("\\", "/")
    if not path.startswith("/"):
        path = "/" + path
    path = _encode(path, _PATH_OK, decode_unreserved=True)
    return _remove_dots(path) if "/." in path else path


# ---- URLs ---------------------------------------------------------------------------------------
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")


def parse_url(url: str) -> Target:
    """Parse and normalise an absolute http(s) URL. Other schemes, userinfo, control
    characters and spaces are refused; the fragment is dropped (it is never sent)."""
    if not isinstance(url, str):
        raise BadURL(f"a URL must be a string, not {type(url).__name__}")
    if len(url) > MAX_URL:
        raise BadURL(f"the URL is longer than {MAX_URL} characters")
    if _CONTROL.search(url):
        raise BadURL("the URL contains spaces or control characters")
    m = _SCHEME.match(url)
    if not m:
        raise BadURL("not an absolute URL (it has no scheme)")
    scheme = m.group(1).lower()
    if scheme not in DEFAULT_PORTS:
        raise UnsupportedScheme(f"scheme {scheme!r} is not supported (http and https only)")
    rest = url[m.end():]
    if len(rest) < 2 or any(c not in "/\\" for c in rest[:2]):
        raise BadURL(f"a {scheme} URL needs '//' and a host")
    rest = rest[2:]
    end = len(rest)
    for sep in "/?#\\":
        pos = rest.find(sep)
        if pos != -1:
            end = min(end, pos)
    authority, rest = rest[:end], rest[end:]
    if "@" in authority:
        raise BadURL("credentials in the URL (user@host) are not allowed")
    port_text = ""
    if authority.startswith("["):
        close = authority.find("]")
        if close == -1:
            raise BadURL("unterminated [IPv6] host")
        host, ip = normalise_host(authority[1:close], bracketed=True)
        after = authority[close + 1:]
        if after and not after.startswith(":"):
            raise BadURL("unexpected text after the [IPv6] host")
        port_text = after[1:]
    else:
        name, colon, port_text = authority.partition(":")
        if colon and ":" in port_text:
            raise BadURL("an IPv6 host must be written in [brackets]")
        host, ip = normalise_host(name)
    if port_text == "":
        port = DEFAULT_PORTS[scheme]
    else:
        if not port_text.isascii() or not port_text.isdigit():
            raise BadURL(f"invalid port {port_text!r}")
        port = int(port_text)
        if not 0 < port <= 65535:
            raise BadURL(f"port {port} is out of range")
    rest = rest.partition("#")[0]
    path, qmark, query = rest.partition("?")
    return Target(scheme=scheme, host=host, ip=ip, port=port, path=_normalise_path(path),
                  query=_encode(query, _QUERY_OK, decode_unreserved=False) if qmark else None)


# ---- special addresses --------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Special:
    """Why an address is not an ordinary public one: its category and the range that names it
    (an allow rule unlocks the address only by naming a network inside that range)."""

    address: IPAddress
    category: str
    network: IPNetwork

    def describe(self) -> str:
        return f"{self.address} is a {self.category} address ({self.network})"


_TABLE: list[tuple[str, str]] = [
    # cloud metadata services (inside link-local or private ranges: named first)
    ("169.254.169.254/32", "cloud metadata"), ("169.254.170.2/32", "cloud metadata"),
    ("169.254.169.253/32", "cloud metadata"), ("100.100.100.200/32", "cloud metadata"),
    ("192.0.0.192/32", "cloud metadata"), ("fd00:ec2::254/128", "cloud metadata"),
    ("0.0.0.0/8", "unspecified"), ("::/128", "unspecified"),
    ("127.0.0.0/8", "loopback"), ("::1/128", "loopback"),
    ("10.0.0.0/8", "private"), ("172.16.0.0/12", "private"), ("192.168.0.0/16", "private"),
    ("100.64.0.0/10", "private"), ("fc00::/7", "private"), ("fec0::/10", "private"),
    ("64:ff9b:1::/48", "private"),
    ("169.254.0.0/16", "link-local"), ("fe80::/10", "link-local"),
    ("224.0.0.0/4", "multicast"), ("ff00::/8", "multicast"),
    ("255.255.255.255/32", "reserved"), ("240.0.0.0/4", "reserved"),
    ("192.0.0.0/24", "reserved"), ("192.0.2.0/24", "reserved"), ("198.51.100.0/24", "reserved"),
    ("203.0.113.0/24", "reserved"), ("198.18.0.0/15", "reserved"), ("192.88.99.0/24", "reserved"),
    ("2001:db8::/32", "reserved"), ("100::/64", "reserved"), ("2001::/23", "reserved"),
]
_SPECIAL: list[tuple[IPNetwork, str]] = sorted(
    ((ipaddress.ip_network(n), c) for n, c in _TABLE), key=lambda e: -e[0].prefixlen)


def _buckets() -> list[tuple[int, int, dict[int, tuple[IPNetwork, str]]]]:
    """(version, mask, {network as int: (network, category)}) per prefix length, longest
    first: a lookup is one dict probe per length instead of a scan of the table."""
    by: dict[tuple[int, int], dict[int, tuple[IPNetwork, str]]] = {}
    for net, category in _SPECIAL:
        by.setdefault((net.version, net.prefixlen), {}).setdefault(
            int(net.network_address), (net, category))
    return [(v, int(ipaddress.ip_network(("::" if v == 6 else "0.0.0.0", plen)).netmask), d)
            for (v, plen), d in sorted(by.items(), key=lambda e: -e[0][1])]


_BUCKETS = _buckets()
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_COMPAT = ipaddress.IPv6Network("::/96")


def _embedded_ipv4(addr: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries (mapped, compatible, NAT64, 6to4, Teredo)."""
    if addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    if addr.sixtofour is not None:
        return addr.sixtofour
    if addr.teredo is not None:
        return addr.teredo[1]
    if addr in _NAT64 or (addr in _COMPAT and int(addr) > 1):
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    return None


def classify(addr: IPAddress) -> Special | None:
    """The special category of an address (None for an ordinary public one)."""
    value, version = int(addr), addr.version
    for v, mask, nets in _BUCKETS:
        if v == version:
            hit = nets.get(value & mask)
            if hit is not None:
                return Special(address=addr, category=hit[1], network=hit[0])
    if isinstance(addr, ipaddress.IPv6Address):
        inner = _embedded_ipv4(addr)
        if inner is not None:
            sp = classify(inner)
            if sp is not None:
                return Special(address=addr, category=f"{sp.category} (embedded {inner})",
                               network=ipaddress.IPv6Network(f"{addr}/128"))
    return None
