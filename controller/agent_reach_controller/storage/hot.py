"""How the hot path's statements reach Postgres: through psycopg, prepared, pipelined.

SQLAlchemy spends about as much CPU building and binding a statement as Postgres spends running
it (~0.3-0.6 ms against ~0.1 ms for the same INSERT through psycopg), and a submit or a report is a
handful of such statements. The writes every task makes (its rows, its events, its audit entry,
its wake-ups) are therefore sent as plain SQL on the transaction's own psycopg connection,
prepared once per connection, and queued in a pipeline so that they cost one round trip.

This module is the machinery (`run`, `rows`, `tuples`, rows inserted from a JSON array, the
column lists and key arrays the statements share). Each statement lives in the module of its
table, its Postgres text beside the SQLAlchemy statement SQLite (embedded mode) runs: tasks in
`tasks.py`, the claim in `claims.py`, the event log in `events.py`, and so on.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from psycopg import AsyncCursor
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from agent_reach_controller.storage import schema
from agent_reach_controller.storage.commit import json_rows
from agent_reach_controller.storage.engine import (
    Connection,
    commit_statement,
    prepare,
    round_trip,
)


def columns(table: sa.Table, alias: str = "") -> str:
    """The table's columns by name, never `*`: a prepared statement whose result would grow
    when a newer release's migration adds a column fails ("cached plan must not change result
    type") in every process still running the older code; named columns keep their plans."""
    return ", ".join(f"{alias}{c.name}" for c in table.c)


STEP_COLUMNS, TASK_COLUMNS = columns(schema.steps), columns(schema.tasks)


def keys_of(field: str, kind: str) -> str:
    """The `field` of every row in %(rows)s, as an array. An UPDATE … FROM jsonb_to_recordset
    also matches its table on this: the planner takes any set-returning function for 100 rows,
    so a prepared (generic) plan would otherwise hash-join them against a full scan of the
    table, which grows with it (5 ms a report at 12,000 tasks); `= ANY(array)` uses the key."""
    return f"ARRAY(SELECT (r->>'{field}')::{kind} FROM jsonb_array_elements(%(rows)s::jsonb) AS r)"


def _json_columns(table: sa.Table) -> frozenset[str]:
    return frozenset(c.name for c in table.c if isinstance(c.type, sa.JSON))


_TABLES = {t.name: (t, _json_columns(t)) for t in (schema.tasks, schema.steps)}


@functools.lru_cache(maxsize=64)
def insert_rows_sql(table: str, columns: tuple[str, ...]) -> str:
    """`INSERT INTO table (columns)` from a JSON array of rows, in the array's order: one text
    per set of columns, so each set is prepared once (a submit writes the same few sets)."""
    known = _TABLES[table][0].c
    unknown = [c for c in columns if c not in known]
    if unknown:
        raise ValueError(f"{table} has no column(s) {unknown}")
    names = ", ".join(columns)
    return (
        f"INSERT INTO {table} ({names}) SELECT {names}"
        f" FROM jsonb_populate_recordset(NULL::{table}, %(rows)s::jsonb) WITH ORDINALITY"
        " ORDER BY ordinality"
    )


def _value(value: Any, *, json: bool) -> Any:
    if value is None:
        return None
    if json:
        return Jsonb(value)
    if isinstance(value, enum.Enum):
        return value.value
    return value


def bound(row: Mapping[str, Any], json_columns: frozenset[str]) -> dict[str, Any]:
    return {k: _value(v, json=k in json_columns) for k, v in row.items()}


def by_columns(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, ...], list[Mapping[str, Any]]]:
    """Rows grouped by the columns they set: a column a row leaves out keeps its default (SQL
    NULL or the server default), never a value another row of the batch needed."""
    groups: dict[tuple[str, ...], list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(sorted(row)), []).append(row)
    return groups


def insert_rows(conn: Connection, table: str, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert whole rows of `tasks` or `steps` at commit, one part per set of columns."""
    statement = commit_statement(conn)
    for columns, group in by_columns(rows).items():
        statement.write(insert_rows_sql(table, columns), {"rows": json_rows(group)})


def insert_steps_keyed(
    conn: Connection,
    rows: Sequence[Mapping[str, Any]],
    answer: Callable[[list[tuple[str, str, int]]], None],
) -> None:
    """Insert whole `steps` rows at commit, as `insert_rows`, and tell `answer` the key the
    database gave each: [(task_id, step_id, id)] once the commit statement has run."""
    statement = commit_statement(conn)
    for columns, group in by_columns(rows).items():
        statement.read(
            insert_rows_sql("steps", columns) + " RETURNING task_id, step_id, id",
            {"rows": json_rows(group)},
            value="json_agg(json_build_array(task_id, step_id, id))",
            answer=lambda found: answer([tuple(row) for row in found or ()]),
        )


async def run(
    conn: Connection, sql: str, params: Mapping[str, Any], *, dicts: bool = False
) -> AsyncCursor[Any]:
    """Execute a prepared statement (with whatever must share its round trip)."""
    async with round_trip(conn) as pg:
        cur: AsyncCursor[Any] = pg.cursor(row_factory=dict_row) if dicts else pg.cursor()
        await cur.execute(sql, params, prepare=prepare(pg))
    return cur


def utc(row: dict[str, Any]) -> dict[str, Any]:
    """A row as SQLAlchemy's UtcDateTime gives it: every timestamp in UTC."""
    for name, value in row.items():
        if isinstance(value, datetime) and value.tzinfo is not UTC:
            row[name] = value.astimezone(UTC)
    return row


async def rows(conn: Connection, sql: str, params: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A prepared read's rows as dicts, timestamps in UTC."""
    cur = await run(conn, sql, params, dicts=True)
    return [utc(row) for row in await cur.fetchall()]


async def tuples(conn: Connection, sql: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    """A prepared read's rows as tuples (no timestamp among them is converted)."""
    return await (await run(conn, sql, params)).fetchall()
