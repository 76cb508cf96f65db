"""The `http` connector: one tool call is one HTTP request, classified into a receipt-ready error.

Why httpx, and why several clients: the issue asks for httpx and aiohttp is not a dependency.
httpx's async pool slows down as requests queue on one client (the upstream problem PERFORMANCE.md
notes). Measured through this connector (POST, 2-vCPU dev box, server on the same cores, one run
each): to a minimal asyncio server on 127.0.0.1, one client ~750-950 req/s sequential but ~400
req/s at 32 concurrent; 8 clients round-robin ~940 sequential and ~1,240 at 32 concurrent. To
the test sink (a threaded stdlib server): 1 client ~860 / ~425, 8 clients ~760 / ~690. So the
connector spreads calls over `clients=8` clients sharing the `max_connections` budget;
`clients=1` is the plain single-client shape. Still far from the 5,000 calls/s goal: the transport
can change behind this module without touching the protocol.

Where a call may go (SSRF): the connector resolves the host itself, checks every address against
`netguard` (and the tool's `allow_hosts`), then connects to the checked address only: the URL's
host is rewritten to it, the Host header keeps the name, and over https the name goes as SNI and
is what the certificate must match. A second DNS answer is never asked for, so it cannot be used
(DNS rebinding). Redirects are followed here, hop by hop, each one checked the same way. Since a
pooled connection is keyed by the address it went to, https connections are pooled per server
name too: a connection verified for one name is never reused for another on the same address.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import itertools
import json
import os
import re
import socket
import ssl
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from importlib.metadata import PackageNotFoundError, version
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
from opentelemetry.trace import Span, SpanKind

from agent_reach import telemetry
from agent_reach.errors import ErrorCode
from agent_reach.ids import parse_traceparent
from agent_reach_connectors import netguard
from agent_reach_connectors.base import (
    _SECRET_REF,
    ConnectorError,
    Throttled,
    ToolCall,
    resolve_secrets,
)
from agent_reach_connectors.throttling import parse_retry_after, quota_reset

MAX_TEXT = 64 * 1024
# The most of an answer's body the connector reads (after decompression); a larger answer is a
# failed call, never an executor that runs out of memory.
MAX_BODY = 10 * 1024 * 1024
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_BODY_MODES = frozenset({"auto", "none", "json"})
# 5xx answers that say "this server will never do that": retrying cannot help.
_PERMANENT_5XX = frozenset({501, 505})
_CONNECT_TIMEOUT_CAP = 10.0
# Redirects followed by default (`max_redirects` in the config; 0 treats a 3xx as an answer).
MAX_REDIRECTS = 5
_MAX_REDIRECTS_LIMIT = 20
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# Never carried to another origin by a redirect (nor is any header whose value holds a secret).
_CREDENTIAL_HEADERS = ("authorization", "proxy-authorization", "cookie")
# https clients are pooled per server name; past this many names the least recent go.
_MAX_SERVER_NAMES = 64

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


def _misconfigured(tool: str, what: str) -> ConnectorError:
    return ConnectorError(ErrorCode.CONNECTOR_ERROR, f"{tool}: {what}", retryable=False)


def _text(value: Any) -> str:
    """How an argument travels in a path or query: strings as they are, the rest as JSON."""
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def _secret_strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _secret_strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _secret_strings(item)


class _Redactor:
    """Scrubs the secrets a config refers to out of a message, raw and URL-encoded."""

    def __init__(self, raw_config: Mapping[str, Any]) -> None:
        names = {m for s in _secret_strings(raw_config) for m in _SECRET_REF.findall(s)}
        values = {os.environ.get(name, "") for name in names}
        forms = {form for v in values if v for form in (v, quote(v, safe=""), quote(v))}
        self._values = sorted(forms, key=len, reverse=True)

    def __call__(self, message: str) -> str:
        for value in self._values:
            message = message.replace(value, "***")
        return message


def _fill_url(tool: str, template: str, args: Mapping[str, Any]) -> tuple[str, set[str]]:
    """Fill `{arg}` placeholders (URL-encoded) and resolve `${env:...}` in the literal parts.

    Splitting first means an argument can never smuggle in a secret reference, and a secret
    value can never be mistaken for a placeholder.
    """
    pieces = _PLACEHOLDER.split(template)
    used: set[str] = set()
    out: list[str] = []
    for index, piece in enumerate(pieces):
        if index % 2 == 0:
            out.append(resolve_secrets(piece))
            continue
        if args.get(piece) is None:
            raise ConnectorError(
                ErrorCode.INVALID_ARGUMENTS,
                f"{tool}: the URL needs argument '{piece}', which was not given",
                retryable=False,
            )
        used.add(piece)
        out.append(quote(_text(args[piece]), safe=""))
    url = "".join(out)
    if _dot_segments(url) > _dot_segments(template):
        # `quote` keeps "." and "..", which the client then resolves: an argument ".." would
        # climb out of the configured path to another endpoint of the same host.
        raise ConnectorError(
            ErrorCode.INVALID_ARGUMENTS,
            f"{tool}: an argument in the URL path cannot be '.' or '..'",
            retryable=False,
        )
    return url, used


def _dot_segments(url: str) -> int:
    path = url.split("?", 1)[0].split("#", 1)[0]
    return sum(segment in (".", "..") for segment in path.split("/"))


def _safe_url(url: str) -> str:
    """scheme://host[:port]/path only: queries and credentials may hold secrets."""
    parts = urlsplit(url)
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{parts.hostname or ''}{port}{parts.path}"


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


