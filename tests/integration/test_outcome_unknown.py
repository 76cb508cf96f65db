"""A non-idempotent tool's ambiguous failure waits for an operator instead of a blind retry."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_reach.states import StepStatus
from agent_reach_controller.decide.outcomes import AttemptError, AttemptResult
from tests.integration.test_api import api

PAY = {"steps": [{"step_id": "pay", "tool": "echo.count", "args": {"n": 5}}]}  # not idempotent
SAY = {"steps": [{"step_id": "say", "tool": "echo.say", "args": {}}]}  # idempotent


def ambiguous(step, *, maybe_applied: bool = True) -> AttemptResult:
    return AttemptResult(
        step_key=step.id,
        attempt=step.attempt,
        error=AttemptError(
            code="timeout",
            message=f"{step.tool}: timed out answering",
            retryable=True,
            maybe_applied=maybe_applied,
        ),
    )


async def _run_once(c, body_result) -> None:
    [step] = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=1)
    await c.reporting.report(executor_id="x", results=[body_result(step)])


async def test_ambiguous_failure_of_non_idempotent_tool_waits(
    database_url: str, tmp_path: Path
) -> None:
    async with api(database_url, tmp_path) as (client, c):
        task_id = (await client.post("/v1/tasks", json=PAY)).json()["task_id"]
        await _run_once(c, ambiguous)
        task = (await client.get(f"/v1/tasks/{task_id}")).json()
        step = task["steps"][0]
        assert step["status"] == "outcome_unknown"
        assert task["status"] == "running"
        assert step["receipt"]["status"] == "outcome_unknown"
        assert "may have been applied" in step["receipt"]["error"]["message"]
        assert await c.leasing.claim(executor_id="x", connectors=["echo"], limit=1) == []


async def test_idempotent_tool_retries_and_clear_failure_retries(
    database_url: str, tmp_path: Path
) -> None:
    async with api(database_url, tmp_path) as (client, c):
        say = (await client.post("/v1/tasks", json=SAY)).json()["task_id"]
        await _run_once(c, ambiguous)
        assert (await c.queries.get(say)).steps[0].status is StepStatus.READY
        pay = (await client.post("/v1/tasks", json=PAY)).json()["task_id"]
        # echo.count allows one attempt: a failure known not to have reached it just fails.
        [step] = [
            s
            for s in await c.leasing.claim(executor_id="x", connectors=["echo"], limit=5)
            if s.task_id == pay
        ]
        await c.reporting.report(executor_id="x", results=[ambiguous(step, maybe_applied=False)])
        assert (await c.queries.get(pay)).steps[0].status is StepStatus.FAILED


@pytest.mark.parametrize(
    ("verdict", "step_status", "task_status"),
    [
        ({"action": "succeeded", "output": {"charged": True}}, "succeeded", "succeeded"),
        ({"action": "failed", "reason": "no charge on the statement"}, "failed", "failed"),
        ({"action": "retry", "reason": "provider says not received"}, "ready", "running"),
    ],
)
async def test_operator_resolves(
    sqlite_url: str, tmp_path: Path, verdict: dict, step_status: str, task_status: str
) -> None:
    async with api(sqlite_url, tmp_path) as (client, c):
        task_id = (await client.post("/v1/tasks", json=PAY)).json()["task_id"]
        await _run_once(c, ambiguous)
        response = await client.post(
            f"/v1/tasks/{task_id}/steps/pay/resolve", json={**verdict, "by": "ops@example"}
        )
        assert response.status_code == 200, response.text
        task = response.json()
        assert (task["steps"][0]["status"], task["status"]) == (step_status, task_status)
        events = (await client.get(f"/v1/tasks/{task_id}/events")).json()["events"]
        audit = [e for e in events if e["kind"].startswith("resolve_")]
        # The key's principal decides; on whose behalf is recorded with it.
        assert [e["data"]["by"] for e in audit] == ["tester for ops@example"]
        if verdict["action"] == "succeeded":
            assert task["steps"][0]["receipt"]["data"] == {"charged": True}
        if verdict["action"] == "retry":
            [again] = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=1)
            assert again.attempt == 2
            assert again.idempotency_key == f"{task_id}:pay"


async def test_resolving_a_step_that_is_not_unknown_is_409(sqlite_url: str, tmp_path: Path) -> None:
    async with api(sqlite_url, tmp_path) as (client, _):
        task_id = (await client.post("/v1/tasks", json=PAY)).json()["task_id"]
        verdict = {"action": "retry", "by": "ops"}
        response = await client.post(f"/v1/tasks/{task_id}/steps/pay/resolve", json=verdict)
        assert response.status_code == 409
        assert response.json()["code"] == "not_resolvable"
        missing = await client.post(f"/v1/tasks/{task_id}/steps/nope/resolve", json=verdict)
        assert missing.status_code == 404
        bad = await client.post(
            f"/v1/tasks/{task_id}/steps/pay/resolve", json={"action": "maybe", "by": "x"}
        )
        assert bad.status_code == 422
        assert bad.json()["errors"][0]["pointer"] == "/body/action"


async def test_lost_lease_of_non_idempotent_step_is_unknown(
    sqlite_url: str, tmp_path: Path
) -> None:
    from datetime import UTC, datetime, timedelta

    import sqlalchemy as sa

    from agent_reach_controller.storage.schema import steps

    async with api(sqlite_url, tmp_path) as (client, c):
        task_id = (await client.post("/v1/tasks", json=PAY)).json()["task_id"]
        await c.leasing.claim(executor_id="gone", connectors=["echo"], limit=1)
        async with c.db.transaction() as conn:  # the executor died: its lease ran out
            await conn.execute(
                sa.update(steps).values(lease_expires_at=datetime.now(UTC) - timedelta(seconds=1))
            )
        assert await c.expiry.reap_expired() == 1
        assert (await c.queries.get(task_id)).steps[0].status is StepStatus.OUTCOME_UNKNOWN
