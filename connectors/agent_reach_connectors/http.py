"""The `http` connector: one tool call is one HTTP request, classified into a receipt-ready error.

The transport is aiohttp, chosen on measurements (`python -m tests.bench.http_connector`: 64
concurrent callers, POST with a JSON body, to a fast local downstream, 2-vCPU box, median of 3).
Bare clients: httpx ~140 calls/s on one client and ~500 spread over 8 (its pool slows down as
requests queue on it, and httpcore retries a failing `import sniffio` on every request), httpx's
models over an aiohttp transport ~2,100, aiohttp ~8,000-12,000. Through this connector: ~420
calls/s on httpx (8 clients); 4,000-7,000 on aiohttp with one session, depending on what else
the machine runs (~150-200 us of client CPU per call, ~20 of them ours). httpx's request and
response models alone cost half the budget, so none are used here.

Where a call may go: a tool that lists `destinations` reaches those hosts only, matched by name
before any lookup and again on every redirect hop. Then (SSRF) the connector resolves the host
itself, checks every address against `netguard` (and the tool's `allow_hosts`), then connects to the
checked address only: the URL's host is rewritten to it, the Host header keeps the name, and over
https the name goes as SNI and is what the certificate must match. aiohttp is only ever given
address literals (its own resolver refuses every name), so a second DNS answer is never asked for
and cannot be used (DNS rebinding). Redirects are followed here, hop by hop, each one checked the
same way. aiohttp keys a pooled connection by address, port, TLS context and server name, so a
connection verified for one name is never reused for another on the same address. No cookie jar (one
tool's cookies never reach another call) and no proxy from the environment.

Nothing is sent twice unless the tool is declared idempotent: aiohttp resends a GET, HEAD,
OPTIONS, PUT or DELETE whose connection closed before any answer, and the server may have
applied it first, so every other call goes through a middleware (`_send_once`) that keeps that
failure from aiohttp's resend loop and makes it a "may have been applied" error. The request
itself is built in `http_request`.
"""

from __future__ import annotations

import asyncio
import codecs
import ipaddress
import json
import os
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from importlib.metadata import PackageNotFoundError, version
from typing import Any
from urllib.parse import quote

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from opentelemetry.trace import Span, SpanKind
from yarl import URL

from agent_reach import telemetry
from agent_reach.destinations import Destinations
from agent_reach.errors import ErrorCode
from agent_reach.ids import parse_traceparent
from agent_reach_connectors import netguard
from agent_reach_connectors.base import _SECRET_REF, ConnectorError, Throttled, ToolCall
from agent_reach_connectors.http_request import (
    CONNECT_TIMEOUT_CAP,
    HttpRequest,
    allowlist,
    build_request,
    max_redirects,
    misconfigured,
    redirect_method,
    redirect_target,
    redirected,
    secret_headers,
    secret_strings,
    success_statuses,
    url_destinations,
)
from agent_reach_connectors.throttling import parse_retry_after, quota_reset

MAX_TEXT = 64 * 1024
# The most of an answer's body the connector reads (after decompression); a larger answer is a
# failed call, never an executor that runs out of memory.
MAX_BODY = 10 * 1024 * 1024
# 5xx answers that say "this server will never do that": retrying cannot help.
_PERMANENT_5XX = frozenset({501, 505})
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

# (host, port) -> the host's addresses, as text. The connector's only way to the DNS.
Resolver = Callable[[str, int], Awaitable[Sequence[str]]]


class SystemResolver:
    """The system's resolver (getaddrinfo, off the event loop), each answer kept `ttl` seconds.

    Keeping answers is safe: every call checks the addresses it is given and connects to a checked
    one, however old the answer. It only saves a lookup per call on keep-alive connections.
    """

    def __init__(self, *, ttl: float = 5.0, size: int = 1024) -> None:
        self._ttl = ttl
        self._size = size
        self._answers: dict[str, tuple[float, list[str]]] = {}

    async def __call__(self, host: str, port: int) -> list[str]:
        """The addresses of `host`, in the order getaddrinfo prefers; OSError if it has none."""
        now = time.monotonic()
        kept = self._answers.get(host)
        if kept is not None and kept[0] > now:
            return kept[1]
        infos = await asyncio.get_running_loop().getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )
        answers = list(dict.fromkeys(str(info[4][0]) for info in infos))
        if self._ttl > 0 and answers:
            if len(self._answers) >= self._size:
                self._answers.pop(next(iter(self._answers)))
            self._answers[host] = (now + self._ttl, answers)
        return answers


