"""A scriptable, idempotent HTTP downstream on 127.0.0.1 that records every request it gets.

Usage (sync or async tests alike; the server runs in its own threads, so any process can call it):

    with Sink() as sink:
        sink.script("/pay", [Response(status=503, retry_after=1), Response(json={"ok": True})])
        ... call f"{sink.url}/pay" ...
        assert sink.effects() == {"task:s1": 1}
        [first, second] = sink.requests("/pay")

Each request to a path takes that path's next scripted `Response`; the last one repeats; an
unscripted path answers 200 `{}`. An effect is applied when the answer is 2xx (or when the
response says `applied=True`, e.g. to model "applied, then the connection dropped"), and only once
per `Idempotency-Key`, as an idempotent downstream would. Requests without a key cannot be
deduplicated: each one applies, counted under the key "".
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import socket
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.support.server import HttpServer

__all__ = ["Delivery", "Response", "Sink"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Response:
    """One scripted answer.

    `json` is sent as `application/json` (default `{}`), unless `body` is given (sent with
    `content_type`); a 1xx, 204 or 304 answer carries no body, as HTTP requires. `retry_after`
    becomes a Retry-After header (seconds or an HTTP-date string). `delay` waits before
    answering. `drop` closes the connection after reading the request
    without answering; `reset` does the same with a TCP RST. `applied` overrides whether the
    request's effect counts as applied (default: a 2xx that is actually answered). `echo` adds a
    `delivery` object to the JSON answer (`seq`, `key` and the `x-executor` header), so a caller's
    stored output shows which delivery produced it.
    """

    status: int = 200
    json: Any = None
    body: str | bytes | None = None
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()
    retry_after: str | float | None = None
    delay: float = 0.0
    drop: bool = False
    reset: bool = False
    applied: bool | None = None
    echo: bool = False

    @property
    def applies(self) -> bool:
        """Whether answering this applies the request's effect."""
        if self.applied is not None:
            return self.applied
        return 200 <= self.status < 300 and not (self.drop or self.reset)

    def payload(self, delivery: Delivery | None = None) -> tuple[bytes, str]:
        """The body bytes and their content type (with `echo`, about `delivery`)."""
        if self.body is not None:
            data = self.body.encode() if isinstance(self.body, str) else self.body
            return data, self.content_type
        value = {} if self.json is None else self.json
        if self.echo and delivery is not None and isinstance(value, dict):
            value = {
                **value,
                "delivery": {
                    "seq": delivery.seq,
                    "key": delivery.key,
                    "executor": delivery.headers.get("x-executor"),
                },
            }
        return json.dumps(value).encode(), "application/json"


