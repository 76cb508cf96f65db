"""Where an outgoing HTTP call may go: the address policy of the `http` connector (SSRF guard).

Pure functions, no I/O. A destination is refused when its scheme is not http(s), when its name is
`localhost` or ends in `.localhost`, or when any address it is (or resolves to) is not a public
unicast address: loopback, private (RFC 1918, ULA), link-local (with the cloud metadata
addresses), shared CGNAT space, unspecified, multicast, broadcast, documentation, benchmarking,
reserved, and the IPv6 forms that embed such an IPv4 address (mapped, compatible, 6to4, NAT64).
Literal hosts are read in every spelling a resolver accepts (`2130706433`, `0177.0.0.1`,
`0x7f000001`, `127.1`, bracketed IPv6 with a zone id, a trailing dot, percent-encoding,
full-width digits), so a literal never reaches a resolver that would read it differently.

A tool's allowlist (`allow_hosts`) admits destinations the policy would refuse. Its entries are
exact host names, `*.suffix` wildcards, IP addresses (any spelling) or CIDRs, each host or
address optionally with `:port` (`127.0.0.1:8080`, `[::1]:8080`, `*.corp.example:443`). A name
entry admits the name whatever it resolves to; an address or CIDR entry admits those addresses,
whichever name led to them.

Tables, not `ipaddress.is_global`: its answer differs between Python versions (3.11 calls
`ff02::1`, `fec0::1` and `::7f00:1` global), and a security check must not.
"""

from __future__ import annotations

import functools
import ipaddress
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import unquote

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

SCHEMES = frozenset({"http", "https"})
DEFAULT_PORTS = {"http": 80, "https": 443}

_V4 = ipaddress.IPv4Network
_V6 = ipaddress.IPv6Network

# Most specific first: the first network that holds an address names why it is refused.
_SPECIAL_V4: tuple[tuple[ipaddress.IPv4Network, str], ...] = (
    (_V4("0.0.0.0/32"), "the unspecified address"),
    (_V4("0.0.0.0/8"), "a 'this network' address (0.0.0.0/8)"),
    (_V4("127.0.0.0/8"), "a loopback address"),
    (_V4("169.254.169.254/32"), "the cloud metadata address (link-local)"),
    (_V4("169.254.0.0/16"), "a link-local address"),
    (_V4("10.0.0.0/8"), "a private address (RFC 1918)"),
    (_V4("172.16.0.0/12"), "a private address (RFC 1918)"),
    (_V4("192.168.0.0/16"), "a private address (RFC 1918)"),
    (_V4("100.64.0.0/10"), "a shared CGNAT address (100.64.0.0/10)"),
    (_V4("192.0.0.0/24"), "an IETF protocol assignment address (192.0.0.0/24)"),
    (_V4("192.0.2.0/24"), "a documentation address"),
    (_V4("198.51.100.0/24"), "a documentation address"),
    (_V4("203.0.113.0/24"), "a documentation address"),
    (_V4("198.18.0.0/15"), "a benchmarking address"),
    (_V4("192.88.99.0/24"), "a deprecated 6to4 relay address"),
    (_V4("224.0.0.0/4"), "a multicast address"),
    (_V4("255.255.255.255/32"), "the broadcast address"),
    (_V4("240.0.0.0/4"), "a reserved address (240.0.0.0/4)"),
)

_SPECIAL_V6: tuple[tuple[ipaddress.IPv6Network, str], ...] = (
    (_V6("::/128"), "the unspecified address"),
    (_V6("::1/128"), "a loopback address"),
    (_V6("::ffff:0:0:0/96"), "an IPv4-translated address"),
    (_V6("::/96"), "a deprecated IPv4-compatible address"),
    (_V6("64:ff9b:1::/48"), "a local-use NAT64 address"),
    (_V6("::/8"), "a reserved address (::/8)"),
    (_V6("100::/64"), "a discard-only address"),
    (_V6("2001::/32"), "a Teredo tunnelling address"),
    (_V6("2001:2::/48"), "a benchmarking address"),
    (_V6("2001:db8::/32"), "a documentation address"),
    (_V6("2001::/23"), "an IETF protocol assignment address (2001::/23)"),
    (_V6("3fff::/20"), "a documentation address"),
    (_V6("5f00::/16"), "a segment routing address (5f00::/16)"),
    (_V6("fd00:ec2::254/128"), "the cloud metadata address (unique local)"),
    (_V6("fc00::/7"), "a private address (unique local, fc00::/7)"),
    (_V6("fe80::/10"), "a link-local address"),
    (_V6("fec0::/10"), "a deprecated site-local address"),
    (_V6("ff00::/8"), "a multicast address"),
)
_GLOBAL_UNICAST = _V6("2000::/3")
_MAPPED = _V6("::ffff:0:0/96")
_NAT64 = _V6("64:ff9b::/96")
_6TO4 = _V6("2002::/16")

