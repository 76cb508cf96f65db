"""The hot path's batch UPDATEs find their rows by key, whatever the table's size.

Each of them joins its table to `jsonb_to_recordset(rows)`. Postgres takes any set-returning
function for 100 rows, so with nothing else to go on it hash-joins those 100 against a full scan
of a table of a few thousand rows: a cost that grows with the table (a report took 5 ms at 12,000
tasks). The plans are read from Postgres itself (EXPLAIN) on tables of 5,000 analysed rows.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from agent_reach_controller.storage import audit, steps, tasks

ROWS = 5000


@pytest.fixture
def filled(postgres_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(postgres_url.replace("+psycopg", ""), autocommit=True) as conn:
        conn.execute(
            "INSERT INTO tasks (task_id, trace_id, status, principal, source, request, context,"
            " created_at, updated_at)"
            " SELECT 't' || i, 'trace', 'running', 'p', 'plan', '{}', '{}', now(), now()"
            " FROM generate_series(1, %s) AS i",
            (ROWS,),
        )
        conn.execute(
            "INSERT INTO steps (task_id, step_id, position, trace_id, tool, tool_version,"
            " connector, args, depends_on, status, attempt, max_attempts, idempotency_key,"
            " created_at, updated_at)"
            " SELECT 't' || i, 's', 0, 'trace', 'echo', '1', 'echo', '{}', '[]', 'running', 1,"
            " 3, 'k' || i, now(), now() FROM generate_series(1, %s) AS i",
            (ROWS,),
        )
        conn.execute(
            "INSERT INTO audit_log (at, actor, action, target, data)"
            " SELECT now(), 'a', 'task.submit', 't' || i, '{}' FROM generate_series(1, %s) AS i",
            (ROWS,),
        )
        conn.execute("ANALYZE tasks, steps, audit_log")
        yield conn


def _scans(plan: dict[str, Any]) -> Iterator[tuple[str, str]]:
    if "Relation Name" in plan:
        yield plan["Node Type"], plan["Relation Name"]
    for child in plan.get("Plans", ()):
        yield from _scans(child)


def _by_key(scans: list[tuple[str, str]], table: str) -> bool:
    found = [node for node, rel in scans if rel == table and node != "ModifyTable"]
    return bool(found) and all("Index" in node or "Bitmap" in node for node in found)


def _plan(conn: psycopg.Connection[Any], sql: str, params: dict[str, Any]) -> list[tuple[str, str]]:
    with conn.transaction():
        row = conn.execute("EXPLAIN (FORMAT JSON) " + sql, params).fetchone()
    assert row is not None
    return list(_scans(row[0][0]["Plan"]))


def test_a_report_sets_task_statuses_by_key(filled: psycopg.Connection[Any]) -> None:
    rows = json.dumps(
        [{"task_id": "t7", "version": 1, "status": "succeeded", "now": "2026-12-01T00:00:00+00:00"}]
    )
    scans = _plan(filled, tasks.SET_TASK_STATUSES, {"rows": rows, "expected": 1})
    assert _by_key(scans, "tasks"), scans


def test_step_changes_find_steps_by_key(filled: psycopg.Connection[Any]) -> None:
    rows = json.dumps(
        [{"id": 7, "seen_status": "running", "seen_attempt": 1, "new_status": "succeeded"}]
    )
    sql = steps.change_steps_sql((("error", "jsonb"),))
    scans = _plan(filled, sql, {"rows": rows, "now": "2026-12-01T00:00:00+00:00"})
    assert _by_key(scans, "steps"), scans


def test_the_audit_sealer_finds_entries_by_key(filled: psycopg.Connection[Any]) -> None:
    rows = json.dumps([{"id": 7, "seq": 1, "prev_hash": "0", "hash": "1"}])
    scans = _plan(filled, audit.SEAL_AUDIT_ENTRIES, {"rows": rows})
    assert _by_key(scans, "audit_log"), scans
