"""The `http` connector: one tool call is one HTTP request, classified into a receipt-ready error.

httpx is the client the project standardises on. Its pooled async client is slower than aiohttp
under high concurrency (PERFORMANCE.md); `make bench` measures it, and the transport can change
behind this module without touching the protocol.
"""

from __future__ import annotations

import email.utils
import json
import re
import time
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from agent_reach.errors import ErrorCode
from agent_reach_connectors.base import ConnectorError, ToolCall, resolve_secrets

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
MAX_TEXT = 64 * 1024
# Failures before the request could have reached the server: safe to retry any tool.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)


def _user_agent() -> str:
    try:
        return f"agent-reach/{version('agent-reach')}"
    except PackageNotFoundError:
        return "agent-reach"


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP-date); None if unusable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def _safe_url(url: str) -> str:
    """scheme://host/path only: queries and credentials may hold secrets."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


def _fill_url(tool: str, template: str, args: Mapping[str, Any]) -> tuple[str, set[str]]:
    used: set[str] = set()

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in args:
            raise ConnectorError(
                ErrorCode.INVALID_ARGUMENTS,
                f"{tool}: the URL needs argument '{name}', which was not given",
                retryable=False,
            )
        used.add(name)
        return quote(str(args[name]), safe="")

    return _PLACEHOLDER.sub(substitute, template), used


def _classify_status(tool: str, response: httpx.Response) -> ConnectorError:
    status = response.status_code
    said = f"{tool}: downstream answered {status} {response.reason_phrase}".rstrip()
    retry_after = parse_retry_after(response.headers.get("Retry-After"))
    if status == 429:
        return ConnectorError(ErrorCode.RATE_LIMITED, said, retry_after=retry_after)
    if status >= 500:
        return ConnectorError(ErrorCode.DOWNSTREAM_UNAVAILABLE, said, retry_after=retry_after)
    if status == 408:
        return ConnectorError(ErrorCode.TIMEOUT, said, retryable=True)
    if status in (401, 403):
        return ConnectorError(ErrorCode.UNAUTHORIZED, said)
    if status == 404:
        return ConnectorError(ErrorCode.NOT_FOUND, said)
    return ConnectorError(ErrorCode.DOWNSTREAM_REJECTED, said)


def _classify_transport(tool: str, url: str, exc: httpx.HTTPError) -> ConnectorError:
    where = _safe_url(url)
    if isinstance(exc, httpx.TimeoutException):
        sent = not isinstance(exc, httpx.ConnectTimeout | httpx.PoolTimeout)
        phase = "answering" if sent else "connecting"
        return ConnectorError(
            ErrorCode.TIMEOUT, f"{tool}: timed out {phase} ({where})", maybe_applied=sent
        )
    if isinstance(exc, _NOT_SENT):
        return ConnectorError(
            ErrorCode.CONNECTION_ERROR, f"{tool}: could not connect to {where}", maybe_applied=False
        )
    return ConnectorError(
        ErrorCode.CONNECTION_ERROR,
        f"{tool}: the connection to {where} broke before an answer ({type(exc).__name__})",
        maybe_applied=True,
    )


def _output(response: httpx.Response) -> Any:
    if "json" in response.headers.get("content-type", ""):
        try:
            return response.json()
        except (ValueError, UnicodeDecodeError):
            pass
    return {"status": response.status_code, "text": response.text[:MAX_TEXT]}


class HttpConnector:
    """Config: `method`, `url` (with `{arg}` placeholders), `headers`, `query`, `body`, `timeout`.

    By default (`body: auto`) arguments not used in the URL travel as the JSON body for
    POST/PUT/PATCH/DELETE and as query parameters otherwise. Every request carries the step's
    `Idempotency-Key` and the task's `traceparent`.
    """

    name = "http"

    def __init__(self, *, max_connections: int = 100) -> None:
        self._limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        )
        self._client: httpx.AsyncClient | None = None
        self._agent = _user_agent()

    async def start(self) -> None:
        self._get_client()

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def _get_client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(limits=self._limits, follow_redirects=False)
        return self._client

    def build_request(self, call: ToolCall) -> httpx.Request:
        """The request a call makes (secrets resolved here, on the executor, only)."""
        config = resolve_secrets(dict(call.config))
        method = str(config.get("method", "GET")).upper()
        url, used = _fill_url(call.tool, str(config.get("url", "")), call.args)
        rest = {k: v for k, v in call.args.items() if k not in used}
        mode = config.get("body", "auto")
        headers = {
            "User-Agent": self._agent,
            **{str(k): str(v) for k, v in (config.get("headers") or {}).items()},
        }
        headers["Idempotency-Key"] = call.idempotency_key
        if call.traceparent:
            headers["traceparent"] = call.traceparent
        params: dict[str, Any] = dict(config.get("query") or {})
        content: bytes | None = None
        if mode == "json" or (mode == "auto" and method in _BODY_METHODS):
            content = json.dumps(rest, separators=(",", ":")).encode()
            headers["Content-Type"] = "application/json"
        elif mode == "auto":
            params.update({k: v if isinstance(v, str) else json.dumps(v) for k, v in rest.items()})
        timeout = float(config.get("timeout", call.timeout_s))
        return self._get_client().build_request(
            method,
            url,
            headers=headers,
            params=params or None,
            content=content,
            timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
        )

    async def invoke(self, call: ToolCall) -> Any:
        try:
            request = self.build_request(call)
        except httpx.InvalidURL:
            raise ConnectorError(
                ErrorCode.INVALID_ARGUMENTS, f"{call.tool}: the URL is not valid", retryable=False
            ) from None
        try:
            response = await self._get_client().send(request)
        except httpx.HTTPError as exc:
            raise _classify_transport(call.tool, str(request.url), exc) from None
        if response.is_success:
            return _output(response)
        raise _classify_status(call.tool, response)