def _user_agent() -> str:
    try:
        return f"agent-reach/{version('agent-reach')}"
    except PackageNotFoundError:
        return "agent-reach"


class Redactor:
    """Scrubs the secrets a config refers to out of a message, raw and URL-encoded.

    Built per call but read only when a message is made (an error, a host from a secret): the
    config is walked and the environment read on first use, not on every successful call.
    """

    __slots__ = ("_raw_config", "_values")

    def __init__(self, raw_config: Mapping[str, Any]) -> None:
        self._raw_config = raw_config
        self._values: list[str] | None = None

    def _forms(self) -> list[str]:
        if self._values is None:
            found = secret_strings(self._raw_config)
            names = {m for s in found for m in _SECRET_REF.findall(s)}
            values = {os.environ.get(name, "") for name in names}
            forms = {form for v in values if v for form in (v, quote(v, safe=""), quote(v))}
            self._values = sorted(forms, key=len, reverse=True)
        return self._values

    def __call__(self, message: str) -> str:
        for value in self._forms():
            message = message.replace(value, "***")
        return message


def safe_url(url: URL) -> str:
    """scheme://host[:port]/path only: queries and credentials may hold secrets."""
    port = f":{url.explicit_port}" if url.explicit_port else ""
    return f"{url.scheme}://{url.raw_host or ''}{port}{url.raw_path}"


def _status_error(
    tool: str, status: int, retry_after: float | None, spent: float | None = None
) -> ConnectorError:
    """The error for a non-success status; `spent` is how long the quota stays spent."""
    if status == 429:
        # Too many requests: everyone calling this tool should wait, not just this step.
        wait = retry_after if retry_after is not None else spent
        said = f"{tool}: downstream answered 429 Too Many Requests"
        return ConnectorError(ErrorCode.RATE_LIMITED, said, retry_after=wait, throttle=wait)
    error = _plain_status_error(tool, status, retry_after)
    error.throttle = spent
    return error


def _plain_status_error(tool: str, status: int, retry_after: float | None) -> ConnectorError:
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    said = f"{tool}: downstream answered {status} {phrase}".rstrip()
    if status >= 500 and status not in _PERMANENT_5XX:
        return ConnectorError(ErrorCode.DOWNSTREAM_UNAVAILABLE, said, retry_after=retry_after)
    if status == 408:
        return ConnectorError(ErrorCode.TIMEOUT, said, retryable=True, retry_after=retry_after)
    if status in (401, 403):
        return ConnectorError(ErrorCode.UNAUTHORIZED, said)
    if status == 404:
        return ConnectorError(ErrorCode.NOT_FOUND, said)
    return ConnectorError(ErrorCode.DOWNSTREAM_REJECTED, said, retryable=False)


class _ClosedUnanswered(Exception):
    """A request went out on a connection that then closed (or broke) before any answer.

    Deliberately neither an aiohttp error nor an OSError: aiohttp's resend loop does not know it.
    """


async def _send_once(
    request: aiohttp.ClientRequest, send: aiohttp.ClientHandlerType
) -> aiohttp.ClientResponse:
    """A client middleware that keeps aiohttp from sending a request a second time.

    aiohttp sends a GET, HEAD, OPTIONS, PUT or DELETE once more on a new connection when the
    one it went on closes before answering (`ServerDisconnectedError`, `ClientOSError`): right
    for a kept-alive connection the server had already dropped, but the server may also have
    read and applied the request first. Seen here, between the send and the resend loop, the
    failure leaves as another exception, which that loop does not catch. A middleware is
    aiohttp's public way in (the loop's own switch is a private attribute of the session).
    """
    try:
        return await send(request)
    except aiohttp.ClientConnectorError:
        raise  # no connection, so nothing sent: aiohttp never resends these either
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
        raise _ClosedUnanswered(str(exc)) from exc


