"""The `notify` connector: one message to one target (a signed webhook, Slack, or an email).

The controller fans a notify step out into a child step per target, so a call delivers once, to
one place. What a failure means differs by channel. A webhook receiver drops repeats by
`webhook-id` (the step's idempotency key, the same on every attempt), so any failed delivery may
be sent again. Slack and SMTP cannot deduplicate: a failure before the message could have been
accepted is an ordinary error, one after it went out with no answer read says it may have been
delivered (`maybe_applied`), and the controller does not send it blindly again.

Every target must be listed in the tool's `destinations` (a URL's host by name, an email's domain as
`@domain`), checked before any lookup. Then every destination passes the http connector's SSRF
guard, which this module reuses rather than restates: webhook and Slack URLs (they come from the
model) go through `HttpConnector.open_request` (scheme, resolve once, `netguard`, `allow_hosts`,
connect to the checked address, no redirect, no proxy from the environment), and the SMTP host
through `check_destination`, after which the socket is connected here to a checked address and
handed to aiosmtplib, with the configured name kept for TLS (SNI and certificate check, implicit or
after STARTTLS).
"""

from __future__ import annotations

import hashlib
import json
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any

import aiohttp
from multidict import CIMultiDict
from standardwebhooks.webhooks import Webhook
from yarl import URL

from agent_reach.destinations import Destinations
from agent_reach.errors import ErrorCode
from agent_reach.times import rfc3339
from agent_reach_connectors.base import ConnectorError, ToolCall, resolve_secrets
from agent_reach_connectors.http import HttpConnector, Redactor, Resolver, not_listed, safe_url
from agent_reach_connectors.http_request import (
    CONNECT_TIMEOUT_CAP,
    HttpRequest,
    misconfigured,
    required_destinations,
)
from agent_reach_connectors.http_request import allowlist as parse_allowlist
from agent_reach_connectors.netguard import Allowlist
from agent_reach_connectors.smtp import Email, SmtpSettings, is_address, send_email, smtp_settings
from agent_reach_connectors.throttling import parse_retry_after

DEFAULT_TIMEOUT = 10.0
DEFAULT_SUBJECT = "Notification"
# The most of an error answer read (Slack's reason is a word: `invalid_payload`, `no_service`).
_ERROR_TEXT_BYTES = 512
# ASCII JSON: any text (a lone surrogate too) encodes, and the bytes signed are the bytes sent.
_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"))
_UNPRINTABLE = re.compile(r"[^\x20-\x7e]+")
_TARGETS_ARE_ARGUMENTS = "a notify tool's targets come from its arguments"


@dataclass(frozen=True, slots=True, kw_only=True)
class _Note:
    """One delivery, read from a call: what to say, and the limits every channel keeps."""

    tool: str
    message: str
    subject: str | None
    timeout: float
    allow: Allowlist
    listed: Destinations


@dataclass(frozen=True, slots=True)
class _Answer:
    status: int
    retry_after: float | None
    text: str


