"""The URL parser and address normaliser the egress policy relies on: every spelling of an
address means one address, the parser is total (a result or BadURL) and its output is a
fixed point, and the special-address table is at least as strict as Python's own."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from lanes import examples

from memex.host_tools.egress import BadURL, parse_url
from memex.host_tools.egress._addr import (  # the parser's internals
    UnsupportedScheme,
    classify,
    normalise_host,
    parse_address,
    parse_ipv4,
)

u32 = st.integers(min_value=0, max_value=2**32 - 1)


def spellings(n: int) -> list[str]:
    """Ways browsers and resolvers accept to write the IPv4 address ``n``."""
    a, b, c, d = n.to_bytes(4, "big")
    return [
        str(ipaddress.IPv4Address(n)), str(n), hex(n), hex(n).upper().replace("X", "x"),
        f"0{n:o}", f"0{a:o}.0{b:o}.0{c:o}.0{d:o}", f"{a}.{b}.{c * 256 + d}",
        f"{a}.{b * 65536 + c * 256 + d}", f"0x{a:x}.0x{b:x}.0x{c:x}.0x{d:x}",
        f"{ipaddress.IPv4Address(n)}.", f"[::ffff:{ipaddress.IPv4Address(n)}]",
        f"[::ffff:{a * 256 + b:x}:{c * 256 + d:x}]", f"[0:0:0:0:0:FFFF:{ipaddress.IPv4Address(n)}]",
        "".join(f"%{ord(ch):02x}" for ch in str(ipaddress.IPv4Address(n))),
        str(ipaddress.IPv4Address(n)).translate(str.maketrans("0123456789.",
                                                                "０１２３４５６７８９．")),
    ]


@given(u32)
@example(0x7F000001)
@example(0)
def test_every_ipv4_spelling_is_the_same_address(n: int) -> None:
    want = ipaddress.IPv4Address(n)
    for s in spellings(n):
        t = parse_url(f"http://{s}:8080/x")
        assert t.ip == want and t.host == str(want), s
        assert t.url == f"http://{want}:8080/x", s


@given(st.ip_addresses())
def test_special_addresses_cover_what_python_calls_non_global(
        addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> None:
    a = parse_address(str(addr))
    if not addr.is_global:
        sp = classify(a)
        assert sp is not None, addr
        assert a in sp.network or sp.network.prefixlen == 128


@given(st.text(max_size=80))
@settings(max_examples=examples(300))
def test_parser_is_total(text: str) -> None:
    for url in (text, f"http://{text}", f"https://example.com/{text}"):
        try:
            t = parse_url(url)
        except BadURL:
            continue
        assert t.scheme in ("http", "https") and t.path.startswith("/")


_host_part = st.text(alphabet="abcXYZ019.-_%25ü。１[]:", min_size=1, max_size=20)
_path_part = st.text(alphabet="abc/.%2e%2E?#&=~ \\ü", max_size=30)


@given(st.sampled_from(["http", "https", "HTTP"]), _host_part,
       st.one_of(st.none(), st.integers(0, 70000)), _path_part)
@settings(max_examples=examples(400))
def test_normal_form_is_a_fixed_point(scheme: str, host: str, port: int | None,
                                      path: str) -> None:
    url = f"{scheme}://{host}" + (f":{port}" if port is not None else "") + "/" + path
    try:
        t = parse_url(url)
    except BadURL:
        return
    again = parse_url(t.url)
    assert again == t, (url, t.url)
    assert "/./" not in t.path and "/../" not in t.path and not t.path.endswith("/..")


@pytest.mark.parametrize(("url", "expected"), [
    ("HTTP://Example.COM./A/b/../c/./d?q=1#frag", "http://example.com/A/c/d?q=1"),
    ("http://example.com", "http://example.com/"),
    ("https://example.com:443/", "https://example.com/"),
    ("http://example.com:80/", "http://example.com/"),
    ("http://example.com:8080", "http://example.com:8080/"),
    ("http://bücher.example/", "http://xn--bcher-kva.example/"),
    ("http://XN--BCHER-KVA.example/", "http://xn--bcher-kva.example/"),
    ("http://example.com/%7euser/%2e%2e/admin", "http://example.com/admin"),
    ("http://example.com/a%2fb", "http://example.com/a%2Fb"),
    ("http://example.com/a\\..\\b", "http://example.com/b"),
    ("http://example.com/ü?ä=1", "http://example.com/%C3%BC?%C3%A4=1"),
    ("http://example.com/%zz", "http://example.com/%25zz"),
    ("http://[::1]:81/", "http://[::1]:81/"),
    ("http://[0:0::1]/", "http://[::1]/"),
    ("http://[::ffff:10.0.0.1]/", "http://10.0.0.1/"),
    ("http://example.com\\@evil.com/", "http://example.com/@evil.com/"),
    ("http://evil.com#@good.com/", "http://evil.com/"),
    ("http://a.com:/", "http://a.com/"),
])
def test_normal_forms(url: str, expected: str) -> None:
    assert parse_url(url).url == expected


@pytest.mark.parametrize(("url", "reason"), [
    ("example.com/x", "no scheme"),
    ("http:example.com", "needs '//'"),
    ("ftp://example.com/", "scheme 'ftp' is not supported"),
    ("http://user@example.com/", "credentials"),
    ("http://u:p@example.com/", "credentials"),
    ("http:///x", "no host"),
    ("http://exa mple.com/", "spaces or control"),
    ("http://example.com/\x00", "spaces or control"),
    ("http://example.com:99999/", "out of range"),
    ("http://example.com:0/", "out of range"),
    ("http://example.com:8o/", "invalid port"),
    ("http://1.2.3.4.5/", "not an IPv4 address"),
    ("http://256.0.0.1/", "not an IPv4 address"),
    ("http://0x100000000/", "not an IPv4 address"),
    ("http://foo.09/", "not an IPv4 address"),
    ("http://::1/", "brackets"),
    ("http://[::1/", "unterminated"),
    ("http://[::1]x/", "after the [IPv6]"),
    ("http://[1.2.3.4]/", "not an IPv6 address"),
    ("http://[fe80::1%25eth0]/", "zone identifiers"),
    ("http://a..b/", "invalid host name label"),
    ("http://-.example/", "invalid host name label"),
    ("http://xn--zz.example/", "punycode"),
    ("http://%ff.example/", "UTF-8"),
    ("http://%2f.example/", "forbidden character"),
    ("http://exa%mple.com/", "percent-encoding"),
    ("http://ex％ample.com/", "forbidden character"),
    ("http://" + "a" * 254 + "/", "longer than 253"),
    ("http://" + "a" * 64 + ".com/", "invalid host name label"),
    ("http://example.com/" + "a" * 9000, "longer than 8192"),
])
def test_bad_urls_say_why(url: str, reason: str) -> None:
    with pytest.raises(BadURL, match=reason.replace("[", r"\[").replace("?", r"\?")):
        parse_url(url)


def test_scheme_errors_are_their_own_class() -> None:
    with pytest.raises(UnsupportedScheme):
        parse_url("gopher://x/")
    with pytest.raises(BadURL):
        parse_url(42)  # type: ignore[arg-type]


@pytest.mark.parametrize(("address", "category"), [
    ("127.0.0.1", "loopback"), ("127.255.0.1", "loopback"), ("::1", "loopback"),
    ("10.1.2.3", "private"), ("172.31.255.255", "private"), ("192.168.0.1", "private"),
    ("100.64.0.1", "private"), ("fd12::1", "private"), ("169.254.0.1", "link-local"),
    ("fe80::1", "link-local"), ("224.0.0.251", "multicast"), ("ff02::fb", "multicast"),
    ("0.0.0.0", "unspecified"), ("0.1.2.3", "unspecified"), ("::", "unspecified"),
    ("169.254.169.254", "cloud metadata"), ("fd00:ec2::254", "cloud metadata"),
    ("100.100.100.200", "cloud metadata"), ("255.255.255.255", "reserved"),
    ("240.0.0.1", "reserved"), ("192.0.2.1", "reserved"), ("2001:db8::1", "reserved"),
    ("::ffff:127.0.0.1", "loopback"), ("64:ff9b::a00:1", "private (embedded 10.0.0.1)"),
    ("2002:7f00:1::", "loopback (embedded 127.0.0.1)"), ("::7f00:1", "loopback (embedded "
                                                                      "127.0.0.1)"),
])
def test_special_categories(address: str, category: str) -> None:
    sp = classify(parse_address(address))
    assert sp is not None and sp.category == category
    assert address.split("::ffff:")[-1] in sp.describe() or category in sp.describe()


@pytest.mark.parametrize("address", ["93.184.216.34", "8.8.8.8", "2606:4700::1111",
                                     "64:ff9b::808:808", "2002:808:808::"])
def test_public_addresses_are_not_special(address: str) -> None:
    assert classify(parse_address(address)) is None


def test_host_helpers() -> None:
    assert normalise_host("Example.COM.") == ("example.com", None)
    assert normalise_host("::1", bracketed=True) == ("::1", ipaddress.IPv6Address("::1"))
    assert parse_ipv4("127.1") == ipaddress.IPv4Address("127.0.0.1")
    assert parse_ipv4("example") is None and parse_ipv4("1.2.3.4.5") is None
    with pytest.raises(BadURL, match="zone"):
        parse_address("fe80::1%eth0")
    with pytest.raises(BadURL):
        parse_address("not-an-ip")
    t = parse_url("http://[::1]:8080/a?b")
    assert (t.authority, t.target, t.origin()) == ("[::1]:8080", "/a?b", ("http", "::1", 8080))
