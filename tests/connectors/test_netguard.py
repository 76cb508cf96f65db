"""The SSRF address policy as pure functions: a corpus of spellings, none of them connected to.

Every vector is checked with `netguard` alone (no socket is opened, no name is resolved): hosts
as written in a URL, whole URLs read by httpx (the parser the connector uses), schemes, and a few
public addresses that must stay allowed. `test_corpus_counts` prints how many were tried,
refused and allowed (run with `-s` to see the line).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

import httpx
import pytest

from agent_reach_connectors import netguard
from agent_reach_connectors.netguard import Allowlist, check_address, parse_ip, refusal

NONE = Allowlist()


def verdict(host: str, port: int = 80, allow: Allowlist = NONE) -> str | None:
    """What the policy says of a host as written, without resolving it (literals and names)."""
    ip = parse_ip(host)
    if ip is None:
        return netguard.check_name(host)  # a name the policy refuses before any lookup
    return refusal(host, port, [ip], allow)


def url_verdict(url: str) -> str | None:
    """The connector's reading of a URL: the scheme, then the host httpx would connect to."""
    parsed = httpx.URL(url)
    reason = netguard.check_scheme(parsed.scheme)
    if reason is not None:
        return reason
    return verdict(parsed.raw_host.decode("ascii"), parsed.port or 80)


