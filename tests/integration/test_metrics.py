"""The controller's /metrics after real steps went through dispatch, parsed as Prometheus would."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
from prometheus_client.parser import text_string_to_metric_families

from agent_reach_controller.api.app import create_app
from agent_reach_controller.decide.outcomes import AttemptError, AttemptResult
from agent_reach_controller.domain.records import StepRow
from agent_reach_controller.runtime import Components, background
from agent_reach_controller.server import running_controller
from agent_reach_controller.settings import ControllerSettings
from agent_reach_controller.storage.engine import before_commit
from agent_reach_controller.storage.schema import steps
from tests.integration.stack import TOOLS, components_for, key_for, ok, submit, write_tools

OPENMETRICS = {"Accept": "application/openmetrics-text; version=1.0.0"}
LIMITED = {
    "name": "echo.limited",
    "description": "Three at once, then 20 a second.",
    "connector": "echo",
    "rate_limit": {"rate": "20/s", "burst": 3},
}
FLAKY = {
    "name": "flaky.call",
    "description": "A downstream that falls over.",
    "connector": "echo",
    "retry": {"maximum_attempts": 1},
    "idempotent": True,
    "breaker": {"failure_rate": 0.5, "minimum_calls": 2, "window": "60s", "cooldown": "60s"},
}


@contextlib.asynccontextmanager
async def keyless(c: Components) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the app that carries no API key, as a Prometheus server would."""
    transport = httpx.ASGITransport(app=create_app(c))
    async with httpx.AsyncClient(transport=transport, base_url="http://reach.test") as client:
        yield client


async def scrape(c: Components) -> str:
    async with keyless(c) as client:
        response = await client.get("/metrics")
    assert response.status_code == 200
    return response.text


