"""A real SMTP server on 127.0.0.1 (aiosmtpd, a free port) that records every message it accepts.

Usage (the server runs in its own thread with its own event loop):

    with SmtpServer() as smtp:
        ... send to 127.0.0.1:{smtp.port} ...
        [received] = smtp.messages
        assert received.message["Subject"] == "Hello"

        smtp.rcpt_reply = "552 5.2.2 mailbox full"   # refuse every recipient with that reply
        smtp.refused["x@example.org"] = "550 no such user"  # or one of them
        smtp.data_reply = "451 4.3.0 try later"      # answer the end of DATA with that reply
        smtp.after_data = "drop"                     # read the message, then close, no reply
        smtp.after_data = "stall"                    # read the message, then never answer

A message counts as received (in `messages`) once its DATA has been read in full, whatever the
reply: "drop" and "stall" model a server that took the message and then went away. With
`password=...` the server offers AUTH (without TLS: tests stay on loopback) and refuses mail
before a successful login; `logins` records every (user, password) it was offered. With
`tls=context` it offers STARTTLS and requires it; with `implicit_tls=True` it speaks TLS from the
first byte (port 465 style).
"""

from __future__ import annotations

import asyncio
import email
import email.policy
import ssl
import threading
import warnings
from dataclasses import dataclass
from email.message import EmailMessage
from typing import Any, Literal, cast

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session

from tests.support.server import Background

__all__ = ["Received", "SmtpServer"]

AfterData = Literal["answer", "drop", "stall"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Received:
    """One message the server read to its end (header names as sent)."""

    sender: str
    recipients: tuple[str, ...]
    data: bytes
    login: str | None  # the AUTH user of the session, if it logged in
    tls: bool  # whether the session was encrypted

    @property
    def message(self) -> EmailMessage:
        """The message parsed (RFC 5322, the modern policy)."""
        return email.message_from_bytes(self.data, policy=email.policy.default)


class _Controller(Controller):
    """aiosmtpd's threaded controller, on a port the OS picks (it only takes a fixed one)."""

    def _create_server(self) -> Any:
        listening = super()._create_server()

        async def create() -> asyncio.Server:
            server = cast(asyncio.Server, await listening)
            self.port = server.sockets[0].getsockname()[1]
            return server

        return create()

    def factory(self) -> SMTP:
        # Deliberate here: AUTH without TLS, as the tests stay on loopback.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Requiring AUTH while not requiring TLS")
            return cast(SMTP, super().factory())  # type: ignore[no-untyped-call]


class _Handler:
    def __init__(self, owner: SmtpServer) -> None:
        self._owner = owner

    async def handle_RCPT(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: list[str]
    ) -> str:
        if self._owner.rcpt_reply is not None:
            return self._owner.rcpt_reply
        if address in self._owner.refused:
            return self._owner.refused[address]
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        owner = self._owner
        auth = session.auth_data
        login = (
            auth.login.decode()
            if session.authenticated and isinstance(auth, LoginPassword)
            else None
        )
        owner._record(
            Received(
                sender=envelope.mail_from or "",
                recipients=tuple(envelope.rcpt_tos),
                data=envelope.original_content or b"",
                login=login,
                tls=_encrypted(server),
            )
        )
        if owner.after_data == "drop":
            assert isinstance(server.transport, asyncio.Transport)
            server.transport.abort()  # closes without a reply; the session's task is cancelled
            await asyncio.sleep(3600)
        elif owner.after_data == "stall":
            await asyncio.sleep(3600)  # until the client gives up or the server stops
        return owner.data_reply or "250 2.0.0 OK queued"


def _encrypted(server: SMTP) -> bool:
    """Whether the session runs over TLS (after STARTTLS, or from the first byte)."""
    transport = server.transport
    return transport is not None and transport.get_extra_info("ssl_object") is not None


class SmtpServer(Background):
    """A recording SMTP server on 127.0.0.1; `with SmtpServer() as smtp:` serves until the end."""

    def __init__(
        self,
        *,
        username: str = "agent",
        password: str | None = None,
        tls: ssl.SSLContext | None = None,
        implicit_tls: bool = False,
    ) -> None:
        self.rcpt_reply: str | None = None
        self.refused: dict[str, str] = {}  # a recipient -> the reply that refuses it
        self.data_reply: str | None = None
        self.after_data: AfterData = "answer"
        self.logins: list[tuple[str, str]] = []
        self._messages: list[Received] = []
        self._lock = threading.Lock()
        self._username = username
        self._password = password
        options: dict[str, Any] = {}
        if password is not None:
            options.update(
                authenticator=self._authenticate, auth_required=True, auth_require_tls=False
            )
        if tls is not None and not implicit_tls:
            options.update(tls_context=tls, require_starttls=True)
        self._controller = _Controller(
            _Handler(self),
            hostname="127.0.0.1",
            port=0,
            server_hostname="smtp.test",  # else aiosmtpd asks the DNS for this machine's name
            ssl_context=tls if implicit_tls else None,
            ready_timeout=10.0,
            **options,
        )

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def port(self) -> int:
        return int(self._controller.port)

    @property
    def messages(self) -> list[Received]:
        """Every message read to its end so far, oldest first."""
        with self._lock:
            return list(self._messages)

    def _start(self) -> None:
        self._controller.start()

    def _stop(self) -> None:
        self._controller.stop()

    def _record(self, received: Received) -> None:
        with self._lock:
            self._messages.append(received)

    def _authenticate(
        self, server: SMTP, session: Session, envelope: Envelope, mechanism: str, data: Any
    ) -> AuthResult:
        if not isinstance(data, LoginPassword):
            return AuthResult(success=False, handled=False)
        user, password = data.login.decode(), data.password.decode()
        with self._lock:
            self.logins.append((user, password))
        ok = (user, password) == (self._username, self._password)
        return AuthResult(success=ok, handled=False, auth_data=data)
