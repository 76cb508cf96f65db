"""Composition root of an executor process: settings, connectors, client, worker, signals."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Iterator, Sequence
from importlib.metadata import PackageNotFoundError, version

from agent_reach_connectors.base import Connector, load_connectors
from agent_reach_executor.client import ControllerClient, Tls
from agent_reach_executor.metrics import serving
from agent_reach_executor.runner import StepRunner
from agent_reach_executor.settings import ExecutorSettings
from agent_reach_executor.worker import Worker

log = logging.getLogger(__name__)


async def run_executor(
    settings: ExecutorSettings,
    *,
    connectors: dict[str, Connector] | None = None,
    stop: asyncio.Event | None = None,
    handle_signals: bool = True,
) -> None:
    """Run one executor until `stop` is set (or SIGTERM/SIGINT arrives), then drain and return.

    `connectors` defaults to the discovered ones named in `settings.connectors` (all when None).
    Signal handlers are installed only when `handle_signals` is true and this is the main thread.
    """
    stop = asyncio.Event() if stop is None else stop
    hosted = load_connectors(settings.connectors) if connectors is None else connectors
    started: list[Connector] = []
    try:
        for connector in hosted.values():
            await connector.start()
            started.append(connector)
        async with ControllerClient(
            settings.controller,
            executor_id=settings.executor_id,
            token=settings.token.get_secret_value() if settings.token else None,
            tls=_tls(settings),
            reconnect_initial=settings.reconnect_initial,
            reconnect_maximum=settings.reconnect_maximum,
            stream=settings.stream,
            streams=settings.pollers,  # one per poller: their polls spread over the replicas
        ) as client:
            runner = StepRunner(hosted, default_timeout_s=settings.default_step_timeout)
            worker = Worker(
                client, runner, connectors=list(hosted), settings=settings, version=_version()
            )
            with (
                _stop_on_signals(stop, enabled=handle_signals),
                _metrics_listener(settings, worker),
            ):
                await worker.run(stop)
    finally:
        await _close_all(started)


def _tls(settings: ExecutorSettings) -> Tls | None:
    if settings.tls_ca is None:
        return None
    return Tls(
        ca=settings.tls_ca,
        cert=settings.tls_cert,
        key=settings.tls_key,
        server_name=settings.tls_server_name,
    )


@contextlib.contextmanager
def _metrics_listener(settings: ExecutorSettings, worker: Worker) -> Iterator[None]:
    """Serve the worker's metrics and readiness on `settings.metrics` while it runs (nothing
    when unset)."""
    if settings.metrics is None:
        yield
        return
    with serving(settings.metrics, worker.metrics.registry, worker.readiness) as bound:
        log.info(
            "executor metrics at http://%s/metrics, readiness at /readyz",
            bound,
            extra={"event": "metrics_listening", "address": bound},
        )
        yield


async def _close_all(connectors: Sequence[Connector]) -> None:
    for connector in reversed(connectors):
        try:
            await connector.close()
        except Exception:
            log.exception(
                "connector %r failed to close",
                connector.name,
                extra={"event": "connector_close_failed"},
            )


@contextlib.contextmanager
def _stop_on_signals(stop: asyncio.Event, *, enabled: bool) -> Iterator[None]:
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT)
    for sig in signals:
        loop.add_signal_handler(sig, _on_signal, stop, sig)
    try:
        yield
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)


def _on_signal(stop: asyncio.Event, sig: signal.Signals) -> None:
    log.info("received %s: draining", sig.name, extra={"event": "signal_received"})
    stop.set()


def _version() -> str:
    try:
        return version("agent-reach")
    except PackageNotFoundError:
        return "0+unknown"


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m agent_reach_executor [--controller HOST:PORT] [--slots N] [--connector NAME]`."""
    parser = argparse.ArgumentParser(prog="agent_reach_executor", description=__doc__)
    parser.add_argument("--controller", help="controller gRPC host:port")
    parser.add_argument("--slots", type=int, help="steps run at once")
    parser.add_argument("--connector", action="append", dest="connectors", help="repeatable")
    parser.add_argument("--metrics", help="serve Prometheus metrics on HOST:PORT")
    args = parser.parse_args(argv)
    overrides = {k: v for k, v in vars(args).items() if v is not None}
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    asyncio.run(run_executor(ExecutorSettings(**overrides)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