# (host as written in a URL, what the refusal must say)
REFUSED_HOSTS: list[tuple[str, str]] = [
    # loopback, every spelling
    ("127.0.0.1", "loopback"),
    ("127.255.255.254", "loopback"),
    ("2130706433", "loopback"),  # decimal
    ("0177.0.0.1", "loopback"),  # octal
    ("0177.0000.0000.0001", "loopback"),
    ("017700000001", "loopback"),  # one octal number
    ("0x7f000001", "loopback"),  # hex
    ("0X7F000001", "loopback"),
    ("0x7f.0x0.0x0.0x1", "loopback"),
    ("0x7f.1", "loopback"),
    ("127.1", "loopback"),  # short forms
    ("127.0.1", "loopback"),
    ("0177.1", "loopback"),
    ("127.0.0.1.", "loopback"),  # trailing dot
    ("127.0.0.1..", "loopback"),
    ("%31%32%37.0.0.1", "loopback"),  # percent-encoded
    ("\uff11\uff12\uff17.\uff10.\uff10.\uff11", "loopback"),  # full-width digits
    ("127\u30020\u30020\u30021", "loopback"),  # ideographic full stops
    ("[::1]", "loopback"),
    ("::1", "loopback"),
    ("[0:0:0:0:0:0:0:1]", "loopback"),
    ("[::ffff:127.0.0.1]", "IPv4-mapped form of 127.0.0.1, a loopback"),
    ("[::ffff:7f00:1]", "IPv4-mapped form of 127.0.0.1, a loopback"),
    ("[0:0:0:0:0:ffff:127.0.0.1]", "IPv4-mapped form of 127.0.0.1"),
    ("[::FFFF:7F00:0001]", "IPv4-mapped form of 127.0.0.1"),  # upper case
    ("[::127.0.0.1]", "IPv4-compatible"),
    ("[::7f00:1]", "IPv4-compatible"),
    ("[2002:7f00:1::]", "6to4 form of 127.0.0.1"),
    ("[2002:7f00:0001:0:0:0:0:1]", "6to4 form of 127.0.0.1"),
    ("[64:ff9b::127.0.0.1]", "NAT64 form of 127.0.0.1"),
    ("[64:ff9b::7f00:1]", "NAT64 form of 127.0.0.1"),
    ("localhost", "loopback name"),
    ("LOCALHOST", "loopback name"),
    ("localhost.", "loopback name"),
    ("LocalHost.", "loopback name"),
    ("app.localhost", "loopback name"),
    ("a.b.localhost.", "loopback name"),
    # unspecified
    ("0", "unspecified"),
    ("0.0.0.0", "unspecified"),
    ("0x0", "unspecified"),
    ("[::]", "unspecified"),
    ("0.1.2.3", "this network"),
    # link-local and the metadata services
    ("169.254.169.254", "metadata"),
    ("2852039166", "metadata"),
    ("0xa9fea9fe", "metadata"),
    ("0251.0376.0251.0376", "metadata"),
    ("169.254.43518", "metadata"),
    ("[::ffff:169.254.169.254]", "metadata"),
    ("[::ffff:a9fe:a9fe]", "metadata"),
    ("[64:ff9b::a9fe:a9fe]", "metadata"),
    ("[2002:a9fe:a9fe::1]", "metadata"),
    ("[fd00:ec2::254]", "metadata"),
    ("169.254.0.1", "link-local"),
    ("[fe80::1]", "link-local"),
    ("[fe80::1%25eth0]", "link-local"),  # zone id, encoded as URLs do
    ("fe80::1%eth0", "link-local"),
    ("[FE80::ABCD]", "link-local"),
    ("[febf::1]", "link-local"),
    # private
    ("10.0.0.1", "private"),
    ("012.0.0.1", "private"),  # octal 10
    ("167772161", "private"),
    ("172.16.0.1", "private"),
    ("172.31.255.255", "private"),
    ("192.168.0.1", "private"),
    ("0xc0a80001", "private"),
    ("192.168.1", "private"),
    ("[::ffff:10.0.0.1]", "private"),
    ("[::ffff:192.168.0.1]", "private"),
    ("[64:ff9b::a00:1]", "private"),
    ("[2002:c0a8:1::1]", "private"),
    ("[fc00::1]", "private"),
    ("[fd12:3456:789a::1]", "private"),
    # shared CGNAT
    ("100.64.0.1", "CGNAT"),
    ("100.127.255.254", "CGNAT"),
    ("100.100.100.200", "CGNAT"),  # another cloud's metadata address
    # multicast and broadcast
    ("224.0.0.1", "multicast"),
    ("239.255.255.250", "multicast"),
    ("[ff02::1]", "multicast"),
    ("[ff05::2]", "multicast"),
    ("255.255.255.255", "broadcast"),
    ("4294967295", "broadcast"),
    # reserved, documentation, benchmarking and other special ranges
    ("240.0.0.1", "reserved"),
    ("192.0.0.1", "IETF protocol assignment"),
    ("192.0.2.1", "documentation"),
    ("198.51.100.7", "documentation"),
    ("203.0.113.9", "documentation"),
    ("198.18.0.1", "benchmarking"),
    ("198.19.255.255", "benchmarking"),
    ("192.88.99.1", "6to4 relay"),
    ("[2001:db8::1]", "documentation"),
    ("[3fff::1]", "documentation"),
    ("[2001:2::1]", "benchmarking"),
    ("[2001::1]", "Teredo"),
    ("[2001:10::1]", "IETF protocol assignment"),
    ("[100::1]", "discard-only"),
    ("[64:ff9b:1::1]", "local-use NAT64"),
    ("[fec0::1]", "site-local"),
    ("[5f00::1]", "segment routing"),
    ("[4000::1]", "outside 2000::/3"),
    ("[::ffff:0:7f00:1]", "IPv4-translated"),
]

# Whole URLs: userinfo tricks, schemes, and hosts spelled in ways only a URL allows.
REFUSED_URLS: list[tuple[str, str]] = [
    ("http://evil.com@127.0.0.1/", "loopback"),
    ("http://user:pass@127.0.0.1:8080/x", "loopback"),
    ("http://evil.com:80@127.0.0.1/", "loopback"),
    ("http://evil.com\\@127.0.0.1/", "loopback"),
    ("http://127.0.0.1#@evil.com/", "loopback"),
    ("http://127.0.0.1?@evil.com/", "loopback"),
    ("http://a@b@[::1]/", "loopback"),
    ("http://evil@2130706433/", "loopback"),
    ("http://[::ffff:127.0.0.1]:8080/", "loopback"),
    ("HTTP://LOCALHOST/", "loopback name"),
    ("https://foo.localhost./", "loopback name"),
    ("http://169.254.169.254/latest/meta-data/", "metadata"),
    ("http://[fd00:ec2::254]/latest/meta-data/", "metadata"),
    ("http://127\u30020\u30020\u30021/", "loopback"),
    ("file:///etc/passwd", "only http and https"),
    ("gopher://127.0.0.1:70/_x", "only http and https"),
    ("ftp://example.com/x", "only http and https"),
    ("dict://127.0.0.1:11211/stat", "only http and https"),
    ("ldap://127.0.0.1/", "only http and https"),
    ("ws://example.com/", "only http and https"),
]

