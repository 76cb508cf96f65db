"""What the tests' background servers share: `with X() as x:` starts one beside the test and
the end of the block stops it and frees what it held; ports of 127.0.0.1 the OS picks; a wait
for readiness with a deadline; an HTTP server served from a thread.

    class Echo(HttpServer):
        def __init__(self) -> None:
            super().__init__(_Handler, name="echo")

    with Echo() as echo:
        httpx.get(f"{echo.url}/hi")

Each server keeps its own behaviour; a subclass says only how it starts (`_start`, nothing by
default: some are running once made) and how it stops (`_stop`).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Self

__all__ = ["Background", "HttpServer", "free_port", "loopback_socket", "wait_until"]

HOST = "127.0.0.1"


class Background:
    """Something a test runs beside it, as a context manager: entering starts it and returns it;
    leaving stops it (threads joined, sockets closed, processes ended, files closed)."""

    def _start(self) -> None:
        """Begin serving (nothing by default: the server was started when it was made)."""

    def _stop(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not say how it stops")

    def __enter__(self) -> Self:
        self._start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop()


def loopback_socket() -> socket.socket:
    """A TCP socket bound to a port of 127.0.0.1 the OS picked (SO_REUSEADDR), not listening."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, 0))
    return sock


def free_port() -> int:
    """A port of 127.0.0.1 that was free a moment ago: nothing listens on it now (connecting is
    refused) and a server started next may take it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def wait_until(
    ready: Callable[[], bool],
    *,
    within: float,
    what: str,
    alive: Callable[[], bool] = lambda: True,
) -> None:
    """Return once `ready()`; RuntimeError when `alive()` turns false first or `within` seconds
    pass (`what` names the server in the message)."""
    deadline = time.monotonic() + within
    while not ready():
        if not alive():
            raise RuntimeError(f"{what} stopped before it was ready")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} was not ready within {within:g}s")
        time.sleep(0.02)


class HttpServer(Background):
    """A `ThreadingHTTPServer` (or a subclass: `server_class`) on a free port of 127.0.0.1,
    serving `handler` from a daemon thread; `url` is `http://127.0.0.1:<port>`."""

    def __init__(
        self,
        handler: type[BaseHTTPRequestHandler],
        *,
        server_class: type[ThreadingHTTPServer] = ThreadingHTTPServer,
        name: str = "http",
        poll_interval: float = 0.5,
    ) -> None:
        self._server = server_class((HOST, 0), handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": poll_interval},
            name=name,
            daemon=True,
        )

    @property
    def port(self) -> int:
        port: int = self._server.server_address[1]
        return port

    @property
    def url(self) -> str:
        """`http://127.0.0.1:<port>`, without a trailing slash."""
        return f"http://{HOST}:{self.port}"

    def _start(self) -> None:
        self._thread.start()

    def _stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
