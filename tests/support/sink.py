"""An idempotent HTTP sink on 127.0.0.1: records every delivery, applies each key's effect once.

Scripted per path: each request takes the next scripted Response (the last one repeats), which
can set a status, Retry-After, a delay, a JSON body, or drop the connection after reading the
request. Usable from sync and async tests (it runs in its own threads).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlsplit


@dataclass(frozen=True, slots=True, kw_only=True)
class Response:
    status: int = 200
    json: Any = None
    retry_after: str | float | None = None
    delay: float = 0.0
    drop: bool = False  # close the connection after reading the request, answer nothing


@dataclass(frozen=True, slots=True, kw_only=True)
class Delivery:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes
    at: float
    key: str | None = field(default=None)

    @property
    def body_hash(self) -> str:
        return hashlib.sha256(self.body).hexdigest()

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    sink: Sink


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        parts = urlsplit(self.path)
        delivery = Delivery(
            method=self.command,
            path=parts.path,
            query=parse_qs(parts.query),
            headers={k.lower(): v for k, v in self.headers.items()},
            body=body,
            at=time.monotonic(),
            key=self.headers.get("Idempotency-Key"),
        )
        response = self.server.sink._record(delivery)
        if response.delay:
            time.sleep(response.delay)
        if response.drop:
            self.close_connection = True
            self.connection.close()
            return
        data = json.dumps(response.json if response.json is not None else {}).encode()
        self.send_response(response.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if response.retry_after is not None:
            self.send_header("Retry-After", str(response.retry_after))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle


class Sink:
    """`with Sink() as sink:` serves on `sink.url` until the block ends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._scripts: dict[str, list[Response]] = {}
        self._served: Counter[str] = Counter()
        self._deliveries: list[Delivery] = []
        self._effects: Counter[str] = Counter()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.sink = self
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> Sink:
        self._thread.start()
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self._server.shutdown()
        self._server.server_close()

    def script(self, path: str, responses: list[Response]) -> None:
        """Answer requests to `path` with these responses in turn; the last one repeats."""
        with self._lock:
            self._scripts[path] = list(responses)
            self._served[path] = 0

    def _record(self, delivery: Delivery) -> Response:
        with self._lock:
            self._deliveries.append(delivery)
            script = self._scripts.get(delivery.path) or [Response()]
            response = script[min(self._served[delivery.path], len(script) - 1)]
            self._served[delivery.path] += 1
            if 200 <= response.status < 300 and not response.drop:
                # The effect of a key is applied once, however often it is delivered.
                key = delivery.key or delivery.body_hash
                self._effects[key] += 0 if self._effects[key] else 1
            return response

    def requests(self, path: str | None = None) -> list[Delivery]:
        with self._lock:
            return [d for d in self._deliveries if path is None or d.path == path]

    def effects(self) -> dict[str, int]:
        """Applied effects per idempotency key (1 each, by construction of an idempotent sink)."""
        with self._lock:
            return dict(self._effects)

    def deliveries_per_key(self) -> dict[str, int]:
        with self._lock:
            return dict(Counter(d.key for d in self._deliveries if d.key))
