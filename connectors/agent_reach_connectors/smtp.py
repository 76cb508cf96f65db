"""One email over SMTP, to an address the SSRF guard checked: the notify connector's email channel.

aiosmtplib is given a socket this module connected to a checked address (never a name to look
up) and the configured host name, which is what TLS verifies (SNI and certificate), whether TLS
is implicit (port 465) or comes after a required STARTTLS. The transaction is run step by step
so that a failure says whether the message may have been delivered: anything before the
server's `354` to DATA is an ordinary error (4xx transient, 5xx permanent); once the message
went out, a lost connection or a missing answer may mean it was delivered (`maybe_applied`).
"""

from __future__ import annotations

import asyncio
import contextlib
import email.policy
import re
import socket
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.message import EmailMessage
from email.utils import format_datetime
from typing import Any

import aiosmtplib
from aiosmtplib import (
    SMTPAuthenticationError,
    SMTPDataError,
    SMTPException,
    SMTPResponse,
    SMTPResponseException,
    SMTPServerDisconnected,
    SMTPStatus,
)

from agent_reach.errors import ErrorCode
from agent_reach_connectors import netguard
from agent_reach_connectors.base import ConnectorError, resolve_secrets
from agent_reach_connectors.http_request import CONNECT_TIMEOUT_CAP, misconfigured

# Headers and body kept to 7-bit (quoted-printable, encoded words): no 8BITMIME is assumed.
_POLICY = email.policy.SMTP.clone(cte_type="7bit")
_LEADING_DOT = re.compile(rb"^\.", re.MULTILINE)
_LOCAL = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_ADDRESS = re.compile(rf"(?P<local>{_LOCAL})@{_LABEL}(?:\.{_LABEL})*")
_SECURITY = {True: "starttls", False: "none", "tls": "tls", "starttls": "starttls"}


def is_address(text: str) -> bool:
    """Whether `text` is one plain ASCII address (`name@example.org`): no display name, no
    list, no whitespace, CR or LF, nothing a header or an SMTP command could be smuggled in."""
    match = _ADDRESS.fullmatch(text)
    return match is not None and len(text) <= 254 and len(match.group("local")) <= 64


