"""A tool's `destinations` in the http and notify connectors, with nothing leaving 127.0.0.1.

A host the list does not name is refused by name before any lookup (the DNS here fails the test
if it is asked), on every redirect hop too; an email to a domain it does not name is refused
before any SMTP. Hosts that are refused are `.invalid` names: they could not go anywhere anyway.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import pytest

from agent_reach_connectors import ConnectorError, ToolCall
from agent_reach_connectors.http import HttpConnector
from agent_reach_connectors.notify import NotifyConnector
from tests.connectors.support import NoDns, Resolver, tool_call
from tests.support.sink import Response, Sink
from tests.support.smtp import SmtpServer

# A URL whose host and port are the model's: the case `destinations` exists for.
TEMPLATE = "http://{host}:{port}/in"
CANARY = "canary-71c0de"


@pytest.fixture
def sink() -> Iterator[Sink]:
    with Sink() as s:
        yield s


@pytest.fixture
def smtp() -> Iterator[SmtpServer]:
    with SmtpServer() as server:
        yield server


@pytest.fixture
async def http():
    connector = HttpConnector(resolver=NoDns())
    yield connector
    await connector.close()


@pytest.fixture
async def notify():
    connector = NotifyConnector(resolver=NoDns())
    yield connector
    await connector.close()


def port_of(sink: Sink) -> int:
    return int(sink.url.rsplit(":", 1)[1])


def http_call(sink: Sink, host: str, **config: Any) -> ToolCall:
    settings = {"url": TEMPLATE, "allow_hosts": ["127.0.0.1"], "destinations": ["127.0.0.1"]}
    return tool_call(
        tool="order.query",
        config=settings | config,
        args={"host": host, "port": port_of(sink)},
    )


async def failure(connector: HttpConnector | NotifyConnector, call: ToolCall) -> ConnectorError:
    with pytest.raises(ConnectorError) as info:
        await connector.invoke(call)
    return info.value


# http -----------------------------------------------------------------------------------------


async def test_a_listed_host_from_the_arguments_is_reached(http, sink) -> None:
    output = await http.invoke(http_call(sink, "127.0.0.1"))
    assert output == {}
    assert len(sink.requests("/in")) == 1


@pytest.mark.parametrize(
    ("host", "named"),
    [
        ("attacker.invalid", "attacker.invalid"),
        ("ATTACKER.invalid.", "attacker.invalid"),
        ("127.0.0.1.attacker.invalid", "127.0.0.1.attacker.invalid"),
        ("127.0.0.2", "127.0.0.2"),
        ("localhost", "localhost"),
    ],
)
async def test_an_unlisted_host_is_refused_by_name_before_any_lookup(
    http, sink, host, named
) -> None:
    error = await failure(http, http_call(sink, host))
    assert (error.code, error.retryable) == ("destination_refused", False)
    assert f"{named} is not one of the tool's destinations" in error.message
    assert sink.requests() == []


async def test_a_wildcard_admits_sub_domains_only(sink) -> None:
    http = HttpConnector(resolver=Resolver({"a.hooks.invalid": ["127.0.0.1"]}))
    try:
        listed = {"destinations": ["*.hooks.invalid"]}
        assert await http.invoke(http_call(sink, "a.hooks.invalid", **listed)) == {}
        for host in ("hooks.invalid", "evilhooks.invalid", "a.hooks.invalid.attacker.invalid"):
            error = await failure(http, http_call(sink, host, **listed))
            assert error.code == "destination_refused", host
    finally:
        await http.close()
    assert len(sink.requests("/in")) == 1


async def test_a_templated_host_without_destinations_is_refused(http, sink) -> None:
    call = tool_call(
        tool="order.query",
        config={"url": TEMPLATE, "allow_hosts": ["127.0.0.1"]},
        args={"host": "127.0.0.1", "port": port_of(sink)},
    )
    error = await failure(http, call)
    assert (error.code, error.retryable) == ("connector_error", False)
    assert "config.destinations is not set" in error.message
    assert sink.requests() == []


@pytest.mark.parametrize(
    "location",
    ["http://attacker.invalid/steal", "//attacker.invalid/steal", "http://127.0.0.2:9/steal"],
)
async def test_a_redirect_to_an_unlisted_host_is_refused(http, sink, location) -> None:
    sink.script("/in", [Response(status=302, headers=(("Location", location),))])
    error = await failure(http, http_call(sink, "127.0.0.1"))
    assert (error.code, error.retryable) == ("destination_refused", False)
    assert error.message.startswith("order.query: refused the redirect to ")
    assert "is not one of the tool's destinations" in error.message
    assert len(sink.requests("/in")) == 1


async def test_a_fixed_url_that_lists_destinations_is_held_to_them(http, sink) -> None:
    sink.script("/go", [Response(status=307, headers=(("Location", "http://x.invalid/"),))])
    config = {"url": f"{sink.url}/go", "allow_hosts": ["127.0.0.1"], "destinations": ["::1"]}
    error = await failure(http, tool_call(config=config))
    assert error.code == "destination_refused"
    assert "127.0.0.1 is not one of the tool's destinations" in error.message
    assert sink.requests() == []


async def test_garbage_destinations_are_a_config_error(http, sink) -> None:
    for entries in (["*"], ["http://127.0.0.1"], [], "127.0.0.1", ["127.0.0.1:80"]):
        error = await failure(http, http_call(sink, "127.0.0.1", destinations=entries))
        assert (error.code, error.retryable) == ("connector_error", False), entries
    assert sink.requests() == []


# notify ---------------------------------------------------------------------------------------


def notify_call(target: dict[str, Any], **config: Any) -> ToolCall:
    secret = "whsec_" + base64.b64encode(b"destinations-test-key").decode()
    settings = {"webhook_secret": secret, "allow_hosts": ["127.0.0.1"]}
    return tool_call(
        tool="notify", args={"message": "hi", "target": target}, config=settings | config
    )


def mail(server: SmtpServer, to: str, destinations: list[str]) -> ToolCall:
    smtp = {"host": "127.0.0.1", "port": server.port, "starttls": False, "from": "r@reach.test"}
    return notify_call({"channel": "email", "to": to}, smtp=smtp, destinations=destinations)


async def test_a_webhook_or_slack_url_off_the_list_is_refused_before_any_lookup(
    notify, sink
) -> None:
    webhook = {"channel": "webhook", "url": f"{sink.url}/hook"}
    assert (await notify.invoke(notify_call(webhook, destinations=["127.0.0.1"])))["status"] == 200
    for target in (
        {"channel": "webhook", "url": "https://attacker.invalid/hook"},
        {"channel": "slack", "url": f"https://hooks.attacker.invalid/services/{CANARY}"},
        webhook,
    ):
        error = await failure(notify, notify_call(target, destinations=["hooks.invalid"]))
        assert (error.code, error.retryable) == ("destination_refused", False), target
        assert "is not one of the tool's destinations" in error.message
        assert CANARY not in error.message  # a Slack URL's path is its credential
    assert len(sink.requests("/hook")) == 1


async def test_an_email_to_a_domain_off_the_list_is_refused(notify, smtp) -> None:
    delivered = await notify.invoke(mail(smtp, "ops@example.invalid", ["@example.invalid"]))
    assert delivered["status"] == 250
    for to, listed in [
        ("ops@attacker.invalid", ["@example.invalid"]),
        ("ops@mail.example.invalid", ["@example.invalid"]),  # exact domain: no sub-domains
        ("ops@example.invalid", ["@*.example.invalid"]),  # sub-domains only
        ("ops@example.invalid", ["example.invalid", "127.0.0.1"]),  # hosts are not domains
    ]:
        error = await failure(notify, mail(smtp, to, listed))
        assert (error.code, error.retryable) == ("destination_refused", False), to
        assert f"refused the email to {to}: @" in error.message
    sub = await notify.invoke(mail(smtp, "ops@eu.example.invalid", ["@*.example.invalid"]))
    assert sub["status"] == 250
    sent = [m.recipients for m in smtp.messages]
    assert sent == [("ops@example.invalid",), ("ops@eu.example.invalid",)]


async def test_a_notify_tool_without_destinations_sends_nothing(notify, sink, smtp) -> None:
    for target in (
        {"channel": "webhook", "url": f"{sink.url}/hook"},
        {"channel": "email", "to": "ops@example.invalid"},
    ):
        error = await failure(notify, notify_call(target))
        assert (error.code, error.retryable) == ("connector_error", False)
        assert "config.destinations is not set" in error.message
    assert sink.requests() == []
    assert smtp.messages == []