# Public addresses the policy must leave alone (checked here only: never connected to).
ALLOWED_HOSTS: list[str] = [
    "8.8.8.8",
    "1.1.1.1",
    "93.184.216.34",
    "134744072",  # 8.8.8.8 in decimal
    "0x08080808",
    "[2606:4700:4700::1111]",
    "[2a00:1450:4001:82b::200e]",
    "[::ffff:8.8.8.8]",
    "[64:ff9b::808:808]",  # NAT64 of a public address
    "[2002:808:808::1]",  # 6to4 of a public address
    "100.128.0.1",  # just past CGNAT
    "172.32.0.1",  # just past 172.16/12
    "192.0.3.1",
]


@dataclass(frozen=True)
class Tally:
    tried: int
    refused: int
    allowed: int


def run_corpus() -> Tally:
    refused = sum(verdict(h) is not None for h, _ in REFUSED_HOSTS)
    refused += sum(url_verdict(u) is not None for u, _ in REFUSED_URLS)
    allowed = sum(verdict(h) is None for h in ALLOWED_HOSTS)
    tried = len(REFUSED_HOSTS) + len(REFUSED_URLS) + len(ALLOWED_HOSTS)
    return Tally(tried, refused, allowed)


@pytest.mark.parametrize(("host", "why"), REFUSED_HOSTS)
def test_special_hosts_are_refused_in_every_spelling(host: str, why: str) -> None:
    reason = verdict(host)
    assert reason is not None, host
    assert why in reason, (host, reason)


@pytest.mark.parametrize(("url", "why"), REFUSED_URLS)
def test_urls_are_refused_for_the_host_httpx_would_connect_to(url: str, why: str) -> None:
    reason = url_verdict(url)
    assert reason is not None, url
    assert why in reason, (url, reason)


@pytest.mark.parametrize("host", ALLOWED_HOSTS)
def test_public_addresses_are_allowed(host: str) -> None:
    assert verdict(host) is None
    assert verdict(host, 443) is None


def test_corpus_counts() -> None:
    tally = run_corpus()
    print(
        f"\nSSRF corpus (netguard, no I/O): {tally.tried} vectors tried, "
        f"{tally.refused} refused, {tally.allowed} allowed"
    )
    assert tally.tried >= 60
    assert tally.refused == len(REFUSED_HOSTS) + len(REFUSED_URLS)
    assert tally.allowed == len(ALLOWED_HOSTS)


# Parsing -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("2130706433", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("10.1", "10.0.0.1"),
        ("10.0.258", "10.0.1.2"),
        ("[::1]", "::1"),
        ("[fe80::1%25en0]", "fe80::1"),
        ("00", "0.0.0.0"),
        ("1.2.3.4.", "1.2.3.4"),
    ],
)
def test_ip_literals_are_read_as_a_resolver_reads_them(host: str, expected: str) -> None:
    assert parse_ip(host) == ipaddress.ip_address(expected)


@pytest.mark.parametrize(
    "host",
    [
        "example.com",
        "1.2.3.4.5",
        "256.1.1.1",
        "1.2.3.256",
        "1.16777216",
        "4294967296",
        "08.0.0.1",  # 8 is not an octal digit
        "0x1g",
        "1..2",
        "",
        "[::1",
        "1.2.3.-4",
        "+1.2.3.4",
        "1_0.0.0.1",
    ],
)
def test_names_and_malformed_literals_are_not_addresses(host: str) -> None:
    assert parse_ip(host) is None


def test_the_parser_agrees_with_httpx_on_userinfo() -> None:
    # "127.0.0.1:80" is the userinfo here: the host is a public name, checked once resolved.
    assert httpx.URL("http://127.0.0.1:80@evil.com/").raw_host == b"evil.com"
    assert url_verdict("http://127.0.0.1:80@evil.com/") is None


