"""Where a tool may send: its `destinations`, a list that restricts, checked by name before DNS.

A tool whose destination comes from its arguments (an `http` tool with a `{placeholder}` in its
URL's scheme, host or port; every `notify` tool) lists where it may send in `config.destinations`.
Entries:

- `api.example.org`: that host name exactly;
- `*.example.org`: its sub-domains only (`a.example.org`, `a.b.example.org`, not `example.org`);
- `192.0.2.7`, `2001:db8::7` (or `[2001:db8::7]`): that address, as a URL's literal host;
- `@example.org`: email recipients at that domain exactly; `@*.example.org`: at its sub-domains.

No ports, schemes, paths, CIDRs or bare `*`: a list that admits everything is not a list. The
host is matched as written in the URL, before it is resolved, so a name that is not listed is
never looked up; every redirect hop is matched again. `allow_hosts` is another thing: it admits
non-public addresses the SSRF guard would refuse, and restricts nothing.

Shared by the controller (which refuses a tool with a bad or missing list when it is loaded) and
the connectors (which enforce it on every call). Pure: no I/O.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# A `{name}` placeholder of an http tool's URL template (filled from the call's arguments).
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
# A `${env:NAME}` reference, resolved on the executor from its environment.
_SECRET_REF = re.compile(r"\$\{env:[A-Za-z_][A-Za-z0-9_]*\}")
_LABEL = re.compile(r"(?!-)[a-z0-9_-]{1,63}(?<!-)")
# A last label of digits (or hex) makes a resolver read the name as an IPv4 literal (`127.1`).
_NUMERIC = re.compile(r"(0x[0-9a-f]*|[0-9]+)")


def destination_from_arguments(url: str) -> bool:
    """Whether a `{placeholder}` of a URL template can change the scheme, host or port: one
    before the `/`, `?` or `#` that ends the authority, or with no `scheme://` before it. A
    URL that starts with a `${env:NAME}` reference takes its origin from that (configuration,
    not arguments): `${env:API_URL}/orders/{id}` is fixed, `${env:API_URL}{path}` is not."""
    match = PLACEHOLDER.search(url)
    if match is None:
        return False
    prefix = url[: match.start()]
    _, separator, authority = prefix.partition("://")
    if not separator:
        origin = _SECRET_REF.match(prefix)
        if origin is None:
            return True
        authority = prefix[origin.end() :]
    return not any(end in authority for end in "/?#")


def _name(text: str) -> str | None:
    """A host or domain name as DNS reads it (lower case, IDNA, no trailing dot), or None."""
    name = text.strip().lower().rstrip(".")
    if not name.isascii():
        try:
            name = name.encode("idna").decode("ascii")
        except UnicodeError:
            return None
    labels = name.split(".")
    if not name or not all(_LABEL.fullmatch(label) for label in labels):
        return None
    if _NUMERIC.fullmatch(labels[-1]):
        return None  # an address in a resolver's eyes, not a name
    return name


def _address(text: str) -> IPAddress | None:
    literal = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    try:
        return ipaddress.ip_address(literal)
    except ValueError:
        return None


def _matches(name: str, exact: frozenset[str], suffixes: tuple[str, ...]) -> bool:
    return name in exact or any(name.endswith(suffix) for suffix in suffixes)


@dataclass(frozen=True, slots=True)
class Destinations:
    """A tool's `destinations`; build it with `Destinations.parse(entries)`."""

    hosts: frozenset[str] = frozenset()
    host_suffixes: tuple[str, ...] = ()
    addresses: frozenset[IPAddress] = frozenset()
    domains: frozenset[str] = frozenset()
    domain_suffixes: tuple[str, ...] = ()

    @classmethod
    def parse(cls, entries: Iterable[object]) -> Destinations:
        """Read entries; ValueError names the first one that is not a destination."""
        hosts: set[str] = set()
        host_suffixes: list[str] = []
        addresses: set[IPAddress] = set()
        domains: set[str] = set()
        domain_suffixes: list[str] = []
        for entry in entries:
            if not isinstance(entry, str):
                raise ValueError(f"destinations entry {entry!r} is not a string")
            text = entry.strip()
            mail = text.startswith("@")
            body = text[1:] if mail else text
            wildcard = body.startswith("*.")
            address = None if mail or wildcard else _address(body)
            name = _name(body[2:] if wildcard else body)
            if address is not None:
                addresses.add(address)
            elif name is None:
                raise ValueError(f"destinations entry {entry!r} is {_why_not(body, mail=mail)}")
            elif wildcard and "." not in name:
                raise ValueError(
                    f"destinations entry {entry!r} admits a whole top-level domain; "
                    "name the domain under it"
                )
            elif wildcard:
                (domain_suffixes if mail else host_suffixes).append("." + name)
            else:
                (domains if mail else hosts).add(name)
        return cls(
            frozenset(hosts),
            tuple(host_suffixes),
            frozenset(addresses),
            frozenset(domains),
            tuple(domain_suffixes),
        )

    @property
    def reaches_hosts(self) -> bool:
        """Whether any entry names a host or an address (not only email domains)."""
        return bool(self.hosts or self.host_suffixes or self.addresses)

    @property
    def reaches_mail(self) -> bool:
        """Whether any entry names an email domain (`@example.org`)."""
        return bool(self.domains or self.domain_suffixes)

    def admits_host(self, host: str, address: IPAddress | None = None) -> bool:
        """Whether a URL's host (as written, before any lookup) is listed.

        `address`: the address the host is a literal of, when the caller reads literals in more
        spellings than `ipaddress` does (`127.1`); a literal matches address entries only.
        """
        if address is None:
            text = host.strip().rstrip(".")
            address = _address(text.split("%", 1)[0] if ":" in text else text)
        if address is not None:
            if isinstance(address, ipaddress.IPv6Address) and address.scope_id:
                address = ipaddress.IPv6Address(address.compressed.split("%", 1)[0])
            return address in self.addresses
        name = _name(host)
        return name is not None and _matches(name, self.hosts, self.host_suffixes)

    def admits_recipient(self, recipient: str) -> bool:
        """Whether an email address's domain is listed (`@example.org`, `@*.example.org`)."""
        local, at, domain = recipient.rpartition("@")
        name = _name(domain) if local and at else None
        return name is not None and _matches(name, self.domains, self.domain_suffixes)


def _why_not(body: str, *, mail: bool) -> str:
    """What an entry that did not parse is, said to the person who wrote it."""
    if not body or body == "*":
        return "not a destination (a list that admits everything restricts nothing)"
    if "://" in body or "/" in body:
        return "not a host: write the host name alone, without scheme or path"
    if "@" in body:
        return "not an email domain: write @example.org, without the local part"
    if ":" in body and not mail:
        return "not a host: destinations take no port"
    return "not a host name, *.suffix, address or @domain"
