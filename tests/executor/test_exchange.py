"""The client's Exchange stream (agent_reach_executor/exchange.py) against a real gRPC fake that
serves it with the controller's own stream handling: what travels on it, what happens when it
breaks, and the way back to unary calls for a controller that has no stream."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator

import pytest

from agent_reach import metrics as m
from agent_reach_executor.client import (
    STREAM_UP_TO,
    ControllerClient,
    ControllerError,
    LeaseKey,
    StepResult,
)
from agent_reach_executor.worker import Worker
from tests.executor.fake_controller import FakeController, FnConnector, Probe
from tests.executor.test_worker import running_worker, wait_until

_METHODS = {"poll": "PollSteps", "heartbeat": "Heartbeat", "report": "ReportResults"}


def _calls_exposed(worker: Worker) -> Counter[tuple[str, str]]:
    """The executor's calls to the controller as its /metrics would show them."""
    calls: Counter[tuple[str, str]] = Counter()
    for family in worker.metrics.registry.collect():
        if family.name == m.EXECUTOR_CONTROLLER_CALLS:
            for sample in family.samples:
                labels = sample.labels
                calls[labels[m.METHOD], labels[m.TRANSPORT]] += int(sample.value)
    return calls


@pytest.fixture
async def fake() -> AsyncIterator[FakeController]:
    controller = FakeController(max_poll_wait_ms=150)
    await controller.start()
    yield controller
    await controller.stop()


async def _one_of_each(client: ControllerClient, fake: FakeController) -> None:
    key = fake.enqueue(connector="echo", args={"n": 1})
    (step,) = await client.poll_steps(["echo"], max_steps=5, wait_s=0.1, deadline_s=2)
    assert (step.lease.step_key, step.lease.attempt) == key
    beat = await client.heartbeat([step.lease], deadline_s=2)
    assert beat.extended == {step.lease}
    result = StepResult(
        lease=step.lease, output_json=b'{"ok": 1}', started_at_ms=1, finished_at_ms=2
    )
    (ack,) = await client.report_results([result], deadline_s=2)
    assert ack.accepted
    assert fake.results[key].output_json == b'{"ok": 1}'