def test_check_address_reads_text_and_scoped_addresses() -> None:
    assert check_address("fe80::1%eth0") == "a link-local address"
    assert check_address("not an address") == "not an IP address"
    assert check_address(ipaddress.ip_address("8.8.8.8")) is None


def test_refusal_names_the_host_and_every_address_must_pass() -> None:
    public, private = ipaddress.ip_address("93.184.216.34"), ipaddress.ip_address("10.0.0.5")
    assert refusal("api.test", 443, [public], NONE) is None
    assert refusal("api.test", 443, [public, private], NONE) == (
        "api.test resolves to 10.0.0.5, a private address (RFC 1918)"
    )
    assert refusal("0x7f000001", 80, [ipaddress.ip_address("127.0.0.1")], NONE) == (
        "0x7f000001 (127.0.0.1) is a loopback address"
    )
    assert refusal("api.test", 443, [], NONE) == "api.test has no address"


# Allowlists ----------------------------------------------------------------------------------


def test_allowlist_entries_admit_names_wildcards_addresses_and_cidrs() -> None:
    allow = Allowlist.parse(
        ["api.internal", "*.corp.example", "127.0.0.1:8080", "10.0.0.0/8", "[::1]:9000", "fd00::/8"]
    )
    loopback = ipaddress.ip_address("127.0.0.1")
    assert allow.admits_name("API.internal.", 443)
    assert allow.admits_name("a.b.corp.example", 80)
    assert not allow.admits_name("corp.example", 80)  # a wildcard is for subdomains only
    assert not allow.admits_name("evilcorp.example", 80)
    assert not allow.admits_name("api.internal.evil.com", 80)
    assert allow.admits_address(loopback, 8080)
    assert not allow.admits_address(loopback, 8081)  # the port is part of the entry
    assert allow.admits_address(ipaddress.ip_address("::ffff:127.0.0.1"), 8080)
    assert allow.admits_address(ipaddress.ip_address("10.200.0.1"), 1)
    assert allow.admits_address(ipaddress.ip_address("::1"), 9000)
    assert not allow.admits_address(ipaddress.ip_address("::1"), 9001)
    assert allow.admits_address(ipaddress.ip_address("fd12::1"), 1)
    assert not allow.admits_address(ipaddress.ip_address("192.168.0.1"), 80)


def test_allowed_hosts_pass_and_others_still_fail() -> None:
    allow = Allowlist.parse(["127.0.0.1", "db.test"])
    assert verdict("127.0.0.1", allow=allow) is None
    assert verdict("2130706433", allow=allow) is None  # the same address, spelled otherwise
    assert verdict("[::ffff:127.0.0.1]", allow=allow) is None
    assert verdict("127.0.0.2", allow=allow) is not None
    assert verdict("[::1]", allow=allow) is not None
    private = ipaddress.ip_address("10.0.0.5")
    assert refusal("db.test", 5432, [private], allow) is None  # an allowed name may be special
    assert refusal("other.test", 5432, [private], allow) is not None


def test_an_allowlisted_name_admits_localhost() -> None:
    allow = Allowlist.parse(["localhost"])
    assert refusal("localhost", 80, [ipaddress.ip_address("127.0.0.1")], allow) is None


def test_allowlist_spellings_of_addresses_are_normalised() -> None:
    allow = Allowlist.parse(["2130706433", "[0:0::1]"])
    assert allow.admits_address(ipaddress.ip_address("127.0.0.1"), 80)
    assert allow.admits_address(ipaddress.ip_address("::1"), 80)


@pytest.mark.parametrize(
    "entry",
    ["*", "*.", "", "a..b", "-a.com", "10.0.0.0/33", "127.0.0.1:0", "127.0.0.1:x", "[::1]x", "a b"],
)
def test_bad_allowlist_entries_are_rejected(entry: str) -> None:
    with pytest.raises(ValueError, match="allow_hosts entry"):
        Allowlist.parse([entry])


def test_an_empty_allowlist_admits_nothing() -> None:
    assert not Allowlist()
    assert not Allowlist.parse([]).admits_address(ipaddress.ip_address("127.0.0.1"), 80)
    assert Allowlist.parse(["a.test"])
