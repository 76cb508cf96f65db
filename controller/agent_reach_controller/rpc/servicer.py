"""ExecutorService: the executors' only door into the controller."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry.trace import SpanKind

from agent_reach import telemetry
from agent_reach.addresses import ListenError
from agent_reach.telemetry import tracing_enabled
from agent_reach.v1 import executor_pb2 as pb
from agent_reach.v1 import executor_pb2_grpc as pb_grpc
from agent_reach_controller.domain.records import StepRow
from agent_reach_controller.identity.pools import ANONYMOUS, PoolScope, PoolTokenService
from agent_reach_controller.rpc.convert import (
    BadResultError,
    assignment_to_proto,
    result_from_proto,
    to_ms,
)
from agent_reach_controller.rpc.exchange import Aborted, MessageContext, Streams
from agent_reach_controller.runtime import Components
from agent_reach_controller.services.leasing import LeasingService
from agent_reach_controller.services.registry import ToolRegistry
from agent_reach_controller.services.reporting import ReportingService
from agent_reach_controller.services.runs import RunService
from agent_reach_controller.services.sessions import (
    Announcement,
    Session,
    SessionEndedError,
    SessionService,
)
from agent_reach_controller.storage.engine import STORAGE_DOWN

log = logging.getLogger(__name__)
MAX_BATCH = 1000


Handler = Callable[[Any, Any, Any], Awaitable[Any]]
# The pool a call's verified client certificate names, if any (mutual TLS; see `rpc/tls.py`).
PeerPool = Callable[[Any], str | None]


def _guarded(method: Handler) -> Handler:
    """Refusals answer their status (counted by reason); an ended session FAILED_PRECONDITION;
    a lost database UNAVAILABLE (executors retry it), never UNKNOWN with a traceback."""

    @functools.wraps(method)
    async def handler(self: Any, request: Any, context: Any) -> Any:
        try:
            return await method(self, request, context)
        except Refused as exc:
            self._leasing.metrics.auth_failed(exc.reason)
            log.warning(
                "%s refused (%s) from %s: %s",
                method.__name__,
                exc.reason,
                context.peer(),
                exc.detail,
                extra={"event": "executor_refused", "reason": exc.reason},
            )
            await context.abort(exc.code, exc.detail)
        except SessionEndedError as exc:
            self._leasing.metrics.auth_failed("session_ended")
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except STORAGE_DOWN as exc:
            self._leasing.leases.storage_down()
            log.warning(
                "%s: storage unavailable (%s)",
                method.__name__,
                type(exc).__name__,
                extra={"event": "storage_down"},
            )
            await context.abort(grpc.StatusCode.UNAVAILABLE, "storage is unavailable; retry")

    return handler


def _leases(pairs: list[tuple[int, int]], session: Session | None = None) -> list[pb.LeaseRef]:
    return [
        pb.LeaseRef(step_key=k, attempt=a, token=session.lease_token(k, a) if session else "")
        for k, a in pairs
    ]


class Refused(Exception):
    """A call refused before it touched anything: its status, a reason for the metric, detail."""

    def __init__(self, code: grpc.StatusCode, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True, kw_only=True)
class Authenticated:
    """An authenticated executor call: its session, and whether it speaks sessions at all."""

    session: Session
    # False for an executor one release older (auth off): it quotes no session nor lease tokens.
    legacy: bool = False

    def splits(
        self, leases: Sequence[pb.LeaseRef]
    ) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """(leases quoted with this session's token, the rest)."""
        valid, forged = [], []
        for lease in leases:
            pair = (lease.step_key, lease.attempt)
            if self.legacy or self.session.issued(lease.token, *pair):
                valid.append(pair)
            else:
                forged.append(pair)
        return valid, forged


class ExecutorService(pb_grpc.ExecutorServiceServicer):  # type: ignore[misc]
    """Translates the wire protocol to leasing and reporting calls; holds no state of its own.

    Every call is authenticated (see the proto's header): a pool token in the metadata, or a
    client certificate when mutual TLS maps certificates to pools; then, past Register, the
    session the executor quotes. With `auth="off"` (a rolling upgrade from executors that have
    no token) callers without a token share one anonymous pool that may run anything.
    """

    def __init__(
        self,
        *,
        parts: Components,
        auth: str = "token",
        peer_pool: PeerPool | None = None,
    ) -> None:
        self._leasing: LeasingService = parts.leasing
        self._reporting: ReportingService = parts.reporting
        self._registry: ToolRegistry = parts.registry
        self._runs: RunService = parts.runs
        self._pools: PoolTokenService = parts.pools
        self._sessions: SessionService = parts.sessions
        self._auth = auth
        self._peer_pool = peer_pool
        self._streams = Streams()

    # -- authentication ---------------------------------------------------------------------------

    async def _scope(self, context: Any) -> PoolScope:
        """The pool the caller proves it belongs to, or Refused."""
        token = _bearer(context)
        if token is not None:
            scope = await self._pools.authenticate(token)
            if scope is None:
                raise Refused(
                    grpc.StatusCode.UNAUTHENTICATED, "bad_token", "the executor token is not valid"
                )
            return scope
        if self._peer_pool is not None:
            pool = self._peer_pool(context)
            if pool is not None:
                scope = await self._pools.pool(pool)
                if scope is None:
                    raise Refused(
                        grpc.StatusCode.PERMISSION_DENIED,
                        "out_of_scope",
                        f"the client certificate names pool {pool!r}, which has no scope",
                    )
                return scope
        if self._auth == "off":
            return PoolScope(pool=ANONYMOUS, credential=ANONYMOUS)
        raise Refused(
            grpc.StatusCode.UNAUTHENTICATED,
            "no_credentials",
            "executor calls need 'authorization: Bearer <executor token>' metadata "
            "(reach executor --token) or a client certificate",
        )

    async def _caller(self, request: Any, context: Any) -> Authenticated:
        """The session a call quotes, checked against the credential it presents."""
        scope = await self._scope(context)
        if request.session:
            session = await self._sessions.verify(request.session)
            if session is None or session.scope.credential != scope.credential:
                raise Refused(
                    grpc.StatusCode.UNAUTHENTICATED,
                    "bad_session",
                    "the session is not one this credential opened",
                )
            return Authenticated(session=session)
        if scope.credential == ANONYMOUS:
            session = await self._sessions.legacy(request.executor_id, ANONYMOUS)
            if session is not None:
                return Authenticated(session=session, legacy=True)
        raise Refused(
            grpc.StatusCode.FAILED_PRECONDITION,
            "session_ended",
            "no live session: call Register and quote the session it returns",
        )

    def _connectors(self, session: Session, asked: Sequence[str]) -> list[str]:
        refused = session.scope.refused_connectors(asked)
        if refused:
            raise Refused(
                grpc.StatusCode.PERMISSION_DENIED,
                "out_of_scope",
                f"pool {session.scope.pool!r} may not run connectors {sorted(refused)}",
            )
        return list(asked)

    # -- the calls --------------------------------------------------------------------------------

    @_guarded
    async def Register(self, request: pb.RegisterRequest, context: Any) -> pb.RegisterResponse:
        scope = await self._scope(context)
        refused = scope.refused_connectors(request.connectors)
        if refused:
            raise Refused(
                grpc.StatusCode.PERMISSION_DENIED,
                "out_of_scope",
                f"pool {scope.pool!r} may not run connectors {sorted(refused)}",
            )
        if not request.executor_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "executor_id is required")
        announced = Announcement(
            executor_id=request.executor_id,
            connectors=list(request.connectors),
            slots=max(0, request.slots),
            version=request.version,
        )
        session, credential = await self._sessions.open(
            announced, scope=scope, now=datetime.now(UTC), reuse=scope.credential == ANONYMOUS
        )
        lease_ms = int(self._sessions.liveness.total_seconds() * 1000)
        log.info(
            "executor %s registered: session %s, pool %s, connectors=%s slots=%d",
            request.executor_id,
            session.id,
            scope.pool,
            ",".join(request.connectors),
            request.slots,
            extra={"event": "executor_registered", "session": session.id, "pool": scope.pool},
        )
        return pb.RegisterResponse(
            lease_ms=lease_ms,
            heartbeat_interval_ms=max(100, lease_ms // 4),
            max_poll_wait_ms=int(self._leasing.timings.max_poll_wait * 1000),
            session=credential,
            session_id=session.id,
            pool=scope.pool,
        )

    @_guarded
    async def PollSteps(self, request: pb.PollStepsRequest, context: Any) -> pb.PollStepsResponse:
        caller = await self._caller(request, context)
        session = caller.session
        connectors = self._connectors(session, request.connectors)
        claimed = await self._leasing.poll(
            executor_id=session.id,
            connectors=connectors,
            limit=min(max(request.max_steps, 0), MAX_BATCH),
            wait=request.wait_ms / 1000,
            session=session,
            poll_seq=max(0, request.poll_seq),
        )
        await self._registry.ensure((s.tool, s.tool_version) for s in claimed)
        claimed = await self._runs.with_requests(claimed)  # a model step's conversation
        trace_dispatch(claimed, executor_id=request.executor_id)
        expires = datetime.now(UTC) + self._sessions.liveness
        return pb.PollStepsResponse(
            steps=[
                assignment_to_proto(
                    s,
                    self._registry.get(s.tool, s.tool_version),
                    lease_token=session.lease_token(s.id, s.attempt),
                    expires_at=expires,
                )
                for s in claimed
            ]
        )

    @_guarded
    async def Heartbeat(self, request: pb.HeartbeatRequest, context: Any) -> pb.HeartbeatResponse:
        caller = await self._caller(request, context)
        leases, forged = caller.splits(request.leases[: MAX_BATCH * 10])
        outcome = await self._leasing.heartbeat(
            executor_id=caller.session.id,
            leases=leases,
            session=caller.session,
            forged=forged,
            polls_completed=0 if caller.legacy else max(0, request.polls_completed),
        )
        session, lost = caller.session, set(outcome.lost)
        return pb.HeartbeatResponse(
            extended=_leases(outcome.extended, session),
            cancelled=_leases(outcome.cancelled, session),
            lost=[lease for lease in request.leases if (lease.step_key, lease.attempt) in lost],
            lease_expires_at_ms=to_ms(outcome.expires_at),
        )

    @_guarded
    async def ReportResults(
        self, request: pb.ReportResultsRequest, context: Any
    ) -> pb.ReportResultsResponse:
        caller = await self._caller(request, context)
        if len(request.results) > MAX_BATCH:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"at most {MAX_BATCH} results")
        try:
            results = [result_from_proto(r) for r in request.results]
        except BadResultError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        session = caller.session
        if caller.legacy:
            results = [
                replace(r, lease_token=session.lease_token(r.step_key, r.attempt)) for r in results
            ]
        acks = await self._reporting.report(
            executor_id=session.id, results=results, session=session
        )
        tokens = {(r.lease.step_key, r.lease.attempt): r.lease.token for r in request.results}
        return pb.ReportResultsResponse(
            acks=[
                pb.ResultAck(
                    lease=pb.LeaseRef(
                        step_key=a.step_key,
                        attempt=a.attempt,
                        token=tokens.get((a.step_key, a.attempt), ""),
                    ),
                    accepted=a.accepted,
                    reason=a.reason,
                )
                for a in acks
            ]
        )

    async def Exchange(self, requests: Any, context: Any) -> None:
        """The three calls above as messages on one stream (rpc/exchange.py)."""
        await self._streams.serve(requests, context, self._answer)

    async def _answer(
        self, message: pb.ExecutorMessage, context: MessageContext
    ) -> pb.ControllerMessage:
        kind = message.WhichOneof("call")
        if kind == "poll":
            return pb.ControllerMessage(
                id=message.id, poll=await self.PollSteps(message.poll, context)
            )
        if kind == "heartbeat":
            return pb.ControllerMessage(
                id=message.id, heartbeat=await self.Heartbeat(message.heartbeat, context)
            )
        if kind == "report":
            return pb.ControllerMessage(
                id=message.id, report=await self.ReportResults(message.report, context)
            )
        raise Aborted(
            grpc.StatusCode.INVALID_ARGUMENT, "a message carries one of poll, heartbeat, report"
        )

    async def close_streams(self, grace: float) -> None:
        """This controller is stopping: every stream answers what it has and ends."""
        await self._streams.close(grace)


