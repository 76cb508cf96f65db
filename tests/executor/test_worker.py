"""The worker loop against a real gRPC fake controller on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any

import pytest

from agent_reach.v1 import executor_pb2 as pb
from agent_reach_connectors.base import ToolCall

# Submodule imports: they work whether or not the editable install predates the package's
# __init__.py (which makes it a namespace package until the project is reinstalled).
from agent_reach_executor.__main__ import run_executor
from agent_reach_executor.client import ControllerClient, StepFailure, StepResult
from agent_reach_executor.runner import StepRunner
from agent_reach_executor.settings import ExecutorSettings
from agent_reach_executor.worker import Worker
from tests.executor.fake_controller import FakeController, FnConnector, Probe

CANARY = "canary-7f3a9c-secret"


async def wait_until(predicate: Callable[[], bool], within: float = 5.0) -> None:
    """Poll `predicate` until it holds; fail the test after `within` seconds."""
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {within}s")
        await asyncio.sleep(0.01)


def make_settings(target: str, **overrides: Any) -> ExecutorSettings:
    values: dict[str, Any] = {
        "controller": target,
        "executor_id": "exec-test",
        "slots": 4,
        "poll_wait": 0.2,
        "drain_grace": 2.0,
        "reconnect_initial": 0.02,
        "reconnect_maximum": 0.2,
        "rpc_timeout": 2.0,
    }
    return ExecutorSettings(**(values | overrides))


@dataclass
class Running:
    worker: Worker
    stop: asyncio.Event
    run: asyncio.Task[None]


@asynccontextmanager
async def running_worker(
    fake: FakeController,
    connectors: dict[str, Any],
    *,
    runner: StepRunner | None = None,
    **overrides: Any,
) -> AsyncIterator[Running]:
    settings = make_settings(fake.target, **overrides)
    async with ControllerClient(
        settings.controller,
        executor_id=settings.executor_id,
        reconnect_initial=settings.reconnect_initial,
        reconnect_maximum=settings.reconnect_maximum,
        stream=settings.stream,
        streams=settings.pollers,
    ) as client:
        worker = Worker(
            client,
            runner or StepRunner(connectors),
            connectors=list(connectors),
            settings=settings,
        )
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run(stop))
        try:
            yield Running(worker=worker, stop=stop, run=task)
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)


@pytest.fixture
async def fake() -> AsyncIterator[FakeController]:
    controller = FakeController()
    await controller.start()
    yield controller
    await controller.stop()


def events_of(caplog: pytest.LogCaptureFixture, event: str) -> Callable[[], list[Any]]:
    """A live view of the captured records of one `event` (attributes typed loosely)."""
    return lambda: [r for r in caplog.records if getattr(r, "event", None) == event]


def failure_of(fake: FakeController, key: tuple[int, int]) -> pb.StepError:
    result = fake.results[key]
    assert result.outcome == pb.OUTCOME_FAILED
    return result.error


async def test_runs_up_to_slots_concurrently_and_batches_reports(fake: FakeController) -> None:
    probe = Probe()
    keys = [fake.enqueue(connector="probe", args={"n": i}) for i in range(12)]
    async with running_worker(fake, {"probe": FnConnector("probe", probe)}, slots=4) as running:
        worker = running.worker
        await wait_until(lambda: probe.running == 4)
        assert worker.stats.in_flight == 4
        assert all(p.request.max_steps <= 4 for p in fake.polls)
        probe.release.set()
        await wait_until(lambda: len(fake.results) == 12)
        await wait_until(lambda: worker.stats.results_accepted == 12)
    assert probe.peak == 4
    assert fake.registrations[0].slots == 4
    assert list(fake.registrations[0].connectors) == ["probe"]
    assert len(fake.report_calls) < 12  # results that finish together share a call
    assert len(fake.all_reports()) == 12  # and none is reported twice
    for i, key in enumerate(keys):
        result = fake.results[key]
        assert result.outcome == pb.OUTCOME_SUCCEEDED
        assert json.loads(result.output_json)["args"] == {"n": i}
        assert 0 < result.started_at_ms <= result.finished_at_ms
    assert worker.stats.steps_finished == 12
    assert worker.stats.results_rejected == 0


async def test_pollers_share_the_free_slots_and_count_a_poll_complete_only_in_order(
    fake: FakeController,
) -> None:
    """Two polls open at once ask for no more than the free slots between them, and heartbeats
    never call a poll complete while an earlier one is still open: the controller would free
    the leases that earlier poll is still bringing back."""
    probe = Probe()
    fake.held[1] = slow = asyncio.Event()
    fake.enqueue(connector="probe")
    async with running_worker(
        fake, {"probe": FnConnector("probe", probe)}, slots=3, pollers=2
    ) as running:
        await wait_until(lambda: probe.running == 1)  # leased by poll 2 while poll 1 is held
        # The two pollers' first polls may reach the controller in either order.
        by_seq = {p.request.poll_seq: p.request for p in fake.polls}
        first, second = by_seq[1], by_seq[2]
        assert first.max_steps + second.max_steps <= 3
        beats = len(fake.heartbeats)
        await wait_until(lambda: len(fake.heartbeats) >= beats + 3)
        assert all(beat.polls_completed == 0 for beat in fake.heartbeats)
        assert running.worker.stats.in_flight == 1
        slow.set()
        await wait_until(lambda: fake.heartbeats[-1].polls_completed >= 2)
        seqs = [p.request.poll_seq for p in fake.polls]
        assert len(seqs) == len(set(seqs))  # each number names one poll
        probe.release.set()


async def test_batches_are_capped_by_report_batch_max(fake: FakeController) -> None:
    probe = Probe()
    probe.release.set()
    keys = [fake.enqueue(connector="probe") for _ in range(9)]
    connectors = {"probe": FnConnector("probe", probe)}
    async with running_worker(fake, connectors, slots=9, report_batch_max=2):
        await wait_until(lambda: len(fake.results) == len(keys))
    assert max(len(call.results) for call in fake.report_calls) == 2


async def test_rejected_results_are_counted_and_logged(
    fake: FakeController, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    probe = Probe()
    probe.release.set()
    key = fake.enqueue(connector="probe")
    fake.reject[key] = "stale_lease"
    async with running_worker(fake, {"probe": FnConnector("probe", probe)}) as running:
        worker = running.worker
        await wait_until(lambda: worker.stats.results_rejected == 1)
    (record,) = events_of(caplog, "result_rejected")()
    assert record.levelno == logging.INFO
    assert (record.reason, record.step_id, record.task_id) == ("stale_lease", "s1", "task-1")
    assert worker.stats.results_accepted == 0
    assert len(fake.report_calls) == 1  # a rejection is final, not retried


async def test_timeout_is_reported_as_retryable_and_maybe_applied(fake: FakeController) -> None:
    never = Probe()
    key = fake.enqueue(connector="slow", tool="slow.call", timeout_ms=100)
    async with running_worker(fake, {"slow": FnConnector("slow", never)}):
        await wait_until(lambda: key in fake.results)
    error = failure_of(fake, key)
    assert error.code == "timeout"
    assert error.message == "slow.call did not finish within 0.1s"
    assert error.retryable
    assert error.maybe_applied
    assert never.cancelled == ["s1"]


async def test_connector_error_fields_reach_the_controller(fake: FakeController) -> None:
    from agent_reach_connectors.base import ConnectorError

    async def limited(call: ToolCall) -> Any:
        raise ConnectorError("rate_limited", "slow down", retry_after=2.5, maybe_applied=True)

    key = fake.enqueue(connector="rl")
    async with running_worker(fake, {"rl": FnConnector("rl", limited)}):
        await wait_until(lambda: key in fake.results)
    error = failure_of(fake, key)
    assert (error.code, error.message, error.retryable) == ("rate_limited", "slow down", True)
    assert error.retry_after_s == 2.5
    assert error.maybe_applied


async def test_crash_text_never_reaches_reports_or_logs(
    fake: FakeController, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)

    async def crash(call: ToolCall) -> Any:
        raise RuntimeError(f"connect to postgres://admin:{CANARY}@db failed")

    key = fake.enqueue(connector="crash", tool="db.query")
    async with running_worker(fake, {"crash": FnConnector("crash", crash)}):
        await wait_until(lambda: key in fake.results)
    error = failure_of(fake, key)
    assert error.code == "connector_error"
    assert error.message == "db.query: RuntimeError"
    assert not error.retryable
    for call in fake.report_calls:
        assert CANARY.encode() not in call.SerializeToString()
    assert CANARY not in caplog.text
    assert all(CANARY not in str(vars(record)) for record in caplog.records)
    crashed = [r for r in caplog.records if getattr(r, "event", None) == "connector_crashed"]
    assert len(crashed) == 1
    assert crashed[0].levelno == logging.ERROR
    assert "in crash" in crashed[0].getMessage()  # where it was raised is kept


@pytest.mark.parametrize("verdict", ["cancelled", "lost"])
async def test_heartbeat_verdict_stops_the_step_and_drops_its_result(
    fake: FakeController, verdict: str
) -> None:
    probe = Probe()
    doomed = fake.enqueue(connector="probe")
    async with running_worker(fake, {"probe": FnConnector("probe", probe)}) as running:
        worker = running.worker
        await wait_until(lambda: probe.started == ["s1"])
        await wait_until(
            lambda: any(
                (lease.step_key, lease.attempt) == doomed
                for hb in fake.heartbeats
                for lease in hb.leases
            )
        )
        (fake.to_cancel if verdict == "cancelled" else fake.to_lose).add(doomed)
        await wait_until(lambda: probe.cancelled == ["s1"])
        probe.release.set()
        follower = fake.enqueue(connector="probe")  # a later step proves the reporter ran
        await wait_until(lambda: follower in fake.results)
        assert worker.stats.in_flight == 0
    reported = {(r.lease.step_key, r.lease.attempt) for r in fake.all_reports()}
    assert doomed not in reported
    assert worker.stats.steps_finished == 1


async def test_executor_waits_for_a_controller_that_starts_later(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    fake = FakeController()
    port = await fake.start()
    await fake.stop()  # keep the port, lose the server
    connector = FnConnector("echo", _echo)
    stop = asyncio.Event()
    run = asyncio.create_task(
        run_executor(
            make_settings(fake.target),
            connectors={"echo": connector},
            stop=stop,
            handle_signals=False,
        )
    )
    try:
        failures = events_of(caplog, "controller_unavailable")
        await wait_until(lambda: len(failures()) >= 3)
        assert connector.started
        assert not fake.registrations
        await fake.start(port)
        key = fake.enqueue(connector="echo", args={"x": 1})
        await wait_until(lambda: key in fake.results)
        assert json.loads(fake.results[key].output_json) == {"x": 1}
        assert len(fake.registrations) == 1
    finally:
        stop.set()
        await asyncio.wait_for(run, 10)
        await fake.stop()
    assert connector.closed
    assert any(getattr(r, "event", None) == "executor_registered" for r in caplog.records)


async def _echo(call: ToolCall) -> Any:
    return dict(call.args)


async def test_results_survive_a_controller_restart(
    fake: FakeController, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    probe = Probe()
    keys = [fake.enqueue(connector="probe", args={"n": i}) for i in range(3)]
    async with running_worker(fake, {"probe": FnConnector("probe", probe)}) as running:
        worker = running.worker
        await wait_until(lambda: probe.running == 3)
        await fake.stop()
        probe.release.set()
        await wait_until(lambda: worker.stats.results_pending == 3 and probe.running == 0)
        failed = events_of(caplog, "controller_unavailable")
        await wait_until(lambda: sum(r.method == "ReportResults" for r in failed()) >= 2)
        assert not fake.results
        await fake.start(fake.port)
        # gRPC's own reconnect backoff reaches 5 s (the default cap) while the port is closed.
        await wait_until(lambda: all(k in fake.results for k in keys), within=15)
        late = fake.enqueue(connector="probe", args={"n": 3})
        await wait_until(lambda: late in fake.results, within=15)  # and polls it again
        # The controller holds the result before its answer reaches the worker's count.
        await wait_until(lambda: worker.stats.results_accepted == 4)
        # Its session lives in the controllers' database, not in the process that restarted:
        # the executor keeps it (and its leases) rather than registering again.
        assert len(fake.registrations) == 1


async def test_drain_finishes_in_flight_work_and_stops_polling(
    fake: FakeController, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)

    async def slow(call: ToolCall) -> Any:
        await asyncio.sleep(0.3)
        return "done"

    key = fake.enqueue(connector="slow")
    async with running_worker(fake, {"slow": FnConnector("slow", slow)}) as running:
        await wait_until(lambda: running.worker.stats.in_flight == 1)
        running.stop.set()
        sent_before_stop = running.worker.stats.polls_sent
        await asyncio.wait_for(running.run, 5)
    assert fake.results[key].outcome == pb.OUTCOME_SUCCEEDED
    assert json.loads(fake.results[key].output_json) == "done"
    # A poll sent just before the stop may reach the controller after it; none may be sent after.
    assert running.worker.stats.polls_sent == sent_before_stop
    assert max(p.request.poll_seq for p in fake.polls) <= sent_before_stop
    events = [getattr(r, "event", None) for r in caplog.records]
    assert events.index("drain_started") < events.index("step_finished")
    assert events.index("step_finished") < events.index("drain_finished")


async def test_drain_cancels_steps_that_outlive_the_grace(
    fake: FakeController, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    probe = Probe()
    key = fake.enqueue(connector="probe")
    connectors = {"probe": FnConnector("probe", probe)}
    async with running_worker(fake, connectors, drain_grace=0.3) as running:
        await wait_until(lambda: probe.running == 1)
        began = time.monotonic()
        running.stop.set()
        await asyncio.wait_for(running.run, 5)
        took = time.monotonic() - began
    assert probe.cancelled == ["s1"]
    assert 0.25 <= took < 2.0
    # Reported, not left to expire: it started, so it may have called the downstream (a lease
    # left out of a heartbeat instead would be taken for one whose step never ran).
    failure = fake.results[key].error
    assert (failure.code, failure.retryable, failure.maybe_applied) == ("lease_lost", True, True)
    assert "stopped before it finished" in failure.message
    assert "for the controller to decide again" in caplog.text
    assert running.worker.stats.in_flight == 0


async def test_sigterm_drains_the_executor(fake: FakeController) -> None:
    probe = Probe()
    key = fake.enqueue(connector="probe")
    connectors: dict[str, Any] = {"probe": FnConnector("probe", probe)}
    run = asyncio.create_task(run_executor(make_settings(fake.target), connectors=connectors))
    await wait_until(lambda: probe.running == 1)
    os.kill(os.getpid(), signal.SIGTERM)
    await asyncio.sleep(0)  # let the handler run before the step is released
    probe.release.set()
    await asyncio.wait_for(run, 5)
    assert key in fake.results  # run_executor returned, so the signal set its stop event
    # The handler was removed again: the default disposition is back.
    assert signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, signal.default_int_handler)


def test_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_REACH_EXECUTOR_SLOTS", "3")
    monkeypatch.setenv("AGENT_REACH_EXECUTOR_CONNECTORS", "http, python")
    settings = ExecutorSettings()
    assert settings.slots == 3
    assert settings.connectors == ["http", "python"]
    assert settings.poll_wait == 10.0
    assert settings.report_batch_max == 256
    assert not settings.stream  # unary calls unless asked for
    monkeypatch.setenv("AGENT_REACH_EXECUTOR_STREAM", "true")
    assert ExecutorSettings().stream
    assert settings.executor_id != ExecutorSettings().executor_id  # random suffix per instance


async def test_reporter_survives_an_unexpected_error(
    fake: FakeController, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = ControllerClient.report_results
    calls = 0

    async def flaky(self: ControllerClient, results: Any, *, deadline_s: float, held: int) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("not a ControllerError")
        return await real(self, results, deadline_s=deadline_s, held=held)

    monkeypatch.setattr(ControllerClient, "report_results", flaky)
    key = fake.enqueue(connector="echo", args={"x": 1})
    async with running_worker(fake, {"echo": FnConnector("echo", _echo)}) as running:
        await wait_until(lambda: key in fake.results)  # the loop went on and delivered it
        await wait_until(lambda: running.worker.stats.results_accepted == 1)
    (record,) = events_of(caplog, "report_crashed")()
    assert record.levelno == logging.ERROR
    assert record.exc_info is not None


async def test_heartbeats_survive_an_unexpected_error(
    fake: FakeController, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = ControllerClient.heartbeat
    calls = 0

    async def flaky(self: ControllerClient, leases: Any, *, deadline_s: float, **_: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("not a ControllerError")
        return await real(self, leases, deadline_s=deadline_s)

    monkeypatch.setattr(ControllerClient, "heartbeat", flaky)
    probe = Probe()
    key = fake.enqueue(connector="probe")
    async with running_worker(fake, {"probe": FnConnector("probe", probe)}):
        await wait_until(lambda: probe.running == 1)
        await wait_until(lambda: len(fake.heartbeats) >= 2)  # beats go on after the surprise
        probe.release.set()
        await wait_until(lambda: key in fake.results)
    assert len(events_of(caplog, "heartbeat_crashed")()) == 1


class _PoisonRunner(StepRunner):
    """Step s1 yields a result protobuf cannot encode (a runner bug); the rest run normally."""

    async def run(self, assignment: Any) -> StepResult:
        if assignment.step_id == "s1":
            return StepResult(
                lease=assignment.lease,
                failure=StepFailure(code="connector_error", message="\ud800", retryable=False),
                started_at_ms=1,
                finished_at_ms=2,
            )
        return await super().run(assignment)


async def test_a_result_that_cannot_be_encoded_does_not_block_the_others(
    fake: FakeController, caplog: pytest.LogCaptureFixture
) -> None:
    connectors = {"echo": FnConnector("echo", _echo)}
    poison = fake.enqueue(connector="echo")
    async with running_worker(fake, connectors, runner=_PoisonRunner(connectors)) as running:
        await wait_until(lambda: len(events_of(caplog, "result_unencodable")()) == 1)
        good = fake.enqueue(connector="echo", args={"ok": True})
        await wait_until(lambda: good in fake.results)
        assert running.worker.stats.results_pending == 0
        # Nothing heartbeats the poisoned lease any more: it expires and runs again elsewhere.
        beats = len(fake.heartbeats)
        await asyncio.sleep(0.2)
        assert all(
            (lease.step_key, lease.attempt) != poison
            for hb in fake.heartbeats[beats:]
            for lease in hb.leases
        )
    assert poison not in fake.results


class _Stubborn:
    """Swallows every cancellation until `release` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.running = 0

    async def __call__(self, call: ToolCall) -> Any:
        self.running += 1
        while not self.release.is_set():
            with suppress(asyncio.CancelledError):
                await self.release.wait()
        return "late"


