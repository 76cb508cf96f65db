"""ControllerClient and its proto conversion, against a real gRPC fake controller."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from agent_reach.v1 import executor_pb2 as pb
from agent_reach_executor.client import (
    Backoff,
    ControllerClient,
    ControllerError,
    LeaseKey,
    Registration,
    StepFailure,
    StepResult,
    result_to_proto,
)
from tests.executor.fake_controller import FakeController
from tests.support.server import free_port


@pytest.fixture
async def fake() -> AsyncIterator[FakeController]:
    controller = FakeController(lease_ms=9_000, heartbeat_interval_ms=3_000, max_poll_wait_ms=150)
    await controller.start()
    yield controller
    await controller.stop()


@pytest.fixture
async def client(fake: FakeController) -> AsyncIterator[ControllerClient]:
    async with ControllerClient(fake.target, executor_id="exec-1") as c:
        yield c


async def test_register_returns_the_timings(fake: FakeController, client: ControllerClient) -> None:
    registration = await client.register(["http", "echo"], slots=5, version="1.2", deadline_s=2)
    assert registration == Registration(lease_s=9.0, heartbeat_interval_s=3.0, max_poll_wait_s=0.15)
    request = fake.registrations[0]
    assert (request.executor_id, list(request.connectors), request.slots, request.version) == (
        "exec-1",
        ["http", "echo"],
        5,
        "1.2",
    )


async def test_poll_converts_assignments(fake: FakeController, client: ControllerClient) -> None:
    key = fake.enqueue(
        connector="echo", args={"a": 1}, tool="echo.say", timeout_ms=1234, environment="sandbox"
    )
    fake.enqueue(connector="other")
    steps = await client.poll_steps(["echo"], max_steps=10, wait_s=0.1, deadline_s=2)
    assert len(steps) == 1
    step = steps[0]
    assert step.lease == LeaseKey(step_key=key[0], attempt=key[1])
    assert (step.tool, step.connector, step.timeout_ms, step.max_attempts) == (
        "echo.say",
        "echo",
        1234,
        3,
    )
    assert json.loads(step.args_json) == {"a": 1}
    assert step.environment == "sandbox"  # "" from a controller older than environments
    assert step.lease_expires_at_ms > 0
    assert fake.polls[0].request.wait_ms == 100


async def test_empty_poll_after_the_wait(client: ControllerClient) -> None:
    assert await client.poll_steps(["echo"], max_steps=2, wait_s=0.05, deadline_s=2) == []


async def test_heartbeat_sorts_leases(fake: FakeController, client: ControllerClient) -> None:
    kept, cancelled, lost = (fake.enqueue(connector="echo") for _ in range(3))
    await client.poll_steps(["echo"], max_steps=3, wait_s=0, deadline_s=2)
    fake.to_cancel.add(cancelled)
    fake.to_lose.add(lost)
    leases = [LeaseKey(step_key=k[0], attempt=k[1]) for k in (kept, cancelled, lost)]
    reply = await client.heartbeat(leases, deadline_s=2)
    assert reply.extended == {leases[0]}
    assert reply.cancelled == {leases[1]}
    assert reply.lost == {leases[2]}
    assert reply.lease_expires_at_ms > 0


async def test_report_returns_acks_in_order(fake: FakeController, client: ControllerClient) -> None:
    key = fake.enqueue(connector="echo")
    await client.poll_steps(["echo"], max_steps=1, wait_s=0, deadline_s=2)
    lease = LeaseKey(step_key=key[0], attempt=key[1])
    stranger = LeaseKey(step_key=99, attempt=1)
    results = [
        StepResult(lease=lease, output_json=b'"ok"', started_at_ms=1, finished_at_ms=2),
        StepResult(lease=stranger, output_json=b"1", started_at_ms=1, finished_at_ms=2),
    ]
    acks = await client.report_results(results, deadline_s=2)
    assert [(a.lease, a.accepted, a.reason) for a in acks] == [
        (lease, True, ""),
        (stranger, False, "stale_lease"),
    ]
    assert fake.results[key].output_json == b'"ok"'


def test_failed_result_to_proto() -> None:
    failure = StepFailure(
        code="rate_limited",
        message="slow down",
        retryable=True,
        retry_after_s=3.0,
        maybe_applied=True,
    )
    msg = result_to_proto(
        StepResult(
            lease=LeaseKey(step_key=1, attempt=4),
            failure=failure,
            started_at_ms=5,
            finished_at_ms=9,
        )
    )
    assert msg.outcome == pb.OUTCOME_FAILED
    assert (msg.lease.step_key, msg.lease.attempt) == (1, 4)
    assert (msg.error.code, msg.error.message, msg.error.retryable) == (
        "rate_limited",
        "slow down",
        True,
    )
    assert (msg.error.retry_after_s, msg.error.maybe_applied) == (3.0, True)
    assert (msg.started_at_ms, msg.finished_at_ms) == (5, 9)
    assert msg.output_json == b""


async def test_unreachable_controller_is_a_transient_error() -> None:
    async with ControllerClient(f"127.0.0.1:{free_port()}", executor_id="x") as client:
        with pytest.raises(ControllerError) as caught:
            await client.register(["echo"], slots=1, version="0", deadline_s=2)
    assert caught.value.transient
    assert caught.value.code == "UNAVAILABLE"
    assert caught.value.method == "Register"


def test_backoff_grows_caps_jitters_and_resets() -> None:
    low = Backoff(initial=0.1, maximum=1.0, rng=lambda: 0.0)
    assert [round(low.next_delay(), 3) for _ in range(6)] == [0.05, 0.1, 0.2, 0.4, 0.5, 0.5]
    high = Backoff(initial=0.1, maximum=1.0, rng=lambda: 1.0)
    assert [round(high.next_delay(), 3) for _ in range(5)] == [0.1, 0.2, 0.4, 0.8, 1.0]
    high.reset()
    assert high.failures == 0
    assert high.next_delay() == pytest.approx(0.1)


async def test_a_poll_answer_over_4_mib_is_received(
    fake: FakeController, client: ControllerClient
) -> None:
    # The controller accepts and sends messages up to 64 MiB; a client left at gRPC's 4 MiB
    # receive default failed this poll after the steps were already leased, on every poll.
    keys = [
        fake.enqueue(connector="echo", args={"blob": "x" * (3 * 1024 * 1024)}) for _ in range(2)
    ]
    steps = await client.poll_steps(["echo"], max_steps=10, wait_s=0.1, deadline_s=5)
    assert [(s.lease.step_key, s.lease.attempt) for s in steps] == keys
