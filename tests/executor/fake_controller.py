"""Test doubles: a real grpc.aio ExecutorService on 127.0.0.1, and connectors to run on it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from agent_reach.v1 import executor_pb2 as pb
from agent_reach.v1 import executor_pb2_grpc as pb_grpc
from agent_reach_connectors.base import ToolCall
from agent_reach_controller.rpc.exchange import Streams

Key = tuple[int, int]  # (step_key, attempt)


def key_of(lease: pb.LeaseRef) -> Key:
    return (lease.step_key, lease.attempt)


@dataclass
class PollRecord:
    request: pb.PollStepsRequest
    at: float  # time.monotonic() when the call arrived


@dataclass
class FakeController:
    """The controller's executor-facing state; survives `stop()`/`start()` like a database would."""

    lease_ms: int = 5_000
    heartbeat_interval_ms: int = 50
    max_poll_wait_ms: int = 200
    queue: list[pb.StepAssignment] = field(default_factory=list)
    leased: dict[Key, pb.StepAssignment] = field(default_factory=dict)
    registrations: list[pb.RegisterRequest] = field(default_factory=list)
    polls: list[PollRecord] = field(default_factory=list)
    heartbeats: list[pb.HeartbeatRequest] = field(default_factory=list)
    report_calls: list[pb.ReportResultsRequest] = field(default_factory=list)
    results: dict[Key, pb.StepResult] = field(default_factory=dict)
    to_cancel: set[Key] = field(default_factory=set)
    to_lose: set[Key] = field(default_factory=set)
    reject: dict[Key, str] = field(default_factory=dict)  # reports refused with this reason
    held: dict[int, asyncio.Event] = field(default_factory=dict)  # poll_seq -> answered once set
    port: int = 0
    # Answers the Exchange stream (as the controller does); False: UNIMPLEMENTED, as a controller
    # older than the stream would.
    stream: bool = True
    exchanges: int = 0  # Exchange streams opened
    unary_calls: int = 0  # PollSteps, Heartbeat and ReportResults as unary calls
    # Each poll, heartbeat and report: (call, "unary" or "stream", steps answered or reported).
    carried: list[tuple[str, str, int]] = field(default_factory=list)
    _server: Any = None
    _next_key: int = 1
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self, port: int | None = None) -> int:
        server = grpc.aio.server()
        pb_grpc.add_ExecutorServiceServicer_to_server(_Servicer(self), server)  # type: ignore[no-untyped-call]
        self.port = server.add_insecure_port(f"127.0.0.1:{self.port if port is None else port}")
        await server.start()
        self._server = server
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=None)
            self._server = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    # -- test controls ----------------------------------------------------------------------------

    def enqueue(
        self,
        *,
        connector: str,
        args: dict[str, Any] | None = None,
        tool: str | None = None,
        timeout_ms: int = 5_000,
        config: dict[str, Any] | None = None,
        environment: str = "",
    ) -> Key:
        key = (self._next_key, 1)
        self._next_key += 1
        self.queue.append(
            pb.StepAssignment(
                lease=pb.LeaseRef(step_key=key[0], attempt=key[1]),
                task_id="task-1",
                step_id=f"s{key[0]}",
                tool=tool or f"{connector}.tool",
                connector=connector,
                config_json=json.dumps(config or {}).encode(),
                args_json=json.dumps(args or {}).encode(),
                idempotency_key=f"task-1:s{key[0]}",
                trace_id="0af7651916cd43dd8448eb211c80319c",
                traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                timeout_ms=timeout_ms,
                max_attempts=3,
                environment=environment,
            )
        )
        self._changed.set()
        return key

    def all_reports(self) -> list[pb.StepResult]:
        return [r for call in self.report_calls for r in call.results]

    # -- service behaviour ------------------------------------------------------------------------

    async def poll(self, request: pb.PollStepsRequest) -> pb.PollStepsResponse:
        self.polls.append(PollRecord(request=request, at=time.monotonic()))
        if (gate := self.held.get(request.poll_seq)) is not None:
            await gate.wait()  # an answer slow to come back: the poll stays open meanwhile
        deadline = time.monotonic() + min(request.wait_ms, self.max_poll_wait_ms) / 1000
        while True:
            ready = [s for s in self.queue if s.connector in request.connectors]
            remaining = deadline - time.monotonic()
            if ready or remaining <= 0:
                break
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)
        claimed = ready[: request.max_steps]
        for step in claimed:
            self.queue.remove(step)
            step.lease_expires_at_ms = time.time_ns() // 1_000_000 + self.lease_ms
            self.leased[key_of(step.lease)] = step
        return pb.PollStepsResponse(steps=claimed)

    def heartbeat(self, request: pb.HeartbeatRequest) -> pb.HeartbeatResponse:
        self.heartbeats.append(request)
        reply = pb.HeartbeatResponse(
            lease_expires_at_ms=time.time_ns() // 1_000_000 + self.lease_ms
        )
        for lease in request.leases:
            key = key_of(lease)
            if key in self.to_cancel:
                reply.cancelled.append(lease)
            elif key in self.to_lose or key not in self.leased:
                reply.lost.append(lease)
            else:
                reply.extended.append(lease)
        return reply

    def report(self, request: pb.ReportResultsRequest) -> pb.ReportResultsResponse:
        self.report_calls.append(request)
        reply = pb.ReportResultsResponse()
        for result in request.results:
            key = key_of(result.lease)
            if key in self.reject:
                reply.acks.append(pb.ResultAck(lease=result.lease, reason=self.reject[key]))
            elif key in self.results:
                reply.acks.append(pb.ResultAck(lease=result.lease, reason="duplicate"))
            elif key not in self.leased or key in self.to_cancel or key in self.to_lose:
                reply.acks.append(pb.ResultAck(lease=result.lease, reason="stale_lease"))
            else:
                self.results[key] = result
                reply.acks.append(pb.ResultAck(lease=result.lease, accepted=True))
        return reply


