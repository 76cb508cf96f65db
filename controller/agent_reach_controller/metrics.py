"""The controller's Prometheus metrics: one registry per set of components, fed by dispatch.

Dispatch calls one method per fact (a lease, applied results, settled steps, a deferral) and the
background loop sets the gauges it reads from the database. What is observed inside a
transaction is recorded once that transaction has committed (never if it rolls back). Names and
labels are in `agent_reach.metrics`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.exposition import choose_encoder

from agent_reach import metrics as m
from agent_reach.errors import ErrorCode
from agent_reach.states import StepStatus, Transition, target
from agent_reach_controller.decide.outcomes import AttemptResult
from agent_reach_controller.domain.records import QueuedGroup, RunRow, StepChange, StepRow
from agent_reach_controller.planning import fanout
from agent_reach_controller.storage.engine import Connection, after_commit

_CODES = frozenset(code.value for code in ErrorCode)


def _outcome(transition: Transition) -> str:
    """`retried` when the step went back to the queue, else the state it moved to."""
    status = target(transition)
    return m.RETRIED if status is StepStatus.READY else status.value


def _reason(change: StepChange) -> str:
    code = (change.values.get("error") or {}).get("code")
    return code if code in _CODES else m.OTHER


def _channel(step: StepRow) -> str | None:
    """The channel of a fan-out child's target (`{"channel": "email", …}`), bounded to
    `m.CHANNELS`; None when its target names none (a fan-out that is not a delivery)."""
    for value in (step.resolved_args or step.args).values():
        if isinstance(value, Mapping) and "channel" in value:
            said = value["channel"]
            return said if said in m.CHANNELS else m.OTHER
    return None


def _exemplar(step: StepRow) -> dict[str, str]:
    return {m.TRACE_ID: step.trace_id}


class PoolFigures(Protocol):
    """One pool's share of the work (services/autoscaling.py's PoolDemand)."""

    @property
    def pool(self) -> str: ...
    @property
    def queued(self) -> int: ...
    @property
    def running(self) -> int: ...
    @property
    def oldest_ready_age_seconds(self) -> float: ...
    @property
    def slots_per_executor(self) -> int | None: ...


class ControllerMetrics:
    """Every metric one controller exports, in its own registry (several may share a process).

    `total(name)` sums a metric's samples over its labels (tests read counts through it)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._children: dict[tuple[Any, tuple[str, ...]], Any] = {}
        r = self.registry
        ProcessCollector(registry=r)
        self._depth = Gauge(
            m.QUEUE_DEPTH, "Steps waiting for an executor, due or not.", [m.TOOL], registry=r
        )
        self._oldest = Gauge(
            m.QUEUE_OLDEST_READY_AGE,
            "How long the longest-waiting due step has been due (0: none).",
            [m.TOOL],
            registry=r,
        )
        self._pool_depth = Gauge(
            m.POOL_QUEUE_DEPTH, "Ready steps the pool may take, due or not.", [m.POOL], registry=r
        )
        self._pool_running = Gauge(
            m.POOL_RUNNING, "Steps the pool's executors hold.", [m.POOL], registry=r
        )
        self._pool_oldest = Gauge(
            m.POOL_OLDEST_READY_AGE,
            "How long the pool's longest-waiting due step has been due (0: none).",
            [m.POOL],
            registry=r,
        )
        self._pool_slots = Gauge(
            m.POOL_SLOTS,
            "Slots of the pool's most recent executor (absent: none has registered).",
            [m.POOL],
            registry=r,
        )
        self._start = Histogram(
            m.SCHEDULE_TO_START,
            "From when an attempt was due (ready, past its backoff, hold or rate limit) to its "
            "lease.",
            [m.TOOL],
            buckets=m.LATENCY_BUCKETS,
            registry=r,
        )
        self._leased = Counter(
            m.STEPS_LEASED,
            "Leases handed to executors: claimed from the queue, or handed_off to a waiting "
            "poll in the submit's own transaction.",
            [m.PATH],
            registry=r,
        )
        for path in m.LEASE_PATHS:
            self._leased.labels(path)
        self._duration = Histogram(
            m.STEP_DURATION,
            "How long an attempt ran on its executor, by what became of the step.",
            [m.TOOL, m.OUTCOME],
            buckets=m.LATENCY_BUCKETS,
            registry=r,
        )
        self._steps = Counter(
            m.STEPS,
            "Attempts the controller closed, by what became of the step (retried: queued again).",
            [m.TOOL, m.OUTCOME],
            registry=r,
        )
        self._deliveries = Counter(
            m.DELIVERIES,
            "Attempts to reach one target of a fan-out step, by channel and what became of it.",
            [m.TOOL, m.CHANNEL, m.OUTCOME],
            registry=r,
        )
        self._retries = Counter(
            m.RETRIES, "Attempts queued again, by error code.", [m.TOOL, m.REASON], registry=r
        )
        self._rate_limited = Counter(
            m.RATE_LIMITED,
            "Steps a rate-limit bucket sent back to the queue until it admits them.",
            [m.TOOL],
            registry=r,
        )
        self._pauses = Counter(
            m.TOOL_PAUSES,
            "Times a downstream asked a whole tool to hold back (429, quota spent).",
            [m.TOOL],
            registry=r,
        )
        self._breakers = Gauge(
            m.BREAKER_STATE,
            "Circuit breaker of each guarded tool: 0 closed, 1 half-open, 2 open.",
            [m.TOOL],
            registry=r,
        )
        self._expired = Counter(
            m.LEASE_EXPIRATIONS,
            "Running steps whose executor stopped heartbeating (re-queued, failed or held).",
            registry=r,
        )
        self._rejected = Counter(
            m.RESULTS_REJECTED,
            "Results and heartbeats not applied: for an older attempt (stale_lease), repeated, "
            "or quoting a lease the caller does not hold (not_lease_holder).",
            [m.REASON],
            registry=r,
        )
        self._auth_failures = Counter(
            m.EXECUTOR_AUTH_FAILURES,
            "Executor calls refused: no_credentials, bad_token, bad_session, session_ended, "
            "out_of_scope.",
            [m.REASON],
            registry=r,
        )
        self._sweep_failures = Counter(
            m.SWEEP_FAILURES,
            "Background sweeps that raised (each runs again at its next interval), by sweep.",
            [m.SWEEP],
            registry=r,
        )
        self._group_size = Histogram(
            m.SUBMIT_GROUP_SIZE,
            "Submits per intake transaction: 1 alone, more when submits arrived while the "
            "database was busy and shared one commit.",
            buckets=m.GROUP_SIZE_BUCKETS,
            registry=r,
        )
        self._groups_split = Counter(
            m.SUBMIT_GROUPS_SPLIT,
            "Submit groups refused at commit (a taken Idempotency-Key, a changed catalogue) whose "
            "members then ran alone.",
            registry=r,
        )
        self._sessions_ended = Counter(
            m.EXECUTOR_SESSIONS_ENDED,
            "Executor sessions ended, and their leases released: expired, revoked, replaced.",
            [m.REASON],
            registry=r,
        )

        self._model_calls = Counter(
            m.MODEL_CALLS,
            "Model calls of agent runs that completed.",
            [m.AGENT, m.VERSION, m.MODEL],
            registry=r,
        )
        self._model_tokens = Counter(
            m.MODEL_TOKENS,
            "Tokens agent runs were charged for: at least what was sent, whatever a reply said.",
            [m.AGENT, m.VERSION, m.MODEL, m.KIND],
            registry=r,
        )
        self._model_cost = Counter(
            m.MODEL_COST,
            "What agent runs' model calls cost, in the profile's price table's units.",
            [m.AGENT, m.VERSION, m.MODEL],
            registry=r,
        )
        self._runs_ended = Counter(
            m.RUNS_ENDED,
            "Agent runs ended, by status and reason.",
            [m.AGENT, m.VERSION, m.STATUS, m.REASON],
            registry=r,
        )
        self._run_rounds = Counter(
            m.RUN_ROUNDS, "Rounds of the agent runs that ended.", [m.AGENT, m.VERSION], registry=r
        )
        self._runs_ungrounded = Counter(
            m.RUNS_UNGROUNDED,
            "Agent runs that answered with claims nothing the model read supports.",
            [m.AGENT, m.VERSION],
            registry=r,
        )
        self._run_tool_calls = Counter(
            m.RUN_TOOL_CALLS,
            "Tool calls of agent runs' rounds, by how they ended (succeeded or failed).",
            [m.AGENT, m.VERSION, m.OUTCOME],
            registry=r,
        )

    # -- agent runs -------------------------------------------------------------------------------

    def model_called(
        self,
        conn: Connection,
        run: RunRow,
        model: str,
        tokens: Mapping[str, int],
        cost: float,
    ) -> None:
        """A run's model call, charged, once its transaction commits."""
        who = (run.agent, run.agent_version)

        def record() -> None:
            self._child(self._model_calls, *who, model).inc()
            for kind in m.TOKEN_KINDS:
                self._child(self._model_tokens, *who, model, kind).inc(tokens.get(kind, 0))
            self._child(self._model_cost, *who, model).inc(cost)

        after_commit(conn, record)

    def run_ended(
        self, conn: Connection, run: RunRow, status: str, reason: str, *, ungrounded: bool
    ) -> None:
        """A run's end (its rounds, whether its answer made claims up), once it commits."""
        who = (run.agent, run.agent_version)

        def record() -> None:
            self._child(self._runs_ended, *who, status, reason).inc()
            self._child(self._run_rounds, *who).inc(run.round - run.turn_start + 1)
            if ungrounded:
                self._child(self._runs_ungrounded, *who).inc()

        after_commit(conn, record)

    def run_tool_calls(self, conn: Connection, run: RunRow, failed: int, succeeded: int) -> None:
        who = (run.agent, run.agent_version)

        def record() -> None:
            self._child(self._run_tool_calls, *who, "failed").inc(failed)
            self._child(self._run_tool_calls, *who, "succeeded").inc(succeeded)

        after_commit(conn, record)

    # -- dispatch -------------------------------------------------------------------------------

    def total(self, name: str, **labels: str) -> float:
        """The sum of a series' samples over its labels, or those matching `labels`
        (e.g. `total("agent_reach_results_rejected_total", reason="stale_lease")`)."""
        return sum(
            sample.value
            for family in self.registry.collect()
            for sample in family.samples
            if sample.name == name and labels.items() <= sample.labels.items()
        )

    def _child(self, metric: Any, *values: str) -> Any:
        """`metric.labels(*values)`, looked up once: `labels()` validates and locks on every
        call, and the per-step metrics call it three times a step. (Label values are bounded:
        tools of the catalogue, outcomes, reasons.)"""
        key = (metric, values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def leased(self, steps: Sequence[StepRow], *, now: datetime, handed_off: bool = False) -> None:
        """Schedule-to-start of attempts just handed to an executor (committed leases), and
        how they were leased."""
        self._child(self._leased, m.HANDED_OFF if handed_off else m.CLAIMED).inc(len(steps))
        for step in steps:
            if (due := step.due_at) is None:
                continue
            wait = max(0.0, (now - due).total_seconds())
            self._child(self._start, step.tool).observe(wait, exemplar=_exemplar(step))

    def results(
        self, conn: Connection, applied: Sequence[tuple[AttemptResult, StepChange]]
    ) -> None:
        """Attempts closed from executors' results, once their transaction commits."""
        closed = list(applied)

        def record() -> None:
            for result, change in closed:
                self._closed(change, result)

        after_commit(conn, record)

    def settled(self, conn: Connection, changes: Sequence[StepChange]) -> None:
        """Steps the controller moved itself (lease expiry, a timeout, a refusal), at commit."""
        closed = list(changes)

        def record() -> None:
            for change in closed:
                self._closed(change, None)

        after_commit(conn, record)

    def _closed(self, change: StepChange, result: AttemptResult | None) -> None:
        step, outcome = change.step, _outcome(change.transition)
        exemplar = _exemplar(step)
        self._child(self._steps, step.tool, outcome).inc(exemplar=exemplar)
        if outcome == m.RETRIED:
            self._child(self._retries, step.tool, _reason(change)).inc(exemplar=exemplar)
        if fanout.parent_of(step.step_id) is not None and (channel := _channel(step)):
            self._child(self._deliveries, step.tool, channel, outcome).inc(exemplar=exemplar)
        if result is not None and result.started_at and result.finished_at:
            ran = max(0.0, (result.finished_at - result.started_at).total_seconds())
            self._child(self._duration, step.tool, outcome).observe(ran, exemplar=exemplar)

    def rate_limited(self, conn: Connection, tools: Iterable[str]) -> None:
        deferred = list(tools)

        def record() -> None:
            for tool in deferred:
                self._rate_limited.labels(tool).inc()

        after_commit(conn, record)

    def tool_paused(self, conn: Connection, tool: str) -> None:
        after_commit(conn, self._pauses.labels(tool).inc)

    def rejected(self, conn: Connection, reason: str) -> None:
        after_commit(conn, self._rejected.labels(reason).inc)

    def sweep_failed(self, sweep: str) -> None:
        self._sweep_failures.labels(sweep).inc()

    def submit_group(self, size: int) -> None:
        self._group_size.observe(size)

    def submit_group_split(self) -> None:
        self._groups_split.inc()

    def auth_failed(self, reason: str) -> None:
        self._auth_failures.labels(reason).inc()

    def sessions_ended(self, reason: str, count: int) -> None:
        if count:
            self._sessions_ended.labels(reason).inc(count)

    def leases_expired(self, count: int) -> None:
        if count:
            self._expired.inc(count)

    # -- gauges the background loop sets --------------------------------------------------------

    def queue(self, queued: Sequence[QueuedGroup], *, tools: Iterable[str], now: datetime) -> None:
        """Replace the queue gauges: every catalogue tool (0 when idle) and any tool with steps,
        each the sum of its groups (connector, tenant) and the oldest due among them."""
        depth: dict[str, int] = dict.fromkeys(tools, 0)
        age: dict[str, float] = dict.fromkeys(depth, 0.0)
        for q in queued:
            depth[q.tool] = depth.get(q.tool, 0) + q.depth
            waited = (now - q.oldest_due).total_seconds() if q.oldest_due is not None else 0.0
            age[q.tool] = max(age.get(q.tool, 0.0), waited)
        self._depth.clear()
        self._oldest.clear()
        for tool, n in depth.items():
            self._depth.labels(tool).set(n)
            self._oldest.labels(tool).set(age[tool])

    def pools(self, pools: Iterable[PoolFigures]) -> None:
        """Replace the per-pool gauges."""
        for gauge in (self._pool_depth, self._pool_running, self._pool_oldest, self._pool_slots):
            gauge.clear()
        for p in pools:
            self._pool_depth.labels(p.pool).set(p.queued)
            self._pool_running.labels(p.pool).set(p.running)
            self._pool_oldest.labels(p.pool).set(p.oldest_ready_age_seconds)
            if p.slots_per_executor:
                self._pool_slots.labels(p.pool).set(p.slots_per_executor)

    def breakers(self, states: Mapping[str, Mapping[str, Any]]) -> None:
        """Replace the breaker gauge from `ToolHealth.breaker_states()`."""
        self._breakers.clear()
        for tool, state in states.items():
            self._breakers.labels(tool).set(m.BREAKER_STATES.get(str(state["state"]), 0))

    # -- exposition -----------------------------------------------------------------------------

    def exposition(self, accept: str) -> tuple[bytes, str]:
        """The scrape body and its content type: OpenMetrics (with exemplars) when asked for."""
        encode, content_type = choose_encoder(accept)
        return encode(self.registry), content_type
