"""What one single-step task costs Postgres, counted by Postgres itself.

A transaction that writes is given a transaction id and flushes the WAL when it commits; that is
the cost that bounds a durable system's rate. Postgres hands out those ids in order, so the
difference of `pg_snapshot_xmax` before and after a piece of work is the number of transactions
that wrote (or tried to), whoever sent them. The controller here runs without its background
sweeps, so its only writers are the calls made below: a submit over the REST API with an API key,
then a poll and a report by an executor over real gRPC with a pool token. The ids are the
server's, though, shared with every other database on it (tests running beside this one,
autovacuum): those can only add to a task's figure, never take from it, so the smallest figure of
several tasks is this controller's. `test_statements.py` counts the same task's transactions on
the wire, exactly.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import psycopg

from agent_reach.v1 import executor_pb2_grpc as pb_grpc
from agent_reach_controller.rpc.servicer import ExecutorService, build_server
from agent_reach_controller.runtime import Components
from tests.integration.stack import api_client, components_for, write_tools
from tests.integration.test_executor_auth import Executor

BODY = {
    "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "echo.say", "arguments": "{}"}}
    ]
}


def _next_xid(url: str) -> int:
    """The next transaction id Postgres will hand out (reading it takes none)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text").fetchone()
        assert row is not None
        return int(row[0])


@contextlib.asynccontextmanager
async def executor_plane(c: Components) -> AsyncIterator[Any]:
    service = ExecutorService(parts=c)
    server, port, _ = build_server(service, "127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield pb_grpc.ExecutorServiceStub(channel)
    finally:
        await server.stop(None)


async def test_a_single_step_task_writes_once_to_submit_and_three_times_in_all(
    postgres_url: str, tmp_path: Path
) -> None:
    async with (
        components_for(postgres_url, write_tools(tmp_path)) as c,
        api_client(c) as http,
        executor_plane(c) as stub,
    ):
        _, token = await c.pools.create(name="pool", created_by="test")
        executor = Executor(stub, token, executor_id="counted")
        await executor.register()

        async def one_task() -> tuple[int, int]:
            before = _next_xid(postgres_url)
            answer = await http.post("/v1/tasks", json=BODY)
            assert answer.status_code == 202, answer.text
            submitted = _next_xid(postgres_url)
            (step,) = await executor.poll(wait_ms=2000)
            assert (await executor.report(step.lease, {"ok": True})).accepted
            task = await c.queries.get(answer.json()["task_id"])
            assert task.task.status == "succeeded"
            return submitted - before, _next_xid(postgres_url) - before

        await one_task()  # warm: the API key and the session are read once, then cached
        counts = [await one_task() for _ in range(8)]
    assert min(submit for submit, _ in counts) == 1, counts
    assert min(total for _, total in counts) <= 3, counts
