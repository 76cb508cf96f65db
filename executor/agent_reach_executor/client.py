"""The controller as the executor sees it: domain values and the gRPC client (the proto edge)."""

from __future__ import annotations

import ipaddress
import json
import random
import socket
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import grpc

from agent_reach import metrics as m
from agent_reach.addresses import split_address
from agent_reach.v1 import executor_pb2 as pb
from agent_reach.v1 import executor_pb2_grpc as pb_grpc
from agent_reach_executor.exchange import (
    FIELDS,
    TRANSIENT_CODES,
    CallFailed,
    StreamCalls,
    StreamUnsupported,
)

# The largest message either side accepts (the controller's server uses the same limit).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

# With the stream on, a call goes on it while the executor holds at most this many steps (leased
# and not yet acknowledged): one submitter's pace. A message costs both sides about half a unary
# call, most of what a call carrying one step costs. A busier executor calls unary: its calls'
# cost is shared among their steps, and the stream's quicker answers would send the next poll and
# report sooner, carrying less, each a transaction (counted in BENCHMARKS.md, issue 33 rounds nine
# and ten). The call's own size is the wrong signal: in plans, a poll that brings back a step or
# two is followed by another that does the same.
STREAM_UP_TO = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseKey:
    """One attempt of one step: the fencing token quoted on heartbeats and reports."""

    step_key: int
    attempt: int
    # Bound to this executor's session by the controller; empty from one that predates sessions.
    token: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Registration:
    """The timings the controller asks this executor to use."""

    lease_s: float
    heartbeat_interval_s: float
    max_poll_wait_s: float
    # The session credential to quote on every call (empty from a controller without sessions),
    # its public id and the pool it belongs to.
    session: str = ""
    session_id: str = ""
    pool: str = ""

    def with_defaults(self, *, poll_wait: float) -> Registration:
        """Timings a controller left at zero replaced with safe values."""
        lease_s = self.lease_s or 30.0
        return Registration(
            lease_s=lease_s,
            heartbeat_interval_s=self.heartbeat_interval_s or lease_s / 3,
            max_poll_wait_s=self.max_poll_wait_s or poll_wait,
            session=self.session,
            session_id=self.session_id,
            pool=self.pool,
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
    idempotent: bool = False  # the catalogue says a second delivery is harmless
    environment: str = ""  # where the task runs (dev, sandbox, prod); "" from older controllers

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

    @property
    def session_ended(self) -> bool:
        """The controller ended this executor's session (expired, revoked): register again."""
        return self.code == "FAILED_PRECONDITION"


@dataclass(frozen=True, slots=True, kw_only=True)
class Tls:
    """TLS to the controller: the CA that signed its certificate, and this executor's own
    certificate and key for mutual TLS (PEM files)."""

    ca: Path
    cert: Path | None = None
    key: Path | None = None
    # Expect this name in the controller's certificate instead of the target's host.
    server_name: str | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca.read_bytes(),
            private_key=self.key.read_bytes() if self.key else None,
            certificate_chain=self.cert.read_bytes() if self.cert else None,
        )


def channel_target(controller: str) -> str:
    """A gRPC target reaching every controller replica named.

    `dns:///name:port` (a Kubernetes headless Service) resolves to every replica and follows
    changes; `a:port,b:port` lists them (names resolved once, at start); one `host:port` is one.
    Calls are spread round robin over the replicas that answer, so a dead one costs a retry.
    """
    if "://" in controller or "," not in controller:
        return controller
    addresses = []
    for part in (p.strip() for p in controller.split(",") if p.strip()):
        host, port = split_address(part)
        addresses.extend(_resolve(host, port))
    if all(a.version == 4 for a, _ in addresses):
        return "ipv4:" + ",".join(f"{a}:{port}" for a, port in addresses)
    return "ipv6:" + ",".join(
        f"[{a if a.version == 6 else ipaddress.IPv6Address('::ffff:' + str(a))}]:{port}"
        for a, port in addresses
    )


def _resolve(
    host: str, port: int
) -> list[tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]]:
    try:
        return [(ipaddress.ip_address(host), port)]
    except ValueError:
        pass
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    seen = dict.fromkeys(ipaddress.ip_address(info[4][0]) for info in infos)
    return [(address, port) for address in seen]


_ROUND_ROBIN = json.dumps({"loadBalancingConfig": [{"round_robin": {}}]})


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
    return pb.LeaseRef(step_key=lease.step_key, attempt=lease.attempt, token=lease.token)


