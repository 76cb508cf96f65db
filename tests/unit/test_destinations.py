"""A tool's `destinations`: how entries are read and refused, and what each one admits."""

from __future__ import annotations

import ipaddress

import pytest

from agent_reach.destinations import Destinations, destination_from_arguments


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ("", "restricts nothing"),
        ("*", "restricts nothing"),
        ("@", "restricts nothing"),
        ("http://api.example.org", "without scheme or path"),
        ("api.example.org/v1", "without scheme or path"),
        ("api.example.org:443", "no port"),
        ("[::1]:443", "no port"),
        ("ops@example.org", "not an email domain"),
        ("@ops@example.org", "not an email domain"),
        ("*.org", "a whole top-level domain"),
        ("@*.org", "a whole top-level domain"),
        ("*.*.example.org", "not a host name"),
        ("api.*.example.org", "not a host name"),
        ("-bad.example.org", "not a host name"),
        ("10.0.0.0/8", "without scheme or path"),
        ("127.1", "not a host name"),
        ("@127.0.0.1", "not a host name"),
        ("has space.example.org", "not a host name"),
    ],
)
def test_entries_that_are_not_destinations_are_refused(entry: str, says: str) -> None:
    with pytest.raises(ValueError, match="destinations entry") as info:
        Destinations.parse([entry])
    assert says in str(info.value)
    assert repr(entry) in str(info.value)


def test_a_non_string_entry_is_refused() -> None:
    with pytest.raises(ValueError, match="is not a string"):
        Destinations.parse([443])


def test_exact_names_match_as_dns_reads_them() -> None:
    listed = Destinations.parse(["API.Example.org.", "bücher.example"])
    for host in ("api.example.org", "API.EXAMPLE.ORG", "api.example.org.", "xn--bcher-kva.example"):
        assert listed.admits_host(host), host
    for host in ("example.org", "x.api.example.org", "api.example.org.attacker.invalid", ""):
        assert not listed.admits_host(host), host


def test_a_wildcard_admits_sub_domains_only() -> None:
    listed = Destinations.parse(["*.example.org"])
    assert listed.admits_host("a.example.org")
    assert listed.admits_host("a.b.example.org")
    assert not listed.admits_host("example.org")
    assert not listed.admits_host("badexample.org")
    assert not listed.admits_host("a.example.org.attacker.invalid")


def test_addresses_match_literals_only() -> None:
    listed = Destinations.parse(["127.0.0.1", "[2001:db8::7]"])
    assert listed.admits_host("127.0.0.1")
    assert listed.admits_host("2001:db8::7")
    assert listed.admits_host("[2001:DB8:0::7]")
    assert listed.admits_host("127.1", ipaddress.ip_address("127.0.0.1"))  # read by the caller
    assert not listed.admits_host("127.1")  # a resolver would read it as an address
    assert not listed.admits_host("127.0.0.2")
    assert not listed.admits_host("localhost")
    assert not listed.admits_host("1.0.0.127.in-addr.arpa")


def test_mail_domains_match_recipients_and_nothing_else() -> None:
    listed = Destinations.parse(["@example.org", "@*.corp.example", "hooks.example"])
    assert listed.reaches_hosts
    assert listed.reaches_mail
    assert listed.admits_recipient("ops@example.org")
    assert listed.admits_recipient("ops@EXAMPLE.org")
    assert listed.admits_recipient("ops@eu.corp.example")
    for recipient in ("ops@corp.example", "ops@mail.example.org", "ops@hooks.example", "x"):
        assert not listed.admits_recipient(recipient), recipient
    assert not listed.admits_host("example.org")  # an @domain is not a host
    assert not Destinations.parse(["hooks.example"]).reaches_mail


@pytest.mark.parametrize(
    ("url", "from_arguments"),
    [
        ("https://api.example.org/orders/{id}", False),
        ("https://api.example.org?q={q}", False),
        ("https://api.example.org#{frag}", False),
        ("https://${env:API_HOST}/orders/{id}", False),
        ("https://api.example.org/fixed", False),
        ("${env:API_URL}/orders/{id}", False),
        ("${env:API_URL}?q={q}", False),
        ("${env:API_URL}{path}", True),
        ("${env:API_URL}.{tld}/x", True),
        ("${env:SCHEME}://{host}/x", True),
        ("x${env:API_URL}/orders/{id}", True),
        ("https://{host}/orders", True),
        ("https://{tenant}.example.org/orders", True),
        ("https://api.example.org:{port}/orders", True),
        ("{scheme}://api.example.org/orders", True),
        ("{base}/orders", True),
        ("https://api.example.org{path}", True),
        ("https://user:{password}@api.example.org/", True),
        ("https://api.example.org\\{path}", True),
    ],
)
def test_which_templates_take_their_destination_from_the_arguments(
    url: str, from_arguments: bool
) -> None:
    assert destination_from_arguments(url) is from_arguments