_HEX = re.compile(r"0[xX][0-9a-fA-F]+")
_OCTAL = re.compile(r"0[0-7]+")
_DECIMAL = re.compile(r"0|[1-9][0-9]*")
_LABEL = re.compile(r"(?!-)[a-z0-9_-]{1,63}(?<!-)")
_DOTS = str.maketrans({"\u3002": ".", "\uff0e": ".", "\uff61": "."})


@functools.lru_cache(maxsize=4096)
def normalize_host(host: str) -> str:
    """A host as a resolver reads it: lower case, percent-decoded, NFKC (full-width digits and
    dots made ASCII), without IPv6 brackets, zone id or trailing dots."""
    text = unicodedata.normalize("NFKC", unquote(host.strip())).translate(_DOTS).lower()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    if ":" in text:
        text = text.split("%", 1)[0]  # fe80::1%eth0: the zone names an interface, not a host
    return text.rstrip(".")


def _ipv4_number(part: str) -> int | None:
    """One part of a legacy IPv4 literal: decimal, octal (leading 0) or hex (0x)."""
    if _HEX.fullmatch(part):
        return int(part[2:], 16)
    if _OCTAL.fullmatch(part):
        return int(part, 8)
    if _DECIMAL.fullmatch(part):
        return int(part, 10)
    return None


def _legacy_ipv4(text: str) -> ipaddress.IPv4Address | None:
    """inet_aton's reading: 1-4 parts, the last filling the remaining bytes (127.1, 2130706433)."""
    parts = text.split(".")
    if not 1 <= len(parts) <= 4 or not all(parts):
        return None
    numbers = [_ipv4_number(p) for p in parts]
    if any(n is None for n in numbers):
        return None
    *head, last = [n for n in numbers if n is not None]
    if any(n > 255 for n in head) or last >= 256 ** (4 - len(head)):
        return None
    value = last
    for index, byte in enumerate(head):
        value |= byte << (8 * (3 - index))
    return ipaddress.IPv4Address(value)


@functools.lru_cache(maxsize=4096)
def parse_ip(host: str) -> IPAddress | None:
    """The address a host names when it is an IP literal in any spelling; None for a name."""
    text = normalize_host(host)
    if ":" in text:
        try:
            return ipaddress.IPv6Address(text)
        except ValueError:
            return None
    return _legacy_ipv4(text)


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> tuple[str, ipaddress.IPv4Address] | None:
    """The IPv4 address an IPv6 address stands for, and how (mapped, NAT64, 6to4)."""
    if ip in _MAPPED:
        return "an IPv4-mapped form of", ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip in _NAT64:
        return "a NAT64 form of", ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip in _6TO4:
        return "a 6to4 form of", ipaddress.IPv4Address((int(ip) >> 80) & 0xFFFFFFFF)
    return None


def _special(ip: IPAddress) -> str | None:
    """What the special-purpose tables say of an address (embedded IPv4 excluded)."""
    if isinstance(ip, ipaddress.IPv6Address):
        table: Iterable[tuple[IPNetwork, str]] = _SPECIAL_V6
        if not any(ip in network for network, _ in _SPECIAL_V6) and ip not in _GLOBAL_UNICAST:
            return "a reserved address (outside 2000::/3)"
    else:
        table = _SPECIAL_V4
    return next((reason for network, reason in table if ip in network), None)


@functools.lru_cache(maxsize=4096)
def check_address(ip: IPAddress | str) -> str | None:
    """Why an address is not a public destination ("a loopback address"), or None if it is.

    Accepts an address object or its text (scope ids allowed: `fe80::1%eth0`). Text that is not
    an address at all is refused as such.
    """
    if isinstance(ip, str):
        try:
            ip = ipaddress.ip_address(ip)
        except ValueError:
            return "not an IP address"
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.scope_id:
            ip = ipaddress.IPv6Address(ip.compressed.split("%", 1)[0])
        embedded = _embedded_ipv4(ip)
        if embedded is not None:
            how, v4 = embedded
            inner = check_address(v4)
            return None if inner is None else f"{how} {v4}, {inner}"
    reason = _special(ip)
    if reason is None and not ip.is_global:  # what a newer registry knows and the tables do not
        reason = "not a public address"
    return reason


def check_name(host: str) -> str | None:
    """Why a host name is refused before resolving it (`localhost`, `*.localhost`), or None."""
    name = normalize_host(host)
    if not name:
        return "an empty host"
    if name == "localhost" or name.endswith(".localhost"):
        return "a loopback name"
    return None


def check_scheme(scheme: str) -> str | None:
    """Why a URL scheme is refused (anything but http and https), or None."""
    if scheme.lower() in SCHEMES:
        return None
    return f"the scheme '{scheme}' is not allowed; only http and https are"