def _transport_error(tool: str, where: str, exc: httpx.HTTPError) -> ConnectorError:
    if isinstance(exc, httpx.ConnectTimeout | httpx.PoolTimeout):
        return ConnectorError(ErrorCode.TIMEOUT, f"{tool}: timed out connecting to {where}")
    if isinstance(exc, httpx.TimeoutException):
        return ConnectorError(
            ErrorCode.TIMEOUT,
            f"{tool}: timed out waiting for {where} after sending; it may have been applied",
            maybe_applied=True,
        )
    if isinstance(exc, httpx.ConnectError):
        return ConnectorError(ErrorCode.CONNECTION_ERROR, f"{tool}: could not connect to {where}")
    if isinstance(exc, httpx.UnsupportedProtocol | httpx.LocalProtocolError):
        return _misconfigured(
            tool, f"the request to {where} could not be built ({type(exc).__name__})"
        )
    return ConnectorError(
        ErrorCode.CONNECTION_ERROR,
        f"{tool}: the connection to {where} broke before an answer; it may have been applied",
        maybe_applied=True,
    )


def _output(response: httpx.Response, body: bytes) -> Any:
    if "json" in response.headers.get("content-type", "").lower():
        try:
            return json.loads(body)
        except (ValueError, UnicodeDecodeError):
            pass
    text = body.decode(response.encoding or "utf-8", errors="replace")
    return {"status": response.status_code, "text": text[:MAX_TEXT]}


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


