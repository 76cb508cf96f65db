"""ExecutorService: the executors' only door into the controller."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry.trace import SpanKind

from agent_reach import telemetry
from agent_reach.telemetry import tracing_enabled
from agent_reach.v1 import executor_pb2 as pb
from agent_reach.v1 import executor_pb2_grpc as pb_grpc
from agent_reach_controller.db.engine import STORAGE_DOWN
from agent_reach_controller.rpc.convert import (
    BadResultError,
    assignment_to_proto,
    result_from_proto,
    to_ms,
)
from agent_reach_controller.state.dispatch import DispatchService
from agent_reach_controller.state.records import StepRow
from agent_reach_controller.state.registry import ToolRegistry

log = logging.getLogger(__name__)
MAX_BATCH = 1000


Handler = Callable[[Any, Any, Any], Awaitable[Any]]


def _storage_unavailable(method: Handler) -> Handler:
    """A lost database answers UNAVAILABLE (executors retry it), not UNKNOWN with a traceback."""

    @functools.wraps(method)
    async def handler(self: Any, request: Any, context: Any) -> Any:
        try:
            return await method(self, request, context)
        except STORAGE_DOWN as exc:
            log.warning(
                "%s: storage unavailable (%s)",
                method.__name__,
                type(exc).__name__,
                extra={"event": "storage_down"},
            )
            await context.abort(grpc.StatusCode.UNAVAILABLE, "storage is unavailable; retry")

    return handler


def _leases(pairs: list[tuple[int, int]]) -> list[pb.LeaseRef]:
    return [pb.LeaseRef(step_key=k, attempt=a) for k, a in pairs]


class ExecutorService(pb_grpc.ExecutorServiceServicer):  # type: ignore[misc]
    """Translates the wire protocol to DispatchService calls; holds no state of its own."""

    def __init__(self, *, dispatch: DispatchService, registry: ToolRegistry) -> None:
        self._dispatch = dispatch
        self._registry = registry

    async def Register(self, request: pb.RegisterRequest, context: Any) -> pb.RegisterResponse:
        lease_ms = int(self._dispatch.timings.lease.total_seconds() * 1000)
        log.info(
            "executor %s registered: connectors=%s slots=%d",
            request.executor_id,
            ",".join(request.connectors),
            request.slots,
            extra={"event": "executor_registered"},
        )
        return pb.RegisterResponse(
            lease_ms=lease_ms,
            heartbeat_interval_ms=max(100, lease_ms // 3),
            max_poll_wait_ms=int(self._dispatch.timings.max_poll_wait * 1000),
        )

    @_storage_unavailable
    async def PollSteps(self, request: pb.PollStepsRequest, context: Any) -> pb.PollStepsResponse:
        if not request.executor_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "executor_id is required")
        claimed = await self._dispatch.poll(
            executor_id=request.executor_id,
            connectors=list(request.connectors),
            limit=min(max(request.max_steps, 0), MAX_BATCH),
            wait=request.wait_ms / 1000,
        )
        await self._registry.ensure((s.tool, s.tool_version) for s in claimed)
        trace_dispatch(claimed, executor_id=request.executor_id)
        return pb.PollStepsResponse(
            steps=[
                assignment_to_proto(s, self._registry.get(s.tool, s.tool_version)) for s in claimed
            ]
        )

    @_storage_unavailable
    async def Heartbeat(self, request: pb.HeartbeatRequest, context: Any) -> pb.HeartbeatResponse:
        outcome = await self._dispatch.heartbeat(
            executor_id=request.executor_id,
            leases=[(lease.step_key, lease.attempt) for lease in request.leases[: MAX_BATCH * 10]],
        )
        return pb.HeartbeatResponse(
            extended=_leases(outcome.extended),
            cancelled=_leases(outcome.cancelled),
            lost=_leases(outcome.lost),
            lease_expires_at_ms=to_ms(outcome.expires_at),
        )

    @_storage_unavailable
    async def ReportResults(
        self, request: pb.ReportResultsRequest, context: Any
    ) -> pb.ReportResultsResponse:
        if len(request.results) > MAX_BATCH:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"at most {MAX_BATCH} results")
        try:
            results = [result_from_proto(r) for r in request.results]
        except BadResultError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        acks = await self._dispatch.report(executor_id=request.executor_id, results=results)
        return pb.ReportResultsResponse(
            acks=[
                pb.ResultAck(
                    lease=pb.LeaseRef(step_key=a.step_key, attempt=a.attempt),
                    accepted=a.accepted,
                    reason=a.reason,
                )
                for a in acks
            ]
        )


def build_server(service: ExecutorService, address: str) -> tuple[Any, int, Any]:
    """A grpc.aio server with the executor service, health checking and reflection.

    Returns (server, bound port, health servicer).
    """
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", 64 * 1024 * 1024),
            ("grpc.max_send_message_length", 64 * 1024 * 1024),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", 5000),
        ]
    )
    pb_grpc.add_ExecutorServiceServicer_to_server(service, server)  # type: ignore[no-untyped-call]
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = (
        pb.DESCRIPTOR.services_by_name["ExecutorService"].full_name,
        health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
        reflection.SERVICE_NAME,
    )
    reflection.enable_server_reflection(names, server)
    port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"could not bind gRPC to {address}")
    return server, port, health_servicer


def trace_dispatch(claimed: list[StepRow], *, executor_id: str) -> None:
    """One span per attempt handed out, from the attempt becoming due to its lease: the hop
    from the task's trace to an executor."""
    if not tracing_enabled():
        return
    for step in claimed:
        due = step.due_at
        with telemetry.span(
            f"{telemetry.DISPATCH} {step.tool}",
            trace_id=step.trace_id,
            span_id=telemetry.dispatch_span_id(step.task_id, step.step_id, step.attempt),
            parent_span_id=telemetry.task_span_id(step.task_id),
            kind=SpanKind.PRODUCER,
            attributes={
                telemetry.TASK_ID: step.task_id,
                telemetry.STEP_ID: step.step_id,
                telemetry.ATTEMPT: step.attempt,
                telemetry.EXECUTOR_ID: executor_id,
                telemetry.GEN_AI_TOOL_NAME: step.tool,
                "rpc.system": "grpc",
                "rpc.method": "PollSteps",
            },
            start_time_ns=int(due.timestamp() * 1e9) if due is not None else None,
        ):
            pass
