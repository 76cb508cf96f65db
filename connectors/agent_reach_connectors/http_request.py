"""The request an `http` tool call makes, read from its config, and the next after a redirect."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

import aiohttp
from multidict import CIMultiDict
from yarl import URL

from agent_reach.destinations import PLACEHOLDER, Destinations, destination_from_arguments
from agent_reach.errors import ErrorCode
from agent_reach_connectors import netguard
from agent_reach_connectors.base import _SECRET_REF, ConnectorError, ToolCall, resolve_secrets

# One encoder for every call: `json.dumps` with separators builds a new one each time.
_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"))
_PLACEHOLDER = PLACEHOLDER
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_BODY_MODES = frozenset({"auto", "none", "json"})
CONNECT_TIMEOUT_CAP = 10.0
# Redirects followed by default (`max_redirects` in the config; 0 treats a 3xx as an answer).
MAX_REDIRECTS = 5
_MAX_REDIRECTS_LIMIT = 20
# Never carried to another origin by a redirect (nor is any header whose value holds a secret).
_CREDENTIAL_HEADERS = ("authorization", "proxy-authorization", "cookie")
# Characters a URL may hold as they are (RFC 3986's reserved set, "%" of the escapes, and "~").
_URL_CHARACTERS = "!#$%&'()*+,/:;=?@[]~"


@dataclass(slots=True, kw_only=True)
class HttpRequest:
    """One hop's request: built from a call (secrets resolved), or from a redirect.

    `headers` holds every header to send but those the transport adds (Content-Length, Accept,
    Accept-Encoding); `Host` names the URL's host, whatever address the hop is pinned to.
    `resendable`: the tool is declared idempotent, so the transport may send the request again
    over a new connection when the kept-alive one it went on turns out closed.
    """

    method: str
    url: URL
    headers: CIMultiDict[str]
    body: bytes | None
    timeout: aiohttp.ClientTimeout
    resendable: bool = False


def build_request(call: ToolCall, *, user_agent: str) -> HttpRequest:
    """The request a call makes; secrets are resolved here, on the executor, only."""
    raw = call.config
    url_template = raw.get("url")
    if not isinstance(url_template, str) or not url_template:
        raise misconfigured(call.tool, "config.url is missing")
    method = str(raw.get("method", "GET")).upper()
    mode = raw.get("body", "auto")
    if mode not in _BODY_MODES:
        raise misconfigured(call.tool, "config.body must be one of auto, json, none")
    url, used = _fill_url(call.tool, url_template, call.args)
    rest = {k: v for k, v in call.args.items() if k not in used}
    headers: CIMultiDict[str] = CIMultiDict({"User-Agent": user_agent})
    for key, value in (resolve_secrets(raw.get("headers")) or {}).items():
        if value is not None:
            headers[str(key)] = str(value)
    headers["Idempotency-Key"] = call.idempotency_key
    if call.traceparent:
        headers["traceparent"] = call.traceparent
    params = {str(k): _text(v) for k, v in (resolve_secrets(raw.get("query")) or {}).items()}
    body: bytes | None = None
    if mode == "json" or (mode == "auto" and method in _BODY_METHODS):
        body = _COMPACT_JSON.encode(rest).encode()
        headers["Content-Type"] = "application/json"
    elif mode == "auto":
        params.update({k: _text(v) for k, v in rest.items() if v is not None})
    timeout = _timeout(call.tool, raw, call.timeout_s)
    # Added to the URL's own query (a `?key=` written into the configured URL stays).
    target = _parse_url(url).extend_query(params) if params else _parse_url(url)
    if "Host" not in headers:
        headers["Host"] = _host_header(target)
    return HttpRequest(
        method=method,
        url=target,
        headers=headers,
        body=body,
        timeout=timeout,
        resendable=call.idempotent,
    )


def misconfigured(tool: str, what: str) -> ConnectorError:
    """The error for a tool whose config cannot make a request: fixing the config is the cure."""
    return ConnectorError(ErrorCode.CONNECTOR_ERROR, f"{tool}: {what}", retryable=False)


def _text(value: Any) -> str:
    """How an argument travels in a path or query: strings as they are, the rest as JSON."""
    return value if isinstance(value, str) else _COMPACT_JSON.encode(value)


def secret_strings(value: Any) -> Iterator[str]:
    """Every string in a config value, however deeply nested."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from secret_strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from secret_strings(item)