class NotifyConnector:
    """Delivers one notification per call to one target: a webhook, Slack or an email.

    Arguments: `{"message": str, "subject": str (optional), "target": {...}}`, the target being
    `{"channel": "webhook", "url": ...}` (a JSON body signed per Standard Webhooks with
    `config.webhook_secret`; `webhook-id` is the step's idempotency key), `{"channel": "slack",
    "url": ...}` (an incoming webhook, `{"text": ...}`; its URL is a secret and only its host is
    ever shown) or `{"channel": "email", "to": address}` (over SMTP, `config.smtp`: `host`,
    `port` (587), `starttls` (true; false, or "tls" for implicit TLS), `username`, `password`,
    `from`, `timeout`; `Message-ID` derived from the idempotency key).

    Config: `webhook_secret`, `smtp`, `destinations` (required: the only targets it may reach, host
    names, `*.suffix` and addresses for webhook and Slack URLs, `@domain` and `@*.suffix` for email
    recipients, matched before any lookup), `allow_hosts` (as the http connector reads it: the
    non-public destinations that may be reached) and `timeout` (seconds per wait, default 10, never
    more than the call's). `${env:NAME}` references are resolved at invoke time; no secret reaches
    an output or an error message. The output names the channel, the target as it may be shown,
    `delivered_at`, the HTTP status or SMTP reply code, and the message id.

    `resolver` (tests) replaces the system's getaddrinfo and `verify` the system's CAs, for
    HTTPS and SMTP alike.
    """

    name = "notify"

    def __init__(
        self,
        *,
        max_connections: int = 100,
        resolver: Resolver | None = None,
        verify: ssl.SSLContext | None = None,
    ) -> None:
        self._http = HttpConnector(
            max_connections=max_connections, resolver=resolver, verify=verify
        )
        self._tls = verify

    async def start(self) -> None:
        """Open the HTTP connection pool (invoke also opens it lazily)."""
        await self._http.start()

    async def close(self) -> None:
        """Close every pooled HTTP connection."""
        await self._http.close()

    async def invoke(self, call: ToolCall) -> dict[str, Any]:
        """Deliver the call's message to its target; the delivery's record, or ConnectorError."""
        try:
            note, target = _read_call(call)
            channel = target.get("channel")
            if channel == "webhook":
                return await self._webhook(call, note, target)
            if channel == "slack":
                return await self._slack(note, target)
            if channel == "email":
                return await self._email(call, note, target)
            raise _invalid(note.tool, "target.channel must be one of webhook, slack, email")
        except ConnectorError as error:
            error.message = _scrub(call.config, error.message)  # a reply may echo a secret
            error.args = (error.message,)
            raise

    async def _webhook(
        self, call: ToolCall, note: _Note, target: Mapping[str, Any]
    ) -> dict[str, Any]:
        signer = _signer(call)
        url = _target_url(note.tool, target, "webhook")
        now = datetime.now(UTC)
        data = {
            "message": note.message,
            "subject": note.subject,
            "task_id": call.task_id,
            "step_id": call.step_id,
        }
        body = _COMPACT_JSON.encode(
            {"type": "notification", "timestamp": rfc3339(now), "data": data}
        )
        key = call.idempotency_key
        headers = {
            "webhook-id": key,
            "webhook-timestamp": str(int(now.timestamp())),
            "webhook-signature": signer.sign(key, now, body),
        }
        if call.traceparent:
            headers["traceparent"] = call.traceparent
        shown = safe_url(url)
        request = _post(url, body.encode(), headers, note.timeout)
        try:
            answer = await self._send(note, request, what=shown, where=shown)
        except ConnectorError as error:
            if error.code in (ErrorCode.TIMEOUT, ErrorCode.CONNECTION_ERROR):
                # The receiver drops a repeat of this webhook-id: delivering again is safe.
                error.retryable, error.maybe_applied = True, False
                error.message += "; a retry carries the same webhook-id"
            raise
        if not 200 <= answer.status < 300:
            raise _status_error(note.tool, f"the webhook {shown}", answer)
        return _delivered("webhook", shown, answer.status, key)

    async def _slack(self, note: _Note, target: Mapping[str, Any]) -> dict[str, Any]:
        url = _target_url(note.tool, target, "slack")
        shown = url.host_port_subcomponent or ""  # the path is the credential: never shown
        text = f"*{_one_line(note.subject)}*\n{note.message}" if note.subject else note.message
        request = _post(url, _COMPACT_JSON.encode({"text": text}).encode(), {}, note.timeout)
        what = f"the Slack webhook at {shown}"
        answer = await self._send(note, request, what=what, where=what)
        if not 200 <= answer.status < 300:
            reason = _without(answer.text, _url_secrets(url))
            raise _status_error(note.tool, what, answer, reason)
        return _delivered("slack", shown, answer.status, None)

    async def _email(
        self, call: ToolCall, note: _Note, target: Mapping[str, Any]
    ) -> dict[str, Any]:
        to = _recipient(note.tool, target.get("to"))
        if not note.listed.admits_recipient(to):
            domain = to.rpartition("@")[2].lower()
            raise not_listed(note.tool, f"the email to {to}", f"@{domain}")
        settings: SmtpSettings = smtp_settings(note.tool, call.config)
        wait = min(note.timeout, settings.timeout or note.timeout)
        digest = hashlib.sha256(call.idempotency_key.encode()).hexdigest()[:32]
        message_id = f"<{digest}@agent-reach>"
        addresses = await self._http.check_destination(
            note.tool,
            settings.host,
            settings.port,
            note.allow,
            what=f"the SMTP server {settings.where}",
            wait=min(wait, CONNECT_TIMEOUT_CAP),
        )
        reply = await send_email(
            Email(
                tool=note.tool,
                to=to,
                subject=_one_line(note.subject or DEFAULT_SUBJECT),
                body=note.message,
                message_id=message_id,
            ),
            settings=settings,
            addresses=addresses,
            wait=wait,
            tls=self._tls,
        )
        return _delivered("email", to, reply, message_id)

    async def _send(self, note: _Note, request: HttpRequest, *, what: str, where: str) -> _Answer:
        """POST through the http connector's guard; the answer's status (and reason if not 2xx)."""
        response = await self._http.open_request(
            note.tool, request, note.allow, what=what, where=where, listed=note.listed
        )
        try:
            retry_after = parse_retry_after(response.headers.get("Retry-After"))
            ok = 200 <= response.status < 300
            return _Answer(response.status, retry_after, "" if ok else await _reason(response))
        finally:
            response.release()


