"""An ungoverned claim on Postgres reads nothing first: one round trip, BEGIN to COMMIT.

It assumes the replica's catalogue is current and none of its tools is paused, and the claim
statement checks both. What that must keep: a claim under a stale assumption leases nothing (the
claimer then reads and claims again), so a tool disabled or paused by another replica a moment
ago is never handed out.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from agent_reach_controller.storage import claims, flow
from tests.integration.stack import api_client, components_for, write_tools

PLAN = {"steps": [{"step_id": "a", "tool": "echo.say", "args": {}}]}


def _claim(now: datetime) -> claims.ClaimInput:
    return claims.ClaimInput(
        executor_id="x", connectors=["echo"], limit=5, now=now, lease_expires_at=now
    )


async def test_a_claim_under_a_stale_assumption_leases_nothing(
    postgres_url: str, tmp_path: Path
) -> None:
    async with components_for(postgres_url, write_tools(tmp_path)) as c, api_client(c) as api:
        queued = (await api.post("/v1/tasks", json=PLAN)).json()["task_id"]
        now = datetime.now(UTC)
        current = c.registry.revision
        tools = ["echo.say", "echo.count"]
        for wrong in (claims.Assumed(current - 1, tools), claims.Assumed(current + 1, tools)):
            with pytest.raises(claims.AssumptionFailed):
                async with c.db.transaction() as conn:
                    await claims.claim_ready(conn, _claim(now), last=True, assumed=wrong)
        async with c.db.transaction() as conn:
            await flow.pause_tool(
                conn, "echo.say", until=now + timedelta(minutes=1), reason="test", now=now
            )
        with pytest.raises(claims.AssumptionFailed):
            async with c.db.transaction() as conn:
                await claims.claim_ready(
                    conn, _claim(now), last=True, assumed=claims.Assumed(current, tools)
                )
        assert (await c.queries.get(queued)).steps[0].status == "ready"
        # A pause of a tool the claimer does not serve does not stop it.
        async with c.db.transaction() as conn:
            leased, _, _ = await claims.claim_ready(
                conn, _claim(now), last=True, assumed=claims.Assumed(current, ["echo.count"])
            )
        assert [s.task_id for s in leased] == [queued]


async def test_claims_skip_the_read_until_an_assumption_fails(
    postgres_url: str, tmp_path: Path
) -> None:
    tools = write_tools(tmp_path)
    async with (
        components_for(postgres_url, tools) as one,
        components_for(postgres_url, tools) as two,
        api_client(one) as api,
    ):
        first = (await api.post("/v1/tasks", json=PLAN)).json()["task_id"]
        leased = await two.leasing.claim(executor_id="y", connectors=["echo"], limit=5)
        assert [s.task_id for s in leased] == [first]
        assert two.leasing.claim_paths["assumed"] == 1
        assert two.leasing.claim_paths["read_first"] == 0

        # Replica one pauses the tool: replica two's next claim finds its assumption stale,
        # reads the pause, leases nothing, and reads first until the pause ends.
        now = datetime.now(UTC)
        async with one.db.transaction() as conn:
            await flow.pause_tool(
                conn, "echo.say", until=now + timedelta(minutes=1), reason="test", now=now
            )
        second = (await api.post("/v1/tasks", json=PLAN)).json()["task_id"]
        assert await two.leasing.claim(executor_id="y", connectors=["echo"], limit=5) == []
        assert two.leasing.claim_paths["assumption_failed"] == 1
        assert await two.leasing.claim(executor_id="y", connectors=["echo"], limit=5) == []
        assert two.leasing.claim_paths["assumption_failed"] == 1  # it read first this time
        assert two.leasing.claim_paths["read_first"] == 2
        assert (await two.queries.get(second)).steps[0].status == "ready"