def lease_from_proto(msg: pb.LeaseRef) -> LeaseKey:
    return LeaseKey(step_key=msg.step_key, attempt=msg.attempt, token=msg.token)


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
        idempotent=msg.idempotent,
        environment=msg.environment,
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

    def __init__(  # noqa: PLR0913 - the channel's options, all by keyword
        self,
        target: str,
        *,
        executor_id: str,
        token: str | None = None,
        tls: Tls | None = None,
        reconnect_initial: float = 0.1,
        reconnect_maximum: float = 5.0,
        stream: bool = False,
        streams: int = 1,
    ) -> None:
        self.executor_id = executor_id
        # The pool token goes with every call; the session credential, once registered.
        self._metadata = (("authorization", f"Bearer {token}"),) if token else None
        self.session = ""
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
            # Every replica the target names, round robin; a dead one is skipped once noticed.
            ("grpc.service_config", _ROUND_ROBIN),
            ("grpc.dns_min_time_between_resolutions_ms", 1000),
            # Notice a controller that vanished (power loss) in seconds, not at the TCP timeout.
            ("grpc.keepalive_time_ms", 10_000),
            ("grpc.keepalive_timeout_ms", 5_000),
        ]
        if tls is not None and tls.server_name:
            options.append(("grpc.ssl_target_name_override", tls.server_name))
        channel_to = channel_target(target)
        self._channel = (
            grpc.aio.secure_channel(channel_to, tls.credentials(), options=options)
            if tls is not None
            else grpc.aio.insecure_channel(channel_to, options=options)
        )
        self._stub = pb_grpc.ExecutorServiceStub(self._channel)  # type: ignore[no-untyped-call]
        # With `stream`, heartbeats, and polls and reports while few steps are held (STREAM_UP_TO),
        # go as messages on `streams` streams (exchange.py), until a controller says it has none.
        self._stream = StreamCalls(self._stub, self._metadata, streams=streams) if stream else None
        # Calls made, by (method, "unary" or "stream"): the executor's metrics read it.
        self.calls: Counter[tuple[str, str]] = Counter()

    @property
    def streaming(self) -> bool:
        """Whether calls after Register go on the Exchange stream (else unary calls)."""
        return self._stream is not None

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
        if self._stream is not None:
            await self._stream.close()
        await self._channel.close()

    async def register(
        self, connectors: Sequence[str], *, slots: int, version: str, deadline_s: float
    ) -> Registration:
        request = pb.RegisterRequest(
            executor_id=self.executor_id, connectors=connectors, slots=slots, version=version
        )
        reply: pb.RegisterResponse = await self._call("Register", request, deadline_s)
        self.session = reply.session
        return Registration(
            lease_s=reply.lease_ms / 1000,
            heartbeat_interval_s=reply.heartbeat_interval_ms / 1000,
            max_poll_wait_s=reply.max_poll_wait_ms / 1000,
            session=reply.session,
            session_id=reply.session_id,
            pool=reply.pool,
        )

    async def poll_steps(
        self,
        connectors: Sequence[str],
        *,
        max_steps: int,
        wait_s: float,
        deadline_s: float,
        poll_seq: int = 0,
        held: int = 0,
    ) -> list[Assignment]:
        """`held`: steps the executor holds as it asks (it decides the transport)."""
        request = pb.PollStepsRequest(
            executor_id=self.executor_id,
            connectors=connectors,
            max_steps=max_steps,
            wait_ms=int(wait_s * 1000),
            session=self.session,
            poll_seq=poll_seq,
        )
        reply: pb.PollStepsResponse = await self._call(
            "PollSteps", request, deadline_s, few=held <= STREAM_UP_TO
        )
        return [assignment_from_proto(step) for step in reply.steps]

    async def heartbeat(
        self, leases: Sequence[LeaseKey], *, deadline_s: float, polls_completed: int = 0
    ) -> HeartbeatReply:
        """`polls_completed`: every poll up to this seq has finished; a lease they handed out
        that is not in `leases` is not held (its reply was lost), and the controller frees it."""
        request = pb.HeartbeatRequest(
            executor_id=self.executor_id,
            leases=[lease_to_proto(x) for x in leases],
            session=self.session,
            polls_completed=polls_completed,
        )
        reply: pb.HeartbeatResponse = await self._call("Heartbeat", request, deadline_s)
        return heartbeat_from_proto(reply)

    async def report_results(
        self, results: Sequence[StepResult], *, deadline_s: float, held: int = 0
    ) -> list[ResultAck]:
        """`held`: steps the executor holds, these included (it decides the transport)."""
        request = pb.ReportResultsRequest(
            executor_id=self.executor_id,
            results=[result_to_proto(r) for r in results],
            session=self.session,
        )
        reply: pb.ReportResultsResponse = await self._call(
            "ReportResults", request, deadline_s, few=held <= STREAM_UP_TO
        )
        return [ack_from_proto(ack) for ack in reply.acks]

    async def _call(self, method: str, request: Any, deadline_s: float, *, few: bool = True) -> Any:
        """The reply to one call: on the stream if there is one and the executor holds `few`
        steps (`STREAM_UP_TO`), else unary."""
        stream = self._stream
        if stream is not None and few and method in FIELDS:
            self.calls[method, m.STREAM] += 1
            try:
                return await stream.call(method, request, deadline_s)
            except CallFailed as failed:
                raise ControllerError(
                    method,
                    failed.code.name,
                    failed.details,
                    transient=failed.code in TRANSIENT_CODES,
                ) from None
            except StreamUnsupported:
                if self._stream is stream:  # an older controller: unary calls from now on
                    self._stream = None
                    await stream.close()
        self.calls[method, m.UNARY] += 1
        try:
            return await getattr(self._stub, method)(
                request, timeout=deadline_s, metadata=self._metadata
            )
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            raise ControllerError(
                method,
                code.name,
                exc.details() or "",
                transient=code in TRANSIENT_CODES,
            ) from exc
