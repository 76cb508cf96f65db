"""The gRPC edge of a running controller: health, reflection, and the protocol's error answers."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from agent_reach.v1 import executor_pb2 as pb
from agent_reach.v1 import executor_pb2_grpc as pb_grpc
from agent_reach_controller.server import running_controller
from agent_reach_controller.settings import ControllerSettings
from tests.integration.stack import write_tools


async def test_health_reflection_and_protocol(sqlite_url: str, tmp_path: Path) -> None:
    settings = ControllerSettings(
        database_url=sqlite_url,
        tools=[write_tools(tmp_path)],
        http="127.0.0.1:0",
        grpc="127.0.0.1:0",
    )
    async with (
        running_controller(settings) as (c, bound),
        grpc.aio.insecure_channel(bound.grpc) as channel,
    ):
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "agent_reach.v1.ExecutorService"):
            reply = await health.Check(health_pb2.HealthCheckRequest(service=service))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING

        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        stream = reflection.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        )
        names = {s.name async for r in stream for s in r.list_services_response.service}
        assert "agent_reach.v1.ExecutorService" in names

        stub = pb_grpc.ExecutorServiceStub(channel)
        _, token = await c.pools.create(name="test", created_by="test")
        auth = (("authorization", f"Bearer {token}"),)
        registered = await stub.Register(
            pb.RegisterRequest(executor_id="x", connectors=["echo"], slots=2), metadata=auth
        )
        assert registered.lease_ms > registered.heartbeat_interval_ms > 0
        assert registered.pool == "test"
        session = registered.session
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await stub.Register(pb.RegisterRequest(connectors=["echo"]), metadata=auth)
        assert missing.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        bad = pb.StepResult(lease=pb.LeaseRef(step_key=1, attempt=1))
        with pytest.raises(grpc.aio.AioRpcError) as unspecified:
            await stub.ReportResults(
                pb.ReportResultsRequest(executor_id="x", results=[bad], session=session),
                metadata=auth,
            )
        assert unspecified.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        unknown = pb.StepResult(
            lease=pb.LeaseRef(step_key=999, attempt=1),
            outcome=pb.OUTCOME_SUCCEEDED,
            output_json=b"{}",
        )
        acks = await stub.ReportResults(
            pb.ReportResultsRequest(executor_id="x", results=[unknown], session=session),
            metadata=auth,
        )
        assert [(a.accepted, a.reason) for a in acks.acks] == [(False, "stale_lease")]
        empty = await stub.PollSteps(
            pb.PollStepsRequest(
                executor_id="x", connectors=["echo"], max_steps=1, wait_ms=50, session=session
            ),
            metadata=auth,
        )
        assert list(empty.steps) == []


async def test_unstorable_output_fails_its_step_not_the_batch(
    database_url: str, tmp_path: Path
) -> None:
    from agent_reach_controller.planning.plan import parse_plan
    from agent_reach_controller.services.intake import SubmitInput

    settings = ControllerSettings(
        database_url=database_url,
        tools=[write_tools(tmp_path)],
        http="127.0.0.1:0",
        grpc="127.0.0.1:0",
    )
    body = {
        "steps": [
            {"step_id": s, "tool": "echo.say", "args": {}} for s in ("nan", "nul", "half", "ok")
        ]
    }
    async with (
        running_controller(settings) as (c, bound),
        grpc.aio.insecure_channel(bound.grpc) as channel,
    ):
        submitted = await c.intake.submit(
            SubmitInput(plan=parse_plan(body, c.catalog), request=body)
        )
        stub = pb_grpc.ExecutorServiceStub(channel)
        _, token = await c.pools.create(name="test", created_by="test")
        auth = (("authorization", f"Bearer {token}"),)
        session = (
            await stub.Register(
                pb.RegisterRequest(executor_id="x", connectors=["echo"]), metadata=auth
            )
        ).session
        polled = await stub.PollSteps(
            pb.PollStepsRequest(executor_id="x", connectors=["echo"], max_steps=4, session=session),
            metadata=auth,
        )
        outputs = {
            "nan": b'{"x": NaN}',
            "nul": b'{"x": "a\\u0000b"}',
            "half": b'"\\ud83d"',
            "ok": b'{"x": 1}',
        }
        results = [
            pb.StepResult(
                lease=a.lease, outcome=pb.OUTCOME_SUCCEEDED, output_json=outputs[a.step_id]
            )
            for a in polled.steps
        ]
        acks = await stub.ReportResults(
            pb.ReportResultsRequest(executor_id="x", results=results, session=session),
            metadata=auth,
        )
        assert [a.accepted for a in acks.acks] == [True] * 4
        view = await c.queries.get(submitted.task_id)
        by_id = {s.step_id: s for s in view.steps}
        assert by_id["ok"].status == "succeeded"
        for name in ("nan", "nul", "half"):
            assert by_id[name].status == "failed"
            assert by_id[name].receipt["error"]["code"] == "connector_error"
