"""Tracing shared by every process: one trace per task, span ids the event log can recompute.

A task's trace id is its `trace_id`. The spans Agent-Reach makes have ids derived from what they
stand for (the task; a step's attempt being dispatched; that attempt being executed), so the
controller, the executor and the Jaeger export built later from the event log all name the same
span with the same id, without storing any. A retry an hour later on another executor joins the
same trace under a new attempt.

Export is OTLP over HTTP, configured by the standard `OTEL_*` variables (`OTEL_EXPORTER_OTLP_
ENDPOINT` or `…_TRACES_ENDPOINT`, `OTEL_SERVICE_NAME`, `OTEL_TRACES_SAMPLER`, `OTEL_SDK_DISABLED`,
`OTEL_TRACES_EXPORTER=none`). Without an endpoint nothing is installed: `span()` then yields a
non-recording span that still carries the derived ids (for logs and the `traceparent` sent
downstream), which costs one small object per span.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import os
import random
import re
import socket
from collections.abc import Iterator, Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)

from agent_reach.ids import make_traceparent, new_span_id

TRACER_NAME = "agent_reach"
_TRACE_ID = re.compile(r"^(?!0{32})[0-9a-f]{32}$")

# Span names (low cardinality: the tool name is the only variable part).
SUBMIT = "submit_task"
VALIDATE = "validate_plan"
STORE = "store_task"
DISPATCH = "dispatch_step"  # controller: a step's attempt handed to an executor
EXECUTE = "execute_tool"  # executor: GenAI semantic conventions' tool execution
# A person's word on a task (API or console), a child of the task's submit span.
CANCEL = "cancel_task"
DECIDE = "decide_step"  # approve or reject
RESOLVE = "resolve_step"
RESCHEDULE = "reschedule_step"

# Attributes (OpenTelemetry GenAI semantic conventions, and ours under agent_reach.*).
GEN_AI_OPERATION = "gen_ai.operation.name"
GEN_AI_TOOL_NAME = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID = "gen_ai.tool.call.id"
GEN_AI_TOOL_TYPE = "gen_ai.tool.type"
TASK_ID = "agent_reach.task_id"
STEP_ID = "agent_reach.step_id"
ATTEMPT = "agent_reach.attempt"
EXECUTOR_ID = "agent_reach.executor_id"
OUTCOME = "agent_reach.outcome"
ENVIRONMENT = "agent_reach.environment"  # where the task runs: dev, sandbox or prod
PRINCIPAL = "agent_reach.principal"  # who acted (an operator span); never a credential
DECISION = "agent_reach.decision"
ERROR_TYPE = "error.type"

_chosen_trace: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "agent_reach_chosen_trace", default=None
)
_chosen_span: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "agent_reach_chosen_span", default=None
)
# (trace_id, span_id) of the innermost span, for log lines (set with or without an SDK).
log_context: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar(
    "agent_reach_log_context", default=None
)
_state = {"enabled": False}
# The installed provider's sampler, asked once per span that continues a stored parent.
_sampler: list[Any] = []
_tracer: list[Any] = []  # the installed provider's tracer, asked for once


def derived_span_id(*parts: object) -> str:
    """16 hex characters from what a span stands for (never all zeros)."""
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    value = int.from_bytes(digest[:8], "big") or 1
    return f"{value:016x}"


def task_span_id(task_id: str) -> str:
    return derived_span_id(task_id, "task")


def dispatch_span_id(task_id: str, step_id: str, attempt: int) -> str:
    return derived_span_id(task_id, step_id, attempt, "dispatch")


def execute_span_id(task_id: str, step_id: str, attempt: int) -> str:
    return derived_span_id(task_id, step_id, attempt, "execute")


class _ChosenIds:
    """The SDK's id source: the ids `span()` was asked for, random otherwise."""

    def __init__(self) -> None:
        self._rng = random.SystemRandom()

    def generate_span_id(self) -> int:
        return _chosen_span.get() or self._rng.getrandbits(64) or 1

    def generate_trace_id(self) -> int:
        return _chosen_trace.get() or self._rng.getrandbits(128) or 1

    def is_trace_id_random(self) -> bool:
        return True  # chosen ids are task trace ids, themselves random (W3C "random" flag)


def tracing_enabled() -> bool:
    return _state["enabled"]


def configure_tracing(service_name: str, *, env: Mapping[str, str] | None = None) -> bool:
    """Install an OTLP/HTTP exporting tracer provider if the environment asks for one.

    Returns whether tracing is on. Idempotent per process (the first call decides).
    """
    env = os.environ if env is None else env
    if _state["enabled"]:
        return True
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    disabled = env.get("OTEL_SDK_DISABLED", "").lower() == "true"
    if not endpoint or disabled or env.get("OTEL_TRACES_EXPORTER", "otlp") == "none":
        return False
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    facts = {"service.name": env.get("OTEL_SERVICE_NAME", service_name)}
    if "service.instance.id" not in env.get("OTEL_RESOURCE_ATTRIBUTES", ""):
        # Which process ran a span: attempts of one step on two executors look different.
        facts["service.instance.id"] = f"{socket.gethostname()}-{os.getpid()}"
    resource = Resource.create(facts)
    provider = TracerProvider(resource=resource, id_generator=_ChosenIds())  # type: ignore[arg-type]
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    _sampler[:] = [provider.sampler]
    _tracer[:] = [provider.get_tracer(TRACER_NAME)]
    _state["enabled"] = True
    return True