async def _read_body(response: httpx.Response, *, tool: str, where: str, limit: int) -> bytes:
    """The (decoded) body, at most `limit` bytes: refused early by Content-Length, else read."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit and "content-encoding" not in response.headers:
        raise _too_large(tool, where, limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > limit:
            raise _too_large(tool, where, limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _timeout(tool: str, config: Mapping[str, Any], default: float) -> httpx.Timeout:
    raw = config.get("timeout", default)
    if isinstance(raw, bool) or not isinstance(raw, int | float) or raw <= 0:
        raise _misconfigured(tool, "config.timeout must be a positive number of seconds")
    seconds = float(raw)
    return httpx.Timeout(seconds, connect=min(seconds, _CONNECT_TIMEOUT_CAP))


def _success_statuses(tool: str, config: Mapping[str, Any]) -> frozenset[int] | None:
    raw = config.get("success_statuses")
    if raw is None:
        return None
    if not isinstance(raw, list) or not all(isinstance(s, int) for s in raw):
        raise _misconfigured(tool, "config.success_statuses must be a list of status codes")
    return frozenset(raw)


@functools.lru_cache(maxsize=256)
def _parse_allowlist(entries: tuple[str, ...]) -> netguard.Allowlist:
    return netguard.Allowlist.parse(entries)


def _allowlist(tool: str, config: Mapping[str, Any]) -> netguard.Allowlist:
    raw = config.get("allow_hosts")
    if raw is None:
        return netguard.Allowlist()
    if not isinstance(raw, list) or not all(isinstance(e, str) for e in raw):
        raise _misconfigured(tool, "config.allow_hosts must be a list of hosts, addresses or CIDRs")
    try:
        return _parse_allowlist(tuple(raw))
    except ValueError as exc:
        raise _misconfigured(tool, f"config.{exc}") from None


def _max_redirects(tool: str, config: Mapping[str, Any]) -> int:
    raw = config.get("max_redirects", MAX_REDIRECTS)
    if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw <= _MAX_REDIRECTS_LIMIT:
        raise _misconfigured(
            tool, f"config.max_redirects must be a whole number from 0 to {_MAX_REDIRECTS_LIMIT}"
        )
    return raw


def _secret_headers(config: Mapping[str, Any]) -> frozenset[str]:
    """Names of the configured headers whose value holds a secret reference."""
    headers = config.get("headers")
    if not isinstance(headers, Mapping):
        return frozenset()
    return frozenset(
        str(name).lower()
        for name, value in headers.items()
        if any(_SECRET_REF.search(text) for text in _secret_strings(value))
    )


def _refused(tool: str, what: str, reason: str, *, allowable: bool = True) -> ConnectorError:
    advice = "; add it to the tool's allow_hosts to permit it" if allowable else ""
    return ConnectorError(
        ErrorCode.DESTINATION_REFUSED, f"{tool}: refused {what}: {reason}{advice}", retryable=False
    )


def _origin(url: httpx.URL) -> tuple[str, bytes, int | None]:
    return url.scheme, url.raw_host.lower(), url.port or netguard.DEFAULT_PORTS.get(url.scheme)


def _same_origin(source: httpx.URL, target: httpx.URL) -> bool:
    """Same scheme, host and port, or the same host moving from http to https (as httpx does)."""
    if _origin(source) == _origin(target):
        return True
    return (
        source.scheme == "http"
        and target.scheme == "https"
        and source.raw_host.lower() == target.raw_host.lower()
        and source.port in (None, 80)
        and target.port in (None, 443)
    )


def _redirect_method(method: str, status: int) -> str:
    """The method of the next hop, as browsers and httpx choose it."""
    if status == 303 and method != "HEAD":
        return "GET"
    if status in (301, 302) and method == "POST":
        return "GET"
    return method


def _redirected(
    request: httpx.Request, url: httpx.URL, target: httpx.URL, status: int, secrets: frozenset[str]
) -> httpx.Request:
    """The next hop's request: to `target`, from the hop that asked for it (at logical `url`)."""
    method = _redirect_method(request.method, status)
    headers = httpx.Headers(request.headers)
    headers.pop("host", None)
    if not _same_origin(url, target):
        for name in (*_CREDENTIAL_HEADERS, *secrets):
            headers.pop(name, None)
    content: bytes | None = request.content
    if method != request.method:
        content = None
        for name in ("content-type", "content-length", "transfer-encoding"):
            headers.pop(name, None)
    return httpx.Request(
        method,
        target,
        headers=headers,
        content=content or None,
        extensions={"timeout": request.extensions["timeout"]},
    )


@dataclass(frozen=True, slots=True)
class _Destination:
    """Where one hop goes: its checked addresses, and the name TLS must verify (https only)."""

    addresses: tuple[netguard.IPAddress, ...]
    server_name: str | None


class _Group:
    """Clients used in turn for one kind of destination; a retired group closes once idle."""

    __slots__ = ("_turn", "busy", "clients", "retired")

    def __init__(self, clients: list[httpx.AsyncClient]) -> None:
        self.clients = clients
        self._turn = itertools.cycle(clients)
        self.busy = 0
        self.retired = False

    def take(self) -> httpx.AsyncClient:
        self.busy += 1
        return next(self._turn)

    async def aclose(self) -> None:
        for client in self.clients:
            await client.aclose()