@dataclass(frozen=True, slots=True, kw_only=True)
class Delivery:
    """One request as the sink received it (header names lower-cased)."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes
    at: float  # time.monotonic() on arrival (system-wide on Linux, comparable across processes)
    wall: float  # time.time() on arrival
    key: str | None = None  # the Idempotency-Key header, if any
    seq: int = 0  # 1-based order of arrival at this sink

    @property
    def traceparent(self) -> str | None:
        """The W3C traceparent header, if any."""
        return self.headers.get("traceparent")

    @property
    def body_hash(self) -> str:
        """SHA-256 of the body, to compare deliveries of the same key."""
        return hashlib.sha256(self.body).hexdigest()

    def json(self) -> Any:
        """The body parsed as JSON (None when empty)."""
        return json.loads(self.body) if self.body else None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 128  # bursts of parallel clients must queue, not be refused
    sink: Sink

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients that time out or go away mid-answer are the point of many tests: not errors.
        return


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # otherwise every keep-alive answer waits ~40 ms (delayed ACK)

    def log_message(self, format: str, *args: Any) -> None:
        return

    def setup(self) -> None:
        super().setup()
        self.server.sink._track(self.connection, open_=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.sink._track(self.connection, open_=False)

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline().strip():
                pass  # trailers
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _handle(self) -> None:
        body = self._read_body()
        parts = urlsplit(self.path)
        delivery = Delivery(
            method=self.command,
            path=parts.path,
            query=parse_qs(parts.query, keep_blank_values=True),
            headers={k.lower(): v for k, v in self.headers.items()},
            body=body,
            at=time.monotonic(),
            wall=time.time(),
            key=self.headers.get("Idempotency-Key"),
        )
        response, delivery = self.server.sink._record(delivery)
        if response.delay and self.server.sink._stopping.wait(response.delay):
            return
        if response.drop or response.reset:
            if response.reset:
                self.connection.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )
            self.close_connection = True
            self.connection.close()
            return
        self._answer(response, delivery)

    def _answer(self, response: Response, delivery: Delivery) -> None:
        data, content_type = response.payload(delivery)
        # HTTP forbids a body (and its length) on 1xx, 204 and 304: a client reading one there
        # would take it for the start of the next answer on the connection.
        bodiless = response.status < 200 or response.status in (204, 304)
        if bodiless:
            data = b""
        self.send_response(response.status)
        self.send_header("Content-Type", content_type)
        if not bodiless:
            self.send_header("Content-Length", str(len(data)))
        if response.retry_after is not None:
            self.send_header("Retry-After", str(response.retry_after))
        for name, value in response.headers:
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _handle


class Sink(HttpServer):
    """A recording, scriptable, idempotent HTTP server on 127.0.0.1 (a free port).

    `with Sink() as sink:` serves on `sink.url` until the block ends, then closes every
    connection (clients see a dropped connection, not a hang). Thread-safe throughout.
    """

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._stopping = threading.Event()
        self._scripts: dict[str, list[Response]] = {}
        self._served: Counter[str] = Counter()
        self._deliveries: list[Delivery] = []
        self._effects: Counter[str] = Counter()
        self._connections: set[socket.socket] = set()
        super().__init__(_Handler, server_class=_Server, name="sink", poll_interval=0.05)
        assert isinstance(self._server, _Server)
        self._server.sink = self

    def _stop(self) -> None:
        self._stopping.set()
        super()._stop()
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    def script(self, path: str, responses: list[Response]) -> None:
        """Answer requests to `path` with these responses in turn; the last one repeats."""
        if not responses:
            raise ValueError("script at least one Response")
        with self._lock:
            self._scripts[path] = list(responses)
            self._served[path] = 0

    def requests(self, path: str | None = None) -> list[Delivery]:
        """Every request received so far (to `path` only, if given), oldest first."""
        with self._lock:
            return [d for d in self._deliveries if path is None or d.path == path]

    def wait_for_requests(
        self, count: int, *, path: str | None = None, timeout: float = 5.0
    ) -> list[Delivery]:
        """Block until at least `count` requests (to `path`) arrived; TimeoutError otherwise."""
        with self._lock:
            if not self._lock.wait_for(lambda: len(self._matching(path)) >= count, timeout):
                raise TimeoutError(f"{len(self._matching(path))} of {count} requests arrived")
            return self._matching(path)

    def effects(self) -> dict[str, int]:
        """Applied effects per Idempotency-Key: 1 per key; "" counts requests without a key."""
        with self._lock:
            return dict(self._effects)

    def deliveries_per_key(self) -> dict[str, int]:
        """How many requests carried each Idempotency-Key (retries deliver a key again)."""
        with self._lock:
            return dict(Counter(d.key for d in self._deliveries if d.key))

    def _matching(self, path: str | None) -> list[Delivery]:
        return [d for d in self._deliveries if path is None or d.path == path]

    def _track(self, connection: socket.socket, *, open_: bool) -> None:
        with self._lock:
            if open_:
                self._connections.add(connection)
            else:
                self._connections.discard(connection)

    def _record(self, delivery: Delivery) -> tuple[Response, Delivery]:
        with self._lock:
            delivery = replace(delivery, seq=len(self._deliveries) + 1)
            self._deliveries.append(delivery)
            script = self._scripts.get(delivery.path) or [Response()]
            response = script[min(self._served[delivery.path], len(script) - 1)]
            self._served[delivery.path] += 1
            if response.applies:
                key = delivery.key or ""
                if not key or not self._effects[key]:
                    self._effects[key] += 1
            self._lock.notify_all()
            return response, delivery
