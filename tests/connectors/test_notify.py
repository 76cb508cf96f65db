"""The notify connector against real servers on 127.0.0.1: a recording HTTP sink for webhooks and
Slack, aiosmtpd for email. Delivery, classification (what may have been delivered), the SSRF
guard on every URL and on the SMTP host, and secrets that never show."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import socket
import ssl
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from standardwebhooks.webhooks import Webhook

from agent_reach_connectors import ConnectorError, ToolCall, load_connectors
from agent_reach_connectors.notify import NotifyConnector
from agent_reach_connectors.smtp import smtp_settings
from tests.connectors.support import Resolver
from tests.support.certs import Authority
from tests.support.sink import Response, Sink
from tests.support.smtp import SmtpServer

CANARY = "canary-3d9a71"
# A Standard Webhooks secret whose base64 text carries the canary.
SECRET = "whsec_" + base64.b64encode(f"{CANARY}-webhook-key".encode()).decode()
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
SENDER = "agent@reach.test"


DNS = {"hooks.test": ["127.0.0.1"], "mail.test": ["127.0.0.1"], "meta.test": ["169.254.169.254"]}
# Every host and domain these tests send to, so that the SSRF guard, not the list, is what refuses.
EVERYWHERE = [
    "127.0.0.1",
    "127.0.0.2",
    "::1",
    "10.0.0.1",
    "169.254.169.254",
    "localhost",
    "hooks.test",
    "mail.test",
    "meta.test",
    "@example.org",
]


def call(
    target: dict[str, Any],
    config: dict[str, Any] | None = None,
    *,
    message: str = "The deploy finished.",
    subject: str | None = "Deploy",
    **kw: Any,
) -> ToolCall:
    args: dict[str, Any] = {"message": message, "target": target}
    if subject is not None:
        args["subject"] = subject
    values: dict[str, Any] = {
        "tool": "notify",
        "task_id": "task-1",
        "step_id": "s1.0",
        "args": args,
        "config": {"allow_hosts": ["127.0.0.1"], "destinations": EVERYWHERE, **(config or {})},
        "idempotency_key": "task-1:s1.0",
        "attempt": 1,
        "max_attempts": 3,
        "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
        "traceparent": TRACEPARENT,
        "timeout_s": 5.0,
    }
    values.update(kw)
    return ToolCall(**values)


@pytest.fixture
async def notify():
    connector = NotifyConnector(resolver=Resolver(DNS))
    await connector.start()
    yield connector
    await connector.close()


@pytest.fixture
def sink() -> Iterator[Sink]:
    with Sink() as s:
        yield s


@pytest.fixture
def smtp() -> Iterator[SmtpServer]:
    with SmtpServer() as server:
        yield server


@pytest.fixture
def webhook_secret(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.setenv("NOTIFY_WEBHOOK_SECRET", SECRET)
    return {"webhook_secret": "${env:NOTIFY_WEBHOOK_SECRET}"}


def mail_config(server: SmtpServer, **smtp: Any) -> dict[str, Any]:
    settings = {"host": server.host, "port": server.port, "starttls": False, "from": SENDER}
    return {"smtp": {**settings, **smtp}, "allow_hosts": [f"127.0.0.1:{server.port}"]}


async def failure(notify: NotifyConnector, tool_call: ToolCall) -> ConnectorError:
    with pytest.raises(ConnectorError) as info:
        await notify.invoke(tool_call)
    return info.value


def outcome(error: ConnectorError) -> tuple[str, bool, bool]:
    return error.code, error.retryable, error.maybe_applied


def port_of(sink: Sink) -> int:
    return int(sink.url.rsplit(":", 1)[1])


# Webhooks -------------------------------------------------------------------------------------


async def test_the_entry_point_loads_it() -> None:
    assert isinstance(load_connectors(["notify"])["notify"], NotifyConnector)


async def test_a_signed_webhook_keeps_its_id_on_every_attempt(notify, sink, webhook_secret) -> None:
    sink.script("/hook", [Response(status=503, retry_after=2), Response(status=202)])
    target = {"channel": "webhook", "url": f"{sink.url}/hook?token=q-{CANARY}#frag"}
    text = "The deploy finished \u2713 (\ud800 is a lone surrogate)"
    error = await failure(notify, call(target, webhook_secret, message=text))
    assert outcome(error) == ("downstream_unavailable", True, False)
    assert error.retry_after == 2
    output = await notify.invoke(call(target, webhook_secret, message=text, attempt=2))

    first, second = sink.requests("/hook")
    assert first.headers["webhook-id"] == second.headers["webhook-id"] == "task-1:s1.0"
    for delivery in (first, second):
        # The receiving side's check, with the library the receiver would use.
        payload = Webhook(SECRET).verify(delivery.body, delivery.headers)
        assert payload["type"] == "notification"
        assert payload["data"] == {
            "message": text,
            "subject": "Deploy",
            "task_id": "task-1",
            "step_id": "s1.0",
        }
        assert delivery.headers["traceparent"] == TRACEPARENT
        assert delivery.headers["content-type"] == "application/json"
        assert delivery.query == {"token": [f"q-{CANARY}"]}
    with pytest.raises(Exception, match="signature"):
        Webhook("whsec_" + base64.b64encode(b"another key").decode()).verify(
            second.body, second.headers
        )
    assert output["channel"] == "webhook"
    assert output["target"] == f"{sink.url}/hook"  # no query: it may hold a token
    assert (output["status"], output["message_id"]) == (202, "task-1:s1.0")
    assert datetime.fromisoformat(output["delivered_at"]).tzinfo == UTC
    assert output["delivered_at"].endswith("Z")


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        (Response(status=410), ("downstream_rejected", False, False)),
        (Response(status=404), ("downstream_rejected", False, False)),
        (Response(status=400), ("downstream_rejected", False, False)),
        (
            Response(status=302, headers=(("Location", "/x"),)),
            ("downstream_rejected", False, False),
        ),
        (Response(status=408), ("timeout", True, False)),
        (Response(status=429, retry_after=7), ("rate_limited", True, False)),
        (Response(status=500), ("downstream_unavailable", True, False)),
        # The receiver deduplicates by webhook-id, so even after sending it may go again.
        (Response(drop=True), ("connection_error", True, False)),
        (Response(delay=2.0), ("timeout", True, False)),
    ],
)
async def test_webhook_outcomes(notify, sink, webhook_secret, response, expected) -> None:
    sink.script("/hook", [response])
    target = {"channel": "webhook", "url": f"{sink.url}/hook"}
    error = await failure(notify, call(target, {**webhook_secret, "timeout": 0.5}))
    assert outcome(error) == expected
    assert error.message.startswith("notify: ")
    if response.status == 429:
        assert error.retry_after == 7
    assert len(sink.requests("/hook")) == 1  # nothing is retried inside the call
    assert sink.requests("/hook")[0].headers.get("location") is None


async def test_a_webhook_is_never_sent_unsigned(notify, sink, monkeypatch) -> None:
    target = {"channel": "webhook", "url": f"{sink.url}/hook"}
    for config in [
        {},
        {"webhook_secret": ""},
        {"webhook_secret": "whsec_!!not base64!!"},
        {"webhook_secret": "${env:NOTIFY_UNSET_SECRET}"},
    ]:
        monkeypatch.delenv("NOTIFY_UNSET_SECRET", raising=False)
        error = await failure(notify, call(target, config))
        assert outcome(error) == ("connector_error", False, False), config
        assert "webhook_secret" in error.message or "NOTIFY_UNSET_SECRET" in error.message
    assert sink.requests() == []


# Slack ----------------------------------------------------------------------------------------


REJECTED = ("downstream_rejected", False, False)


def slack_target(sink: Sink) -> dict[str, Any]:
    return {"channel": "slack", "url": f"{sink.url}/services/T0/B0/{CANARY}"}


async def test_slack_gets_text_with_a_bold_subject(notify, sink) -> None:
    sink.script(f"/services/T0/B0/{CANARY}", [Response(body="ok")])
    output = await notify.invoke(call(slack_target(sink)))
    [delivery] = sink.requests()
    assert delivery.json() == {"text": "*Deploy*\nThe deploy finished."}
    assert output["target"] == f"127.0.0.1:{port_of(sink)}"  # the host: the path is the secret
    assert (output["channel"], output["status"], output["message_id"]) == ("slack", 200, None)
    await notify.invoke(call(slack_target(sink), subject=None))
    assert sink.requests()[1].json() == {"text": "The deploy finished."}


@pytest.mark.parametrize(
    ("response", "expected", "said"),
    [
        (Response(status=400, body="invalid_payload"), REJECTED, "invalid_payload"),
        (Response(status=404, body="no_service"), REJECTED, "no_service"),
        (Response(status=403, body=f"invalid_token {CANARY}"), REJECTED, "invalid_token ***"),
        (Response(status=429, retry_after=30), ("rate_limited", True, False), "429 Too Many"),
        (Response(status=503, body="busy"), ("downstream_unavailable", True, False), "503"),
        # The request went out and no answer came: Slack cannot deduplicate a second post.
        (Response(drop=True), ("connection_error", True, True), "may have been applied"),
        (Response(delay=2.0), ("timeout", True, True), "may have been applied"),
    ],
)  # fmt: skip
async def test_slack_outcomes(notify, sink, response, expected, said) -> None:
    sink.script(f"/services/T0/B0/{CANARY}", [response])
    error = await failure(notify, call(slack_target(sink), {"timeout": 0.5}))
    assert outcome(error) == expected
    assert said in error.message
    assert f"127.0.0.1:{port_of(sink)}" in error.message
    assert CANARY not in error.message
    assert "/services" not in error.message
    if response.status == 429:
        assert error.retry_after == 30


async def test_nothing_listening_means_not_sent(notify) -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    error = await failure(
        notify, call({"channel": "slack", "url": f"http://127.0.0.1:{port}/services/{CANARY}"})
    )
    assert outcome(error) == ("connection_error", True, False)
    assert CANARY not in error.message


# Email ----------------------------------------------------------------------------------------


def message_id(key: str = "task-1:s1.0") -> str:
    return f"<{hashlib.sha256(key.encode()).hexdigest()[:32]}@agent-reach>"


async def test_an_email_is_delivered_with_a_stable_message_id(notify, smtp) -> None:
    target = {"channel": "email", "to": "ops@example.org"}
    body = "Line one.\n.a line that starts with a dot\nGrüße"
    output = await notify.invoke(call(target, mail_config(smtp), message=body))
    again = await notify.invoke(call(target, mail_config(smtp), message=body, attempt=2))
    first, second = smtp.messages
    assert (first.sender, first.recipients, first.tls) == (SENDER, ("ops@example.org",), False)
    parsed = first.message
    assert parsed["Message-ID"] == second.message["Message-ID"] == message_id()
    assert (parsed["Subject"], parsed["To"], parsed["From"]) == (
        "Deploy",
        "ops@example.org",
        SENDER,
    )
    content = parsed.get_content()
    assert content.replace("\r\n", "\n").rstrip("\n") == body
    assert output == {**output, "channel": "email", "target": "ops@example.org", "status": 250}
    assert output["message_id"] == again["message_id"] == message_id()


async def test_text_that_cannot_be_an_email_is_refused(notify, smtp) -> None:
    target = {"channel": "email", "to": "ops@example.org"}
    for text in [{"message": "a lone \ud800"}, {"subject": "a lone \udfff"}]:
        error = await failure(notify, call(target, mail_config(smtp), **text))
        assert outcome(error) == ("invalid_arguments", False, False)
    assert smtp.messages == []


async def test_the_subject_defaults_and_stays_on_one_line(notify, smtp) -> None:
    target = {"channel": "email", "to": "ops@example.org"}
    await notify.invoke(call(target, mail_config(smtp), subject=None))
    await notify.invoke(call(target, mail_config(smtp), subject="Deploy\r\nBcc: x@evil.test"))
    first, second = smtp.messages
    assert first.message["Subject"] == "Notification"
    assert second.message["Subject"] == "Deploy Bcc: x@evil.test"
    assert second.message["Bcc"] is None
    assert second.recipients == ("ops@example.org",)


async def test_a_permanent_refusal_is_not_retried(notify, smtp) -> None:
    target = {"channel": "email", "to": "full@example.org"}
    smtp.rcpt_reply = "552 5.2.2 mailbox full"
    error = await failure(notify, call(target, mail_config(smtp)))
    assert outcome(error) == ("downstream_rejected", False, False)
    assert error.message == "notify: email to full@example.org failed: 552 5.2.2 mailbox full"
    smtp.rcpt_reply = None
    smtp.data_reply = "552 5.3.4 message too big"
    error = await failure(notify, call(target, mail_config(smtp)))
    assert outcome(error) == ("downstream_rejected", False, False)
    assert error.message.endswith("failed: 552 5.3.4 message too big")


async def test_a_transient_refusal_may_be_retried(notify, smtp) -> None:
    target = {"channel": "email", "to": "ops@example.org"}
    smtp.rcpt_reply = "450 4.2.1 try again later"
    error = await failure(notify, call(target, mail_config(smtp)))
    assert outcome(error) == ("downstream_unavailable", True, False)
    assert smtp.messages == []
    smtp.rcpt_reply = None
    smtp.data_reply = "451 4.3.0 queue full"  # a definite answer to the message: not accepted
    error = await failure(notify, call(target, mail_config(smtp)))
    assert outcome(error) == ("downstream_unavailable", True, False)


async def test_a_disconnect_after_data_may_have_delivered(notify, smtp) -> None:
    target = {"channel": "email", "to": "ops@example.org"}
    smtp.after_data = "drop"
    error = await failure(notify, call(target, mail_config(smtp)))
    assert error.maybe_applied is True
    assert error.code == "connection_error"
    assert "it may have been delivered" in error.message
    assert len(smtp.messages) == 1  # the server had it: a blind resend would deliver it twice
    smtp.after_data = "stall"
    error = await failure(notify, call(target, mail_config(smtp, timeout=0.5)))
    assert (error.code, error.maybe_applied) == ("timeout", True)


async def test_an_smtp_server_that_is_not_there(notify) -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    config = {
        "smtp": {"host": "127.0.0.1", "port": port, "starttls": False, "from": SENDER},
        "allow_hosts": ["127.0.0.1"],
    }
    error = await failure(notify, call({"channel": "email", "to": "ops@example.org"}, config))
    assert outcome(error) == ("connection_error", True, False)


@pytest.mark.parametrize(
    "to",
    [
        "ops@example.org\r\nBcc: victim@example.org",
        "ops@example.org\n",
        "ops@example.org, other@example.org",
        "Ops <ops@example.org>",
        "ops@example.org>\r\nRCPT TO:<victim@example.org",
        "ops",
        "@example.org",
        "ops@",
        "op s@example.org",
        "ops@exa mple.org",
        "ops@[127.0.0.1]",
        "öps@example.org",
        "",
        ["ops@example.org"],
    ],
)
async def test_a_recipient_must_be_one_plain_address(notify, smtp, to) -> None:
    error = await failure(notify, call({"channel": "email", "to": to}, mail_config(smtp)))
    assert outcome(error) == ("invalid_arguments", False, False)
    assert smtp.messages == []


async def test_bad_smtp_configs_are_refused(notify, smtp) -> None:
    target = {"channel": "email", "to": "ops@example.org"}
    bad: list[dict[str, Any]] = [
        {"from": "not an address"},
        {"from": "a@b.test\r\nBcc: x@y.test"},
        {"port": "25a"},
        {"starttls": "maybe"},
        {"starttls": ["tls"]},
        {"starttls": 1},
        {"password": "p"},  # without a username
        {"timeout": 0},
    ]
    for smtp_config in bad:
        error = await failure(notify, call(target, mail_config(smtp, **smtp_config)))
        assert outcome(error) == ("connector_error", False, False), smtp_config
    error = await failure(notify, call(target, {"allow_hosts": ["127.0.0.1"]}))
    assert "config.smtp" in error.message
    # STARTTLS is required by default: a server that does not offer it gets nothing.
    error = await failure(notify, call(target, mail_config(smtp, starttls=True)))
    assert outcome(error) == ("connector_error", False, False)
    assert "STARTTLS" in error.message
    assert smtp.messages == []


async def test_smtp_auth_sends_the_password_and_never_shows_it(notify, monkeypatch, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("NOTIFY_SMTP_PASSWORD", CANARY)
    target = {"channel": "email", "to": "ops@example.org"}
    with SmtpServer(password=CANARY) as server:
        config = mail_config(server, username="agent", password="${env:NOTIFY_SMTP_PASSWORD}")
        output = await notify.invoke(call(target, config))
        server.rcpt_reply = f"550 5.1.1 no such user (auth {CANARY})"  # a reply that echoes it
        refused = await failure(notify, call(target, config))
        monkeypatch.setenv("NOTIFY_SMTP_PASSWORD", f"wrong-{CANARY}")
        wrong = await failure(notify, call(target, config))
        # Written into the config as it is (not a reference): still never shown.
        literal = mail_config(server, username="agent", password=CANARY)
        server.rcpt_reply = f"550 5.1.1 no such user (auth {CANARY})"
        echoed = await failure(notify, call(target, literal))
        [received] = server.messages
        logins = list(server.logins)
    assert received.login == "agent"
    assert logins[0] == ("agent", CANARY)
    assert outcome(refused) == ("downstream_rejected", False, False)
    assert "550 5.1.1 no such user (auth ***)" in refused.message
    assert outcome(wrong) == ("unauthorized", False, False)
    assert "refused the login: 535" in wrong.message
    assert echoed.message == refused.message
    shown = [json.dumps(output), refused.message, str(refused), wrong.message, str(wrong)]
    shown += [record.getMessage() for record in caplog.records if "agent_reach" in record.name]
    assert not any(CANARY in text for text in shown)


async def test_no_secret_ever_shows(notify, sink, smtp, webhook_secret, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    sink.script("/bad", [Response(status=400, body=f"bad signature {SECRET}")])
    shown: list[str] = []
    targets = [
        {"channel": "webhook", "url": f"{sink.url}/ok?t={CANARY}"},
        {"channel": "webhook", "url": f"{sink.url}/bad"},
        slack_target(sink),
        {"channel": "slack", "url": f"http://127.0.0.2:9/services/{CANARY}"},
        {"channel": "slack", "url": f"http://10.0.0.1/services/{CANARY}?x={CANARY}"},
        {"channel": "webhook", "url": f"http://user:{CANARY}@127.0.0.1:{port_of(sink)}/x"},
    ]
    for target in targets:
        try:
            shown.append(json.dumps(await notify.invoke(call(target, webhook_secret))))
        except ConnectorError as error:
            shown += [error.message, str(error)]
    assert len(shown) >= len(targets)
    shown += [record.getMessage() for record in caplog.records if "agent_reach" in record.name]
    assert not any(CANARY in text or SECRET in text for text in shown), shown


# The SSRF guard -------------------------------------------------------------------------------


@pytest.mark.parametrize("channel", ["webhook", "slack"])
@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:{p}/x",
        "http://2130706433:{p}/x",
        "http://[::1]:{p}/x",
        "http://localhost:{p}/x",
        "http://hooks.test:{p}/x",  # a name that resolves to loopback
        "http://169.254.169.254/latest/meta-data/",
        "http://meta.test/latest/meta-data/",
        "http://10.0.0.1/x",
        "file:///etc/passwd",
        "gopher://127.0.0.1:{p}/_x",
    ],
)
async def test_special_destinations_are_refused(notify, sink, webhook_secret, channel, url) -> None:
    target = {"channel": channel, "url": url.format(p=port_of(sink))}
    error = await failure(notify, call(target, {**webhook_secret, "allow_hosts": []}))
    assert outcome(error) == ("destination_refused", False, False)
    assert error.message.startswith("notify: refused ")
    assert sink.requests() == []


async def test_a_refusal_names_the_host_and_why(notify, sink, webhook_secret) -> None:
    config = {**webhook_secret, "allow_hosts": []}
    error = await failure(notify, call({"channel": "webhook", "url": f"{sink.url}/x"}, config))
    assert "127.0.0.1 is a loopback address" in error.message
    error = await failure(
        notify, call({"channel": "webhook", "url": "http://meta.test/latest"}, config)
    )
    assert "meta.test resolves to 169.254.169.254, the cloud metadata address" in error.message


async def test_credentials_in_a_url_are_refused(notify, sink, webhook_secret) -> None:
    url = f"http://user:pw@127.0.0.1:{port_of(sink)}/x"
    error = await failure(notify, call({"channel": "webhook", "url": url}, webhook_secret))
    assert outcome(error) == ("destination_refused", False, False)
    assert sink.requests() == []


async def test_allow_hosts_admits_a_name_at_its_checked_address(
    notify, sink, webhook_secret
) -> None:
    url = f"http://hooks.test:{port_of(sink)}/in"
    config = {**webhook_secret, "allow_hosts": [f"127.0.0.1:{port_of(sink)}"]}
    output = await notify.invoke(call({"channel": "webhook", "url": url}, config))
    assert output["status"] == 200
    [delivery] = sink.requests("/in")
    assert delivery.headers["host"] == f"hooks.test:{port_of(sink)}"


async def test_the_smtp_host_passes_the_same_guard(notify, smtp) -> None:
    target = {"channel": "email", "to": "ops@example.org"}
    for host, reason in [
        ("127.0.0.1", "127.0.0.1 is a loopback address"),
        ("localhost", "localhost is a loopback name"),
        ("mail.test", "mail.test resolves to 127.0.0.1, a loopback address"),
        ("169.254.169.254", "the cloud metadata address"),
    ]:
        config = {**mail_config(smtp, host=host), "allow_hosts": []}
        error = await failure(notify, call(target, config))
        assert outcome(error) == ("destination_refused", False, False), host
        assert error.message.startswith("notify: refused the SMTP server ")
        assert reason in error.message
    assert smtp.messages == []
    config = {**mail_config(smtp, host="mail.test"), "allow_hosts": ["mail.test"]}
    assert (await notify.invoke(call(target, config)))["status"] == 250


# TLS to a pinned address, verified for the name ----------------------------------------------


@pytest.fixture
def tls_files(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server context with a certificate for mail.test only, and a client trusting its CA."""
    authority = Authority(tmp_path, "notify")
    issued = authority.issue("mail", dns=("mail.test",), server=True)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(issued.cert, issued.key)
    return server, ssl.create_default_context(cafile=str(authority.cert))