# Per request: for a tool not declared idempotent, no resend; otherwise aiohttp's own rule.
_NO_RESEND: tuple[aiohttp.ClientMiddlewareType, ...] = (_send_once,)

# What a failed send can raise: aiohttp's errors, the OS's, a timeout, a header it would not
# send, and a send `_send_once` kept from being repeated.
_SEND_ERRORS = (aiohttp.ClientError, OSError, TimeoutError, ValueError, _ClosedUnanswered)


def _transport_error(tool: str, where: str, exc: BaseException) -> ConnectorError:
    """The error for a failed send or read; "may have been applied" unless nothing was sent."""
    if isinstance(exc, aiohttp.ConnectionTimeoutError):  # no pool slot or no connection in time
        return ConnectorError(ErrorCode.TIMEOUT, f"{tool}: timed out connecting to {where}")
    if isinstance(exc, TimeoutError):  # aiohttp's ServerTimeoutError is one too
        return ConnectorError(
            ErrorCode.TIMEOUT,
            f"{tool}: timed out waiting for {where} after sending; it may have been applied",
            maybe_applied=True,
        )
    if isinstance(exc, aiohttp.ClientConnectorError):  # refused, unreachable, TLS not verified
        return ConnectorError(ErrorCode.CONNECTION_ERROR, f"{tool}: could not connect to {where}")
    if isinstance(exc, ValueError | aiohttp.NonHttpUrlClientError):  # InvalidURL is a ValueError
        return misconfigured(
            tool, f"the request to {where} could not be built ({type(exc).__name__})"
        )
    return ConnectorError(
        ErrorCode.CONNECTION_ERROR,
        f"{tool}: the connection to {where} broke before an answer; it may have been applied",
        maybe_applied=True,
    )


def _output(response: aiohttp.ClientResponse, body: bytes) -> Any:
    if "json" in response.headers.get("Content-Type", "").lower():
        try:
            return json.loads(body)
        except (ValueError, UnicodeDecodeError):
            pass
    text = body.decode(_charset(response), errors="replace")
    return {"status": response.status, "text": text[:MAX_TEXT]}


def _charset(response: aiohttp.ClientResponse) -> str:
    """The answer's declared charset when Python knows it, else UTF-8."""
    declared = response.charset
    if declared:
        try:
            return codecs.lookup(declared).name
        except LookupError:
            pass
    return "utf-8"


def _size(count: int) -> str:
    for unit, factor in (("MiB", 1024 * 1024), ("KiB", 1024)):
        if count >= factor and count % factor == 0:
            return f"{count // factor} {unit}"
    return f"{count} bytes"


def _too_large(tool: str, where: str, limit: int) -> ConnectorError:
    return ConnectorError(
        ErrorCode.CONNECTOR_ERROR,
        f"{tool}: the answer from {where} is larger than {_size(limit)}; "
        "it was not read, and the request may have been applied",
        retryable=False,
        maybe_applied=True,
    )