@dataclass(frozen=True, slots=True)
class _Template:
    """A configured URL split once: literal parts at even indexes, placeholder names between."""

    pieces: tuple[str, ...]
    secret: bool  # whether a literal part holds a `${env:...}` reference
    dot_segments: int


@functools.lru_cache(maxsize=1024)
def _template(text: str) -> _Template:
    pieces = tuple(_PLACEHOLDER.split(text))
    secret = any(_SECRET_REF.search(piece) for piece in pieces[::2])
    return _Template(pieces, secret, _dot_segments(text))


def _fill_url(tool: str, template: str, args: Mapping[str, Any]) -> tuple[str, set[str]]:
    """Fill `{arg}` placeholders (URL-encoded) and resolve `${env:...}` in the literal parts.

    Splitting first means an argument can never smuggle in a secret reference, and a secret
    value can never be mistaken for a placeholder.
    """
    parsed = _template(template)
    used: set[str] = set()
    out: list[str] = []
    for index, piece in enumerate(parsed.pieces):
        if index % 2 == 0:
            out.append(resolve_secrets(piece) if parsed.secret else piece)
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
    if _dot_segments(url) > parsed.dot_segments:
        # `quote` keeps "." and "..", which the URL parser then resolves: an argument ".." would
        # climb out of the configured path to another endpoint of the same host.
        raise ConnectorError(
            ErrorCode.INVALID_ARGUMENTS,
            f"{tool}: an argument in the URL path cannot be '.' or '..'",
            retryable=False,
        )
    return url, used


def _parse_url(text: str) -> URL:
    """A URL kept as written: existing escapes stay escaped (an argument's "%3B" is never turned
    into a ";" that means something else to the server), only what no URL may hold (spaces,
    non-ASCII) is percent-encoded, and a non-ASCII or escaped host is IDNA-encoded. ValueError
    when it cannot be read."""
    url = URL(quote(text, safe=_URL_CHARACTERS), encoded=True)
    host = url.raw_host
    if host and "%" in host:
        url = url.with_host(unquote(host))
    return url


def _dot_segments(url: str) -> int:
    path = url.split("?", 1)[0].split("#", 1)[0]
    return sum(segment in (".", "..") for segment in path.split("/"))


def _timeout(tool: str, config: Mapping[str, Any], default: float) -> aiohttp.ClientTimeout:
    """Each wait (a pool slot and connecting, then every read) bounded by `timeout` seconds;
    connecting alone by at most 10. The call as a whole is bounded by the executor's deadline."""
    raw = config.get("timeout", default)
    if isinstance(raw, bool) or not isinstance(raw, int | float) or raw <= 0:
        raise misconfigured(tool, "config.timeout must be a positive number of seconds")
    return _client_timeout(float(raw))


@functools.lru_cache(maxsize=64)
def _client_timeout(seconds: float) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(
        total=None,
        connect=seconds,
        sock_connect=min(seconds, CONNECT_TIMEOUT_CAP),
        sock_read=seconds,
    )


def success_statuses(tool: str, config: Mapping[str, Any]) -> frozenset[int] | None:
    """The statuses that count as success; None: any 2xx."""
    raw = config.get("success_statuses")
    if raw is None:
        return None
    if not isinstance(raw, list) or not all(isinstance(s, int) for s in raw):
        raise misconfigured(tool, "config.success_statuses must be a list of status codes")
    return frozenset(raw)


@functools.lru_cache(maxsize=256)
def _parsed_allowlist(entries: tuple[str, ...]) -> netguard.Allowlist:
    return netguard.Allowlist.parse(entries)


def allowlist(tool: str, config: Mapping[str, Any]) -> netguard.Allowlist:
    """The non-public destinations the tool may reach (`allow_hosts`)."""
    raw = config.get("allow_hosts")
    if raw is None:
        return netguard.Allowlist()
    if not isinstance(raw, list) or not all(isinstance(e, str) for e in raw):
        raise misconfigured(tool, "config.allow_hosts must be a list of hosts, addresses or CIDRs")
    try:
        return _parsed_allowlist(tuple(raw))
    except ValueError as exc:
        raise misconfigured(tool, f"config.{exc}") from None


