"""The Exchange stream of a real controller on Postgres, spoken to with the generated stub (no
help from our executor): each message answered as its unary call would be, a refusal ending the
message and not the stream, and a stopping controller ending its streams cleanly."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent_reach.v1 import executor_pb2 as pb
from agent_reach.v1 import executor_pb2_grpc as pb_grpc
from agent_reach_controller.rpc.servicer import ExecutorService, build_server
from agent_reach_controller.runtime import Components
from tests.integration.stack import api_client, components_for, write_tools
from tests.integration.test_executor_auth import Executor
from tests.integration.test_hand_off import _waiting

BODY = {"steps": [{"step_id": "a", "tool": "echo.say", "args": {"n": 1}}]}


@contextlib.asynccontextmanager
async def _plane(c: Components) -> AsyncIterator[tuple[ExecutorService, Any]]:
    service = ExecutorService(parts=c)
    server, port, _ = build_server(service, "127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield service, pb_grpc.ExecutorServiceStub(channel)
    finally:
        await server.stop(None)


async def _registered(c: Components, stub: Any, name: str) -> tuple[Executor, Any]:
    """An executor of a new pool, registered, and an Exchange stream it opened."""
    _, token = await c.pools.create(name="pool", created_by="test")
    executor = Executor(stub, token, executor_id=name)
    await executor.register()
    return executor, stub.Exchange(metadata=executor.metadata)


async def _ask(stream: Any, message: pb.ExecutorMessage) -> pb.ControllerMessage:
    await stream.write(message)
    reply: pb.ControllerMessage = await asyncio.wait_for(stream.read(), 10)
    assert reply.id == message.id
    return reply


def _poll(executor: Executor, message_id: int, *, wait_ms: int = 2000) -> pb.ExecutorMessage:
    executor.seq += 1
    return pb.ExecutorMessage(
        id=message_id,
        timeout_ms=wait_ms + 5000,
        poll=pb.PollStepsRequest(
            executor_id=executor.executor_id,
            connectors=["echo"],
            max_steps=10,
            wait_ms=wait_ms,
            session=executor.session,
            poll_seq=executor.seq,
        ),
    )


async def test_a_step_is_leased_kept_and_reported_on_one_stream(
    postgres_url: str, tmp_path: Path
) -> None:
    async with (
        components_for(postgres_url, write_tools(tmp_path)) as c,
        api_client(c) as http,
        _plane(c) as (_, stub),
    ):
        executor, stream = await _registered(c, stub, "streaming")
        await stream.write(_poll(executor, 41))  # waits: the queue is empty
        answer = await http.post("/v1/tasks", json=BODY)
        assert answer.status_code == 202, answer.text
        reply = await asyncio.wait_for(stream.read(), 10)
        assert (reply.id, reply.WhichOneof("reply")) == (41, "poll")
        (step,) = reply.poll.steps
        assert step.task_id == answer.json()["task_id"]

        beat = await _ask(
            stream,
            pb.ExecutorMessage(
                id=42,
                heartbeat=pb.HeartbeatRequest(
                    executor_id="streaming",
                    leases=[step.lease],
                    session=executor.session,
                    polls_completed=executor.seq,
                ),
            ),
        )
        assert [lease.step_key for lease in beat.heartbeat.extended] == [step.lease.step_key]
        result = pb.StepResult(
            lease=step.lease, outcome=pb.OUTCOME_SUCCEEDED, output_json=json.dumps(7).encode()
        )
        report = await _ask(
            stream,
            pb.ExecutorMessage(
                id=43,
                report=pb.ReportResultsRequest(
                    executor_id="streaming", results=[result], session=executor.session
                ),
            ),
        )
        assert [ack.accepted for ack in report.report.acks] == [True]
        await stream.done_writing()
        assert await stream.read() == grpc.aio.EOF
        assert await stream.code() == grpc.StatusCode.OK
        task = await c.queries.get(step.task_id)
        assert task.task.status == "succeeded"
        assert task.steps[0].output == 7


async def test_a_refused_message_answers_its_status_and_the_stream_stays_open(
    postgres_url: str, tmp_path: Path
) -> None:
    async with (
        components_for(postgres_url, write_tools(tmp_path)) as c,
        _plane(c) as (_, stub),
    ):
        executor, stream = await _registered(c, stub, "honest")

        token = executor.token
        forged = Executor(stub, token, executor_id="honest", session=executor.session + "x")
        reply = await _ask(stream, _poll(forged, 1, wait_ms=0))
        assert reply.WhichOneof("reply") == "status"
        assert reply.status.code == grpc.StatusCode.UNAUTHENTICATED.value[0]
        assert "session" in reply.status.details

        empty = await _ask(stream, pb.ExecutorMessage(id=2))
        assert empty.status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]

        too_many = pb.ReportResultsRequest(executor_id="honest", session=executor.session)
        too_many.results.extend(pb.StepResult() for _ in range(1001))
        refused = await _ask(stream, pb.ExecutorMessage(id=3, report=too_many))
        assert refused.status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]

        fine = await _ask(stream, _poll(executor, 4, wait_ms=0))
        assert (fine.WhichOneof("reply"), list(fine.poll.steps)) == ("poll", [])
        stream.cancel()


async def test_a_stream_without_credentials_gets_each_message_refused(
    postgres_url: str, tmp_path: Path
) -> None:
    async with (
        components_for(postgres_url, write_tools(tmp_path)) as c,
        api_client(c) as http,
        _plane(c) as (_, stub),
    ):
        answer = await http.post("/v1/tasks", json=BODY)
        assert answer.status_code == 202, answer.text
        stranger = Executor(stub, None, executor_id="stranger", session="")
        stream = stub.Exchange()  # no metadata at all
        for message_id in (1, 2):
            reply = await _ask(stream, _poll(stranger, message_id, wait_ms=0))
            assert reply.status.code == grpc.StatusCode.UNAUTHENTICATED.value[0]
        stream.cancel()
        task = await c.queries.get(answer.json()["task_id"])
        assert [step.status for step in task.steps] == ["ready"]  # nobody leased it


@pytest.mark.parametrize("in_flight", [True, False])
async def test_a_stopping_controller_answers_what_it_has_and_ends_its_streams(
    postgres_url: str, tmp_path: Path, in_flight: bool
) -> None:
    async with (
        components_for(postgres_url, write_tools(tmp_path)) as c,
        _plane(c) as (service, stub),
    ):
        executor, stream = await _registered(c, stub, "leaving")
        await _ask(stream, _poll(executor, 1, wait_ms=0))  # the stream is being served
        if in_flight:
            await stream.write(_poll(executor, 2, wait_ms=300))
            await _waiting(c)
        await asyncio.wait_for(service.close_streams(grace=5), 10)
        if in_flight:
            reply = await asyncio.wait_for(stream.read(), 10)
            assert (reply.id, reply.WhichOneof("reply")) == (2, "poll")
        assert await asyncio.wait_for(stream.read(), 10) == grpc.aio.EOF
        assert await stream.code() == grpc.StatusCode.OK

        again = stub.Exchange(metadata=executor.metadata)
        await again.write(_poll(executor, 3, wait_ms=0))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await asyncio.wait_for(again.read(), 10)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
