"""The executor loop: register, long-poll for steps, heartbeat leases, report results, drain."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

from agent_reach.errors import ErrorCode
from agent_reach_executor.client import (
    Assignment,
    Backoff,
    ControllerClient,
    ControllerError,
    LeaseKey,
    Registration,
    ResultAck,
    StepFailure,
    StepResult,
    result_to_proto,
)
from agent_reach_executor.metrics import ExecutorMetrics
from agent_reach_executor.probes import ReadinessState
from agent_reach_executor.runner import StepRunner
from agent_reach_executor.settings import ExecutorSettings

log = logging.getLogger(__name__)

T = TypeVar("T")

# Output bytes per ReportResults call: with outputs capped at MAX_OUTPUT_BYTES (runner), a batch
# stays well under the 64 MiB the controller accepts.
REPORT_BATCH_BYTES = 32 * 1024 * 1024

# A long-poll answers after its wait; the call deadline leaves this much room for the network.
_POLL_MARGIN_S = 5.0


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerStats:
    """A snapshot of the worker's counters."""

    steps_started: int
    steps_finished: int
    results_accepted: int
    results_rejected: int
    results_pending: int
    in_flight: int
    polls_sent: int


@dataclass(slots=True)
class _Held:
    """A lease this executor holds: running (`task` set) or finished and awaiting its ack."""

    assignment: Assignment
    task: asyncio.Task[StepResult] | None
    started_at_ms: int = 0


def _abandoned(held: _Held, why: str) -> StepResult:
    """The result of a step that started and ended without its own: it may have called the
    downstream, so the controller decides as it would on an expired lease, without the wait
    (and never as a lease whose step did not run, which is what an unlisted lease would say)."""
    return StepResult(
        lease=held.assignment.lease,
        failure=StepFailure(
            code=ErrorCode.LEASE_LOST.value,
            message=f"{held.assignment.tool}: {why}",
            retryable=True,
            maybe_applied=True,
        ),
        started_at_ms=held.started_at_ms,
        finished_at_ms=int(time.time() * 1000),
    )


