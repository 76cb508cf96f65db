"""The executor's Prometheus metrics (one registry per worker) and the listener serving them.

Names and labels are in `agent_reach.metrics`. The listener is a small threaded WSGI server on a
daemon thread: prometheus_client's app at /metrics (any other path too, as before), which
answers OpenMetrics (with exemplars) when the scraper asks, and /readyz (`probes`).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator, Mapping
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily
from prometheus_client.exposition import make_wsgi_app
from prometheus_client.registry import Collector

from agent_reach import metrics as m
from agent_reach.addresses import split_address
from agent_reach_executor.client import Assignment, StepResult
from agent_reach_executor.probes import ReadinessState, with_readyz


class ExecutorMetrics:
    """Slots, calls and reports of one worker, in its own registry."""

    def __init__(self, *, slots: int, calls: Mapping[tuple[str, str], int] | None = None) -> None:
        """`calls`: the client's count of its calls by (method, transport), read at each scrape."""
        self.registry = CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)
        if calls is not None:
            r.register(_CallsCollector(calls))
        self._slots = Gauge(
            m.EXECUTOR_SLOTS, "Step slots of this executor, busy or free.", [m.STATE], registry=r
        )
        self._calls = Histogram(
            m.EXECUTOR_CALL_DURATION,
            "How long a step's call through its connector took here, by outcome.",
            [m.TOOL, m.OUTCOME],
            buckets=m.LATENCY_BUCKETS,
            registry=r,
        )
        self._results = Counter(
            m.EXECUTOR_RESULTS,
            "Results reported to the controller, by whether it applied them.",
            [m.RESULT],
            registry=r,
        )
        self._total = slots
        # Children looked up once: `labels()` costs more than the update (twice per step).
        self._busy, self._free = self._slots.labels(m.BUSY), self._slots.labels(m.FREE)
        self.slots_busy(0)

    def slots_busy(self, busy: int) -> None:
        self._busy.set(busy)
        self._free.set(max(0, self._total - busy))

    def call_finished(self, assignment: Assignment, result: StepResult) -> None:
        seconds = max(0.0, (result.finished_at_ms - result.started_at_ms) / 1000)
        outcome = m.SUCCEEDED if result.succeeded else m.FAILED
        exemplar = {m.TRACE_ID: assignment.trace_id} if assignment.trace_id else None
        self._calls.labels(assignment.tool, outcome).observe(seconds, exemplar=exemplar)

    def reported(self, *, accepted: bool) -> None:
        self._results.labels(m.ACCEPTED if accepted else m.REJECTED).inc()


class _CallsCollector(Collector):
    """The client's own count of calls, exposed as a counter (counted there at no lock's cost)."""

    def __init__(self, calls: Mapping[tuple[str, str], int]) -> None:
        self._calls = calls

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            m.EXECUTOR_CONTROLLER_CALLS,
            "Calls to the controller, by method and transport (unary, or the Exchange stream).",
            labels=[m.METHOD, m.TRANSPORT],
        )
        for (method, transport), count in sorted(dict(self._calls).items()):
            family.add_metric([method, transport], count)
        yield family


class _Listener(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a slow scraper never holds the executor's exit


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes and probes are not news (the base class writes each to stderr)."""


@contextlib.contextmanager
def serving(address: str, registry: CollectorRegistry, readiness: ReadinessState) -> Iterator[str]:
    """Serve `registry` at http://HOST:PORT/metrics and `readiness` at /readyz for the life of
    the block; yields the bound address (port 0 picks a free one)."""
    host, port = split_address(address)
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]

    class Listener(_Listener):
        address_family = family  # IPv6 when HOST is one

    app = with_readyz(make_wsgi_app(registry), readiness)
    server: WSGIServer = make_server(host, port, app, Listener, handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, name="executor-metrics", daemon=True)
    thread.start()
    try:
        bound = server.server_address[1]
        yield f"[{host}]:{bound}" if ":" in host else f"{host}:{bound}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