def flush_tracing(timeout_ms: int = 5000) -> None:
    """Export what is buffered (before a process exits)."""
    provider = trace.get_tracer_provider()
    force_flush = getattr(provider, "force_flush", None)
    if force_flush is not None:
        force_flush(timeout_ms)


def remote_parent(trace_id: str, span_id: str | None) -> Any:
    """An OpenTelemetry context whose current span is (trace_id, span_id) from elsewhere."""
    if not span_id:
        return None
    trace_int = int(trace_id, 16)
    sampled = TraceFlags.SAMPLED if sampled_trace(trace_int) else TraceFlags.DEFAULT
    parent = SpanContext(
        trace_id=trace_int,
        span_id=int(span_id, 16),
        is_remote=True,
        trace_flags=TraceFlags(sampled),
    )
    return trace.set_span_in_context(NonRecordingSpan(parent))


def sampled_trace(trace_id: int) -> bool:
    """Whether the configured sampler keeps trace `trace_id`, asked as for a root span.

    A stored parent (the task's span, an attempt's dispatch) carries no sampled flag, and the
    spans continuing it run later in other processes; the ratio samplers of `OTEL_TRACES_SAMPLER`
    decide from the trace id alone, so asking the sampler here gives every process the same
    answer and a task's spans are kept or dropped together.
    """
    if not _sampler:
        return True
    decision = _sampler[0].should_sample(otel_context.Context(), trace_id, "agent-reach")
    return bool(decision.decision.is_sampled())


def current_ids() -> tuple[str, str] | None:
    """(trace_id, span_id) of the span current here, if a real one is (e.g. FastAPI's)."""
    current = trace.get_current_span().get_span_context()
    if not current.is_valid:
        return None
    return f"{current.trace_id:032x}", f"{current.span_id:016x}"


def traceparent_of(span: Span) -> str:
    context = span.get_span_context()
    return make_traceparent(
        f"{context.trace_id:032x}", f"{context.span_id:016x}", sampled=context.trace_flags.sampled
    )


@contextlib.contextmanager
def span(  # noqa: PLR0913 - a span's facts, all by keyword
    name: str,
    *,
    trace_id: str,
    span_id: str | None = None,
    parent_span_id: str | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Mapping[str, Any] | None = None,
    start_time_ns: int | None = None,
) -> Iterator[Span]:
    """A span of trace `trace_id`, with the id asked for (or a random one), current meanwhile.

    Exceptions escaping the block mark the span as an error, by type only (never the message).
    Without tracing configured the span records nothing but still carries its ids (logs and
    `traceparent_of` use them).
    """
    if not _TRACE_ID.match(trace_id):
        yield trace.INVALID_SPAN  # nothing to attach it to (e.g. a hand-made assignment)
        return
    chosen = span_id or new_span_id()
    token = log_context.set((trace_id, chosen))
    try:
        trace_int = int(trace_id, 16)
        if not _state["enabled"] or not sampled_trace(trace_int):
            # Nothing to record: the span is its ids alone, as cheap as it can be (a trace the
            # sampler drops is dropped in every process: see sampled_trace).
            flags = TraceFlags.DEFAULT if _state["enabled"] else TraceFlags.SAMPLED
            yield NonRecordingSpan(
                SpanContext(
                    trace_id=trace_int,
                    span_id=int(chosen, 16),
                    is_remote=False,
                    trace_flags=TraceFlags(flags),
                )
            )
            return
        tracer = _tracer[0] if _tracer else trace.get_tracer(TRACER_NAME)
        ids = (_chosen_trace.set(trace_int), _chosen_span.set(int(chosen, 16)))
        try:
            started = tracer.start_span(
                name,
                # No parent given: a root span, whatever span is current.
                context=remote_parent(trace_id, parent_span_id) or otel_context.Context(),
                kind=kind,
                attributes=dict(attributes or {}),
                start_time=start_time_ns,
            )
        finally:
            _chosen_span.reset(ids[1])
            _chosen_trace.reset(ids[0])
        # Exception messages may carry secrets (a URL, a config value): a span says only the
        # exception's type, unless the code marked it itself (mark_error) with a known code.
        with trace.use_span(
            started, end_on_exit=True, record_exception=False, set_status_on_exception=False
        ):
            try:
                yield started
            except BaseException as exc:
                status = getattr(started, "status", None)  # the SDK's span has one
                if status is None or status.is_unset:
                    mark_error(started, type(exc).__name__)
                raise
    finally:
        log_context.reset(token)


def mark_error(current: Span, error_type: str, message: str = "") -> None:
    """Say on a span that what it stands for failed, and how (no secret ever goes in `message`)."""
    current.set_attribute(ERROR_TYPE, error_type)
    current.set_status(Status(StatusCode.ERROR, message or error_type))