def _bearer(context: Any) -> str | None:
    """The token of an `authorization: Bearer …` metadata entry, if any."""
    for key, value in context.invocation_metadata() or ():
        if key == "authorization" and isinstance(value, str):
            scheme, _, token = value.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


def build_server(
    service: ExecutorService,
    address: str,
    *,
    credentials: grpc.ServerCredentials | None = None,
    reuse_port: bool = False,
) -> tuple[Any, int, Any]:
    """A grpc.aio server with the executor service, health checking and reflection; over TLS
    with `credentials`. gRPC would set SO_REUSEPORT by itself, letting a second controller
    bind the same port by mistake: only the workers of one controller (`reuse_port`) share it.

    Returns (server, bound port, health servicer).
    """
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", 64 * 1024 * 1024),
            ("grpc.max_send_message_length", 64 * 1024 * 1024),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", 5000),
            ("grpc.so_reuseport", 1 if reuse_port else 0),
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
    try:
        port = (
            server.add_secure_port(address, credentials)
            if credentials is not None
            else server.add_insecure_port(address)
        )
    except RuntimeError:  # grpcio raises this where older releases returned 0
        port = 0
    if port == 0:
        raise ListenError(
            f"cannot listen on {address} (gRPC): the address is in use or not this machine's; "
            "another process holds it, or choose another with --grpc"
        )
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
                telemetry.ENVIRONMENT: step.environment,
                "rpc.system": "grpc",
                "rpc.method": "PollSteps",
            },
            start_time_ns=int(due.timestamp() * 1e9) if due is not None else None,
        ):
            pass