def _read_call(call: ToolCall) -> tuple[_Note, Mapping[str, Any]]:
    args, tool = call.args, call.tool
    message, subject, target = args.get("message"), args.get("subject"), args.get("target")
    if not isinstance(message, str) or not message:
        raise _invalid(tool, "message must be a non-empty string")
    if subject is not None and not isinstance(subject, str):
        raise _invalid(tool, "subject must be a string")
    if not isinstance(target, Mapping):
        raise _invalid(tool, "target must be an object with a channel")
    raw = call.config.get("timeout", DEFAULT_TIMEOUT)
    if isinstance(raw, bool) or not isinstance(raw, int | float) or raw <= 0:
        raise misconfigured(tool, "config.timeout must be a positive number of seconds")
    timeout = min(float(raw), call.timeout_s) if call.timeout_s > 0 else float(raw)
    allow = parse_allowlist(tool, call.config)
    listed = required_destinations(tool, call.config, why=_TARGETS_ARE_ARGUMENTS)
    note = _Note(
        tool=tool,
        message=message,
        subject=subject or None,
        timeout=timeout,
        allow=allow,
        listed=listed,
    )
    return note, target


def _scrub(config: Mapping[str, Any], message: str) -> str:
    """`message` without the config's secrets: every `${env:...}` value, and the webhook
    secret and SMTP password even when written into the config as they are."""
    message = Redactor(config)(message)
    smtp = config.get("smtp")
    password = smtp.get("password") if isinstance(smtp, Mapping) else None
    for value in (config.get("webhook_secret"), password):
        if isinstance(value, str) and len(value) >= 4 and "${" not in value:
            message = message.replace(value, "***")
    return message


def _invalid(tool: str, what: str) -> ConnectorError:
    return ConnectorError(ErrorCode.INVALID_ARGUMENTS, f"{tool}: {what}", retryable=False)


def _signer(call: ToolCall) -> Webhook:
    """The Standard Webhooks signer of the configured secret; unsigned webhooks are not sent."""
    secret = resolve_secrets(call.config.get("webhook_secret"))
    if not isinstance(secret, str) or not secret.strip():
        raise misconfigured(call.tool, "config.webhook_secret is not set; webhooks go out signed")
    try:
        return Webhook(secret.strip())
    except Exception:  # binascii.Error, EmptyWebhookSecretError: never with the value
        raise misconfigured(
            call.tool, "config.webhook_secret is not a Standard Webhooks secret (whsec_...)"
        ) from None


