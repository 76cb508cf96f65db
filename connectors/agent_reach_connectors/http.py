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
"""

from __future__ import annotations

import email.utils
import itertools
import json
import math
import os
import re
import time
from collections.abc import Iterator, Mapping
from http import HTTPStatus
from importlib.metadata import PackageNotFoundError, version
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from agent_reach.errors import ErrorCode
from agent_reach_connectors.base import (
    _SECRET_REF,
    ConnectorError,
    Throttled,
    ToolCall,
    resolve_secrets,
)

MAX_TEXT = 64 * 1024
# The most of an answer's body the connector reads (after decompression); a larger answer is a
# failed call, never an executor that runs out of memory.
MAX_BODY = 10 * 1024 * 1024
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_BODY_MODES = frozenset({"auto", "none", "json"})
_SECONDS = re.compile(r"\d+(\.\d+)?")
# 5xx answers that say "this server will never do that": retrying cannot help.
_PERMANENT_5XX = frozenset({501, 505})
_CONNECT_TIMEOUT_CAP = 10.0


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP-date); None if unusable."""
    if not value:
        return None
    value = value.strip()
    if _SECONDS.fullmatch(value):
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None or when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


# Unix times are this large; smaller reset values are seconds from now (both are in use).
_EPOCH_MIN = 1_000_000_000
_FIELD = {"r": "r", "remaining": "r", "t": "t", "reset": "t"}
_STRUCTURED = re.compile(r"(?:^|[;,\s])(r|t|remaining|reset)\s*=\s*(\d+(?:\.\d+)?)", re.IGNORECASE)


def quota_reset(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """Seconds until the downstream's quota refills, when it says the quota is spent now.

    Reads `X-RateLimit-Remaining`/`X-RateLimit-Reset` (GitHub, Twitter and many others),
    `RateLimit-Remaining`/`RateLimit-Reset` and the IETF draft's `RateLimit: ...;r=0;t=30`.
    A reset is seconds from now, or a Unix time when it is that large. None when the quota is
    not spent or the answer does not say when it refills.
    """
    lowered = {k.lower(): v for k, v in headers.items()}
    remaining = lowered.get("x-ratelimit-remaining", lowered.get("ratelimit-remaining"))
    reset = lowered.get("x-ratelimit-reset", lowered.get("ratelimit-reset"))
    if "ratelimit" in lowered:
        fields = {_FIELD[k.lower()]: v for k, v in _STRUCTURED.findall(lowered["ratelimit"])}
        remaining, reset = fields.get("r", remaining), fields.get("t", reset)
    try:
        spent = remaining is not None and float(remaining.strip()) <= 0
        seconds = float(reset.strip()) if reset is not None and spent else None
    except ValueError:
        return None
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return None
    if seconds >= _EPOCH_MIN:
        seconds = max(0.0, seconds - (time.time() if now is None else now))
    return seconds or None


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


class HttpConnector:
    """Sends one HTTP request per tool call and classifies what came back.

    Tool config: `method` (default GET); `url` with `{arg}` placeholders filled from the
    arguments (URL-encoded); `headers`; `query` (extra query parameters); `body`: `auto`
    (default: arguments not used in the URL go as a JSON body for POST/PUT/PATCH/DELETE and as
    query parameters for GET/HEAD/others), `json` (always a JSON body) or `none`; `timeout`
    (seconds, default the call's timeout); `success_statuses` (default: any 2xx).
    `${env:NAME}` references in the config are resolved here, at invoke time on the executor.

    Every request carries the step's `Idempotency-Key`, the task's `traceparent` and a
    `User-Agent: agent-reach/<version>`. A JSON answer is returned parsed; anything else as
    `{"status": code, "text": first 64 KiB}`. A body over `max_body` bytes (10 MiB) is not
    read and fails the call; an error status's body is never read. Failures raise
    `ConnectorError` with one sentence naming the tool, the status or `scheme://host/path`, and
    never a secret.
    """

    name = "http"

    def __init__(
        self, *, max_connections: int = 100, clients: int = 8, max_body: int = MAX_BODY
    ) -> None:
        self._max_body = max_body
        self._clients_wanted = max(1, clients)
        per_client = max(1, max_connections // self._clients_wanted)
        self._limits = httpx.Limits(
            max_connections=per_client, max_keepalive_connections=per_client
        )
        self._clients: list[httpx.AsyncClient] = []
        self._turn: Iterator[httpx.AsyncClient] = iter(())
        self._agent = _user_agent()

    async def start(self) -> None:
        """Open the connection pools (invoke also opens them lazily)."""
        self._client()

    async def close(self) -> None:
        """Close every pooled connection."""
        clients, self._clients, self._turn = self._clients, [], iter(())
        for client in clients:
            await client.aclose()

    def _client(self) -> httpx.AsyncClient:
        if not self._clients:
            tls = httpx.create_ssl_context()  # loading CA certificates is slow: do it once
            self._clients = [
                httpx.AsyncClient(limits=self._limits, follow_redirects=False, verify=tls)
                for _ in range(self._clients_wanted)
            ]
            self._turn = itertools.cycle(self._clients)
        return next(self._turn)

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
        return httpx.Request(
            method,
            url,
            headers=headers,
            params=params or None,
            content=content,
            extensions={"timeout": timeout.as_dict()},
        )

    async def invoke(self, call: ToolCall) -> Any:
        """Send the call's request; return its output or raise a classified ConnectorError."""
        redact = _Redactor(call.config)
        try:
            request = self.build_request(call)
        except httpx.InvalidURL:
            raise _misconfigured(call.tool, "the URL is not valid") from None
        except (AttributeError, TypeError, ValueError):
            raise _misconfigured(call.tool, "the http config is malformed") from None
        success = _success_statuses(call.tool, call.config)
        where = redact(_safe_url(str(request.url)))
        try:
            response = await self._client().send(request, stream=True)
        except httpx.HTTPError as exc:
            raise _transport_error(call.tool, where, exc) from None
        try:
            if not (response.is_success if success is None else response.status_code in success):
                # The status says it all: an error page is never read (nor its size trusted).
                retry_after = parse_retry_after(response.headers.get("Retry-After"))
                raise _status_error(
                    call.tool, response.status_code, retry_after, quota_reset(response.headers)
                )
            try:
                body = await _read_body(response, tool=call.tool, where=where, limit=self._max_body)
            except httpx.HTTPError as exc:
                raise _transport_error(call.tool, where, exc) from None
            spent = quota_reset(response.headers)
            output = _output(response, body)
            return output if spent is None else Throttled(output, spent)
        finally:
            await response.aclose()
