"""`reach controller --workers N`: N controller processes on the same REST and gRPC ports.

The parent reserves both ports (bound with SO_REUSEPORT, never listening, so it takes no
connection), applies migrations once if asked, and starts N workers. Each worker is a whole
controller (its own event loop, connection pool and sweeps, like a replica) that binds the same
ports with SO_REUSEPORT; the kernel spreads new connections among them. Everything a replica
keeps in memory is already correct across replicas (API keys are re-read within seconds, leases
and admission live in the database), so it is across workers too.

The parent writes the ready file once every worker listens, forwards SIGTERM/SIGINT to them and
waits for their graceful shutdown; if a worker dies, the others are stopped and the parent exits
non-zero, so the supervisor above (Kubernetes, systemd) restarts the whole controller.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import signal
import socket
import tempfile
import time
from multiprocessing.connection import wait
from pathlib import Path
from types import FrameType
from typing import Any

from agent_reach.addresses import split_address

log = logging.getLogger("agent_reach_controller.workers")

START_WITHIN_S = 60.0
# A worker's own graceful shutdown takes up to ~10 s (HTTP and gRPC grace of 5 s each).
STOP_WITHIN_S = 20.0


def _reserve(address: str) -> tuple[socket.socket, str]:
    """Bind `address` with SO_REUSEPORT without listening; the concrete HOST:PORT."""
    host, port = split_address(address)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    bound = sock.getsockname()[1]
    return sock, f"[{host}]:{bound}" if family == socket.AF_INET6 else f"{host}:{bound}"


def _ready(path: Path) -> dict[str, Any] | None:
    """A worker's ready file, once it is there and whole (it may be read mid-write)."""
    try:
        found: dict[str, Any] = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return found


def _stop(workers: list[Any]) -> None:
    for worker in workers:
        if worker.is_alive():
            worker.terminate()  # SIGTERM: the worker's own graceful shutdown
    deadline = time.monotonic() + STOP_WITHIN_S
    for worker in workers:
        worker.join(max(0.0, deadline - time.monotonic()))
        if worker.is_alive():
            worker.kill()
            worker.join()


def supervise(settings: Any) -> int:
    """Run `settings.workers` controller processes until SIGTERM/SIGINT or one of them dies."""
    from agent_reach_cli.process_commands import controller_worker
    from agent_reach_controller.storage import migrate
    from agent_reach_controller.storage.engine import is_postgres

    url = settings.database_url.get_secret_value()
    if not is_postgres(url):
        log.error("--workers needs Postgres: SQLite has one writer, so one process")
        return 2
    if settings.migrate:
        migrate.upgrade(url)
    stopping: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stopping.append(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    http_sock, http = _reserve(settings.http)
    grpc_sock, grpc = _reserve(settings.grpc)
    spawn = multiprocessing.get_context("spawn")
    workers: list[Any] = []
    with tempfile.TemporaryDirectory(prefix="reach-workers-") as scratch:
        readies = [Path(scratch) / f"worker-{i}.json" for i in range(settings.workers)]
        for i, ready in enumerate(readies):
            one = settings.model_copy(
                update={
                    "http": http,
                    "grpc": grpc,
                    "workers": 1,
                    "reuse_port": True,
                    "migrate": False,
                    "ready_file": ready,
                }
            )
            worker = spawn.Process(target=controller_worker, args=(one,), name=f"worker-{i}")
            worker.start()
            workers.append(worker)
        try:
            deadline = time.monotonic() + START_WITHIN_S
            while not all(_ready(r) for r in readies):
                if stopping or any(not w.is_alive() for w in workers):
                    return _ended(workers, stopping)
                if time.monotonic() > deadline:
                    log.error("controller workers did not start within %.0f s", START_WITHIN_S)
                    _stop(workers)
                    return 1
                time.sleep(0.05)
        finally:
            http_sock.close()
            grpc_sock.close()
    pids = [w.pid for w in workers]
    if settings.ready_file is not None:
        settings.ready_file.write_text(json.dumps({"http": http, "grpc": grpc, "workers": pids}))
    log.info(
        "controller listening with %d workers: http=%s grpc=%s",
        len(workers),
        http,
        grpc,
        extra={"event": "controller_workers_started", "workers": pids},
    )
    while not stopping and all(w.is_alive() for w in workers):
        wait([w.sentinel for w in workers], timeout=0.5)
    return _ended(workers, stopping)


def _ended(workers: list[Any], stopping: list[int]) -> int:
    """Stop every worker; 0 if asked to stop, 1 if a worker died on its own."""
    died = [w for w in workers if not w.is_alive()]
    if not stopping:
        for worker in died:
            log.error(
                "controller worker %s (pid %s) exited with %s: stopping the others",
                worker.name,
                worker.pid,
                worker.exitcode,
                extra={"event": "controller_worker_died"},
            )
    _stop(workers)
    return 0 if stopping else 1
