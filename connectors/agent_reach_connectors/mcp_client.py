"""The `mcp` connector: one tool call is one `tools/call` to a tool of a remote MCP server.

Each call opens its own session with the official SDK's client (Streamable HTTP, or stdio for
an allowlisted command), `initialize`s, lists the tools (every page) to find the remote tool,
checks its definition against the hash approved when it was imported (`definition_sha256`: a
server that changes a tool's description or schema after review, a "rug pull", is refused, not
called), then sends `tools/call` with the step's arguments and `_meta` carrying the step's
idempotency key and traceparent.

Where a call may go (SSRF): the URL passes the http connector's guard (`check_destination`: the
host resolved once, every address checked against `netguard` and `allow_hosts`), and the SDK's
httpx2 client is given a transport (`_PinnedTransport`) that sends every request to a checked
address only, the name kept in the Host header and as the TLS server name, so no second DNS
answer is ever used. That transport refuses any request off the checked origin (the SDK follows
same-origin redirects only; an http to https upgrade counts as another origin here), and the
client reads no proxy or certificate settings from the environment.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import quote

import anyio
import httpx2
import mcp_types as types
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from agent_reach.errors import DEFINITION_CHANGED, ErrorCode
from agent_reach_connectors import netguard
from agent_reach_connectors.base import _SECRET_REF, ConnectorError, ToolCall, resolve_secrets
from agent_reach_connectors.http import HttpConnector, Resolver
from agent_reach_connectors.http_request import (
    CONNECT_TIMEOUT_CAP,
    allowlist,
    misconfigured,
    secret_strings,
)
from agent_reach_connectors.throttling import parse_retry_after

DEFAULT_TIMEOUT = 30.0
# Comma-separated absolute paths of the commands an executor may start as stdio MCP servers.
COMMANDS_ENV = "AGENT_REACH_EXECUTOR_MCP_COMMANDS"
MAX_ERROR_TEXT = 500
# The SDK's client logs every message it receives at DEBUG, tool results included: what a
# server sends back (an echoed credential, a customer's data) must not reach the executor's
# logs, whatever level they are kept at. Its warnings and errors still do.
logging.getLogger("mcp.client").setLevel(logging.INFO)


class _NoTraceback(logging.Filter):
    """A server that answers garbage is an expected event, not a crash: the SDK's transports log
    it with a traceback (and the reply's text), then hand the error to the session, where the
    connector classifies it and the executor logs one line. Here it keeps one line, at DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        said = record.getMessage()
        if record.exc_info is None and not said.startswith(_UNEXPECTED_TYPE):
            return True
        exc = record.exc_info[1] if record.exc_info else None
        record.msg = f"{said} ({type(exc).__name__})" if exc else said
        record.args, record.exc_info, record.exc_text = None, None, None
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


# A logger's filter sees only its own records: each module of the SDK's client that logs one.
for _name in ("streamable_http", "sse", "stdio", "session", "client"):
    logging.getLogger(f"mcp.client.{_name}").addFilter(_NoTraceback())
_MAX_PAGES = 100
# How the SDK's transport says a reply was not JSON or SSE.
_UNEXPECTED_TYPE = "Unexpected content type:"
_CLIENT = types.Implementation(name="agent-reach", version="0.1.0")
_T = TypeVar("_T")
Streams = tuple[Any, Any]


def definition_sha256(tool: Mapping[str, Any]) -> str:
    """The hash of a remote tool's definition, as its wire form (`tools/list`) gives it.

    SHA-256 of the canonical JSON (sorted keys, no spaces, UTF-8) of its `name`,
    `description`, `inputSchema` and `annotations` (null when absent). `reach tools
    import-mcp` stores it as `config.definition_sha256`; the connector compares it on every call.
    """
    subset = {key: tool.get(key) for key in ("name", "description", "inputSchema", "annotations")}
    text = json.dumps(subset, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def wire_form(tool: types.Tool) -> dict[str, Any]:
    """A listed tool as the server sent it (camelCase keys, absent fields left out)."""
    return tool.model_dump(by_alias=True, mode="json", exclude_none=True)


async def list_all_tools(session: ClientSession) -> list[types.Tool]:
    """Every tool the server lists, following `nextCursor` (at most 100 pages)."""
    tools: list[types.Tool] = []
    cursor: str | None = None
    seen: set[str] = set()
    for _ in range(_MAX_PAGES):
        params = None if cursor is None else types.PaginatedRequestParams(cursor=cursor)
        page = await session.list_tools(params=params)
        tools += page.tools
        cursor = page.next_cursor
        if cursor is None or cursor in seen:
            break
        seen.add(cursor)
    return tools


@dataclass(frozen=True, slots=True, kw_only=True)
class Endpoint:
    """Where and how to reach one MCP server; header values are secret-resolved here."""

    tool: str
    url: httpx2.URL | None = None
    headers: dict[str, str] = field(default_factory=dict)
    allow: netguard.Allowlist = field(default_factory=netguard.Allowlist)
    command: StdioServerParameters | None = None
    timeout: float = DEFAULT_TIMEOUT

    @property
    def where(self) -> str:
        """The endpoint as it may be shown: scheme://host[:port]/path, or the command's path."""
        if self.url is None:
            return self.command.command if self.command is not None else "?"
        return str(self.url.copy_with(query=None, fragment=None))


def read_endpoint(tool: str, config: Mapping[str, Any], call_timeout: float = 0.0) -> Endpoint:
    """The endpoint of a tool's config (`url` or `command`, `headers`, `allow_hosts`, `timeout`).

    Refused (`destination_refused`) when the URL is not http(s), carries credentials, or the
    command is not one the executor allows; a malformed config is a `connector_error`.
    """
    raw = config.get("timeout", DEFAULT_TIMEOUT)
    if isinstance(raw, bool) or not isinstance(raw, int | float) or raw <= 0:
        raise misconfigured(tool, "config.timeout must be a positive number of seconds")
    timeout = min(float(raw), call_timeout) if call_timeout > 0 else float(raw)
    headers = _headers(tool, config.get("headers"))
    allow = allowlist(tool, config)
    url, command = config.get("url"), config.get("command")
    if (url is None) == (command is None):
        raise misconfigured(tool, "config needs either url (Streamable HTTP) or command (stdio)")
    if command is not None:
        params = _stdio(tool, command, config.get("env"))
        return Endpoint(tool=tool, command=params, timeout=timeout)
    return Endpoint(tool=tool, url=_url(tool, url), headers=headers, allow=allow, timeout=timeout)


def _headers(tool: str, raw: Any) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping) or not all(isinstance(v, str) for v in raw.values()):
        raise misconfigured(tool, "config.headers must map header names to strings")
    resolved = resolve_secrets(raw)
    for name, value in resolved.items():
        if any(c in str(name) + value for c in "\r\n\0"):
            raise misconfigured(tool, f"config.headers.{name} holds a line break")
    return {str(name): value for name, value in resolved.items()}


def _url(tool: str, raw: Any) -> httpx2.URL:
    if not isinstance(raw, str) or not raw:
        raise misconfigured(tool, "config.url must be the server's Streamable HTTP URL")
    if "${" in raw:
        raise misconfigured(tool, "config.url may not hold secrets; send them in config.headers")
    try:
        url = httpx2.URL(raw.strip())
    except httpx2.InvalidURL:
        raise misconfigured(tool, "config.url is not a valid URL") from None
    reason = netguard.check_scheme(url.scheme) if url.scheme else "it is not absolute"
    if reason is None and not url.host:
        reason = "it has no host"
    if reason is None and url.userinfo:
        reason = "it carries credentials; send them in config.headers"
    if reason is not None:
        raise _refused(tool, f"refused the url: {reason}")
    return url.copy_with(fragment=None)


def _stdio(tool: str, command: Any, env: Any) -> StdioServerParameters:
    if (
        not isinstance(command, list)
        or not command
        or not all(isinstance(part, str) and part for part in command)
    ):
        raise misconfigured(tool, "config.command must be a non-empty list of strings")
    allowed = {
        os.path.normpath(path.strip())
        for path in os.environ.get(COMMANDS_ENV, "").split(",")
        if os.path.isabs(path.strip())
    }
    program = command[0]
    if not os.path.isabs(program) or os.path.normpath(program) not in allowed:
        raise _refused(
            tool,
            f"refused to start {program}: it is not in the executor's {COMMANDS_ENV} "
            "(absolute paths of the commands it may start)",
        )
    if env is not None and not (
        isinstance(env, Mapping) and all(isinstance(v, str) for v in env.values())
    ):
        raise misconfigured(tool, "config.env must map variable names to strings")
    resolved = {str(k): v for k, v in resolve_secrets(env or {}).items()}
    return StdioServerParameters(command=program, args=command[1:], env=resolved or None)


def _refused(tool: str, said: str) -> ConnectorError:
    return ConnectorError(ErrorCode.DESTINATION_REFUSED, f"{tool}: {said}", retryable=False)


@dataclass(slots=True)
class Observer:
    """What a session did before it failed: how far it got, and an HTTP refusal it met."""

    phase: str = "connect"  # connect, initialize, list, call
    status: int | None = None
    retry_after: float | None = None

    def saw(self, status: int, retry_after: str | None) -> None:
        """An HTTP error status answered a request (the SDK keeps only a generic error)."""
        self.status, self.retry_after = status, parse_retry_after(retry_after)


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def classify(exc: Exception, tool: str, where: str, observer: Observer) -> ConnectorError:
    """The ConnectorError a failed session stands for (`exc` may be a group of failures)."""
    leaves = _leaves(exc)
    first = next((e for e in leaves if isinstance(e, ConnectorError)), None)
    if first is not None:
        return first
    sent = observer.phase == "call"  # the tools/call may have reached the tool
    doing = f"{tool}: {where}"
    if any(isinstance(e, TimeoutError | httpx2.TimeoutException) for e in leaves):
        unsent = not sent or any(isinstance(e, httpx2.ConnectTimeout) for e in leaves)
        said = "" if unsent else " after the call was sent; it may have been applied"
        return ConnectorError(
            ErrorCode.TIMEOUT, f"{doing} timed out{said}", maybe_applied=not unsent
        )
    if any(isinstance(e, httpx2.ConnectError | OSError) for e in leaves):
        return ConnectorError(ErrorCode.CONNECTION_ERROR, f"{doing} could not be reached")
    if observer.status is not None and any(isinstance(e, MCPError) for e in leaves):
        return _status_error(doing, observer.status, observer.retry_after)
    return _session_error(leaves, doing, observer.phase)


def _session_error(leaves: list[BaseException], doing: str, phase: str) -> ConnectorError:
    """A failure inside the session: a redirect away, a lost connection, a JSON-RPC error."""
    sent = phase == "call"
    if any(isinstance(e, _OffOrigin) for e in leaves):
        said = f"{doing} redirected to another origin, which is not followed"
        return ConnectorError(ErrorCode.DESTINATION_REFUSED, said, retryable=False)
    errors = [e for e in leaves if isinstance(e, MCPError)]
    lost = any(isinstance(e, httpx2.TransportError) for e in leaves) or any(
        e.code == types.CONNECTION_CLOSED for e in errors
    )
    if lost:
        said = f"{doing}: the connection was lost" + ("; it may have been applied" if sent else "")
        return ConnectorError(ErrorCode.CONNECTION_ERROR, said, maybe_applied=sent)
    if errors and (garbage := _not_json_rpc(errors[0])):
        said = f"{doing} answered the {phase} with {garbage}, not JSON-RPC"
        if sent:
            said += "; it may have been applied"
        return ConnectorError(
            ErrorCode.DOWNSTREAM_REJECTED, said, retryable=False, maybe_applied=sent
        )
    if errors:
        text = " ".join(errors[0].message.split())[:MAX_ERROR_TEXT]
        said = f"{doing} refused the {phase}: {text}"
        return ConnectorError(ErrorCode.DOWNSTREAM_REJECTED, said, retryable=False)
    said = f"{doing}: the MCP session failed during the {phase} ({type(leaves[0]).__name__})"
    return ConnectorError(ErrorCode.DOWNSTREAM_REJECTED, said, retryable=False, maybe_applied=sent)


def _not_json_rpc(error: MCPError) -> str | None:
    """What a reply that is not JSON-RPC was, from the error the SDK's transport made of it; None
    for an error the server itself sent."""
    if error.message.startswith(_UNEXPECTED_TYPE):
        kind = error.message[len(_UNEXPECTED_TYPE) :].split(";")[0].strip()[:60]
        return f"a {kind or 'untyped'} reply"
    if error.code != types.PARSE_ERROR:
        return None
    return "invalid JSON" if "json_invalid" in error.message else "JSON of another shape"


def _status_error(doing: str, status: int, retry_after: float | None) -> ConnectorError:
    said = f"{doing} answered HTTP {status}"
    if status in (401, 403):
        return ConnectorError(ErrorCode.UNAUTHORIZED, said, retryable=False)
    if status == 429:
        return ConnectorError(
            ErrorCode.RATE_LIMITED, said, retry_after=retry_after, throttle=retry_after
        )
    if status >= 500 and status not in (501, 505):
        return ConnectorError(ErrorCode.DOWNSTREAM_UNAVAILABLE, said, retry_after=retry_after)
    return ConnectorError(ErrorCode.DOWNSTREAM_REJECTED, said, retryable=False)


class _OffOrigin(Exception):
    """A request of the session to anywhere but the checked origin (a redirect elsewhere)."""


class _PinnedTransport(httpx2.AsyncBaseTransport):
    """httpx2's transport, sending every request to one of the checked addresses only."""

    def __init__(
        self,
        inner: httpx2.AsyncBaseTransport,
        *,
        origin: tuple[str, str, int],
        addresses: tuple[netguard.IPAddress, ...],
        observer: Observer,
    ) -> None:
        self._inner = inner
        self._origin = origin
        self._addresses = addresses
        self._observer = observer
        scheme, host, _ = origin
        self._sni = host if scheme == "https" and netguard.parse_ip(host) is None else None

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        url = request.url
        scheme = url.scheme
        port = url.port or netguard.DEFAULT_PORTS.get(scheme, 0)
        if (scheme, netguard.normalize_host(url.host), port) != self._origin:
            raise _OffOrigin(f"{scheme}://{url.host}:{port}")
        extensions = dict(request.extensions)
        if self._sni is not None:
            extensions["sni_hostname"] = self._sni
        last = len(self._addresses)
        for index, address in enumerate(self._addresses, start=1):
            pinned = httpx2.Request(
                request.method,
                url.copy_with(host=address.compressed),  # the Host header keeps the name
                headers=request.headers,
                stream=request.stream,
                extensions=extensions,
            )
            try:
                response = await self._inner.handle_async_request(pinned)
            except httpx2.ConnectError:
                if index == last:
                    raise
                continue  # nothing was sent: the next checked address
            if request.method == "POST" and response.status_code >= 400:
                self._observer.saw(response.status_code, response.headers.get("Retry-After"))
            return response
        raise AssertionError("unreachable: a destination has an address")  # pragma: no cover

    async def aclose(self) -> None:
        await self._inner.aclose()


class McpConnector:
    """Calls one tool of a remote MCP server per tool call.

    Config: `url` (the server's Streamable HTTP endpoint) or `command` (a stdio server: a list,
    its first element an absolute path listed in the executor's `AGENT_REACH_EXECUTOR_MCP_COMMANDS`,
    with `env` for it); `tool` (the remote tool's name, default this tool's name); `headers`
    (`${env:NAME}` references resolved here, on the executor); `definition_sha256` (the approved
    definition: a call to a tool whose definition differs fails with `tool_unavailable`,
    "definition changed: ..."); `allow_hosts` (as the http connector reads it); `timeout`
    (seconds for the whole call, never more than the call's own).

    The output is the result's `structuredContent` when it has one, else `{"content": [...]}`
    (text items as their text, others as their JSON). An `isError` result fails with
    `downstream_rejected` and its text. No secret reaches an output or a message.

    `resolver` (tests) replaces the system's getaddrinfo; `verify` the system's CAs.
    """

    name = "mcp"

    def __init__(self, *, resolver: Resolver | None = None, verify: ssl.SSLContext | None = None):
        self._guard = HttpConnector(resolver=resolver, verify=verify)
        self._verify: ssl.SSLContext | bool = True if verify is None else verify

    async def start(self) -> None:
        """Nothing to open: each call has its own session."""

    async def close(self) -> None:
        """Nothing to close: each call closes its own session."""

    async def invoke(self, call: ToolCall) -> Any:
        """Call the remote tool; its output, or a classified ConnectorError."""
        config = call.config
        try:
            endpoint = read_endpoint(call.tool, config, call.timeout_s)
            remote = config.get("tool", call.tool)
            expected = config.get("definition_sha256")
            if not isinstance(remote, str) or not remote:
                raise misconfigured(call.tool, "config.tool must be the remote tool's name")
            if expected is not None and not isinstance(expected, str):
                raise misconfigured(call.tool, "config.definition_sha256 must be a hex string")
            meta: Any = {"idempotency_key": call.idempotency_key}  # RequestParamsMeta
            if call.traceparent:
                meta["traceparent"] = call.traceparent

            async def on_progress(
                progress: float, total: float | None, message: str | None
            ) -> None:
                call.heartbeat()  # the remote tool says it is working: not hung

            async def work(session: ClientSession, observer: Observer) -> types.CallToolResult:
                observer.phase = "list"
                found = await self._find(endpoint, session, remote, expected)
                observer.phase = "call"
                return await session.call_tool(
                    found.name, dict(call.args), progress_callback=on_progress, meta=meta
                )

            result = await self.session(endpoint, work)
            output = _output(call.tool, remote, result)
        except ConnectorError as error:
            secrets = _secret_values(config)  # a server may echo a credential
            error.message = _scrubbed(error.message, secrets)
            error.args = (error.message,)
            raise
        secrets = _secret_values(config)
        return _scrubbed(output, secrets) if secrets else output

    async def _find(
        self, endpoint: Endpoint, session: ClientSession, remote: str, expected: str | None
    ) -> types.Tool:
        found = next((t for t in await list_all_tools(session) if t.name == remote), None)
        if found is None:
            raise ConnectorError(
                ErrorCode.TOOL_UNAVAILABLE,
                f"{endpoint.tool}: the MCP server at {endpoint.where} lists no tool {remote!r}",
                retryable=False,
            )
        actual = definition_sha256(wire_form(found))
        if expected is not None and actual != expected.strip().lower():
            raise ConnectorError(
                ErrorCode.TOOL_UNAVAILABLE,
                f"{DEFINITION_CHANGED}: {remote!r} at {endpoint.where} is not the definition "
                f"approved for {endpoint.tool} (sha256 {expected[:12]}..., now {actual[:12]}...); "
                "not called. Review it and import it again (reach tools import-mcp)",
                retryable=False,
            )
        return found

    async def session(
        self, endpoint: Endpoint, work: Callable[[ClientSession, Observer], Awaitable[_T]]
    ) -> _T:
        """Run `work` in an initialized session with the endpoint, within its timeout.

        Every failure leaves as a classified ConnectorError. Also how `reach tools import-mcp`
        lists a server's tools.
        """
        observer = Observer()
        try:
            with anyio.fail_after(endpoint.timeout):
                async with AsyncExitStack() as stack:
                    read, write = await stack.enter_async_context(
                        await self._transport(endpoint, observer)
                    )
                    session = ClientSession(read, write, client_info=_CLIENT)
                    await stack.enter_async_context(session)
                    observer.phase = "initialize"
                    await session.initialize()
                    return await work(session, observer)
        except Exception as exc:  # groups of them too; a cancellation passes
            raise classify(exc, endpoint.tool, endpoint.where, observer) from None

    async def _transport(
        self, endpoint: Endpoint, observer: Observer
    ) -> AbstractAsyncContextManager[Streams]:
        if endpoint.command is not None:
            return stdio_client(endpoint.command)
        url = endpoint.url
        assert url is not None
        host = netguard.normalize_host(url.host)
        port = url.port or netguard.DEFAULT_PORTS[url.scheme]
        addresses = await self._guard.check_destination(
            endpoint.tool,
            host,
            port,
            endpoint.allow,
            what=endpoint.where,
            wait=min(endpoint.timeout, CONNECT_TIMEOUT_CAP),
        )
        inner = httpx2.AsyncHTTPTransport(verify=self._verify, trust_env=False)
        pinned = _PinnedTransport(
            inner, origin=(url.scheme, host, port), addresses=addresses, observer=observer
        )
        timeout = httpx2.Timeout(
            endpoint.timeout, connect=min(endpoint.timeout, CONNECT_TIMEOUT_CAP)
        )
        client = httpx2.AsyncClient(
            transport=pinned,
            headers={"User-Agent": "agent-reach-mcp", **endpoint.headers},
            timeout=timeout,
            follow_redirects=False,
            trust_env=False,
        )
        return _http_streams(client, str(url))


@asynccontextmanager
async def _http_streams(client: httpx2.AsyncClient, url: str) -> AsyncIterator[Streams]:
    async with client, streamable_http_client(url, http_client=client) as streams:
        yield streams


def _secret_values(config: Mapping[str, Any]) -> list[str]:
    """The secrets a config holds, longest first: every `${env:...}` value (raw and URL-encoded)
    and each header value written into it as it is (and each word of it: `Bearer <token>`)."""
    names = {name for text in secret_strings(config) for name in _SECRET_REF.findall(text)}
    values = {os.environ.get(name, "") for name in names}
    forms = {form for v in values if v for form in (v, quote(v, safe=""), quote(v))}
    headers = config.get("headers")
    for value in headers.values() if isinstance(headers, Mapping) else ():
        if isinstance(value, str) and "${" not in value:
            forms.update(part for part in (value, *value.split()) if len(part) >= 6)
    return sorted(forms, key=len, reverse=True)


def _scrubbed(value: Any, secrets: list[str]) -> Any:
    """`value` with every secret in its strings (keys too) replaced by `***`."""
    if isinstance(value, str):
        for secret in secrets:
            value = value.replace(secret, "***")
        return value
    if isinstance(value, Mapping):
        return {_scrubbed(k, secrets): _scrubbed(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrubbed(item, secrets) for item in value]
    return value


def _output(tool: str, remote: str, result: types.CallToolResult) -> Any:
    if result.is_error:
        text = " ".join(_texts(result)).strip()[:MAX_ERROR_TEXT] or "(no text)"
        raise ConnectorError(
            ErrorCode.DOWNSTREAM_REJECTED,
            f"{tool}: the MCP tool {remote!r} answered with an error: {text}",
            retryable=False,
        )
    if result.structured_content is not None:
        return result.structured_content
    content = [
        item.text
        if isinstance(item, types.TextContent)
        else item.model_dump(by_alias=True, mode="json", exclude_none=True)
        for item in result.content
    ]
    return {"content": content}


def _texts(result: types.CallToolResult) -> list[str]:
    return [item.text for item in result.content if isinstance(item, types.TextContent)]
