"""A report of a one-step task's step, leased by this replica, decides on the rows the lease left
(services/held.py): no read of its own, the task locked by its commit, ahead of any write.

Over the real REST API and real gRPC on Postgres. What must hold: the verdict, the rows and the
events are the ones a report reading under the lock gives; a task that changed after the lease
(cancelled, its version moved, even while the report's commit waits for its lock) makes the
commit write nothing, and the report is decided again under the lock; nothing is sent before
the commit that takes the lock.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from agent_reach_controller.runtime import Components
from agent_reach_controller.services.held import HeldLeases, HeldRowsChanged
from agent_reach_controller.storage import claims, hot, locks
from agent_reach_controller.storage.engine import Database, nothing_before_commit
from tests.integration import test_hand_off
from tests.integration.test_commits import _next_xid
from tests.integration.test_hand_off import (
    PLAN,
    _events,
    _polling,
    _registered,
    _session_of,
    _until,
    _waiting,
)

# The fixture: a controller on Postgres, its REST client and a gRPC stub.
plane = test_hand_off.plane

TWO_STEPS = {
    "steps": [
        {"step_id": "a", "tool": "echo.say", "args": {}},
        {"step_id": "b", "tool": "echo.say", "args": {}},
    ]
}


async def _handed(c: Components, http: Any, stub: Any) -> tuple[Any, Any, str]:
    """A task submitted while a poll waits: (executor, its step, task id)."""
    executor, poll = await _polling(c, stub, wait_ms=5000)
    await _waiting(c)
    answer = await http.post("/v1/tasks", json=PLAN)
    assert answer.status_code == 202, answer.text
    (step,) = await asyncio.wait_for(poll, 5)
    return executor, step, answer.json()["task_id"]


def _held(c: Components) -> HeldLeases:
    held = c.reporting.held
    assert held is not None
    return held


def _rows(url: str, task_id: str) -> tuple[Any, ...]:
    """What a report leaves of a task: its status and version, its step's status, attempt and
    output, and its events (kinds and statuses, in order)."""
    with psycopg.connect(url) as conn:
        task = conn.execute(
            "SELECT status, version, cancel_requested FROM tasks WHERE task_id = %s", (task_id,)
        ).fetchone()
        step = conn.execute(
            "SELECT status, attempt, output FROM steps WHERE task_id = %s", (task_id,)
        ).fetchone()
    events = [(kind, frm, to) for kind, _, frm, to, _ in _events(url, task_id)]
    return task, step, events


async def test_the_report_of_a_handed_step_reads_nothing_and_ends_as_a_locked_one(
    postgres_url: str, plane: tuple[Components, Any, Any]
) -> None:
    c, http, stub = plane
    held = _held(c)
    executor, step, task_id = await _handed(c, http, stub)
    kept = held.get(step.lease.step_key)  # kept once the submit committed: as a read gives them
    assert kept is not None
    async with c.db.transaction() as conn:
        tasks, steps, whole = await locks.lock_steps(conn, [step.lease.step_key])
    assert kept[0] == tasks[task_id]
    assert replace(kept[1], queued_at=None) == steps[step.lease.step_key]
    assert task_id in whole

    before = _next_xid(postgres_url)
    ack = await executor.report(step.lease, {"ok": True})
    assert ack.accepted, ack.reason
    assert (held.taken, held.refused, len(held)) == (1, 0, 0)
    assert _next_xid(postgres_url) - before == 1
    fast = _rows(postgres_url, task_id)

    # The same once more with nothing remembered: the report reads under the lock.
    c.reporting.held = None
    executor, step, other = await _handed(c, http, stub)
    ack = await executor.report(step.lease, {"ok": True})
    assert ack.accepted, ack.reason
    assert _rows(postgres_url, other) == fast
    assert fast[0] == ("succeeded", 3, False)
    assert fast[1] == ("succeeded", 1, {"ok": True})


@pytest.mark.parametrize("how", ["api", "flag"])
async def test_a_task_cancelled_after_its_lease_is_decided_again_under_the_lock(
    postgres_url: str, plane: tuple[Components, Any, Any], how: str
) -> None:
    """Cancelled through the API (its step cancelled too) or only asked to (the flag alone, as
    `request_cancel` sets it): the same end as a report that read under the lock."""
    c, http, stub = plane
    held = _held(c)
    ends = []
    for remembered in (True, False):
        if not remembered:
            c.reporting.held = None
        executor, step, task_id = await _handed(c, http, stub)
        if how == "api":
            cancel = await http.post(f"/v1/tasks/{task_id}/cancel")
            assert cancel.status_code == 200, cancel.text
        else:
            with psycopg.connect(postgres_url) as conn:
                conn.execute(
                    "UPDATE tasks SET cancel_requested = true WHERE task_id = %s", (task_id,)
                )
        ack = await executor.report(step.lease, {"ok": True})
        ends.append((ack.accepted, ack.reason, _rows(postgres_url, task_id)))
    assert (held.taken, held.refused) == (1, 1)
    assert ends[0] == ends[1]  # as if the report had read under the lock
    assert ends[0][2][0][2] is True  # the cancel was seen


async def test_a_version_moved_while_the_commit_waits_for_the_lock_is_seen(
    postgres_url: str, plane: tuple[Components, Any, Any]
) -> None:
    """Another transaction holds the task's lock when the report commits, and moves the task's
    version before it lets go: the commit, once it has the lock, checks the row as committed."""
    c, http, stub = plane
    held = _held(c)
    executor, step, task_id = await _handed(c, http, stub)
    locked, release = threading.Event(), threading.Event()

    def other_writer() -> None:
        with psycopg.connect(postgres_url) as conn:
            conn.execute("SELECT 1 FROM tasks WHERE task_id = %s FOR UPDATE", (task_id,))
            locked.set()
            release.wait(10)
            conn.execute("UPDATE tasks SET version = version + 1 WHERE task_id = %s", (task_id,))

    writer = threading.Thread(target=other_writer)
    writer.start()
    try:
        assert await asyncio.to_thread(locked.wait, 5)
        report = asyncio.create_task(executor.report(step.lease, {"ok": True}))
        await _until(lambda: _lock_waits(postgres_url) > 0, "the report never waited for the lock")
        assert not report.done()
    finally:
        release.set()
        await asyncio.to_thread(writer.join, 10)
    ack = await asyncio.wait_for(report, 10)
    assert ack.accepted, ack.reason
    assert (held.taken, held.refused) == (1, 1)
    task, step_row, events = _rows(postgres_url, task_id)
    assert task == ("succeeded", 4, False)  # its version moved once more than a report moves it
    assert step_row[0] == "succeeded"
    assert events[-2:] == [
        ("succeed", "running", "succeeded"),
        ("task_status", "running", "succeeded"),
    ]


@pytest.mark.parametrize("guarded", [False, True])
async def test_a_claim_gives_its_one_step_tasks_as_a_locked_read_gives_them(
    plane: tuple[Components, Any, Any], guarded: bool
) -> None:
    """The task rows a claim hands back (services/held.py) are, field for field, what reading
    them under the lock gives once it has committed; a task of two steps is not among them."""
    c, http, _ = plane
    one = (await http.post("/v1/tasks", json=PLAN)).json()["task_id"]
    two = (await http.post("/v1/tasks", json=TWO_STEPS)).json()["task_id"]
    now = datetime.now(UTC)
    claim = claims.ClaimInput(
        executor_id="x", connectors=["echo"], limit=5, now=now, lease_expires_at=now
    )
    assumed = claims.Assumed(c.registry.revision, ["echo.say"]) if guarded else None
    async with c.db.transaction() as conn:
        leased, _, alone = await claims.claim_ready(conn, claim, last=True, assumed=assumed)
    assert {s.task_id for s in leased} == {one, two}
    assert list(alone) == [one]
    async with c.db.transaction() as conn:
        tasks, steps, whole = await locks.lock_steps(conn, [s.id for s in leased])
    assert alone[one] == tasks[one]
    (step,) = (s for s in leased if s.task_id == one)
    assert replace(step, queued_at=None) == steps[step.id]
    assert one in whole


async def test_the_report_of_a_claimed_step_reads_nothing(
    postgres_url: str, plane: tuple[Components, Any, Any]
) -> None:
    c, http, stub = plane
    held = _held(c)
    ends = []
    for remembered in (True, False):
        if not remembered:
            c.reporting.held = None
        task_id = (await http.post("/v1/tasks", json=PLAN)).json()["task_id"]
        executor = await _registered(c, stub, name=f"claimer-{remembered}")
        (step,) = await executor.poll(wait_ms=2000)  # claimed: nobody was waiting
        assert step.task_id == task_id
        before = _next_xid(postgres_url)
        ack = await executor.report(step.lease, {"ok": True})
        assert ack.accepted, ack.reason
        ends.append((_next_xid(postgres_url) - before, _rows(postgres_url, task_id)))
    assert (held.taken, held.refused) == (1, 0)
    assert ends[0] == ends[1]
    assert ends[0][1][0][0] == "succeeded"


async def test_a_step_requeued_after_its_lease_refuses_the_late_report_under_the_lock(
    postgres_url: str, plane: tuple[Components, Any, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """A sweep put the step back in the queue at its next attempt, which leaves the task's
    version alone: the kept rows would accept the late report, the commit finds the step moved,
    and the report is refused as a locked read refuses it, with no alarm about a writer that
    broke the lock rule."""
    c, http, stub = plane
    held = _held(c)
    executor, step, task_id = await _handed(c, http, stub)
    with psycopg.connect(postgres_url) as conn:
        conn.execute(
            "UPDATE steps SET status = 'ready', attempt = attempt + 1, lease_owner = NULL"
            " WHERE id = %s",
            (step.lease.step_key,),
        )
    ack = await executor.report(step.lease, {"ok": True})
    assert (ack.accepted, ack.reason) == (False, "stale_lease")
    assert (held.taken, held.refused) == (1, 1)
    assert "step_moved_unlocked" not in [getattr(r, "event", "") for r in caplog.records]
    task, step_row, _ = _rows(postgres_url, task_id)
    assert (task[0], step_row[:2]) == ("running", ("ready", 2))


async def test_a_step_leased_again_is_reported_on_rows_read_under_the_lock(
    postgres_url: str, plane: tuple[Components, Any, Any]
) -> None:
    """Kept rows of an earlier attempt, or of another holder, decide nothing: the lease of the
    next attempt went to an executor whose claim started no task (the task was running)."""
    c, http, stub = plane
    held = _held(c)
    _, step, task_id = await _handed(c, http, stub)
    assert held.get(step.lease.step_key) is not None
    with psycopg.connect(postgres_url) as conn:  # revoked: its lease goes back to the queue
        conn.execute(
            "UPDATE executor_sessions SET ended_at = now(), end_reason = 'revoked' WHERE id = %s",
            (_session_of(postgres_url, "waiting"),),
        )
    await c.leases.reap_sessions()
    other = await _registered(c, stub, name="other")
    (again,) = await other.poll(wait_ms=2000)
    assert (again.lease.step_key, again.lease.attempt) == (step.lease.step_key, 2)
    ack = await other.report(again.lease, {"ok": True})
    assert ack.accepted, ack.reason
    assert (held.taken, held.missed) == (0, 1)
    assert _rows(postgres_url, task_id)[0][0] == "succeeded"


def _lock_waits(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE wait_event_type = 'Lock' AND datname = current_database()"
        ).fetchone()
    assert row is not None
    return int(row[0])


async def test_nothing_is_sent_before_the_commit_that_takes_the_locks(postgres_url: str) -> None:
    """Through psycopg or through SQLAlchemy, a statement before the commit raises the refusal
    (the write would lock a row before its task); the commit itself goes."""
    db = Database(postgres_url)

    async def send_first(through: str) -> None:
        async with db.transaction() as conn:
            nothing_before_commit(conn, HeldRowsChanged)
            if through == "psycopg":
                await hot.tuples(conn, "SELECT 1", {})
            else:
                await conn.execute(sa.text("SELECT 1"))

    try:
        for through in ("psycopg", "sqlalchemy"):
            with pytest.raises(HeldRowsChanged):
                await send_first(through)
        async with db.transaction() as conn:  # a later transaction on the same connection
            assert await hot.tuples(conn, "SELECT 1", {}) == [(1,)]
    finally:
        await db.close()