@pytest.mark.parametrize("mode", ["starttls", "tls"])
async def test_tls_verifies_the_name_on_the_checked_address(tls_files, mode) -> None:
    server_side, trust = tls_files
    resolver = Resolver({"mail.test": ["127.0.0.1"], "evil.test": ["127.0.0.1"]})
    notify = NotifyConnector(resolver=resolver, verify=trust)
    target = {"channel": "email", "to": "ops@example.org"}
    starttls: Any = True if mode == "starttls" else "tls"
    try:
        with SmtpServer(tls=server_side, implicit_tls=mode == "tls") as server:
            allow = {"allow_hosts": ["127.0.0.1"]}
            good = {**mail_config(server, host="mail.test", starttls=starttls), **allow}
            output = await notify.invoke(call(target, good))
            wrong = {**mail_config(server, host="evil.test", starttls=starttls), **allow}
            error = await failure(notify, call(target, wrong))
            [received] = server.messages
    finally:
        await notify.close()
    assert output["status"] == 250
    assert received.tls is True
    assert outcome(error) == ("connection_error", True, False)
    assert "TLS with the SMTP server evil.test" in error.message
    assert resolver.asked == ["mail.test", "evil.test"]


# Arguments ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        {"target": {"channel": "webhook", "url": "http://hooks.test/"}},
        {"message": "", "target": {"channel": "webhook", "url": "http://hooks.test/"}},
        {"message": "hi", "subject": 3, "target": {"channel": "webhook", "url": "x"}},
        {"message": "hi"},
        {"message": "hi", "target": {"channel": "pager"}},
        {"message": "hi", "target": {"channel": "webhook"}},
        {"message": "hi", "target": {"channel": "slack", "url": "/relative"}},
        {"message": "hi", "target": {"channel": "slack", "url": "http://[::1/x"}},
    ],
)
async def test_bad_arguments_are_refused(notify, webhook_secret, args) -> None:
    tool_call = call({}, webhook_secret)
    error = await failure(notify, ToolCall(**{**_fields(tool_call), "args": args}))
    assert outcome(error) == ("invalid_arguments", False, False)


def _fields(tool_call: ToolCall) -> dict[str, Any]:
    return {name: getattr(tool_call, name) for name in ToolCall.__dataclass_fields__}


async def test_the_timeout_never_exceeds_the_call(notify, sink, webhook_secret) -> None:
    sink.script("/slow", [Response(delay=1.5)])
    target = {"channel": "webhook", "url": f"{sink.url}/slow"}
    error = await failure(notify, call(target, {**webhook_secret, "timeout": 30}, timeout_s=0.5))
    assert error.code == "timeout"
    error = await failure(notify, call(target, {**webhook_secret, "timeout": "soon"}))
    assert outcome(error) == ("connector_error", False, False)


def test_an_smtp_port_from_the_environment_is_read_as_a_number(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SMTP_PORT", "2525")
    config = {"smtp": {"host": "mail.example.org", "port": "${env:SMTP_PORT}", "from": SENDER}}
    assert smtp_settings("t", config).port == 2525