@dataclass(frozen=True, slots=True, kw_only=True)
class SmtpSettings:
    """`config.smtp`, secrets resolved. `host` is normalized: the name TLS verifies."""

    host: str
    port: int
    security: str  # "starttls" (required), "tls" (implicit), or "none"
    sender: str
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    timeout: float | None = None

    @property
    def where(self) -> str:
        """`host:port` as a message may show it."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def smtp_settings(tool: str, config: Mapping[str, Any]) -> SmtpSettings:
    """Read `config.smtp` (resolving its `${env:...}` references); a bad one is misconfigured."""
    raw = config.get("smtp")
    if not isinstance(raw, Mapping):
        raise misconfigured(tool, "config.smtp is not set; the email channel needs an SMTP server")
    smtp = resolve_secrets(raw)
    host = smtp.get("host")
    if not isinstance(host, str) or not host.strip() or any(c.isspace() for c in host.strip()):
        raise misconfigured(tool, "config.smtp.host must be a host name or address")
    name = netguard.normalize_host(host)
    literal = netguard.parse_ip(name)
    starttls = smtp.get("starttls", True)
    security = _SECURITY.get(starttls) if isinstance(starttls, bool | str) else None
    if security is None:
        raise misconfigured(tool, 'config.smtp.starttls must be true, false or "tls"')
    port = smtp.get("port", 465 if security == "tls" else 587)
    if isinstance(port, str) and port.isdigit():  # from the environment (`${env:SMTP_PORT}`)
        port = int(port)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise misconfigured(tool, "config.smtp.port must be a port number")
    sender = smtp.get("from")
    if not isinstance(sender, str) or not is_address(sender):
        raise misconfigured(tool, "config.smtp.from must be one email address")
    username, password = smtp.get("username"), smtp.get("password")
    if not isinstance(username, str | None) or not isinstance(password, str | None):
        raise misconfigured(tool, "config.smtp.username and password must be strings")
    if password is not None and not username:
        raise misconfigured(tool, "config.smtp.password needs a username")
    timeout = smtp.get("timeout")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0
    ):
        raise misconfigured(tool, "config.smtp.timeout must be a positive number of seconds")
    return SmtpSettings(
        host=literal.compressed if literal is not None else name,
        port=port,
        security=security,
        sender=sender,
        username=username or None,
        password=password,
        timeout=None if timeout is None else float(timeout),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Email:
    """One plain-text message to one checked recipient."""

    tool: str
    to: str
    subject: str
    body: str
    message_id: str


async def send_email(
    mail: Email,
    *,
    settings: SmtpSettings,
    addresses: Sequence[netguard.IPAddress],
    wait: float,
    tls: ssl.SSLContext | None,
) -> int:
    """Send `mail` through the server at one of `addresses` (checked ones only); the reply code
    of the end of DATA. Each wait is bounded by `wait` seconds. Raises a classified
    ConnectorError.
    """
    data = _message_bytes(mail, settings.sender)
    sock = await _connect(mail.tool, addresses, settings, wait)
    client: aiosmtplib.SMTP | None = None
    sent = done = False
    try:
        client = aiosmtplib.SMTP(
            hostname=settings.host,  # not looked up (the socket is connected): what TLS verifies
            sock=sock,
            use_tls=settings.security == "tls",
            start_tls=settings.security == "starttls",  # required: no silent plain-text fallback
            tls_context=tls,
            timeout=wait,
            username=settings.username,
            password=settings.password,
            local_hostname=_helo_name(sock),
        )
        await client.connect()  # greeting, STARTTLS, AUTH: the socket is the client's now
        await client.mail(settings.sender)
        await client.rcpt(mail.to)
        # DATA, then the message, by hand: `client.data()` does both in one call, and a failure
        # inside it could not tell "refused before the message" from "lost after it went out".
        start = await client.execute_command(b"DATA")
        if start.code != SMTPStatus.start_input:
            raise SMTPDataError(start.code, start.message)
        sent = True
        reply = await _send_message(client, data, wait)
        done = True
    except (SMTPException, OSError, TimeoutError, ValueError) as exc:
        raise _failure(mail, settings, exc, sent=sent) from None
    finally:
        if client is None:
            sock.close()
        elif not done:
            client.close()  # also when cancelled
    try:
        with contextlib.suppress(SMTPException, OSError, TimeoutError):
            await client.quit(timeout=min(wait, 2.0))  # a courtesy: the message is accepted
    finally:
        client.close()
    return reply.code


async def _connect(
    tool: str, addresses: Sequence[netguard.IPAddress], settings: SmtpSettings, wait: float
) -> socket.socket:
    """A socket connected to the first of `addresses` that accepts (the next one is tried only
    when a connection is refused: nothing was sent)."""
    loop = asyncio.get_running_loop()
    for index, address in enumerate(addresses, start=1):
        family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            async with asyncio.timeout(min(wait, CONNECT_TIMEOUT_CAP)):
                await loop.sock_connect(sock, (address.compressed, settings.port))
        except TimeoutError:
            sock.close()
            raise ConnectorError(
                ErrorCode.TIMEOUT,
                f"{tool}: timed out connecting to the SMTP server {settings.where}",
            ) from None
        except OSError:
            sock.close()
            if index == len(addresses):
                raise ConnectorError(
                    ErrorCode.CONNECTION_ERROR,
                    f"{tool}: could not connect to the SMTP server {settings.where}",
                ) from None
        except BaseException:
            sock.close()
            raise
        else:
            return sock
    raise AssertionError("unreachable: a checked destination has an address")  # pragma: no cover


def _helo_name(sock: socket.socket) -> str:
    """What EHLO names: this end's address as a literal (RFC 5321), no DNS lookup of our own."""
    address = str(sock.getsockname()[0])
    return f"[IPv6:{address}]" if ":" in address else f"[{address}]"


