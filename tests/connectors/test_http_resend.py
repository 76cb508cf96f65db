"""The http connector never sends a call twice on its own, unless the tool is idempotent.

A real server on 127.0.0.1 answers the first request on each connection (keeping it alive) and
closes the connection right after reading the second, without answering: the client sees a
kept-alive connection that turned out closed, after its request may have been applied.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from agent_reach_connectors import ConnectorError, ToolCall
from agent_reach_connectors.http import HttpConnector

OK = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n"
    b"Connection: keep-alive\r\n\r\n"
    b'{"ok":true}'
)


@dataclass
class Received:
    """What the server read: (connection number, method, path), in arrival order."""

    requests: list[tuple[int, str, str]] = field(default_factory=list)

    def of(self, method: str) -> list[int]:
        """The connections on which `method /order` arrived."""
        return [conn for conn, m, path in self.requests if (m, path) == (method, "/order")]


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str] | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    if length:
        await reader.readexactly(length)
    return method, path.split("?", 1)[0]


@asynccontextmanager
async def one_answer_per_connection() -> AsyncIterator[tuple[str, Received]]:
    """A server that answers a connection's first request and hangs up on its second."""
    received = Received()
    connections = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        number = connections
        try:
            for index in range(2):
                request = await _read_request(reader)
                if request is None:
                    return
                received.requests.append((number, *request))
                if index == 0:
                    writer.write(OK)
                    await writer.drain()
        finally:
            writer.close()  # the second request is read, never answered

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", received
    finally:
        server.close()
        await server.wait_closed()


def _call(url: str, method: str, *, idempotent: bool) -> ToolCall:
    return ToolCall(
        tool="order.update",
        task_id="task",
        step_id="s1",
        args={"n": 1},
        config={"method": method, "url": url, "allow_hosts": ["127.0.0.1"]},
        idempotency_key="task:s1",
        attempt=1,
        max_attempts=3,
        trace_id="4bf92f3577b34da6a3ce929d0e0e4736",
        traceparent="",
        timeout_s=5.0,
        idempotent=idempotent,
    )


@pytest.fixture
async def http() -> AsyncIterator[HttpConnector]:
    connector = HttpConnector()
    yield connector
    await connector.close()


async def _warm_then(
    http: HttpConnector, base: str, method: str, *, idempotent: bool
) -> tuple[Any, ConnectorError | None]:
    """One answered call to leave a connection in the pool, then `method` on it."""
    assert await http.invoke(_call(f"{base}/warm", "GET", idempotent=True)) == {"ok": True}
    try:
        return await http.invoke(_call(f"{base}/order", method, idempotent=idempotent)), None
    except ConnectorError as error:
        return None, error


@pytest.mark.parametrize("method", ["PUT", "DELETE", "GET", "POST"])
async def test_a_call_of_a_tool_not_declared_idempotent_is_never_resent(http, method) -> None:
    async with one_answer_per_connection() as (base, received):
        output, error = await _warm_then(http, base, method, idempotent=False)
    assert output is None
    assert error is not None
    assert (error.code, error.retryable, error.maybe_applied) == ("connection_error", True, True)
    assert "may have been applied" in error.message
    # Sent once, on the kept-alive connection; no new connection was opened for it.
    assert received.of(method) == [1]
    assert len(received.requests) == 2


@pytest.mark.parametrize("method", ["GET", "PUT"])
async def test_a_call_of_an_idempotent_tool_is_resent_once_on_a_new_connection(
    http, method
) -> None:
    async with one_answer_per_connection() as (base, received):
        output, error = await _warm_then(http, base, method, idempotent=True)
    assert error is None
    assert output == {"ok": True}
    assert received.of(method) == [1, 2]


async def test_even_an_idempotent_post_is_never_resent(http) -> None:
    async with one_answer_per_connection() as (base, received):
        _, error = await _warm_then(http, base, "POST", idempotent=True)
    assert error is not None
    assert error.maybe_applied
    assert received.of("POST") == [1]