def _target_url(tool: str, target: Mapping[str, Any], channel: str) -> URL:
    """The target's URL, read but not yet checked (the guard does that); never echoed."""
    raw = target.get("url")
    if not isinstance(raw, str) or not raw:
        raise _invalid(tool, f"a {channel} target needs a url")
    try:
        url = URL(raw.strip())
    except ValueError:
        raise _invalid(tool, f"the {channel} url is not a valid URL") from None
    if not url.scheme:
        raise _invalid(tool, f"the {channel} url must be absolute (https://host/...)")
    if url.raw_user is not None or url.raw_password is not None:
        # aiohttp would send them as Basic credentials: to wherever the model pointed.
        raise ConnectorError(
            ErrorCode.DESTINATION_REFUSED,
            f"{tool}: refused the {channel} url: it carries credentials",
            retryable=False,
        )
    return url.with_fragment(None)


def _post(url: URL, body: bytes, headers: Mapping[str, str], timeout: float) -> HttpRequest:
    all_headers: CIMultiDict[str] = CIMultiDict(headers)
    all_headers["Content-Type"] = "application/json"
    all_headers["User-Agent"] = "agent-reach-notify"
    all_headers["Host"] = url.host_port_subcomponent or ""  # the connection goes to an address
    return HttpRequest(
        method="POST",
        url=url,
        headers=all_headers,
        body=body,
        timeout=aiohttp.ClientTimeout(
            total=None,
            connect=timeout,
            sock_connect=min(timeout, CONNECT_TIMEOUT_CAP),
            sock_read=timeout,
        ),
    )


async def _reason(response: aiohttp.ClientResponse) -> str:
    """The first printable line of an error answer (at most 512 bytes read), or ""."""
    data = b""
    try:
        while len(data) < _ERROR_TEXT_BYTES:
            chunk = await response.content.read(_ERROR_TEXT_BYTES - len(data))
            if not chunk:
                break
            data += chunk
    except (aiohttp.ClientError, OSError, TimeoutError):
        pass  # the status is the answer; its text is a courtesy
    line = data.decode("utf-8", "replace").strip().split("\n", 1)[0]
    return _UNPRINTABLE.sub(" ", line).strip()[:120]


def _url_secrets(url: URL) -> list[str]:
    """The parts of a URL that may be a credential (path, its segments, the query)."""
    parts = [url.raw_path, url.path, url.raw_query_string, url.query_string]
    parts += [segment for segment in url.raw_path.split("/") if len(segment) >= 4]
    return sorted({p for p in parts if p and p != "/"}, key=len, reverse=True)


def _without(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, "***")
    return text


def _status_error(tool: str, what: str, answer: _Answer, reason: str = "") -> ConnectorError:
    """The error for a non-2xx answer: 408, 429 and 5xx may pass, the rest will not."""
    status = answer.status
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    said = f"{tool}: {what} answered {status} {phrase}".rstrip()
    said += f": {reason}" if reason else ""
    if status == 429:
        return ConnectorError(ErrorCode.RATE_LIMITED, said, retry_after=answer.retry_after)
    if status == 408:
        return ConnectorError(
            ErrorCode.TIMEOUT, said, retryable=True, retry_after=answer.retry_after
        )
    if status >= 500:
        return ConnectorError(
            ErrorCode.DOWNSTREAM_UNAVAILABLE, said, retryable=True, retry_after=answer.retry_after
        )
    if 300 <= status < 400:
        said += " (redirects are not followed)"
    return ConnectorError(ErrorCode.DOWNSTREAM_REJECTED, said, retryable=False)


def _recipient(tool: str, value: Any) -> str:
    """One plain address: no display name, no list, no CR/LF, nothing a header could carry."""
    if not isinstance(value, str) or not is_address(value):
        raise _invalid(tool, "target.to must be one email address, like name@example.org")
    return value


def _one_line(text: str) -> str:
    """A subject on one line: CR, LF and other control characters become spaces."""
    return " ".join(re.sub(r"[\x00-\x1f\x7f]", " ", text).split())


def _delivered(channel: str, target: str, status: int, message_id: str | None) -> dict[str, Any]:
    return {
        "channel": channel,
        "target": target,
        "delivered_at": rfc3339(datetime.now(UTC)),
        "status": status,
        "message_id": message_id,
    }
