"""Retention, on both backends: tasks that finished before the retention window go, with their
steps, events, cap charges and idempotency keys, in batches; recent and unfinished ones stay;
the audit chain still verifies. On Postgres the tables shrink back to their size before the run
(after VACUUM FULL, which gives the space back to the file system)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from agent_reach_controller.audit import log as audit_log
from agent_reach_controller.planning.plan import parse_plan
from agent_reach_controller.runtime import Components
from agent_reach_controller.services.intake import SubmitInput
from agent_reach_controller.storage.schema import (
    audit_checkpoints,
    events,
    idempotency_keys,
    steps,
    tasks,
)
from agent_reach_controller.storage.schema import audit_log as audit_log_table
from tests.integration.stack import components_for, ok, write_tools

TABLES = ("tasks", "steps", "events", "idempotency_keys")


async def _finished_task(c: Components, n: int) -> str:
    body = {"steps": [{"step_id": f"s{i}", "tool": "echo.say", "args": {"n": n}} for i in range(2)]}
    done = await c.intake.submit(
        SubmitInput(plan=parse_plan(body, c.catalog), request=body, idempotency_key=f"key-{n}")
    )
    held = await c.leasing.claim(executor_id="x", connectors=["echo"], limit=2)
    await c.reporting.report(executor_id="x", results=[ok(s, {}) for s in held])
    return done.task_id


async def _backdate(c: Components, task_ids: list[str], finished: datetime) -> None:
    async with c.db.transaction() as conn:
        await conn.execute(
            sa.update(tasks).where(tasks.c.task_id.in_(task_ids)).values(finished_at=finished)
        )


async def _counts(c: Components, task_ids: list[str]) -> dict[str, int]:
    found: dict[str, Any] = {}
    async with c.db.transaction() as conn:
        for table in (tasks, steps, events, idempotency_keys):
            rows = await conn.execute(
                sa.select(sa.func.count()).select_from(table).where(table.c.task_id.in_(task_ids))
            )
            found[table.name] = rows.scalar_one()
    return found


async def test_what_finished_before_the_window_goes_and_the_rest_stays(
    database_url: str, tmp_path: Path
) -> None:
    settings = {"retention_days": 30, "retention_batch": 2}
    async with components_for(database_url, write_tools(tmp_path), **settings) as c:
        old = [await _finished_task(c, n) for n in range(5)]
        recent = [await _finished_task(c, n) for n in range(5, 7)]
        body = {"steps": [{"step_id": "s", "tool": "echo.say", "args": {}}]}
        pending = (
            await c.intake.submit(SubmitInput(plan=parse_plan(body, c.catalog), request=body))
        ).task_id
        now = datetime.now(UTC)
        await _backdate(c, old, now - timedelta(days=31))
        await _backdate(c, recent, now - timedelta(days=29))
        assert (await _counts(c, old))["events"] > 0

        pruned = await c.retention.prune(now=now)  # in batches of 2: three of them

        assert pruned["tasks"] == 5
        assert await _counts(c, old) == dict.fromkeys(TABLES, 0)
        kept = await _counts(c, recent)
        assert kept["tasks"] == 2
        assert kept["steps"] == 4
        assert kept["idempotency_keys"] == 2
        assert (await _counts(c, [pending]))["tasks"] == 1
        assert await c.retention.prune(now=now) == {}  # nothing more to do
        # The audit log is kept whole: sealed, the chain verifies.
        await audit_log.seal(c.db, now=now + timedelta(seconds=5))  # past the settle time
        report = await audit_log.verify(c.db)
        assert report.ok, report.lines()
        assert report.sealed > 0


def _size_after_vacuum(url: str) -> int:
    with psycopg.connect(url.replace("+psycopg", ""), autocommit=True) as conn:
        for table in TABLES:
            conn.execute(f"VACUUM FULL {table}")
        row = conn.execute(
            "SELECT sum(pg_total_relation_size(c)) FROM unnest(%s::regclass[]) AS c",
            (list(TABLES),),
        ).fetchone()
        assert row is not None
        return int(row[0])


async def test_the_database_shrinks_back_after_a_run_is_pruned(
    postgres_url: str, tmp_path: Path
) -> None:
    settings = {"retention_days": 1, "retention_batch": 100}
    async with components_for(postgres_url, write_tools(tmp_path), **settings) as c:
        before = _size_after_vacuum(postgres_url)
        ran = [await _finished_task(c, n) for n in range(150)]
        grown = _size_after_vacuum(postgres_url)
        await _backdate(c, ran, datetime.now(UTC) - timedelta(days=2))
        assert (await c.retention.prune())["tasks"] == len(ran)
        after = _size_after_vacuum(postgres_url)
        await audit_log.seal(c.db, now=datetime.now(UTC) + timedelta(seconds=5))
        report = await audit_log.verify(c.db)
    assert grown > before + 100_000  # the run took room...
    assert after <= before + 16 * 8192  # ...and gave it back, up to a few index pages
    assert report.ok, report.lines()  # and the audit chain of the whole run still verifies


async def _entries(c: Components, times: list[datetime]) -> None:
    async with c.db.transaction() as conn:
        for n, at in enumerate(times):
            await audit_log.record(
                conn, actor="op", tenant=None, action="test.entry", target=f"t:{n}", now=at
            )


async def test_old_audit_entries_go_behind_a_checkpoint_the_chain_verifies_from(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path), audit_retention_days=30) as c:
        # Entries in the order time made them: what the controller recorded at start, six more
        # now, then four in 40 days; retention runs 42 days from now, keeping 30.
        now = datetime.now(UTC)
        later = now + timedelta(days=40)
        await _entries(c, [now] * 6)
        old = await audit_log.seal(c.db, now=now + timedelta(seconds=5))
        await _entries(c, [later + timedelta(minutes=n) for n in range(4)])
        assert await audit_log.seal(c.db, now=later + timedelta(hours=1)) == 4
        assert old >= 6

        pruned = await c.retention.prune(now=now + timedelta(days=42))

        assert pruned == {"audit_log": old}
        report = await audit_log.verify(c.db)
        assert report.ok, report.lines()
        assert (report.start_seq, report.checked, report.head_seq) == (old, 4, old + 4)
        assert f"from the checkpoint at seq {old}" in "\n".join(report.lines())
        # What is past the checkpoint stays undeletable; the sealer goes on from the chain head.
        async with c.db.transaction() as conn:
            with pytest.raises(sa.exc.DBAPIError):
                async with conn.begin_nested():
                    await conn.execute(
                        sa.delete(audit_log_table).where(audit_log_table.c.seq == old + 2)
                    )
        await _entries(c, [later + timedelta(hours=2)])
        assert await audit_log.seal(c.db, now=later + timedelta(hours=3)) == 1
        assert (await audit_log.verify(c.db)).head_seq == old + 5


async def test_a_forged_checkpoint_breaks_the_chain(database_url: str, tmp_path: Path) -> None:
    async with components_for(database_url, write_tools(tmp_path)) as c:
        now = datetime.now(UTC)
        await _entries(c, [now] * 6)
        head = await audit_log.seal(c.db, now=now + timedelta(seconds=5))
        # Someone with write access removes the first entries behind a checkpoint of their own.
        async with c.db.transaction() as conn:
            await conn.execute(
                sa.insert(audit_checkpoints).values(
                    seq=head - 2, hash="0" * 64, entries=head - 2, created_at=now
                )
            )
            await conn.execute(sa.delete(audit_log_table).where(audit_log_table.c.seq <= head - 2))
        report = await audit_log.verify(c.db)
        assert report.problem is not None
        assert report.problem.kind == "prev_hash_mismatch"