async def _reachable(client: ControllerClient, within: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while True:
        try:
            await client.heartbeat([], deadline_s=1)
            return
        except ControllerError as exc:
            if not exc.transient:
                raise
            assert asyncio.get_running_loop().time() < deadline, "the controller stayed away"
            await asyncio.sleep(0.05)


async def test_polls_heartbeats_and_reports_travel_on_one_stream(fake: FakeController) -> None:
    async with ControllerClient(fake.target, executor_id="x", stream=True) as client:
        await client.register(["echo"], slots=1, version="0", deadline_s=2)
        await _one_of_each(client, fake)
        await _one_of_each(client, fake)
        assert client.streaming
    assert (fake.exchanges, fake.unary_calls) == (1, 0)


async def test_a_busy_executor_calls_unary(fake: FakeController) -> None:
    """The stream carries calls while the executor holds a step or two (STREAM_UP_TO), where its
    lower cost per call counts; while it holds more, polls and reports go as unary calls (their
    cost is shared, and a slower answer lets the next one carry more). The call's own size does
    not decide: a poll that may bring back many goes on the stream from an idle executor."""
    busy = STREAM_UP_TO + 1
    keys = [fake.enqueue(connector="echo") for _ in range(busy + 1)]
    async with ControllerClient(fake.target, executor_id="x", stream=True) as client:
        await client.register(["echo"], slots=8, version="0", deadline_s=2)
        idle = await client.poll_steps(["echo"], max_steps=busy, wait_s=0.1, deadline_s=2)
        holding = await client.poll_steps(
            ["echo"], max_steps=busy, wait_s=0.1, deadline_s=2, held=len(idle)
        )
        results = [
            StepResult(lease=step.lease, output_json=b"{}", started_at_ms=1, finished_at_ms=2)
            for step in idle + holding
        ]
        await client.report_results(results[:1], deadline_s=2, held=busy + 1)
        await client.report_results(results[1:], deadline_s=2, held=STREAM_UP_TO)
        await client.heartbeat([], deadline_s=2)
        assert client.calls == {
            ("Register", "unary"): 1,
            ("PollSteps", "stream"): 1,
            ("PollSteps", "unary"): 1,
            ("ReportResults", "unary"): 1,
            ("ReportResults", "stream"): 1,
            ("Heartbeat", "stream"): 1,
        }
    assert sorted(fake.results) == sorted(keys)
    assert fake.carried == [
        ("poll", "stream", busy),  # holding nothing: many steps may come back
        ("poll", "unary", 1),  # holding `busy`
        ("report", "unary", 1),  # one result, while holding more
        ("report", "stream", busy),
        ("heartbeat", "stream", 0),
    ]


async def test_unary_calls_unless_asked_for_the_stream(fake: FakeController) -> None:
    async with ControllerClient(fake.target, executor_id="x") as client:
        await _one_of_each(client, fake)
    assert (fake.exchanges, fake.unary_calls) == (0, 3)


async def test_a_controller_without_the_stream_gets_unary_calls(fake: FakeController) -> None:
    fake.stream = False  # answers Exchange UNIMPLEMENTED, as a release before it would
    async with ControllerClient(fake.target, executor_id="x", stream=True) as client:
        await _one_of_each(client, fake)
        await _one_of_each(client, fake)
        assert not client.streaming
    assert (fake.exchanges, fake.unary_calls) == (1, 6)  # asked once, then never again


async def test_calls_in_flight_when_the_stream_breaks_fail_transient_and_the_next_opens_another(
    fake: FakeController,
) -> None:
    fake.held[1] = asyncio.Event()  # poll 1 stays open until the controller goes
    async with ControllerClient(fake.target, executor_id="x", stream=True) as client:
        poll = asyncio.create_task(
            client.poll_steps(["echo"], max_steps=1, wait_s=0.1, deadline_s=10, poll_seq=1)
        )
        await wait_until(lambda: bool(fake.polls))
        port = fake.port
        await fake.stop()
        with pytest.raises(ControllerError) as caught:
            await asyncio.wait_for(poll, 5)
        assert (caught.value.method, caught.value.transient) == ("PollSteps", True)
        await fake.start(port)
        await _reachable(client)  # the channel reconnects, as a worker's retries would wait
        await _one_of_each(client, fake)
        assert client.streaming
    assert fake.exchanges >= 2
    assert fake.unary_calls == 0


async def test_a_call_past_its_deadline_fails_and_the_stream_carries_on(
    fake: FakeController,
) -> None:
    fake.held[7] = asyncio.Event()  # poll 7 is never answered
    async with ControllerClient(fake.target, executor_id="x", stream=True) as client:
        with pytest.raises(ControllerError) as caught:
            await client.poll_steps(["echo"], max_steps=1, wait_s=0.1, deadline_s=0.3, poll_seq=7)
        assert (caught.value.code, caught.value.transient) == ("DEADLINE_EXCEEDED", True)
        await _one_of_each(client, fake)
        fake.held[7].set()
    assert (fake.exchanges, fake.unary_calls) == (1, 0)


async def test_answers_are_matched_by_id_whatever_their_order(fake: FakeController) -> None:
    """A poll held open answers after the heartbeat and report sent behind it."""
    fake.held[1] = gate = asyncio.Event()
    key = fake.enqueue(connector="echo")
    async with ControllerClient(fake.target, executor_id="x", stream=True) as client:
        poll = asyncio.create_task(
            client.poll_steps(["echo"], max_steps=1, wait_s=0.1, deadline_s=5, poll_seq=1)
        )
        await wait_until(lambda: bool(fake.polls))
        lease = LeaseKey(step_key=key[0], attempt=key[1])
        beat = await client.heartbeat([lease], deadline_s=2)
        assert beat.lost == {lease}  # not leased yet: the held poll has not taken it
        gate.set()
        (step,) = await asyncio.wait_for(poll, 5)
        assert step.lease == lease
    assert fake.exchanges == 1


async def test_one_stream_per_poller_spreads_them_over_the_replicas() -> None:
    """Two replicas, two streams: each stream is a call of its own, and the channel's round robin
    puts them on different replicas, so each poller's poll can wait where a submit may land."""
    replicas = [FakeController(max_poll_wait_ms=150) for _ in range(2)]
    for replica in replicas:
        await replica.start()
    try:
        target = ",".join(replica.target for replica in replicas)
        async with ControllerClient(target, executor_id="x", stream=True, streams=2) as client:
            deadline = asyncio.get_running_loop().time() + 10
            while not all(replica.registrations for replica in replicas):  # both connected
                assert asyncio.get_running_loop().time() < deadline, "a replica stayed away"
                await client.register(["echo"], slots=1, version="0", deadline_s=2)
            await asyncio.gather(
                *(
                    client.poll_steps(["echo"], max_steps=1, wait_s=0.05, deadline_s=5)
                    for _ in range(4)
                )
            )
        assert [replica.exchanges for replica in replicas] == [1, 1]
        assert sum(len(replica.polls) for replica in replicas) == 4
    finally:
        for replica in replicas:
            await replica.stop()


async def test_a_worker_on_streams_runs_and_reports_its_steps(fake: FakeController) -> None:
    probe = Probe()
    keys = [fake.enqueue(connector="probe") for _ in range(12)]
    async with running_worker(
        fake, {"probe": FnConnector("probe", probe)}, slots=4, pollers=2, stream=True
    ) as running:
        await wait_until(lambda: probe.running == 4)
        await wait_until(lambda: any(beat.leases for beat in fake.heartbeats))  # leases kept
        probe.release.set()
        await wait_until(lambda: len(fake.results) == len(keys))
    assert sorted(fake.results) == sorted(keys)
    assert fake.exchanges == 2  # one stream per poller
    # A report's results are among the steps held: more than a step or two go unary.
    reports = [(how, n) for call, how, n in fake.carried if call == "report"]
    assert reports
    assert all(how == "unary" for how, n in reports if n > STREAM_UP_TO)
    # The worker's metrics count its calls by transport: every report the controller saw, and
    # at least every poll and heartbeat (one still open at the stop is counted, never answered).
    seen = Counter((_METHODS[call], how) for call, how, _ in fake.carried)
    exposed = _calls_exposed(running.worker)
    assert exposed["Register", "unary"] == 1
    for key, count in seen.items():
        assert exposed[key] == count if key[0] == "ReportResults" else exposed[key] >= count
    assert sum(n for key, n in exposed.items() if key[0] == "ReportResults") == len(reports)
    assert any(how == "stream" for call, how, _ in fake.carried if call == "heartbeat")
