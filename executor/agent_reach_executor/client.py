"""The controller as the executor sees it: domain values and the gRPC client (the proto edge)."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import grpc

from agent_reach.v1 import executor_pb2 as pb
from agent_reach.v1 import executor_pb2_grpc as pb_grpc

# The largest message either side accepts (the controller's server uses the same limit).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

# Codes after which the same call may succeed later: the controller is restarting, overloaded or
# unreachable. Anything else is a bug on one side; the worker still retries, but louder.
_TRANSIENT_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseKey:
    """One attempt of one step: the fencing token quoted on heartbeats and reports."""

    step_key: int
    attempt: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Registration:
    """The timings the controller asks this executor to use."""

    lease_s: float
    heartbeat_interval_s: float
    max_poll_wait_s: float

    def with_defaults(self, *, poll_wait: float) -> Registration:
        """Timings a controller left at zero replaced with safe values."""
        lease_s = self.lease_s or 30.0
        return Registration(
            lease_s=lease_s,
            heartbeat_interval_s=self.heartbeat_interval_s or lease_s / 3,
            max_poll_wait_s=self.max_poll_wait_s or poll_wait,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Assignment:
    """One leased step attempt with everything needed to run it (JSON payloads still encoded)."""

    lease: LeaseKey
    task_id: str
    step_id: str
    tool: str
    connector: str
    config_json: bytes
    args_json: bytes
    idempotency_key: str
    trace_id: str
    traceparent: str
    timeout_ms: int
    lease_expires_at_ms: int
    max_attempts: int
    heartbeat_timeout_ms: int = 0

    def log_extra(self, event: str) -> dict[str, Any]:
        """The `extra` of a log line about this step."""
        return {
            "event": event,
            "task_id": self.task_id,
            "step_id": self.step_id,
            "trace_id": self.trace_id,
            "tool": self.tool,
            "attempt": self.lease.attempt,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class StepFailure:
    """Why an attempt failed, as the controller records it."""

    code: str
    message: str
    retryable: bool
    retry_after_s: float = 0.0
    maybe_applied: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class StepResult:
    """A finished attempt: succeeded when `failure` is None."""

    lease: LeaseKey
    output_json: bytes = b""
    failure: StepFailure | None = None
    started_at_ms: int
    finished_at_ms: int
    # Seconds the downstream asked every caller of this tool to hold back; 0 when none.
    throttle_s: float = 0.0

    @property
    def succeeded(self) -> bool:
        return self.failure is None


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatReply:
    """What the controller did with the leases of one heartbeat."""

    extended: frozenset[LeaseKey]
    cancelled: frozenset[LeaseKey]
    lost: frozenset[LeaseKey]
    lease_expires_at_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ResultAck:
    """Whether one reported result was applied, and why not."""

    lease: LeaseKey
    accepted: bool
    reason: str


class ControllerError(Exception):
    """A call to the controller failed; `transient` when retrying the same call may succeed."""

    def __init__(self, method: str, code: str, details: str, *, transient: bool) -> None:
        super().__init__(f"{method} failed: {code} {details}")
        self.method = method
        self.code = code
        self.details = details
        self.transient = transient


class Backoff:
    """Capped exponential backoff with jitter (each delay is 50-100% of the nominal one)."""

    def __init__(
        self, *, initial: float, maximum: float, rng: Callable[[], float] = random.random
    ) -> None:
        self._initial = initial
        self._maximum = maximum
        self._rng = rng
        self._failures = 0

    @property
    def failures(self) -> int:
        return self._failures

    def next_delay(self) -> float:
        nominal = min(self._maximum, self._initial * 2.0**self._failures)
        self._failures += 1
        return nominal * (0.5 + self._rng() / 2)

    def reset(self) -> None:
        self._failures = 0


# -- proto conversion: the only place that knows the wire messages ------------------------------


def lease_to_proto(lease: LeaseKey) -> pb.LeaseRef:
    return pb.LeaseRef(step_key=lease.step_key, attempt=lease.attempt)


def lease_from_proto(msg: pb.LeaseRef) -> LeaseKey:
    return LeaseKey(step_key=msg.step_key, attempt=msg.attempt)


def assignment_from_proto(msg: pb.StepAssignment) -> Assignment:
    return Assignment(
        lease=lease_from_proto(msg.lease),
        task_id=msg.task_id,
        step_id=msg.step_id,
        tool=msg.tool,
        connector=msg.connector,
        config_json=msg.config_json,
        args_json=msg.args_json,
        idempotency_key=msg.idempotency_key,
        trace_id=msg.trace_id,
        traceparent=msg.traceparent,
        timeout_ms=msg.timeout_ms,
        lease_expires_at_ms=msg.lease_expires_at_ms,
        max_attempts=msg.max_attempts,
        heartbeat_timeout_ms=msg.heartbeat_timeout_ms,
    )


def result_to_proto(result: StepResult) -> pb.StepResult:
    msg = pb.StepResult(
        lease=lease_to_proto(result.lease),
        started_at_ms=result.started_at_ms,
        finished_at_ms=result.finished_at_ms,
        throttle_s=result.throttle_s,
    )
    if result.failure is None:
        msg.outcome = pb.OUTCOME_SUCCEEDED
        msg.output_json = result.output_json
    else:
        msg.outcome = pb.OUTCOME_FAILED
        msg.error.CopyFrom(
            pb.StepError(
                code=result.failure.code,
                message=result.failure.message,
                retryable=result.failure.retryable,
                retry_after_s=result.failure.retry_after_s,
                maybe_applied=result.failure.maybe_applied,
            )
        )
    return msg


def heartbeat_from_proto(msg: pb.HeartbeatResponse) -> HeartbeatReply:
    return HeartbeatReply(
        extended=frozenset(lease_from_proto(x) for x in msg.extended),
        cancelled=frozenset(lease_from_proto(x) for x in msg.cancelled),
        lost=frozenset(lease_from_proto(x) for x in msg.lost),
        lease_expires_at_ms=msg.lease_expires_at_ms,
    )


def ack_from_proto(msg: pb.ResultAck) -> ResultAck:
    return ResultAck(lease=lease_from_proto(msg.lease), accepted=msg.accepted, reason=msg.reason)


# -- the client -----------------------------------------------------------------------------------


class ControllerClient:
    """Typed async calls to the controller's ExecutorService over one gRPC channel.

    Every RPC failure surfaces as `ControllerError`; retrying is the caller's decision.
    Use as an async context manager (or call `close`) to release the channel.
    """

    def __init__(
        self,
        target: str,
        *,
        executor_id: str,
        reconnect_initial: float = 0.1,
        reconnect_maximum: float = 5.0,
    ) -> None:
        self.executor_id = executor_id
        # The channel's own reconnect backoff defaults to 1 s..120 s, which would leave a restarted
        # controller unused for minutes; align it with the worker's backoff.
        options = [
            ("grpc.initial_reconnect_backoff_ms", max(1, int(reconnect_initial * 1000))),
            ("grpc.min_reconnect_backoff_ms", max(1, int(reconnect_initial * 1000))),
            ("grpc.max_reconnect_backoff_ms", max(1, int(reconnect_maximum * 1000))),
            # gRPC's 4 MiB default receive limit would refuse a poll answer the controller (which
            # allows 64 MiB) already committed as leases: the steps would be leased, never run,
            # and re-leased on every poll until their attempts ran out. Match the controller.
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ]
        self._channel = grpc.aio.insecure_channel(target, options=options)
        self._stub = pb_grpc.ExecutorServiceStub(self._channel)  # type: ignore[no-untyped-call]

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def register(
        self, connectors: Sequence[str], *, slots: int, version: str, deadline_s: float
    ) -> Registration:
        request = pb.RegisterRequest(
            executor_id=self.executor_id, connectors=connectors, slots=slots, version=version
        )
        reply: pb.RegisterResponse = await self._call("Register", request, deadline_s)
        return Registration(
            lease_s=reply.lease_ms / 1000,
            heartbeat_interval_s=reply.heartbeat_interval_ms / 1000,
            max_poll_wait_s=reply.max_poll_wait_ms / 1000,
        )

    async def poll_steps(
        self, connectors: Sequence[str], *, max_steps: int, wait_s: float, deadline_s: float
    ) -> list[Assignment]:
        request = pb.PollStepsRequest(
            executor_id=self.executor_id,
            connectors=connectors,
            max_steps=max_steps,
            wait_ms=int(wait_s * 1000),
        )
        reply: pb.PollStepsResponse = await self._call("PollSteps", request, deadline_s)
        return [assignment_from_proto(step) for step in reply.steps]

    async def heartbeat(self, leases: Sequence[LeaseKey], *, deadline_s: float) -> HeartbeatReply:
        request = pb.HeartbeatRequest(
            executor_id=self.executor_id, leases=[lease_to_proto(x) for x in leases]
        )
        reply: pb.HeartbeatResponse = await self._call("Heartbeat", request, deadline_s)
        return heartbeat_from_proto(reply)

    async def report_results(
        self, results: Sequence[StepResult], *, deadline_s: float
    ) -> list[ResultAck]:
        request = pb.ReportResultsRequest(
            executor_id=self.executor_id, results=[result_to_proto(r) for r in results]
        )
        reply: pb.ReportResultsResponse = await self._call("ReportResults", request, deadline_s)
        return [ack_from_proto(ack) for ack in reply.acks]

    async def _call(self, method: str, request: Any, deadline_s: float) -> Any:
        try:
            return await getattr(self._stub, method)(request, timeout=deadline_s)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            raise ControllerError(
                method,
                code.name,
                exc.details() or "",
                transient=code in _TRANSIENT_CODES,
            ) from exc