def _message_bytes(mail: Email, sender: str) -> bytes:
    """The message as DATA carries it: CRLF lines, leading dots doubled, the final dot line."""
    message = EmailMessage(policy=_POLICY)
    try:
        message["From"] = sender
        message["To"] = mail.to
        message["Subject"] = mail.subject
        message["Date"] = format_datetime(datetime.now(UTC))
        message["Message-ID"] = mail.message_id
        message.set_content(mail.body)
        data = message.as_bytes()
    except ValueError:  # a UnicodeError (a lone surrogate), or a line break in a header
        raise ConnectorError(
            ErrorCode.INVALID_ARGUMENTS,
            f"{mail.tool}: the subject or message cannot be sent as an email",
            retryable=False,
        ) from None
    if not data.endswith(b"\r\n"):
        data += b"\r\n"
    return _LEADING_DOT.sub(b"..", data) + b".\r\n"


async def _send_message(client: aiosmtplib.SMTP, data: bytes, wait: float) -> SMTPResponse:
    """Write the message after the server's 354 and read its verdict."""
    protocol = client.protocol
    if protocol is None:
        raise SMTPServerDisconnected("Connection lost")
    protocol.write(data)
    reply = await protocol.read_response(timeout=wait)
    if reply.code != SMTPStatus.completed:
        raise SMTPDataError(reply.code, reply.message)
    return reply


def _said(text: str) -> str:
    """A server's reply text, on one line and short (it is read by a model)."""
    return " ".join(text.split())[:200]


def _failure(mail: Email, settings: SmtpSettings, exc: Exception, *, sent: bool) -> ConnectorError:
    """What a failed transaction means, and whether the message may have been delivered."""
    tool, where = mail.tool, settings.where
    if isinstance(exc, SMTPResponseException) and 400 <= exc.code < 600:
        return _refused(mail, settings, exc)
    tls_error = exc if isinstance(exc, ssl.SSLError) else exc.__cause__
    if isinstance(tls_error, ssl.SSLError):
        reason = getattr(tls_error, "verify_message", None) or tls_error.reason or "handshake"
        return ConnectorError(
            ErrorCode.CONNECTION_ERROR, f"{tool}: TLS with the SMTP server {where} failed: {reason}"
        )
    if isinstance(exc, OSError | TimeoutError):  # SMTPServerDisconnected is an OSError
        return _lost(mail, settings, exc, sent=sent)
    # The server cannot do what the config asks (no STARTTLS, no AUTH), or a malformed reply.
    return ConnectorError(
        ErrorCode.CONNECTOR_ERROR,
        f"{tool}: the SMTP server {where}: {_said(str(exc))}",
        retryable=False,
        maybe_applied=sent,
    )


def _refused(mail: Email, settings: SmtpSettings, exc: SMTPResponseException) -> ConnectorError:
    """A definite 4xx (transient) or 5xx (permanent) reply: the message was not accepted."""
    said = f"{exc.code} {_said(exc.message)}".rstrip()
    if isinstance(exc, SMTPAuthenticationError):
        code = ErrorCode.UNAUTHORIZED if exc.code >= 500 else ErrorCode.DOWNSTREAM_UNAVAILABLE
        return ConnectorError(
            code, f"{mail.tool}: the SMTP server {settings.where} refused the login: {said}"
        )
    if exc.code < 500:
        return ConnectorError(
            ErrorCode.DOWNSTREAM_UNAVAILABLE, f"{mail.tool}: email to {mail.to} failed: {said}"
        )
    return ConnectorError(
        ErrorCode.DOWNSTREAM_REJECTED,
        f"{mail.tool}: email to {mail.to} failed: {said}",
        retryable=False,
    )


def _lost(
    mail: Email, settings: SmtpSettings, exc: OSError | TimeoutError, *, sent: bool
) -> ConnectorError:
    """A connection lost or a reply not read in time: after the message, it may be delivered."""
    timed_out = isinstance(exc, TimeoutError)
    code = ErrorCode.TIMEOUT if timed_out else ErrorCode.CONNECTION_ERROR
    where = f"the SMTP server {settings.where}"
    if sent:
        how = "did not answer" if timed_out else "closed the connection"
        return ConnectorError(
            code,
            f"{mail.tool}: {where} {how} after the email to {mail.to} was sent; "
            "it may have been delivered",
            maybe_applied=True,
        )
    how = "timed out" if timed_out else "failed"
    said = f"{mail.tool}: the exchange with {where} {how} before the email was sent"
    return ConnectorError(code, said)