def value(text: str, name: str, **labels: str) -> float | None:
    """One sample of a text-format scrape (None when absent)."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return None


async def eventually(c: Components, check: Callable[[str], bool], *, within: float = 10.0) -> str:
    """Scrape until `check` holds for the scrape; fail after `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        text = await scrape(c)
        if check(text):
            return text
        assert time.monotonic() < deadline, f"metrics never matched:\n{text}"
        await asyncio.sleep(0.02)


def ran(step: StepRow, seconds: float, error: AttemptError | None = None) -> AttemptResult:
    """A result whose attempt ran `seconds` on the executor."""
    finished = datetime.now(UTC)
    return AttemptResult(
        step_key=step.id,
        attempt=step.attempt,
        output=None if error else {},
        error=error,
        started_at=finished - timedelta(seconds=seconds),
        finished_at=finished,
    )


async def backdate(c: Components, step_id: str, **values: datetime) -> None:
    async with c.db.transaction() as conn:
        await conn.execute(sa.update(steps).where(steps.c.step_id == step_id).values(**values))


async def test_metrics_need_no_key_and_stay_out_of_the_openapi(
    sqlite_url: str, tmp_path: Path
) -> None:
    async with components_for(sqlite_url, write_tools(tmp_path)) as c, keyless(c) as client:
        plain = await client.get("/metrics")
        assert plain.status_code == 200
        assert plain.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert "agent_reach_queue_depth" in plain.text
        assert (await client.get("/v1/tasks")).status_code == 401
        assert "/metrics" not in (await client.get("/openapi.json")).json()["paths"]


async def test_queue_gauges_and_schedule_to_start_come_from_the_database(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c:
        await submit(
            c,
            {
                "steps": [
                    {"step_id": "old", "tool": "echo.say", "args": {}},
                    {"step_id": "backoff", "tool": "echo.say", "args": {}},
                    {"step_id": "later", "tool": "echo.say", "args": {}},
                    {"step_id": "count", "tool": "echo.count", "args": {"n": 1}},
                ]
            },
        )
        now = datetime.now(UTC)
        # Queued 20 s ago; queued long ago but due only 1.5 s ago; not due for a minute.
        await backdate(c, "old", updated_at=now - timedelta(seconds=20))
        await backdate(
            c,
            "backoff",
            updated_at=now - timedelta(seconds=100),
            not_before=now - timedelta(seconds=1.5),  # mid-bucket: 1 s of slack either way
        )
        await backdate(c, "later", not_before=now + timedelta(seconds=60))
        assert await c.admission.refresh_queue_depth() == 4
        text = await scrape(c)
        assert value(text, "agent_reach_queue_depth", tool="echo.say") == 3
        assert value(text, "agent_reach_queue_depth", tool="echo.count") == 1
        oldest = value(text, "agent_reach_queue_oldest_ready_age_seconds", tool="echo.say")
        assert oldest is not None
        assert 20 <= oldest < 30  # the backoff step waits 1.5 s, the later one is not due
        leased = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=10)
        assert sorted(s.step_id for s in leased) == ["backoff", "count", "old"]
        text = await scrape(c)
        bucket = "agent_reach_schedule_to_start_seconds_bucket"
        # Each leased row carries its own queue time: 1.5 s for one, 20 s for the other.
        assert value(text, bucket, tool="echo.say", le="1.0") == 0
        assert value(text, bucket, tool="echo.say", le="2.5") == 1
        assert value(text, bucket, tool="echo.say", le="10.0") == 1
        assert value(text, bucket, tool="echo.say", le="30.0") == 2
        assert value(text, "agent_reach_schedule_to_start_seconds_count", tool="echo.count") == 1
        await c.admission.refresh_queue_depth()
        text = await scrape(c)
        assert value(text, "agent_reach_queue_depth", tool="echo.say") == 1
        assert value(text, "agent_reach_queue_depth", tool="echo.count") == 0
        assert value(text, "agent_reach_queue_oldest_ready_age_seconds", tool="echo.say") == 0


async def test_outcomes_retries_and_durations_carry_the_tasks_trace_id(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c:
        task_id = await submit(
            c,
            {
                "steps": [
                    *({"step_id": f"s{i}", "tool": "echo.say", "args": {}} for i in range(4)),
                    {"step_id": "count", "tool": "echo.count", "args": {"n": 1}},
                ]
            },
        )
        trace_id = (await c.queries.get(task_id)).task.trace_id
        claimed = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=10)
        leased = {s.step_id: s for s in claimed}
        unavailable = AttemptError(code="downstream_unavailable", message="503", retryable=True)
        invalid = AttemptError(code="invalid_arguments", message="no", retryable=False)
        results = [
            *(ran(leased[f"s{i}"], 0.2) for i in range(3)),
            ran(leased["s3"], 0.04, unavailable),
            ran(leased["count"], 0.01, invalid),
        ]
        acks = await c.reporting.report(executor_id="x", results=results)
        assert all(a.accepted for a in acks)
        late = await c.reporting.report(executor_id="x", results=[ok(leased["s0"], {})])
        assert [a.reason for a in late] == ["stale_lease"]
        text = await scrape(c)
        steps_total = "agent_reach_steps_total"
        assert value(text, steps_total, tool="echo.say", outcome="succeeded") == 3
        assert value(text, steps_total, tool="echo.say", outcome="retried") == 1
        assert value(text, steps_total, tool="echo.count", outcome="failed") == 1
        assert value(text, steps_total, tool="echo.count", outcome="succeeded") is None
        retries = "agent_reach_retries_total"
        assert value(text, retries, tool="echo.say", reason="downstream_unavailable") == 1
        assert value(text, "agent_reach_results_rejected_total", reason="stale_lease") == 1
        duration = "agent_reach_step_duration_seconds"
        assert value(text, f"{duration}_count", tool="echo.say", outcome="succeeded") == 3
        total = value(text, f"{duration}_sum", tool="echo.say", outcome="succeeded")
        assert total is not None
        assert abs(total - 0.6) < 1e-3
        assert value(text, f"{duration}_count", tool="echo.say", outcome="retried") == 1
        assert value(text, f"{duration}_count", tool="echo.count", outcome="failed") == 1

        async with keyless(c) as client:
            om = await client.get("/metrics", headers=OPENMETRICS)
        assert om.headers["content-type"].startswith("application/openmetrics-text")
        exemplars = {
            (s.name, s.labels.get("outcome")): s.exemplar
            for f in om_families(om.text)
            for s in f.samples
            if s.exemplar is not None
        }
        succeeded = exemplars[(f"{duration}_bucket", "succeeded")]
        assert succeeded.labels == {"trace_id": trace_id}
        assert succeeded.value == 0.2
        started = exemplars[("agent_reach_schedule_to_start_seconds_bucket", None)]
        assert started.labels == {"trace_id": trace_id}


async def test_expired_leases_and_open_breakers_show_from_the_background_loop(
    database_url: str, tmp_path: Path
) -> None:
    tools = write_tools(tmp_path, [*TOOLS, FLAKY])
    async with components_for(
        database_url, tools, lease_seconds=0.3, reap_interval_seconds=0.05
    ) as c:
        await submit(
            c,
            {
                "steps": [
                    {"step_id": "lost", "tool": "echo.say", "args": {}},
                    *({"step_id": f"f{i}", "tool": "flaky.call", "args": {}} for i in range(2)),
                ]
            },
        )
        leased = await c.leasing.claim(executor_id="gone", connectors=["echo"], limit=10)
        unavailable = AttemptError(code="downstream_unavailable", message="503", retryable=True)
        await c.reporting.report(
            executor_id="gone",
            results=[ran(s, 0.01, unavailable) for s in leased if s.tool == "flaky.call"],
        )
        # "lost" is never reported nor heartbeaten: the reaper finds it once its lease ends.
        async with background(c):
            text = await eventually(
                c,
                lambda t: (
                    value(t, "agent_reach_lease_expirations_total") == 1
                    and value(t, "agent_reach_breaker_state", tool="flaky.call") == 2
                    and value(t, "agent_reach_queue_depth", tool="echo.say") == 1
                ),
            )
        assert value(text, "agent_reach_retries_total", tool="echo.say", reason="lease_lost") == 1
        assert value(text, "agent_reach_steps_total", tool="echo.say", outcome="retried") == 1
        assert value(text, "agent_reach_steps_total", tool="flaky.call", outcome="failed") == 2


async def test_rate_limited_deferrals_and_downstream_pauses_are_counted(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path, [*TOOLS, LIMITED])) as c:
        plan = [{"step_id": f"s{i}", "tool": "echo.limited", "args": {}} for i in range(6)]
        await submit(c, {"steps": plan})
        leased = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=10)
        # At most the burst now (a bucket may start empty); the rest wait for their bucket.
        assert len(leased) <= 3
        text = await scrape(c)
        deferred = value(text, "agent_reach_rate_limited_total", tool="echo.limited")
        assert deferred == len(plan) - len(leased)
        if not leased:
            leased = await c.leasing.poll(executor_id="x", connectors=["echo"], limit=1, wait=5)
        spent = AttemptResult(step_key=leased[0].id, attempt=leased[0].attempt, throttle_s=5.0)
        await c.reporting.report(executor_id="x", results=[spent])
        text = await scrape(c)
        assert value(text, "agent_reach_tool_pauses_total", tool="echo.limited") == 1


async def test_a_running_controllers_scrape_passes_promtool(
    sqlite_url: str, tmp_path: Path, promtool: str
) -> None:
    settings = ControllerSettings(
        database_url=sqlite_url,
        tools=[write_tools(tmp_path, [*TOOLS, FLAKY, LIMITED])],
        http="127.0.0.1:0",
        grpc="127.0.0.1:0",
    )
    async with running_controller(settings) as (c, bound):
        headers = await key_for(c)
        async with httpx.AsyncClient(base_url=f"http://{bound.http}") as client:
            plan = {"steps": [{"step_id": "a", "tool": "echo.say", "args": {}}]}
            assert (await client.post("/v1/tasks", json=plan, headers=headers)).status_code == 202
            [step] = await c.leasing.poll(executor_id="x", connectors=["echo"], limit=1, wait=5)
            await c.reporting.report(executor_id="x", results=[ran(step, 0.05)])
            await c.admission.refresh_queue_depth()
            text = (await client.get("/metrics")).text
            assert value(text, "agent_reach_steps_total", tool="echo.say", outcome="succeeded")
    checked = await asyncio.to_thread(
        subprocess.run,
        [promtool, "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


async def test_what_a_rolled_back_transaction_observed_is_not_counted(
    sqlite_url: str, tmp_path: Path
) -> None:
    async with components_for(sqlite_url, write_tools(tmp_path)) as c:
        rejected = "agent_reach_results_rejected_total"

        async def fail(_: Any) -> None:
            raise RuntimeError("the commit never comes")

        async def observe_then_fail() -> None:
            async with c.db.transaction() as conn:
                c.metrics.rejected(conn, "duplicate")
                before_commit(conn, fail)  # a later step of the commit fails

        with pytest.raises(RuntimeError):
            await observe_then_fail()
        assert c.metrics.total(rejected) == 0
        async with c.db.transaction() as conn:
            c.metrics.rejected(conn, "duplicate")
            assert c.metrics.total(rejected) == 0  # not before the commit either
        assert c.metrics.total(rejected) == 1