@functools.lru_cache(maxsize=256)
def _parsed_destinations(entries: tuple[str, ...]) -> Destinations:
    return Destinations.parse(entries)


def destinations(tool: str, config: Mapping[str, Any]) -> Destinations | None:
    """Where the tool may send (`destinations`: host names, `*.suffix`, addresses, `@domain`);
    None when it lists none: anywhere the SSRF guard admits."""
    raw = config.get("destinations")
    if raw is None:
        return None
    if not isinstance(raw, list) or not raw or not all(isinstance(e, str) for e in raw):
        raise misconfigured(tool, "config.destinations must be a non-empty list of hosts")
    try:
        return _parsed_destinations(tuple(raw))
    except ValueError as exc:
        raise misconfigured(tool, f"config.{exc}") from None


def required_destinations(tool: str, config: Mapping[str, Any], *, why: str) -> Destinations:
    """The tool's `destinations`, which it must list because `why` (its destination comes
    from its arguments): without them every call is refused."""
    listed = destinations(tool, config)
    if listed is None:
        raise misconfigured(tool, f"config.destinations is not set, and {why}")
    return listed


def url_destinations(tool: str, config: Mapping[str, Any]) -> Destinations | None:
    """An http tool's `destinations`: required when an argument reaches the URL's host."""
    url = config.get("url")
    if isinstance(url, str) and destination_from_arguments(url):
        why = "an argument of the url reaches its scheme, host or port"
        return required_destinations(tool, config, why=why)
    return destinations(tool, config)


def max_redirects(tool: str, config: Mapping[str, Any]) -> int:
    """How many redirects a call follows."""
    raw = config.get("max_redirects", MAX_REDIRECTS)
    if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw <= _MAX_REDIRECTS_LIMIT:
        raise misconfigured(
            tool, f"config.max_redirects must be a whole number from 0 to {_MAX_REDIRECTS_LIMIT}"
        )
    return raw


def secret_headers(config: Mapping[str, Any]) -> frozenset[str]:
    """Names of the configured headers whose value holds a secret reference."""
    headers = config.get("headers")
    if not isinstance(headers, Mapping):
        return frozenset()
    return frozenset(
        str(name).lower()
        for name, value in headers.items()
        if any(_SECRET_REF.search(text) for text in secret_strings(value))
    )


def _origin(url: URL) -> tuple[str, str, int | None]:
    return url.scheme, (url.raw_host or "").lower(), url.port


def _same_origin(source: URL, target: URL) -> bool:
    """Same scheme, host and port, or the same host moving from http to https on default ports."""
    if _origin(source) == _origin(target):
        return True
    return (
        source.scheme == "http"
        and target.scheme == "https"
        and (source.raw_host or "").lower() == (target.raw_host or "").lower()
        and source.port == 80
        and target.port == 443
    )


def redirect_method(method: str, status: int) -> str:
    """The method of the next hop, as browsers (and httpx, and aiohttp) choose it."""
    if status == 303 and method != "HEAD":
        return "GET"
    if status in (301, 302) and method == "POST":
        return "GET"
    return method


def _host_header(url: URL) -> str:
    return url.host_port_subcomponent or ""


def redirected(
    request: HttpRequest, target: URL, status: int, secrets: frozenset[str]
) -> HttpRequest:
    """The next hop's request: to `target`, from the hop that asked for it."""
    method = redirect_method(request.method, status)
    headers = CIMultiDict(request.headers)
    if not _same_origin(request.url, target):
        for name in (*_CREDENTIAL_HEADERS, *secrets):
            headers.popall(name, None)
    body = request.body
    if method != request.method:
        body = None
        for name in ("content-type", "content-length", "transfer-encoding"):
            headers.popall(name, None)
    headers["Host"] = _host_header(target)
    return HttpRequest(
        method=method,
        url=target,
        headers=headers,
        body=body or None,
        timeout=request.timeout,
        resendable=request.resendable,
    )


def redirect_target(tool: str, where: str, url: URL, location: str) -> URL:
    """Where a redirect's Location leads, read against the URL that answered with it."""
    try:
        return url.join(_parse_url(location))
    except ValueError:
        raise ConnectorError(
            ErrorCode.DOWNSTREAM_REJECTED,
            f"{tool}: {where} redirected to an invalid URL",
            retryable=False,
        ) from None