@dataclass(frozen=True, slots=True)
class Allowlist:
    """A tool's `allow_hosts`: destinations admitted although the policy would refuse them.

    Build it with `Allowlist.parse(entries)`. A port of None admits every port.
    """

    names: frozenset[tuple[str, int | None]] = frozenset()
    suffixes: tuple[tuple[str, int | None], ...] = ()
    networks: tuple[tuple[IPNetwork, int | None], ...] = ()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> Allowlist:
        """Read entries; ValueError names the first one that is not a host, address or CIDR."""
        names: set[tuple[str, int | None]] = set()
        suffixes: list[tuple[str, int | None]] = []
        networks: list[tuple[IPNetwork, int | None]] = []
        for entry in entries:
            if not isinstance(entry, str):
                raise ValueError(f"allow_hosts entry {entry!r} is not a string")
            kind, value, port = _parse_entry(entry)
            if kind == "network":
                networks.append((ipaddress.ip_network(value, strict=False), port))
            elif kind == "suffix":
                suffixes.append((value, port))
            else:
                names.add((value, port))
        return cls(frozenset(names), tuple(suffixes), tuple(networks))

    def admits_name(self, host: str, port: int) -> bool:
        """Whether a host name (not an address) is admitted by a name or wildcard entry."""
        name = normalize_host(host)
        if (name, None) in self.names or (name, port) in self.names:
            return True
        return any(
            name.endswith(suffix) and allowed in (None, port) for suffix, allowed in self.suffixes
        )

    def admits_address(self, ip: IPAddress, port: int) -> bool:
        """Whether an address is admitted by an address or CIDR entry (mapped forms included)."""
        candidates: list[IPAddress] = [ip]
        if isinstance(ip, ipaddress.IPv6Address):
            if ip.scope_id:
                ip = ipaddress.IPv6Address(ip.compressed.split("%", 1)[0])
                candidates.append(ip)
            if ip.ipv4_mapped is not None:
                candidates.append(ip.ipv4_mapped)
        return any(
            address.version == network.version and address in network and allowed in (None, port)
            for address in candidates
            for network, allowed in self.networks
        )

    def __bool__(self) -> bool:
        return bool(self.names or self.suffixes or self.networks)


def _split_port(entry: str) -> tuple[str, int | None]:
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        if not rest:
            return host, None
        if not rest.startswith(":"):
            raise ValueError(f"allow_hosts entry {entry!r} is not a host, address or CIDR")
        return host, _port(entry, rest[1:])
    if entry.count(":") == 1:
        host, _, port = entry.partition(":")
        return host, _port(entry, port)
    return entry, None


def _port(entry: str, text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"allow_hosts entry {entry!r} has an invalid port")
    return int(text)


def _parse_entry(entry: str) -> tuple[str, str, int | None]:
    """("network" | "suffix" | "name", value, port) for one allowlist entry."""
    text = entry.strip().lower()
    bad = ValueError(f"allow_hosts entry {entry!r} is not a host, address or CIDR")
    if "/" in text:
        try:
            ipaddress.ip_network(text, strict=False)
        except ValueError:
            raise bad from None
        return "network", text, None
    host, port = _split_port(text)
    ip = parse_ip(host)
    if ip is not None:
        return "network", ip.compressed, port
    wildcard = host.startswith("*.")
    name = normalize_host(host[2:] if wildcard else host)
    if not name.isascii():
        try:
            name = name.encode("idna").decode("ascii")
        except UnicodeError:
            raise bad from None
    if not name or not all(_LABEL.fullmatch(label) for label in name.split(".")):
        raise bad
    return ("suffix", "." + name, port) if wildcard else ("name", name, port)


def refusal(host: str, port: int, addresses: Sequence[IPAddress], allow: Allowlist) -> str | None:
    """Why connecting to `host` at these (resolved or literal) addresses is refused, or None.

    The answer is a phrase naming the host: "127.0.0.1 is a loopback address", "db.test
    resolves to 10.0.0.5, a private address (RFC 1918)". Every address must pass: one special
    address among public ones refuses the whole host. An empty list is refused.
    """
    name = normalize_host(host)
    literal = parse_ip(name)
    if literal is None:
        if allow.admits_name(name, port):
            return None
        reason = check_name(name)
        if reason is not None:
            return f"{name or 'the URL'} is {reason}"
    if not addresses:
        return f"{name} has no address"
    for ip in addresses:
        reason = check_address(ip)
        if reason is None or allow.admits_address(ip, port):
            continue
        if literal is not None:
            spelled = name if name == literal.compressed else f"{name} ({literal.compressed})"
            return f"{spelled} is {reason}"
        return f"{name} resolves to {ip.compressed}, {reason}"
    return None
