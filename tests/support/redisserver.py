"""A private Redis on 127.0.0.1 that a test may kill and restart empty.

The shared Redis on 6379 is used by other tests; this one belongs to one test. It keeps nothing
on disk, so a restart is always a restart with nothing in it.

    with PrivateRedis() as redis:
        url = redis.url()
        redis.kill()    # SIGKILL: clients see their connection die
        redis.start()   # the same port, empty
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess

from tests.support.server import Background, free_port, wait_until

__all__ = ["PrivateRedis"]


class PrivateRedis(Background):
    def __init__(self, port: int | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed")
        self._binary = binary
        self.port = port or free_port()
        self._proc: subprocess.Popen[bytes] | None = None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self, *, within: float = 10.0) -> None:
        """Start it (empty) and wait until it answers PING."""
        proc = self._proc = subprocess.Popen(
            [
                self._binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
        )
        wait_until(
            self._answers, within=within, what="redis-server", alive=lambda: proc.poll() is None
        )

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL, and wait for the process to be gone."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGKILL)
            self._proc.wait(10)

    def _start(self) -> None:
        self.start()

    def _stop(self) -> None:
        self.kill()
