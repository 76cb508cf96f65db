"""Running a controller: REST and gRPC listeners, the reaper, and a clean shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import uvicorn
from grpc_health.v1 import health_pb2

from agent_reach.addresses import ListenError, split_address
from agent_reach_controller.api.app import create_app
from agent_reach_controller.rpc import tls
from agent_reach_controller.rpc.servicer import ExecutorService, build_server
from agent_reach_controller.runtime import Components, background, open_components
from agent_reach_controller.settings import ControllerSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class Bound:
    """Where a running controller listens (ports resolved when 0 was asked for)."""

    http: str
    grpc: str


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the process's composition root owns SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _bind(address: str, *, reuse_port: bool = False) -> socket.socket:
    host, port = split_address(address)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:  # the workers of one controller: the kernel spreads connections among them
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    # Accepted sockets inherit this: without it a keep-alive client waits out its delayed ACK
    # (about 40 ms) on every response that is written in more than one piece.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ListenError(
            f"cannot listen on {address} (REST): {exc.strerror or exc}; "
            "another process holds it, or choose another with --http"
        ) from exc
    sock.listen(512)
    sock.setblocking(False)
    return sock


@contextlib.asynccontextmanager
async def running_controller(
    settings: ControllerSettings,
) -> AsyncIterator[tuple[Components, Bound]]:
    """Start everything; on exit, stop taking requests and shut down within a grace period."""
    components = await open_components(settings)
    http_sock = _bind(settings.http, reuse_port=settings.reuse_port)
    host, http_port = http_sock.getsockname()[:2]
    grpc_host, _ = split_address(settings.grpc)
    service = ExecutorService(
        parts=components,
        auth=settings.executor_auth,
        peer_pool=tls.peer_pool if settings.grpc_client_ca is not None else None,
    )
    if settings.executor_auth == "off":
        log.warning(
            "executor authentication is OFF: any process that reaches %s can run steps",
            settings.grpc,
            extra={"event": "executor_auth_off"},
        )
    credentials = (
        tls.server_credentials(
            cert=settings.tls_cert, key=settings.tls_key, client_ca=settings.grpc_client_ca
        )
        if settings.tls_cert is not None and settings.tls_key is not None
        else None
    )
    grpc_server, grpc_port, health = build_server(
        service, settings.grpc, credentials=credentials, reuse_port=settings.reuse_port
    )
    await grpc_server.start()
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    await health.set("agent_reach.v1.ExecutorService", health_pb2.HealthCheckResponse.SERVING)
    app = create_app(components)
    config = uvicorn.Config(
        app,
        log_config=None,
        access_log=False,
        lifespan="off",
        loop="none",  # the process's own (uvloop under `reach`)
        http="httptools",
        server_header=False,  # no "server: uvicorn" on every answer: it names what runs here
        timeout_graceful_shutdown=5,
        timeout_keep_alive=settings.http_keep_alive_seconds,
        ssl_certfile=settings.tls_cert,
        ssl_keyfile=settings.tls_key,
    )
    http_server = _Server(config)
    http_task = asyncio.create_task(http_server.serve(sockets=[http_sock]), name="http")
    bound = Bound(http=f"{host}:{http_port}", grpc=f"{grpc_host}:{grpc_port}")
    if settings.ready_file is not None:
        settings.ready_file.write_text(json.dumps({"http": bound.http, "grpc": bound.grpc}))
    log.info(
        "controller listening: http=%s grpc=%s database=%s",
        bound.http,
        bound.grpc,
        components.db.dialect,
        extra={"event": "controller_started"},
    )
    try:
        mcp = app.state.mcp.running() if app.state.mcp is not None else contextlib.nullcontext()
        async with background(components), mcp:
            yield components, bound
    finally:
        # Not ready from now on (HTTP and gRPC health), still serving for shutdown_delay: what
        # routes here (a Service's endpoints, a load balancer) moves away before the listeners go.
        components.stopping = True
        await health.enter_graceful_shutdown()
        if settings.shutdown_delay:
            log.info(
                "stopping: not ready, serving %.1fs more",
                settings.shutdown_delay,
                extra={"event": "controller_stopping"},
            )
            await asyncio.sleep(settings.shutdown_delay)
        # Live event streams end now (their clients resume elsewhere with Last-Event-ID) rather
        # than holding the HTTP server's graceful shutdown open until its timeout.
        await components.feed.close()
        # So do `?wait=` requests: they answer with the task as it stands (202, Location).
        await components.queries.close()
        http_server.should_exit = True
        await service.close_streams(grace=5)
        await grpc_server.stop(grace=5)
        with contextlib.suppress(asyncio.CancelledError):
            await http_task
        http_sock.close()
        await components.close()
        log.info("controller stopped", extra={"event": "controller_stopped"})


async def serve(settings: ControllerSettings, *, stop: asyncio.Event) -> None:
    """Run a controller until `stop` is set."""
    async with running_controller(settings):
        await stop.wait()