class HttpConnector:
    """Sends one HTTP request per tool call and classifies what came back.

    Tool config: `method` (default GET); `url` with `{arg}` placeholders filled from the
    arguments (URL-encoded); `headers`; `query` (extra query parameters); `body`: `auto`
    (default: arguments not used in the URL go as a JSON body for POST/PUT/PATCH/DELETE and as
    query parameters for GET/HEAD/others), `json` (always a JSON body) or `none`; `timeout`
    (seconds, default the call's timeout); `success_statuses` (default: any 2xx);
    `allow_hosts` (hosts, `*.suffix` wildcards, addresses or CIDRs, each optionally with
    `:port`, that may be reached although they are not public: see `netguard`);
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

    `resolver` (for tests) replaces the system's getaddrinfo; `verify` replaces the system's
    CA certificates (a private CA); `transport` (for tests) replaces the network under every
    client, pools included.
    """

    name = "http"

    def __init__(
        self,
        *,
        max_connections: int = 100,
        clients: int = 8,
        max_body: int = MAX_BODY,
        resolver: Resolver | None = None,
        verify: ssl.SSLContext | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._max_body = max_body
        self._clients_wanted = max(1, clients)
        per_client = max(1, max_connections // self._clients_wanted)
        self._limits = httpx.Limits(
            max_connections=per_client, max_keepalive_connections=per_client
        )
        self._resolve: Resolver = SystemResolver() if resolver is None else resolver
        self._transport = transport
        self._tls = verify
        self._shared: _Group | None = None  # plain http, and https to an address literal
        self._named: OrderedDict[str, _Group] = OrderedDict()  # https, per server name
        self._retired: list[_Group] = []
        self._agent = _user_agent()

    async def start(self) -> None:
        """Open the connection pools (invoke also opens them lazily)."""
        await self._group(None)

    async def close(self) -> None:
        """Close every pooled connection."""
        groups = [*([self._shared] if self._shared else []), *self._named.values(), *self._retired]
        self._shared, self._named, self._retired = None, OrderedDict(), []
        for group in groups:
            await group.aclose()

    def _new_group(self) -> _Group:
        if self._tls is None:
            self._tls = httpx.create_ssl_context()  # loading CA certificates is slow: do it once
        return _Group(
            [
                httpx.AsyncClient(
                    limits=self._limits,
                    follow_redirects=False,
                    verify=self._tls,
                    transport=self._transport,
                )
                for _ in range(self._clients_wanted)
            ]
        )

    async def _group(self, server_name: str | None) -> _Group:
        """The clients for a destination: shared, or those of an https server name."""
        if server_name is None:
            if self._shared is None:
                self._shared = self._new_group()
            return self._shared
        group = self._named.pop(server_name, None) or self._new_group()
        self._named[server_name] = group  # the most recently used last
        while len(self._named) > _MAX_SERVER_NAMES:
            _, old = self._named.popitem(last=False)
            old.retired = True
            if old.busy > 0:
                self._retired.append(old)  # closed by the last call that uses it
            else:
                await old.aclose()
        return group

    async def _release(self, group: _Group) -> None:
        group.busy -= 1
        if group.retired and group.busy <= 0 and group in self._retired:
            self._retired.remove(group)
            await group.aclose()

    def build_request(self, call: ToolCall) -> httpx.Request:
        """The request a call makes; secrets are resolved here, on the executor, only."""
        raw = call.config
        url_template = raw.get("url")
        if not isinstance(url_template, str) or not url_template:
            raise _misconfigured(call.tool, "config.url is missing")
        method = str(raw.get("method", "GET")).upper()
        mode = raw.get("body", "auto")
        if mode not in _BODY_MODES:
            raise _misconfigured(call.tool, "config.body must be one of auto, json, none")
        url, used = _fill_url(call.tool, url_template, call.args)
        rest = {k: v for k, v in call.args.items() if k not in used}
        headers = httpx.Headers({"User-Agent": self._agent})
        for key, value in (resolve_secrets(raw.get("headers")) or {}).items():
            if value is not None:
                headers[str(key)] = str(value)
        headers["Idempotency-Key"] = call.idempotency_key
        if call.traceparent:
            headers["traceparent"] = call.traceparent
        params = {str(k): _text(v) for k, v in (resolve_secrets(raw.get("query")) or {}).items()}
        content: bytes | None = None
        if mode == "json" or (mode == "auto" and method in _BODY_METHODS):
            content = json.dumps(rest, separators=(",", ":")).encode()
            headers["Content-Type"] = "application/json"
        elif mode == "auto":
            params.update({k: _text(v) for k, v in rest.items() if v is not None})
        timeout = _timeout(call.tool, raw, call.timeout_s)
        # Added to the URL's own query: httpx's `params=` would replace it (and drop, say, a
        # `?key=` written into the configured URL).
        target = httpx.URL(url).copy_merge_params(params) if params else httpx.URL(url)
        return httpx.Request(
            method,
            target,
            headers=headers,
            content=content,
            extensions={"timeout": timeout.as_dict()},
        )

    async def _destination(
        self, tool: str, url: httpx.URL, allow: netguard.Allowlist, what: str, wait: float
    ) -> _Destination:
        """Check where `url` leads, resolving its host once; refuse it before any connection."""
        reason = netguard.check_scheme(url.scheme)
        if reason is not None:
            raise _refused(tool, what, reason, allowable=False)
        name = netguard.normalize_host(url.raw_host.decode("ascii", "replace"))
        port = url.port or netguard.DEFAULT_PORTS[url.scheme]
        literal = netguard.parse_ip(name)
        if literal is None and not allow.admits_name(name, port):
            reason = netguard.check_name(name)
            if reason is not None:
                raise _refused(tool, what, f"{name or 'the URL'} is {reason}")
        addresses = [literal] if literal is not None else await self._lookup(tool, name, port, wait)
        reason = netguard.refusal(name, port, addresses, allow)
        if reason is not None:
            raise _refused(tool, what, reason)
        server_name = name if url.scheme == "https" and literal is None else None
        return _Destination(tuple(addresses), server_name)

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

    async def _open(
        self,
        tool: str,
        request: httpx.Request,
        allow: netguard.Allowlist,
        *,
        what: str,
        where: str,
    ) -> tuple[httpx.Response, _Group]:
        """Check the request's destination, then send it to a checked address (the next one
        only if connecting to the previous failed, so nothing was sent)."""
        url = request.url
        wait = float(request.extensions["timeout"].get("connect") or _CONNECT_TIMEOUT_CAP)
        destination = await self._destination(tool, url, allow, what, wait)
        if destination.server_name is not None:
            request.extensions["sni_hostname"] = destination.server_name
        group = await self._group(destination.server_name)
        client = group.take()
        try:
            for index, address in enumerate(destination.addresses, start=1):
                pinned = address.compressed  # the checked address: no second lookup, ever
                request.url = url if url.host == pinned else url.copy_with(host=pinned)
                try:
                    return await client.send(request, stream=True), group
                except httpx.ConnectError as exc:
                    if index == len(destination.addresses):
                        raise _transport_error(tool, where, exc) from None
                except httpx.HTTPError as exc:
                    raise _transport_error(tool, where, exc) from None
            raise _transport_error(tool, where, httpx.ConnectError("no address"))
        except BaseException:
            await self._release(group)
            raise
        finally:
            request.url = url

    async def invoke(self, call: ToolCall) -> Any:
        """Send the call's request; return its output or raise a classified ConnectorError."""
        redact = _Redactor(call.config)
        try:
            request = self.build_request(call)
        except httpx.InvalidURL:
            raise _misconfigured(call.tool, "the URL is not valid") from None
        except (AttributeError, TypeError, ValueError):
            raise _misconfigured(call.tool, "the http config is malformed") from None
        parent = parse_traceparent(call.traceparent)
        url_scheme = request.url.scheme
        with telemetry.span(
            request.method,
            trace_id=call.trace_id,
            parent_span_id=parent[1] if parent else None,
            kind=SpanKind.CLIENT,
            attributes={
                "http.request.method": request.method,
                "server.address": redact(request.url.host),  # a host may come from a secret
                "server.port": request.url.port or netguard.DEFAULT_PORTS.get(url_scheme, 0),
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
        self, call: ToolCall, request: httpx.Request, redact: _Redactor, current: Span
    ) -> Any:
        """Send `request` and follow its redirects (each hop checked); the answer's output."""
        success = _success_statuses(call.tool, call.config)
        allow = _allowlist(call.tool, call.config)
        redirects = _max_redirects(call.tool, call.config)
        secrets = _secret_headers(call.config)
        applied = False  # a write redirected as a GET may have been applied already
        try:
            for hop in range(redirects + 1):
                where = redact(_safe_url(str(request.url)))
                what = where if hop == 0 else f"the redirect to {where}"
                response, group = await self._open(
                    call.tool, request, allow, what=what, where=where
                )
                try:
                    status = response.status_code
                    current.set_attribute("http.response.status_code", status)
                    location = response.headers.get("location")
                    ok = response.is_success if success is None else status in success
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
                    try:
                        target = request.url.join(location)
                    except httpx.InvalidURL:
                        raise ConnectorError(
                            ErrorCode.DOWNSTREAM_REJECTED,
                            f"{call.tool}: {where} redirected to an invalid URL",
                            retryable=False,
                        ) from None
                    method = _redirect_method(request.method, status)
                    applied = applied or (
                        request.method not in _SAFE_METHODS and method != request.method
                    )
                    request = _redirected(request, request.url, target, status, secrets)
                finally:
                    try:
                        await response.aclose()
                    finally:
                        await self._release(group)
        except ConnectorError as error:
            error.maybe_applied = error.maybe_applied or applied
            error.message = redact(error.message)  # a host or path may come from a secret
            error.args = (error.message,)
            raise
        raise AssertionError("unreachable: the last hop answers or raises")  # pragma: no cover

    async def _answer(self, tool: str, response: httpx.Response, where: str, *, ok: bool) -> Any:
        """The output of a final answer, or the error its status stands for."""
        if not ok:
            # The status says it all: an error page is never read (nor its size trusted).
            retry_after = parse_retry_after(response.headers.get("Retry-After"))
            raise _status_error(
                tool, response.status_code, retry_after, quota_reset(response.headers)
            )
        try:
            body = await _read_body(response, tool=tool, where=where, limit=self._max_body)
        except httpx.HTTPError as exc:
            raise _transport_error(tool, where, exc) from None
        spent = quota_reset(response.headers)
        output = _output(response, body)
        return output if spent is None else Throttled(output, spent)