async def _read_body(
    response: aiohttp.ClientResponse, *, tool: str, where: str, limit: int
) -> bytes:
    """The (decoded) body, at most `limit` bytes: refused early by Content-Length, else read."""
    declared = response.headers.get("Content-Length", "")
    if declared.isdigit() and "Content-Encoding" not in response.headers:
        if int(declared) > limit:
            raise _too_large(tool, where, limit)
        return await response.read()  # no more than declared: the parser stops there
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_any():
        size += len(chunk)
        if size > limit:
            raise _too_large(tool, where, limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _refused(tool: str, what: str, reason: str, *, allowable: bool = True) -> ConnectorError:
    advice = "; add it to the tool's allow_hosts to permit it" if allowable else ""
    return ConnectorError(
        ErrorCode.DESTINATION_REFUSED, f"{tool}: refused {what}: {reason}{advice}", retryable=False
    )


def not_listed(tool: str, what: str, host: str) -> ConnectorError:
    """The error for a destination the tool's `destinations` do not list (never retried)."""
    return _refused(tool, what, f"{host} is not one of the tool's destinations", allowable=False)


@dataclass(frozen=True, slots=True)
class _Destination:
    """Where one hop goes: its checked addresses, and the name TLS must verify (https only)."""

    addresses: tuple[netguard.IPAddress, ...]
    server_name: str | None


class _NoResolver(AbstractResolver):
    """aiohttp's resolver here: it is only ever given checked addresses, never a name to look up."""

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        raise OSError(f"the http connector resolves names itself; not {host!r}")

    async def close(self) -> None:
        return None


class HttpConnector:
    """Sends one HTTP request per tool call and classifies what came back.

    Tool config: `method` (default GET); `url` with `{arg}` placeholders filled from the
    arguments (URL-encoded); `headers`; `query` (extra query parameters); `body`: `auto`
    (default: arguments not used in the URL go as a JSON body for POST/PUT/PATCH/DELETE and as
    query parameters for GET/HEAD/others), `json` (always a JSON body) or `none`; `timeout`
    (seconds, default the call's timeout); `success_statuses` (default: any 2xx);
    `allow_hosts` (hosts, `*.suffix` wildcards, addresses or CIDRs, each optionally with
    `:port`, that may be reached although they are not public: see `netguard`);
    `destinations` (the only hosts it may reach: names, `*.suffix`, addresses; see
    `agent_reach.destinations`; required when an argument reaches the URL's scheme, host or
    port, and matched by name before any lookup, on every redirect hop too);
    `max_redirects` (default 5; 0 makes a 3xx an unsuccessful answer).
    `${env:NAME}` references in the config are resolved here, at invoke time on the executor.

    Every request carries the step's `Idempotency-Key`, the task's `traceparent` and a
    `User-Agent: agent-reach/<version>`. A JSON answer is returned parsed; anything else as
    `{"status": code, "text": first 64 KiB}`. A body over `max_body` bytes (10 MiB) is not
    read and fails the call; an error status's body is never read. Failures raise
    `ConnectorError` with one sentence naming the tool, the status or `scheme://host/path`, and
    never a secret. A destination that is not a public address (loopback, private, link-local,
    metadata, ...), a non-http(s) scheme, or a redirect to either, is refused with
    `destination_refused` before any connection is made, unless `allow_hosts` admits it.

    A redirect (301/302/303/307/308 with a Location) is followed up to `max_redirects` times,
    each hop checked like the first; 303, and 301/302 after a POST, continue as a GET without
    the body. Credentials (Authorization, Cookie, and every header whose value holds a secret
    reference) are not carried to another origin. Once a write was sent on as a GET (after a
    303, or a 301/302 to a POST), a later failure says it may have been applied.

    A request goes out once. Only for a tool declared idempotent (`ToolCall.idempotent`) is a
    GET, HEAD, OPTIONS, PUT or DELETE whose connection closes before any answer (typically a
    kept-alive connection the server had just dropped) sent once more on a new connection, as
    RFC 9112 (9.3.1) allows; any other such failure says the call may have been applied.

    Connections are pooled, `max_connections` at most (a call waits for a free one within its
    timeout). `resolver` (for tests) replaces the system's getaddrinfo; `verify` replaces the
    system's CA certificates (a private CA).
    """

    name = "http"

    def __init__(
        self,
        *,
        max_connections: int = 100,
        max_body: int = MAX_BODY,
        resolver: Resolver | None = None,
        verify: ssl.SSLContext | None = None,
    ) -> None:
        self._max_body = max_body
        self._max_connections = max(1, max_connections)
        self._resolve: Resolver = SystemResolver() if resolver is None else resolver
        self._tls = verify
        self._session: aiohttp.ClientSession | None = None
        self._agent = _user_agent()

    async def start(self) -> None:
        """Open the connection pool (invoke also opens it lazily)."""
        self._open_session()

    async def close(self) -> None:
        """Close every pooled connection."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def build_request(self, call: ToolCall) -> HttpRequest:
        """The request a call makes; secrets are resolved here, on the executor, only."""
        return build_request(call, user_agent=self._agent)

    def _open_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            pool = aiohttp.TCPConnector(
                limit=self._max_connections,
                limit_per_host=0,
                ssl=self._tls if self._tls is not None else True,  # True: the system's CAs
                use_dns_cache=False,
                resolver=_NoResolver(),
            )
            self._session = aiohttp.ClientSession(
                connector=pool,
                cookie_jar=aiohttp.DummyCookieJar(),
                trust_env=False,  # no proxy from the environment: the checked address is the peer
                auto_decompress=True,
            )
        return self._session

    async def _destination(
        self,
        tool: str,
        url: URL,
        allow: netguard.Allowlist,
        what: str,
        wait: float,
        listed: Destinations | None,
    ) -> _Destination:
        """Check where `url` leads, resolving its host once; refuse it before any connection.
        A host the tool's `destinations` do not list is refused by name, never looked up."""
        reason = netguard.check_scheme(url.scheme)
        if reason is not None:
            raise _refused(tool, what, reason, allowable=False)
        name = netguard.normalize_host(url.raw_host or "")
        if listed is not None and not listed.admits_host(name, netguard.parse_ip(name)):
            raise not_listed(tool, what, name)
        port = url.port or netguard.DEFAULT_PORTS[url.scheme]
        addresses = await self.check_destination(tool, name, port, allow, what=what, wait=wait)
        tls_name = url.scheme == "https" and netguard.parse_ip(name) is None
        return _Destination(addresses, name if tls_name else None)

    async def check_destination(
        self, tool: str, host: str, port: int, allow: netguard.Allowlist, *, what: str, wait: float
    ) -> tuple[netguard.IPAddress, ...]:
        """The addresses `host:port` may be reached at: the host resolved once (`wait` seconds
        at most) and every address checked against `netguard` and `allow`. Refused (a
        `destination_refused` error naming `what` and why) before any connection otherwise.
        Connect to one of these addresses only: never resolve the name again.

        Also the guard of the notify connector's SMTP host.
        """
        name = netguard.normalize_host(host)
        literal = netguard.parse_ip(name)
        if literal is None and not allow.admits_name(name, port):
            reason = netguard.check_name(name)
            if reason is not None:
                raise _refused(tool, what, f"{name or 'the URL'} is {reason}")
        addresses = [literal] if literal is not None else await self._lookup(tool, name, port, wait)
        reason = netguard.refusal(name, port, addresses, allow)
        if reason is not None:
            raise _refused(tool, what, reason)
        return tuple(addresses)

    async def _lookup(
        self, tool: str, name: str, port: int, wait: float
    ) -> list[netguard.IPAddress]:
        try:
            async with asyncio.timeout(wait):
                answers = await self._resolve(name, port)
        except TimeoutError:
            raise ConnectorError(ErrorCode.TIMEOUT, f"{tool}: timed out resolving {name}") from None
        except (OSError, UnicodeError):
            answers = []
        addresses: list[netguard.IPAddress] = []
        for answer in answers:
            try:
                addresses.append(ipaddress.ip_address(answer))
            except ValueError:
                continue
        if not addresses:
            raise ConnectorError(ErrorCode.CONNECTION_ERROR, f"{tool}: could not resolve {name}")
        return addresses

    async def open_request(
        self,
        tool: str,
        request: HttpRequest,
        allow: netguard.Allowlist,
        *,
        what: str,
        where: str,
        listed: Destinations | None = None,
    ) -> aiohttp.ClientResponse:
        """Check the request's destination, then send it to a checked address (the next one
        only if connecting to the previous failed, so nothing was sent). No redirect is followed.
        `listed`: the tool's `destinations`, when it has them (checked before any lookup).

        The answer is the caller's to read and release. Failures are classified as `invoke`'s
        are: `what` names the destination in a refusal, `where` in a failed send (neither may
        hold a secret). The notify connector sends its webhooks through here.
        """
        url = request.url
        wait = request.timeout.sock_connect or CONNECT_TIMEOUT_CAP
        destination = await self._destination(tool, url, allow, what, wait, listed)
        session = self._open_session()
        last = len(destination.addresses)
        for index, address in enumerate(destination.addresses, start=1):
            pinned = address.compressed  # the checked address: no second lookup, ever
            try:
                return await session.request(
                    request.method,
                    url if url.raw_host == pinned else url.with_host(pinned),
                    headers=request.headers,
                    data=request.body,
                    timeout=request.timeout,
                    server_hostname=destination.server_name,
                    allow_redirects=False,
                    middlewares=None if request.resendable else _NO_RESEND,
                )
            except aiohttp.ClientConnectorError as exc:
                if index == last:
                    raise _transport_error(tool, where, exc) from None
            except _SEND_ERRORS as exc:
                raise _transport_error(tool, where, exc) from None
        raise AssertionError("unreachable: a destination has an address")  # pragma: no cover

    async def invoke(self, call: ToolCall) -> Any:
        """Send the call's request; return its output or raise a classified ConnectorError."""
        redact = Redactor(call.config)
        try:
            request = self.build_request(call)
        except ValueError:  # yarl's word for a URL it cannot read
            raise misconfigured(call.tool, "the URL is not valid") from None
        except (AttributeError, TypeError):
            raise misconfigured(call.tool, "the http config is malformed") from None
        parent = parse_traceparent(call.traceparent)
        url = request.url
        host = url.raw_host or ""
        with telemetry.span(
            request.method,
            trace_id=call.trace_id,
            parent_span_id=parent[1] if parent else None,
            kind=SpanKind.CLIENT,
            attributes={
                "http.request.method": request.method,
                # a host may come from a secret (only a configured URL can hold one)
                "server.address": redact(host) if "${" in str(call.config["url"]) else host,
                "server.port": url.port or 0,
            },
        ) as current:
            if telemetry.tracing_enabled():  # else the attempt's span stays the parent
                request.headers["traceparent"] = telemetry.traceparent_of(current)
            try:
                return await self._send(call, request, redact, current)
            except ConnectorError as error:
                telemetry.mark_error(current, error.code)
                raise

    async def _send(
        self, call: ToolCall, request: HttpRequest, redact: Redactor, current: Span
    ) -> Any:
        """Send `request` and follow its redirects (each hop checked); the answer's output."""
        success = success_statuses(call.tool, call.config)
        allow = allowlist(call.tool, call.config)
        listed = url_destinations(call.tool, call.config)
        redirects = max_redirects(call.tool, call.config)
        applied = False  # a write redirected as a GET may have been applied already
        try:
            for hop in range(redirects + 1):
                # Messages name the URL as it is; every error's message is redacted below.
                where = safe_url(request.url)
                what = where if hop == 0 else f"the redirect to {where}"
                response = await self.open_request(
                    call.tool, request, allow, what=what, where=where, listed=listed
                )
                try:
                    status = response.status
                    current.set_attribute("http.response.status_code", status)
                    location = response.headers.get("Location")
                    ok = 200 <= status < 300 if success is None else status in success
                    if ok or status not in _REDIRECTS or not location:
                        return await self._answer(call.tool, response, where, ok=ok)
                    if hop == redirects and redirects:
                        raise ConnectorError(
                            ErrorCode.DOWNSTREAM_REJECTED,
                            f"{call.tool}: {where} still redirected after {redirects} redirects",
                            retryable=False,
                        )
                    if hop == redirects:
                        return await self._answer(call.tool, response, where, ok=False)
                    target = redirect_target(call.tool, where, request.url, location)
                    method = redirect_method(request.method, status)
                    applied = applied or (
                        request.method not in _SAFE_METHODS and method != request.method
                    )
                    request = redirected(request, target, status, secret_headers(call.config))
                finally:
                    response.release()  # back to the pool when read through, else closed
        except ConnectorError as error:
            error.maybe_applied = error.maybe_applied or applied
            error.message = redact(error.message)  # a host or path may come from a secret
            error.args = (error.message,)
            raise
        raise AssertionError("unreachable: the last hop answers or raises")  # pragma: no cover

    async def _answer(
        self, tool: str, response: aiohttp.ClientResponse, where: str, *, ok: bool
    ) -> Any:
        """The output of a final answer, or the error its status stands for."""
        if not ok:
            # The status says it all: an error page is never read (nor its size trusted).
            retry_after = parse_retry_after(response.headers.get("Retry-After"))
            raise _status_error(tool, response.status, retry_after, quota_reset(response.headers))
        try:
            body = await _read_body(response, tool=tool, where=where, limit=self._max_body)
        except _SEND_ERRORS as exc:
            raise _transport_error(tool, where, exc) from None
        spent = quota_reset(response.headers)
        output = _output(response, body)
        return output if spent is None else Throttled(output, spent)
