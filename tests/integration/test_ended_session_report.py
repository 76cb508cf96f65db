"""A report of an executor session that has ended is refused, and writes nothing, on both
backends. On Postgres the session's heartbeat is the report's commit guard: the report's changes
are made first, and the guard's refusal must undo every one of them."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from agent_reach_controller.services.sessions import Announcement, SessionEndedError
from tests.integration.stack import components_for, ok, submit, write_tools

CHAIN = {
    "steps": [
        {"step_id": "a", "tool": "echo.say", "args": {}},
        {"step_id": "b", "tool": "echo.say", "args": {}, "depends_on": ["a"]},
    ]
}


async def test_a_report_of_an_ended_session_is_refused_and_writes_nothing(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c:
        await c.pools.create(name="general", created_by="test")
        (pool,) = await c.pools.list()
        opened = datetime.now(UTC)
        session, _ = await c.sessions.open(
            Announcement(executor_id="e", connectors=["echo"], slots=4, version="test"),
            scope=pool.scope,
            now=opened,
        )
        task_id = await submit(c, CHAIN)
        (a,) = await c.leasing.claim(executor_id="e", connectors=["echo"], limit=5, session=session)
        # Its heartbeats stopped: the session ends, and the reaper has not re-queued `a` yet.
        async with c.db.transaction() as conn:
            ended = await c.sessions.end_expired(conn, now=opened + timedelta(hours=1))
        assert ended == [session.id]
        before = await c.queries.get(task_id), await c.queries.events(task_id)

        token = session.lease_token(a.id, a.attempt)
        result = replace(ok(a, {"late": True}), lease_token=token)
        with pytest.raises(SessionEndedError) as raised:
            # The lease is the session's and current: only the session's end refuses the
            # success; the same result again would be refused with an event of its own.
            await c.reporting.report(executor_id="e", results=[result, result], session=session)
        assert raised.value.session_id == session.id

        assert (await c.queries.get(task_id), await c.queries.events(task_id)) == before
        (row,) = [s for s in await c.sessions.list(live_only=False) if s.id == session.id]
        assert (row.ended_at, row.last_seen_at) == (opened + timedelta(hours=1), opened)
