"""The model connector's HTTP transport under the vendors' SDKs: SSRF guard, pinned address, cap.

The SDKs (`openai`, `anthropic`) send through an `httpx2.AsyncClient` they are given. Its transport
here is a thin per-call `GuardedTransport` over a pooled `httpx2.AsyncHTTPTransport` kept per
origin (scheme, host name, port), so a TLS connection verified for one name is never reused for
another that resolves to the same address. Per request it: checks the scheme and the tool's
`destinations` by name; resolves the host once and checks every address against `netguard` and
`allow_hosts` (`HttpConnector.check_destination`, the http connector's own guard); sends to a
checked address literal only (the Host header and TLS SNI keep the name, so the certificate must
match it; no second lookup, so no DNS rebinding); and reads the answer's body, decompressing it
here under the cap, so a gzip reply that inflates past `max_reply_bytes` fails after at most that
many bytes, never after inflating in memory. It asks for gzip or deflate only: the encodings it
can inflate incrementally. Redirects are never followed (the client says so too): a 3xx comes
back to the SDK as a status error. Failures leave as `ConnectorError` (the SDKs let exceptions
that are not httpx's pass through unchanged), without the tool's name: the connector adds it.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx2

from agent_reach.destinations import Destinations
from agent_reach.errors import ErrorCode
from agent_reach_connectors import netguard
from agent_reach_connectors.base import ConnectorError
from agent_reach_connectors.http import HttpConnector

# How many origins keep a connection pool; the least recently used one is closed past that.
MAX_ORIGINS = 32
_ACCEPT_ENCODING = "gzip, deflate"
_READ = "the reply"


def size_text(count: int) -> str:
    """`4 MiB`, `64 KiB` or `1000 bytes`."""
    for unit, factor in (("MiB", 1024 * 1024), ("KiB", 1024)):
        if count >= factor and count % factor == 0:
            return f"{count // factor} {unit}"
    return f"{count} bytes"


def too_large(limit: int) -> ConnectorError:
    """The error for a reply past the cap: the same request would get the same reply."""
    return ConnectorError(
        ErrorCode.CONNECTOR_ERROR,
        f"the model's reply is larger than {size_text(limit)} (max_reply_bytes); it was not read",
        retryable=False,
    )


def _bad_encoding(what: str) -> ConnectorError:
    return ConnectorError(
        ErrorCode.DOWNSTREAM_REJECTED, f"the model's reply {what}", retryable=False
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Guard:
    """What one call's requests must respect (`tool` names the call in a refusal)."""

    tool: str
    allow: netguard.Allowlist
    listed: Destinations | None
    max_bytes: int
    connect_wait: float


class _Inflater:
    """A Content-Encoding undone chunk by chunk, never producing more than `limit` bytes."""

    def __init__(self, encoding: str, limit: int) -> None:
        name = encoding.strip().lower()
        self._limit = limit
        self._size = 0
        self._raw = 0
        if name in ("", "identity"):
            self._zlib = None
        elif name in ("gzip", "x-gzip"):
            self._zlib = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif name == "deflate":
            self._zlib = zlib.decompressobj(32 + zlib.MAX_WBITS)  # zlib-wrapped (or gzip)
        else:
            raise _bad_encoding(f"came in an encoding it was not asked for ({name[:40]})")

    def _count(self, piece: bytes) -> bytes:
        self._size += len(piece)
        if self._size > self._limit:
            raise too_large(self._limit)
        return piece

    def feed(self, chunk: bytes) -> list[bytes]:
        # Compressed bytes count too: empty deflate blocks inflate to nothing, forever.
        self._raw += len(chunk)
        if self._raw > self._limit:
            raise too_large(self._limit)
        if self._zlib is None:
            return [self._count(chunk)]
        pieces: list[bytes] = []
        pending = chunk
        try:
            while pending:
                piece = self._zlib.decompress(pending, self._limit - self._size + 1)
                pieces.append(self._count(piece))
                if not piece and pending == self._zlib.unconsumed_tail:
                    break
                pending = self._zlib.unconsumed_tail
        except zlib.error:
            raise _bad_encoding("is not valid compressed data") from None
        return pieces

    def finish(self) -> bytes:
        if self._zlib is None:
            return b""
        try:
            return self._count(self._zlib.flush())
        except zlib.error:
            raise _bad_encoding("is not valid compressed data") from None