class _BrokenRunner(StepRunner):
    """A runner with a bug: it raises instead of returning the step's result."""

    async def run(self, assignment: Any) -> StepResult:
        raise RuntimeError("a bug in the runner")


async def test_a_step_whose_runner_raises_is_reported_as_one_that_may_have_applied(
    fake: FakeController,
) -> None:
    connectors = {"probe": FnConnector("probe", Probe())}
    key = fake.enqueue(connector="probe")
    async with running_worker(fake, connectors, runner=_BrokenRunner(connectors)):
        await wait_until(lambda: key in fake.results)
    failure = fake.results[key].error
    assert (failure.code, failure.retryable, failure.maybe_applied) == ("lease_lost", True, True)
    assert "failed while running it" in failure.message


async def test_drain_is_bounded_when_a_connector_ignores_cancellation(
    fake: FakeController,
) -> None:
    stubborn = _Stubborn()
    connectors = {"stubborn": FnConnector("stubborn", stubborn)}
    runner = StepRunner(connectors, cancel_grace_s=0.1)
    key = fake.enqueue(connector="stubborn")
    try:
        async with running_worker(fake, connectors, runner=runner, drain_grace=0.2) as running:
            await wait_until(lambda: stubborn.running == 1)
            began = time.monotonic()
            running.stop.set()
            await asyncio.wait_for(asyncio.shield(running.run), 3)  # hung for ever before
            assert time.monotonic() - began < 2.0
            assert running.worker.stats.in_flight == 0
            assert runner.abandoned == 1
        assert fake.results[key].error.maybe_applied  # reported as an attempt that may have applied
    finally:
        stubborn.release.set()
        await asyncio.sleep(0.01)


async def test_a_slot_is_freed_when_a_timed_out_connector_ignores_cancellation(
    fake: FakeController,
) -> None:
    stubborn = _Stubborn()
    connectors = {"stubborn": FnConnector("stubborn", stubborn)}
    runner = StepRunner(connectors, cancel_grace_s=0.1)
    first = fake.enqueue(connector="stubborn", timeout_ms=50)
    try:
        async with running_worker(fake, connectors, runner=runner, slots=1) as running:
            await wait_until(lambda: first in fake.results)
            assert fake.results[first].error.code == "timeout"
            second = fake.enqueue(connector="stubborn", timeout_ms=50)
            await wait_until(lambda: second in fake.results)  # the one slot was given back
            assert running.worker.stats.in_flight == 0
    finally:
        stubborn.release.set()
        await asyncio.sleep(0.01)