async def _until_stopped(stop: asyncio.Event, awaitable: Awaitable[T]) -> T | None:
    """Await `awaitable` unless `stop` is set first, in which case cancel it and return None."""
    work = asyncio.ensure_future(awaitable)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({work, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
        if not work.done():
            work.cancel()
            await asyncio.wait({work})  # let it unwind; a result that won the race still counts
    if work.cancelled():
        return None
    return work.result()


async def _sleep_unless_stopped(stop: asyncio.Event, delay: float) -> bool:
    """Sleep `delay` seconds; False when `stop` was set meanwhile."""
    try:
        await asyncio.wait_for(stop.wait(), timeout=delay)
    except TimeoutError:
        return True
    return False


class Worker:
    """Runs leased steps in a fixed number of slots until `stop` is set, then drains.

    Results are never dropped while the process lives unless the controller cancels the step or
    reports its lease lost; the controller rejects results for leases that expired meanwhile.
    """

    def __init__(
        self,
        client: ControllerClient,
        runner: StepRunner,
        *,
        connectors: Sequence[str],
        settings: ExecutorSettings,
        version: str = "0",
    ) -> None:
        self._client = client
        self._runner = runner
        self._connectors = list(connectors)
        self._settings = settings
        self._version = version
        self._registration = Registration(
            lease_s=30.0, heartbeat_interval_s=10.0, max_poll_wait_s=settings.poll_wait
        )
        self._held: dict[LeaseKey, _Held] = {}
        self._running: set[asyncio.Task[StepResult]] = set()
        self._slot_freed = asyncio.Event()
        self._pending: list[StepResult] = []
        self._results_ready = asyncio.Event()
        self._reports_idle = asyncio.Event()
        self._reports_idle.set()
        self._counts = {"started": 0, "finished": 0, "accepted": 0, "rejected": 0}
        # Polls are numbered (never again from 1: a number names one poll for the process's
        # life); heartbeats say up to which one all have ended, so the controller frees leases
        # whose reply never arrived (lost with a controller). Several polls may be open at once
        # (`pollers`), each asking for its share of the free slots.
        self._poll_seq = 0
        self._polls_completed = 0
        self._open_polls: set[int] = set()
        self._asked = 0  # slots the open polls may fill
        self._registering = asyncio.Lock()
        # Set when the controller ended our session: the poll loop registers again.
        self._session_ended = asyncio.Event()
        self.metrics = ExecutorMetrics(slots=settings.slots, calls=client.calls)
        # What /readyz answers: registered, answered, not draining.
        self.readiness = ReadinessState()

    @property
    def stats(self) -> WorkerStats:
        return WorkerStats(
            steps_started=self._counts["started"],
            steps_finished=self._counts["finished"],
            results_accepted=self._counts["accepted"],
            results_rejected=self._counts["rejected"],
            results_pending=len(self._pending),
            in_flight=len(self._running),
            polls_sent=self._poll_seq,
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Work until `stop` is set, then drain: finish or cancel in-flight steps, flush results."""
        self.readiness.running(stop)
        reporter = asyncio.create_task(self._report_loop(), name="executor-reporter")
        heartbeats: asyncio.Task[None] | None = None
        try:
            if not await self._register(stop):
                return
            heartbeats = asyncio.create_task(self._heartbeat_loop(), name="executor-heartbeat")
            await self._poll_loop(stop)
            await self._drain()
        finally:
            loops = [t for t in (reporter, heartbeats) if t is not None]
            leftovers = [*loops, *self._running]
            for task in leftovers:
                task.cancel()
            await asyncio.gather(*leftovers, return_exceptions=True)
            for task in loops:
                if not task.cancelled() and task.exception() is not None:
                    log.error(
                        "%s ended with an error",
                        task.get_name(),
                        exc_info=task.exception(),
                        extra={"event": "executor_loop_failed"},
                    )

    def _backoff(self) -> Backoff:
        return Backoff(
            initial=self._settings.reconnect_initial, maximum=self._settings.reconnect_maximum
        )

    # -- registration and polling -----------------------------------------------------------------

    async def _register(self, stop: asyncio.Event) -> bool:
        """Register, retrying with backoff while the controller is unavailable; False on stop."""
        backoff = self._backoff()
        while not stop.is_set():
            try:
                registration = await self._client.register(
                    self._connectors,
                    slots=self._settings.slots,
                    version=self._version,
                    deadline_s=self._settings.rpc_timeout,
                )
            except ControllerError as exc:
                if not await _sleep_unless_stopped(stop, self._log_failure(exc, backoff)):
                    return False
                continue
            self._registration = registration.with_defaults(poll_wait=self._settings.poll_wait)
            self._session_ended.clear()
            self.readiness.registered()
            log.info(
                "executor %s registered with %s (pool %s, session %s): connectors %s, %d slots, "
                "lease %.1fs",
                self._client.executor_id,
                self._settings.controller,
                registration.pool or "-",
                registration.session_id or "-",
                ",".join(self._connectors),
                self._settings.slots,
                self._registration.lease_s,
                extra={
                    "event": "executor_registered",
                    "executor_id": self._client.executor_id,
                    "session": registration.session_id,
                },
            )
            return True
        return False

    async def _poll_loop(self, stop: asyncio.Event) -> None:
        """Keep `pollers` long polls open until `stop` (or until registering is given up)."""
        pollers = [
            asyncio.create_task(self._poller(stop), name=f"executor-poller-{i}")
            for i in range(self._settings.pollers)
        ]
        try:
            await asyncio.gather(*pollers)
        finally:
            for poller in pollers:
                poller.cancel()
            await asyncio.gather(*pollers, return_exceptions=True)

    async def _poller(self, stop: asyncio.Event) -> None:
        backoff = self._backoff()
        while not stop.is_set():
            if self._session_ended.is_set():
                async with self._registering:  # one poller registers; the others wait for it
                    if self._session_ended.is_set() and not await self._register(stop):
                        return
            free = self._settings.slots - len(self._running) - self._asked
            if free <= 0:
                self._slot_freed.clear()
                await _until_stopped(stop, self._slot_freed.wait())
                continue
            # An even share of what is free among the pollers not polling (this one included).
            idle = max(1, self._settings.pollers - len(self._open_polls))
            ask = -(-free // idle)
            wait_s = min(self._settings.poll_wait, self._registration.max_poll_wait_s)
            self._poll_seq += 1
            seq = self._poll_seq
            poll = self._client.poll_steps(
                self._connectors,
                max_steps=ask,
                wait_s=wait_s,
                deadline_s=wait_s + _POLL_MARGIN_S,
                poll_seq=seq,
                held=len(self._held),
            )
            self._open_polls.add(seq)
            self._asked += ask
            try:
                assignments = await _until_stopped(stop, poll)
            except ControllerError as exc:
                if exc.session_ended:
                    self._end_session(exc)
                    continue
                if not await _sleep_unless_stopped(stop, self._log_failure(exc, backoff)):
                    return
                continue
            finally:
                self._poll_ended(seq, ask)
            backoff.reset()
            self.readiness.answered()
            for assignment in assignments or ():
                self._start(assignment)

    def _poll_ended(self, seq: int, asked: int) -> None:
        """Poll `seq` has ended (answered, failed or abandoned): its share of the slots is free
        again, and every poll before the oldest still open has now ended."""
        self._open_polls.discard(seq)
        self._asked -= asked
        self._polls_completed = min(self._open_polls) - 1 if self._open_polls else self._poll_seq
        self._slot_freed.set()

    def _log_failure(self, exc: ControllerError, backoff: Backoff) -> float:
        """Log one failed call to the controller; returns the delay before the next try."""
        self.readiness.failed(exc.method, exc.code)
        delay = backoff.next_delay()
        log.log(
            logging.WARNING if exc.transient else logging.ERROR,
            "controller %s: %s failed (%s: %s); retry %d in %.2fs",
            self._settings.controller,
            exc.method,
            exc.code,
            exc.details,
            backoff.failures,
            delay,
            extra={"event": "controller_unavailable", "method": exc.method, "code": exc.code},
        )
        return delay

    # -- slots ------------------------------------------------------------------------------------

    def _start(self, assignment: Assignment) -> None:
        task = asyncio.create_task(
            self._runner.run(assignment),
            name=f"step-{assignment.task_id}-{assignment.step_id}-{assignment.lease.attempt}",
        )
        self._held[assignment.lease] = _Held(
            assignment=assignment, task=task, started_at_ms=int(time.time() * 1000)
        )
        self._running.add(task)
        self.metrics.slots_busy(len(self._running))
        self._counts["started"] += 1
        task.add_done_callback(partial(self._on_step_done, assignment.lease))

    def _on_step_done(self, lease: LeaseKey, task: asyncio.Task[StepResult]) -> None:
        self._running.discard(task)
        self.metrics.slots_busy(len(self._running))
        self._slot_freed.set()
        held = self._held.get(lease)
        if held is None or held.task is not task:
            return  # dropped: cancelled or lost, nothing to report
        held.task = None
        if task.cancelled():  # by the drain, past its grace
            self._pending.append(_abandoned(held, "the executor stopped before it finished"))
        elif (exc := task.exception()) is not None:
            log.error(
                "runner failed on %s/%s; reporting it as an attempt that may have applied",
                held.assignment.task_id,
                held.assignment.step_id,
                exc_info=exc,
                extra=held.assignment.log_extra("runner_failed"),
            )
            self._pending.append(_abandoned(held, "the executor failed while running it"))
        else:
            self._counts["finished"] += 1
            self.metrics.call_finished(held.assignment, task.result())
            self._pending.append(task.result())
        self._reports_idle.clear()
        self._results_ready.set()

    def _drop(self, lease: LeaseKey, *, reason: str) -> None:
        """Stop a step the controller no longer wants, and forget its result."""
        held = self._held.pop(lease, None)
        if held is None:
            return
        if held.task is not None:
            held.task.cancel()
        self._pending = [r for r in self._pending if r.lease != lease]
        log.info(
            "step %s/%s %s by the controller; stopping it and reporting nothing",
            held.assignment.task_id,
            held.assignment.step_id,
            reason,
            extra={**held.assignment.log_extra("step_dropped"), "reason": reason},
        )

    def _end_session(self, exc: ControllerError) -> None:
        """The controller ended our session (it expired or its token was revoked): its leases
        are already back in the queue, so stop their steps and forget their results."""
        if self._session_ended.is_set():
            return
        log.error(
            "the controller ended this executor's session (%s); dropping %d leases and "
            "registering again",
            exc.details,
            len(self._held),
            extra={"event": "session_ended", "method": exc.method},
        )
        for lease in list(self._held):
            self._drop(lease, reason="lost with the session")
        self._session_ended.set()
        self.readiness.lost()
        self._slot_freed.set()

    # -- heartbeats -------------------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        """One beat per interval keeps the session, and with it every lease, alive."""
        failing_since: float | None = None
        while True:
            await asyncio.sleep(self._registration.heartbeat_interval_s)
            if self._session_ended.is_set():
                continue
            leases = list(self._held)
            if not leases and not self._registration.session:
                continue  # a controller without sessions has nothing to keep alive
            try:
                # An answer later than half a lease is worthless: give up and try the next beat.
                deadline_s = min(self._settings.rpc_timeout, self._registration.lease_s / 2)
                reply = await self._client.heartbeat(
                    leases, deadline_s=deadline_s, polls_completed=self._polls_completed
                )
            except ControllerError as exc:
                if exc.session_ended:
                    self._end_session(exc)
                    continue
                failing_since = failing_since or time.monotonic()
                self._log_heartbeat_failure(exc, failing_for=time.monotonic() - failing_since)
                continue
            except Exception:
                # Never let a surprise end the heartbeats: every lease would expire while its
                # step keeps running here, and the controller would run it a second time.
                failing_since = failing_since or time.monotonic()
                log.exception(
                    "heartbeat failed unexpectedly; the next beat tries again",
                    extra={"event": "heartbeat_crashed"},
                )
                continue
            failing_since = None
            self.readiness.answered()
            for lease in reply.cancelled:
                self._drop(lease, reason="cancelled")
            for lease in reply.lost:
                self._drop(lease, reason="lost")

    def _log_heartbeat_failure(self, exc: ControllerError, *, failing_for: float) -> None:
        # Past the lease the controller has probably re-queued our steps. Keep working anyway:
        # a late result is rejected as stale, an early drop would waste work that may still count.
        self.readiness.failed(exc.method, exc.code)
        expired = failing_for > self._registration.lease_s
        log.warning(
            "heartbeat failed for %.1fs (%s: %s)%s",
            failing_for,
            exc.code,
            exc.details,
            "; leases have probably expired, results will still be reported" if expired else "",
            extra={"event": "controller_unavailable", "method": exc.method, "code": exc.code},
        )

    # -- reports ----------------------------------------------------------------------------------

    def _next_batch(self, cap: int) -> list[StepResult]:
        """Up to `cap` pending results, and no more output bytes than fit one message."""
        size, count = 0, 0
        for result in self._pending[:cap]:
            size += len(result.output_json)
            if count and size > REPORT_BATCH_BYTES:
                break
            count += 1
        batch, self._pending = self._pending[:count], self._pending[count:]
        return batch

    async def _report_loop(self) -> None:
        """Report results in batches: whatever accumulated during the previous call goes next."""
        backoff = self._backoff()
        cap = self._settings.report_batch_max
        while True:
            await self._results_ready.wait()
            batch = self._next_batch(cap)
            if not batch:
                self._results_ready.clear()
                self._reports_idle.set()
                continue
            try:
                acks = await self._client.report_results(
                    batch, deadline_s=self._settings.rpc_timeout, held=len(self._held)
                )
            except ControllerError as exc:
                if exc.session_ended:
                    self._end_session(exc)
                    continue
                # Keep them (minus any the controller dropped meanwhile) and retry.
                self._pending[:0] = [r for r in batch if r.lease in self._held]
                await asyncio.sleep(self._log_failure(exc, backoff))
                continue
            except Exception:
                # A dead reporter would strand every result, and heartbeats would keep their
                # leases alive for ever: keep the batch, say so loudly, and try again.
                self._pending[:0] = [r for r in batch if self._encodable(r)]
                delay = backoff.next_delay()
                log.exception(
                    "reporting %d results failed unexpectedly; retry in %.2fs",
                    len(batch),
                    delay,
                    extra={"event": "report_crashed", "count": len(batch)},
                )
                await asyncio.sleep(delay)
                continue
            backoff.reset()
            self.readiness.answered()
            self._apply_acks(batch, acks)

    def _encodable(self, result: StepResult) -> bool:
        """Whether `result` is still held and can go on the wire; a poison result is dropped."""
        if result.lease not in self._held:
            return False
        try:
            result_to_proto(result).SerializeToString()
        except Exception:
            held = self._held.pop(result.lease)
            log.exception(
                "result of %s/%s cannot be encoded; dropping it, its lease will expire",
                held.assignment.task_id,
                held.assignment.step_id,
                extra=held.assignment.log_extra("result_unencodable"),
            )
            return False
        return True

    def _apply_acks(self, batch: Sequence[StepResult], acks: Sequence[ResultAck]) -> None:
        if len(acks) != len(batch):
            log.warning(
                "controller answered %d acks for %d results",
                len(acks),
                len(batch),
                extra={"event": "result_ack_mismatch"},
            )
        by_lease = {ack.lease: ack for ack in acks}
        for result in batch:
            held = self._held.pop(result.lease, None)
            ack = by_lease.get(result.lease)
            self.metrics.reported(accepted=ack is not None and ack.accepted)
            if ack is not None and ack.accepted:
                self._counts["accepted"] += 1
                continue
            self._counts["rejected"] += 1
            reason = ack.reason if ack is not None else "no ack"
            extra = held.assignment.log_extra("result_rejected") if held else {}
            log.info(
                "result for step_key %d attempt %d rejected: %s",
                result.lease.step_key,
                result.lease.attempt,
                reason,
                extra={**extra, "event": "result_rejected", "reason": reason},
            )

    # -- drain ------------------------------------------------------------------------------------

    async def _drain(self) -> None:
        grace = self._settings.drain_grace
        running = set(self._running)
        log.info(
            "draining: %d steps in flight, %.1fs grace",
            len(running),
            grace,
            extra={"event": "drain_started", "in_flight": len(running)},
        )
        if running:
            _, late = await asyncio.wait(running, timeout=grace)
            if late:
                log.warning(
                    "cancelling %d steps still running after the %.1fs grace; each is reported "
                    "as an attempt that may have applied, for the controller to decide again",
                    len(late),
                    grace,
                    extra={"event": "drain_cancelled", "cancelled": len(late)},
                )
                for task in late:
                    task.cancel()
                await asyncio.gather(*late, return_exceptions=True)
        flush_s = max(grace, self._settings.rpc_timeout)
        try:
            await asyncio.wait_for(self._reports_idle.wait(), timeout=flush_s)
        except TimeoutError:
            log.error(
                "%d results not delivered within %.1fs; their steps will run again",
                len(self._pending),
                flush_s,
                extra={"event": "results_undelivered", "count": len(self._pending)},
            )
        calls = ", ".join(
            f"{method} {transport} {count}"
            for (method, transport), count in sorted(self._client.calls.items())
        )
        log.info(
            "drain finished: %d started, %d finished, %d accepted, %d rejected; calls: %s",
            *(self._counts[k] for k in ("started", "finished", "accepted", "rejected")),
            calls or "none",
            extra={"event": "drain_finished"},
        )