async def _read_capped(stream: AsyncIterator[bytes], encoding: str, limit: int) -> bytes:
    inflater = _Inflater(encoding, limit)
    parts: list[bytes] = []
    async for chunk in stream:
        parts.extend(inflater.feed(chunk))
    parts.append(inflater.finish())
    return b"".join(parts)


class Pools:
    """The connector's connection pools, one per origin, the oldest closed past `MAX_ORIGINS`."""

    def __init__(self, *, verify: object = True, size: int = MAX_ORIGINS) -> None:
        self._verify = verify
        self._size = size
        self._pools: OrderedDict[tuple[str, str, int], httpx2.AsyncHTTPTransport] = OrderedDict()

    async def pool(self, scheme: str, host: str, port: int) -> httpx2.AsyncHTTPTransport:
        key = (scheme, host, port)
        found = self._pools.get(key)
        if found is not None:
            self._pools.move_to_end(key)
            return found
        if len(self._pools) >= self._size:
            _, oldest = self._pools.popitem(last=False)
            await oldest.aclose()
        made = httpx2.AsyncHTTPTransport(
            verify=self._verify,  # type: ignore[arg-type]
            trust_env=False,  # no proxy and no CA bundle from the environment
            retries=0,
        )
        self._pools[key] = made
        return made

    async def close(self) -> None:
        pools, self._pools = list(self._pools.values()), OrderedDict()
        for pool in pools:
            await pool.aclose()


class GuardedTransport(httpx2.AsyncBaseTransport):
    """One call's transport: every request checked, pinned to a checked address, its reply capped.

    Closing it leaves the shared pools open (the connector closes them).
    """

    def __init__(self, pools: Pools, checker: HttpConnector, guard: Guard) -> None:
        self._pools = pools
        self._checker = checker
        self._guard = guard

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        url = request.url
        scheme = url.scheme
        reason = netguard.check_scheme(scheme)
        if reason is not None:
            raise ConnectorError(ErrorCode.DESTINATION_REFUSED, f"refused the base_url: {reason}")
        name = netguard.normalize_host(url.host)
        listed = self._guard.listed
        if listed is not None and not listed.admits_host(name, netguard.parse_ip(name)):
            raise ConnectorError(
                ErrorCode.DESTINATION_REFUSED,
                f"refused {name}: it is not one of the tool's destinations",
                retryable=False,
            )
        port = url.port or netguard.DEFAULT_PORTS[scheme]
        addresses = await self._checker.check_destination(
            self._guard.tool,
            name,
            port,
            self._guard.allow,
            what="the base_url",
            wait=self._guard.connect_wait,
        )
        pool = await self._pools.pool(scheme, name, port)
        request.headers["Accept-Encoding"] = _ACCEPT_ENCODING
        if scheme == "https" and netguard.parse_ip(name) is None:
            request.extensions = {**request.extensions, "sni_hostname": name}
        return await self._send(pool, request, addresses)

    async def _send(
        self,
        pool: httpx2.AsyncHTTPTransport,
        request: httpx2.Request,
        addresses: tuple[netguard.IPAddress, ...],
    ) -> httpx2.Response:
        original = request.url
        for index, address in enumerate(addresses, start=1):
            # The Host header was set from the name when the request was built; it stays.
            request.url = original.copy_with(host=address.compressed)
            try:
                response = await pool.handle_async_request(request)
            except httpx2.ConnectError:
                if index == len(addresses):
                    raise  # nothing was sent to any address: the SDK calls it a connection error
                continue
            finally:
                request.url = original
            return await self._read(response)
        raise AssertionError("unreachable: a checked destination has an address")

    async def _read(self, response: httpx2.Response) -> httpx2.Response:
        stream = response.stream
        assert isinstance(stream, httpx2.AsyncByteStream)
        try:
            body = await _read_capped(
                aiter(stream),
                response.headers.get("Content-Encoding", ""),
                self._guard.max_bytes,
            )
        finally:
            await stream.aclose()
        headers = [
            (k, v)
            for k, v in response.headers.multi_items()
            if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")
        ]
        return httpx2.Response(
            response.status_code, headers=headers, content=body, extensions=response.extensions
        )