class _Servicer(pb_grpc.ExecutorServiceServicer):
    def __init__(self, fake: FakeController) -> None:
        self._fake = fake
        self._streams = Streams()  # the controller's own stream handling

    async def Register(self, request, context):
        self._fake.registrations.append(request)
        return pb.RegisterResponse(
            lease_ms=self._fake.lease_ms,
            heartbeat_interval_ms=self._fake.heartbeat_interval_ms,
            max_poll_wait_ms=self._fake.max_poll_wait_ms,
        )

    async def PollSteps(self, request, context):
        self._fake.unary_calls += 1
        reply = await self._fake.poll(request)
        self._fake.carried.append(("poll", "unary", len(reply.steps)))
        return reply

    async def Heartbeat(self, request, context):
        self._fake.unary_calls += 1
        self._fake.carried.append(("heartbeat", "unary", len(request.leases)))
        return self._fake.heartbeat(request)

    async def ReportResults(self, request, context):
        self._fake.unary_calls += 1
        self._fake.carried.append(("report", "unary", len(request.results)))
        return self._fake.report(request)

    async def Exchange(self, requests, context):
        self._fake.exchanges += 1
        if not self._fake.stream:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        await self._streams.serve(requests, context, self._answer)

    async def _answer(self, message: pb.ExecutorMessage, _context: Any) -> pb.ControllerMessage:
        kind = message.WhichOneof("call")
        if kind == "poll":
            polled = await self._fake.poll(message.poll)
            self._fake.carried.append(("poll", "stream", len(polled.steps)))
            return pb.ControllerMessage(id=message.id, poll=polled)
        if kind == "heartbeat":
            self._fake.carried.append(("heartbeat", "stream", len(message.heartbeat.leases)))
            reply = self._fake.heartbeat(message.heartbeat)
            return pb.ControllerMessage(id=message.id, heartbeat=reply)
        self._fake.carried.append(("report", "stream", len(message.report.results)))
        return pb.ControllerMessage(id=message.id, report=self._fake.report(message.report))


# -- connectors the executor under test runs ------------------------------------------------------


class FnConnector:
    """A connector whose behaviour is one coroutine function; records its calls."""

    def __init__(self, name: str, fn: Callable[[ToolCall], Awaitable[Any]]) -> None:
        self.name = name
        self._fn = fn
        self.started = False
        self.closed = False
        self.calls: list[ToolCall] = []

    async def start(self) -> None:
        self.started = True

    async def invoke(self, call: ToolCall) -> Any:
        self.calls.append(call)
        return await self._fn(call)

    async def close(self) -> None:
        self.closed = True


class Probe:
    """Blocks every call until `release` is set; records concurrency and cancellations."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.running = 0
        self.peak = 0
        self.started: list[str] = []
        self.cancelled: list[str] = []

    async def __call__(self, call: ToolCall) -> Any:
        self.running += 1
        self.peak = max(self.peak, self.running)
        self.started.append(call.step_id)
        try:
            await self.release.wait()
            return {"step": call.step_id, "args": dict(call.args)}
        except asyncio.CancelledError:
            self.cancelled.append(call.step_id)
            raise
        finally:
            self.running -= 1
