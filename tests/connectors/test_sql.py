"""The sql connector against the real PostgreSQL server, in a throwaway database: bound arguments
only, read-only by default, limits, error classification, the SSRF guard on the database host,
a password that never shows, and a cancelled call that leaves no statement running."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import traceback
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import psycopg
import pytest

from agent_reach_connectors import ConnectorError, ToolCall, load_connectors
from agent_reach_connectors.sql import SqlConnector
from tests.conftest import POSTGRES_ADMIN, _server_url, _unavailable
from tests.connectors.support import Resolver
from tests.support.proxy import PgProxy
from tests.support.server import free_port

pytestmark = pytest.mark.postgres

CANARY = "canary-5e1f0c"
TOKEN = uuid.UUID("6f1c2a4e-8b7d-4c3e-9a10-2b3c4d5e6f70")
PLACED = datetime(2024, 5, 17, 9, 30, 15, 250000, tzinfo=UTC)
BY_ID = "SELECT id, status, total, placed_at, token, receipt FROM orders WHERE id = %(order_id)s"
SCHEMA = """
CREATE TABLE orders (
    id int PRIMARY KEY,
    ref text NOT NULL CONSTRAINT orders_ref_key UNIQUE DEFERRABLE INITIALLY DEFERRED,
    customer text NOT NULL,
    status text NOT NULL,
    total numeric(10, 2) NOT NULL CONSTRAINT orders_total_check CHECK (total >= 0),
    placed_at timestamptz NOT NULL,
    token uuid,
    receipt bytea
);
-- Raises any SQLSTATE: how the classification of each is checked on real server errors.
CREATE FUNCTION fail_with(state text) RETURNS int LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'forced %', state USING ERRCODE = state; END $$;
"""
SEED = [
    (1, "R-1", "ada", "paid", Decimal("12.50"), PLACED, TOKEN, b"\x00\xffreceipt"),
    (2, "R-2", "ada", "open", Decimal("3.00"), PLACED, None, None),
    (3, "R-3", "bob", "open", Decimal("99.99"), PLACED, None, None),
]


@pytest.fixture(scope="module")
def database() -> Iterator[str]:
    """A throwaway database for this module (its name); each test gets fresh `orders` rows."""
    try:
        admin = psycopg.connect(POSTGRES_ADMIN, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        _unavailable("PostgreSQL", exc)
        raise
    name = f"reach_sql_{uuid.uuid4().hex[:10]}"
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield name
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def admin(database: str) -> Iterator[psycopg.Connection[tuple[Any, ...]]]:
    """A direct connection to the test database, with `orders` made afresh."""
    with psycopg.connect(_server_url(database), autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS orders; DROP FUNCTION IF EXISTS fail_with")
        conn.execute(SCHEMA)
        with conn.cursor() as cursor:
            cursor.executemany("INSERT INTO orders VALUES (%s, %s, %s, %s, %s, %s, %s, %s)", SEED)
        yield conn


@pytest.fixture
def app_name() -> str:
    return f"sqltest-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def db_url(database: str, app_name: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The tools' URL, a secret reference: the password in it is the canary (trust auth)."""
    url = f"postgresql://postgres:{CANARY}@127.0.0.1:5432/{database}?application_name={app_name}"
    monkeypatch.setenv("ORDERS_DB_URL", url)
    return url


@pytest.fixture
async def sql() -> AsyncIterator[SqlConnector]:
    connector = SqlConnector(resolver=Resolver({"db.test": ["127.0.0.1"]}))
    await connector.start()
    yield connector
    await connector.close()


def call(config: dict[str, Any], args: dict[str, Any] | None = None, **kw: Any) -> ToolCall:
    values: dict[str, Any] = {
        "tool": "orders",
        "task_id": "task-1",
        "step_id": "s1.0",
        "args": args or {},
        "config": {"url": "${env:ORDERS_DB_URL}", "allow_hosts": ["127.0.0.1"], **config},
        "idempotency_key": "task-1:s1.0",
        "attempt": 1,
        "max_attempts": 3,
        "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
        "traceparent": "",
        "timeout_s": 20.0,
    }
    values.update(kw)
    return ToolCall(**values)


async def failure(sql: SqlConnector, tool_call: ToolCall) -> ConnectorError:
    with pytest.raises(ConnectorError) as info:
        await sql.invoke(tool_call)
    return info.value


def outcome(error: ConnectorError) -> tuple[str, bool, bool]:
    return error.code, error.retryable, error.maybe_applied


def statuses(admin: psycopg.Connection[tuple[Any, ...]]) -> dict[int, str]:
    return dict(admin.execute("SELECT id, status FROM orders ORDER BY id").fetchall())


async def wait_for(condition: Any, what: str, within: float = 10.0) -> None:
    """Poll `condition()` (a cheap query) until it holds; fail naming `what` after `within`."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        if await asyncio.to_thread(condition):
            return
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"waited {within:g}s for {what}")
        await asyncio.sleep(0.05)


async def shown_by(sql: SqlConnector, tool_call: ToolCall) -> list[str]:
    """All a call shows: its output, or its error as a message, as args, as a logged traceback."""
    try:
        return [json.dumps(await sql.invoke(tool_call))]
    except ConnectorError as error:
        failed = error
    # Not chained to the driver's error: its pgconn holds the URL, and a traceback shows it.
    assert failed.__context__ is None
    assert failed.__cause__ is None
    return [failed.message, repr(failed.args), "".join(traceback.format_exception(failed))]


async def test_the_entry_point_loads_it() -> None:
    assert isinstance(load_connectors(["sql"])["sql"], SqlConnector)


async def test_a_select_binds_its_arguments_and_returns_json_safe_rows(sql, admin, db_url) -> None:
    output = await sql.invoke(call({"query": BY_ID}, {"order_id": 1}))
    assert output["row_count"] == 1
    assert output["truncated"] is False
    [row] = output["rows"]
    assert row["id"] == 1
    assert row["status"] == "paid"
    assert row["total"] == "12.50"
    assert datetime.fromisoformat(row["placed_at"]) == PLACED
    assert row["token"] == str(TOKEN)
    assert base64.b64decode(row["receipt"]) == b"\x00\xffreceipt"
    json.dumps(output, allow_nan=False)  # what the executor does with it
    nothing = await sql.invoke(call({"query": BY_ID}, {"order_id": 42}))
    assert nothing == {"rows": [], "row_count": 0, "truncated": False}


async def test_other_values_are_json_too(sql, admin, db_url) -> None:
    statement = (
        "SELECT interval '1 day 2 hours' AS i, 'NaN'::float8 AS f, ARRAY[1.10, 2]::numeric[] AS a,"
        " %(doc)s::jsonb -> 'k' AS j, %(tags)s::text[] AS t, date '2024-05-17' AS d"
    )
    output = await sql.invoke(call({"query": statement}, {"doc": {"k": [1, "x"]}, "tags": ["a"]}))
    assert output["rows"] == [
        {
            "i": "PT93600S",
            "f": "nan",
            "a": ["1.10", "2"],
            "j": [1, "x"],
            "t": ["a"],
            "d": "2024-05-17",
        }
    ]
    json.dumps(output, allow_nan=False)


async def test_named_queries_are_picked_by_the_query_argument(sql, admin, db_url) -> None:
    queries = {
        "by_id": BY_ID,
        "by_customer": "SELECT id FROM orders WHERE customer = %(customer)s ORDER BY id",
        "count": "SELECT count(*) AS n FROM orders;",
    }
    by_customer = await sql.invoke(
        call({"queries": queries}, {"query": "by_customer", "customer": "ada"})
    )
    assert by_customer["rows"] == [{"id": 1}, {"id": 2}]
    count = await sql.invoke(call({"queries": queries}, {"query": "count"}))
    assert count["rows"] == [{"n": 3}]
    unknown = await failure(sql, call({"queries": queries}, {"query": "drop_all"}))
    assert outcome(unknown) == ("invalid_arguments", False, False)
    assert "by_customer, by_id, count" in unknown.message
    unnamed = await failure(sql, call({"queries": queries}, {"customer": "ada"}))
    assert outcome(unnamed) == ("invalid_arguments", False, False)


async def test_an_injection_attempt_stays_a_value(sql, admin, db_url) -> None:
    by_customer = {"query": "SELECT id FROM orders WHERE customer = %(customer)s"}
    attack = "ada'; DROP TABLE orders; --"
    assert (await sql.invoke(call(by_customer, {"customer": attack})))["rows"] == []
    error = await failure(sql, call({"query": BY_ID}, {"order_id": "1; DROP TABLE orders"}))
    assert outcome(error) == ("invalid_arguments", False, False)
    assert "invalid_text_representation (22P02)" in error.message
    written = call({"query": BY_ID, "write": True}, {"order_id": "1; DROP TABLE orders"})
    assert (await failure(sql, written)).code == "invalid_arguments"
    assert len(statuses(admin)) == 3  # the table survives


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ({}, "missing order_id"),
        ({"order_id": 1, "limit": 5}, "not used by the statement: limit"),
        ({"id": 1}, "missing order_id; not used by the statement: id"),
    ],
)
async def test_arguments_must_be_exactly_the_parameters(sql, admin, db_url, args, said) -> None:
    error = await failure(sql, call({"query": BY_ID}, args))
    assert outcome(error) == ("invalid_arguments", False, False)
    assert said in error.message


async def test_a_tool_is_read_only_by_default(sql, admin, db_url) -> None:
    update = {"query": "UPDATE orders SET status = %(status)s WHERE id = %(order_id)s"}
    error = await failure(sql, call(update, {"status": "void", "order_id": 1}))
    assert outcome(error) == ("downstream_rejected", False, False)
    assert "read-only" in error.message
    assert "read_only_sql_transaction (25006)" in error.message
    hidden = {"query": "WITH gone AS (DELETE FROM orders RETURNING id) SELECT count(*) FROM gone"}
    assert (await failure(sql, call(hidden))).code == "downstream_rejected"
    assert statuses(admin) == {1: "paid", 2: "open", 3: "open"}


async def test_a_write_tool_commits_and_counts_its_rows(sql, admin, db_url) -> None:
    update = {"query": "UPDATE orders SET status = %(status)s WHERE customer = %(customer)s"}
    output = await sql.invoke(
        call({**update, "write": True}, {"status": "void", "customer": "ada"})
    )
    assert output == {"row_count": 2}
    assert statuses(admin) == {1: "void", 2: "void", 3: "open"}
    insert = {
        "query": "INSERT INTO orders (id, ref, customer, status, total, placed_at) "
        "VALUES (%(id)s, %(ref)s, 'cy', 'open', %(total)s, now()) RETURNING id, total",
        "write": True,
    }
    returned = await sql.invoke(call(insert, {"id": 4, "ref": "R-4", "total": "7.25"}))
    assert returned == {"row_count": 1, "rows": [{"id": 4, "total": "7.25"}], "truncated": False}
    assert statuses(admin)[4] == "open"


async def test_a_commit_without_an_answer_may_have_been_applied(
    sql, admin, db_url, monkeypatch
) -> None:
    with PgProxy(("127.0.0.1", 5432)) as proxy:
        proxied = db_url.replace(":5432/", f":{proxy.port}/") + "&sslmode=disable"
        monkeypatch.setenv("ORDERS_DB_URL", proxied)
        proxy.arm_commit_cuts(1)  # the COMMIT reaches the server; its answer never comes back
        void = {"query": "UPDATE orders SET status = 'void' WHERE id = 1", "write": True}
        error = await failure(sql, call(void))
        assert outcome(error) == ("connection_error", True, True)
        assert "may have been applied" in error.message
        await wait_for(lambda: statuses(admin)[1] == "void", "the cut COMMIT to land")


async def test_rows_past_max_rows_are_not_fetched(sql, admin, db_url) -> None:
    every = {"query": "SELECT id FROM orders ORDER BY id"}
    two = await sql.invoke(call({**every, "max_rows": 2}))
    assert two == {"rows": [{"id": 1}, {"id": 2}], "row_count": 2, "truncated": True}
    three = await sql.invoke(call({**every, "max_rows": 3}))
    assert three["truncated"] is False
    assert three["row_count"] == 3
    # A billion rows, streamed: the first five come back well inside the timeout.
    endless = {"query": "SELECT generate_series(1, 1000000000) AS n", "max_rows": 5, "timeout": 5}
    output = await sql.invoke(call(endless))
    assert [row["n"] for row in output["rows"]] == [1, 2, 3, 4, 5]
    assert output["truncated"] is True
    void = {"query": "UPDATE orders SET status = 'void' RETURNING id", "write": True, "max_rows": 1}
    written = await sql.invoke(call(void))
    assert (written["row_count"], len(written["rows"]), written["truncated"]) == (3, 1, True)
    assert set(statuses(admin).values()) == {"void"}  # truncating the output kept the write


async def test_a_slow_statement_times_out_and_is_retryable(sql, admin, db_url) -> None:
    slow = {"query": "SELECT pg_sleep(5)", "timeout": 0.5}
    error = await failure(sql, call(slow))
    assert outcome(error) == ("timeout", True, False)
    assert "query_canceled (57014)" in error.message
    # A write that timed out was rolled back: nothing applied, so it may be tried again.
    write = {
        "query": "UPDATE orders SET status = 'void' WHERE id = (SELECT 1 FROM pg_sleep(5))",
        "write": True,
        "timeout": 0.5,
    }
    error = await failure(sql, call(write))
    assert outcome(error) == ("timeout", True, False)
    assert "rolled back" in error.message
    assert statuses(admin)[1] == "paid"
    capped = await failure(sql, call({"query": "SELECT pg_sleep(5)"}, timeout_s=0.5))
    assert capped.code == "timeout"  # the call's own timeout caps the tool's


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"id": 1, "ref": "R-9", "total": "1"}, "on orders_pkey"),
        ({"id": 9, "ref": "R-9", "total": "-1"}, "on orders_total_check"),
        ({"id": 9, "ref": None, "total": "1"}, "on ref"),
    ],
)
async def test_a_constraint_violation_is_rejected_naming_it(
    sql, admin, db_url, values, named
) -> None:
    insert = {
        "query": "INSERT INTO orders (id, ref, customer, status, total, placed_at) "
        "VALUES (%(id)s, %(ref)s, 'cy', 'open', %(total)s, now())",
        "write": True,
    }
    error = await failure(sql, call(insert, values))
    assert outcome(error) == ("downstream_rejected", False, False)
    assert named in error.message
    assert len(statuses(admin)) == 3


async def test_a_deferred_violation_fails_the_commit_definitely(sql, admin, db_url) -> None:
    insert = {
        "query": "INSERT INTO orders (id, ref, customer, status, total, placed_at) "
        "VALUES (9, 'R-1', 'cy', 'open', 1, now())",
        "write": True,
    }
    error = await failure(sql, call(insert))
    # Refused at COMMIT, with an answer: it did not happen.
    assert outcome(error) == ("downstream_rejected", False, False)
    assert "unique_violation (23505) on orders_ref_key" in error.message
    assert len(statuses(admin)) == 3


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        ("40001", ("downstream_unavailable", True, False)),  # serialization_failure
        ("40P01", ("downstream_unavailable", True, False)),  # deadlock_detected
        ("23503", ("downstream_rejected", False, False)),  # foreign_key_violation
        ("42P01", ("connector_error", False, False)),  # undefined_table
        ("42501", ("unauthorized", False, False)),  # insufficient_privilege
        ("53300", ("downstream_unavailable", True, False)),  # too_many_connections
        ("P0001", ("downstream_rejected", False, False)),  # raise_exception
    ],
)
async def test_each_sqlstate_is_classified(sql, admin, db_url, state, expected) -> None:
    error = await failure(sql, call({"query": "SELECT fail_with(%(state)s)"}, {"state": state}))
    assert outcome(error) == expected
    assert f"({state})" in error.message


@pytest.mark.parametrize(
    ("statement", "said"),
    [
        ("SELEC id FROM orders", "syntax_error (42601)"),
        ("SELECT id FROM invoices", "undefined_table (42P01)"),
        ("SELECT price FROM orders", "undefined_column (42703)"),
    ],
)
async def test_a_broken_statement_is_a_misconfigured_tool(
    sql, admin, db_url, statement, said
) -> None:
    error = await failure(sql, call({"query": statement}))
    assert outcome(error) == ("connector_error", False, False)
    assert said in error.message


@pytest.mark.parametrize(
    "statement",
    [
        "SELECT 1; DROP TABLE orders",
        "SELECT 1;\n-- a comment\nDELETE FROM orders;",
        "SELECT 1 /* ; */ ; SELECT 2",
        "SELECT id FROM orders WHERE id = %s",
        "SELECT id FROM orders WHERE status LIKE 'o%'",
        "  ;  ",
    ],
)
async def test_a_bad_configured_statement_is_refused(sql, admin, db_url, statement) -> None:
    error = await failure(sql, call({"query": statement, "write": True}))
    assert outcome(error) == ("connector_error", False, False)
    assert len(statuses(admin)) == 3


async def test_semicolons_in_literals_and_comments_are_text(sql, admin, db_url) -> None:
    statement = """SELECT ';' AS a, $$;$$ AS b, $q$ ; $q$ AS c, "x;y".n AS d, 'it''s;' AS e -- ;
        FROM (SELECT 1 AS n) AS "x;y" /* ; */ WHERE 'o' LIKE 'o%%';  """
    output = await sql.invoke(call({"query": statement}))
    assert output["rows"] == [{"a": ";", "b": ";", "c": " ; ", "d": 1, "e": "it's;"}]


async def test_the_database_host_passes_the_ssrf_guard(sql, admin, db_url) -> None:
    query = {"query": "SELECT 1 AS one"}
    refused = await failure(sql, call({**query, "allow_hosts": []}))
    assert outcome(refused) == ("destination_refused", False, False)
    assert "127.0.0.1 is a loopback address" in refused.message
    assert "allow_hosts" in refused.message
    assert (await sql.invoke(call(query)))["rows"] == [{"one": 1}]
    other_port = await failure(sql, call({**query, "allow_hosts": ["127.0.0.1:6543"]}))
    assert other_port.code == "destination_refused"


async def test_a_name_is_resolved_once_and_its_checked_address_used(
    sql, admin, db_url, monkeypatch
) -> None:
    # libpq cannot resolve db.test: the connection succeeds only through the checked address.
    monkeypatch.setenv("ORDERS_DB_URL", db_url.replace("127.0.0.1", "db.test"))
    query = {"query": "SELECT 1 AS one"}
    refused = await failure(sql, call({**query, "allow_hosts": []}))
    assert "db.test resolves to 127.0.0.1, a loopback address" in refused.message
    assert (await sql.invoke(call({**query, "allow_hosts": ["db.test"]})))["rows"] == [{"one": 1}]


@pytest.mark.parametrize(
    "url",
    ["postgresql:///reach", "postgresql://postgres@%2Fvar%2Frun%2Fpostgresql/reach"],
)
async def test_a_unix_socket_url_is_refused(sql, monkeypatch, url) -> None:
    monkeypatch.setenv("ORDERS_DB_URL", url)
    error = await failure(sql, call({"query": "SELECT 1"}))
    assert outcome(error) == ("destination_refused", False, False)
    assert "Unix socket" in error.message


async def test_a_closed_port_is_a_retryable_connection_error(sql, db_url, monkeypatch) -> None:
    port = free_port()
    monkeypatch.setenv("ORDERS_DB_URL", db_url.replace(":5432/", f":{port}/"))
    error = await failure(sql, call({"query": "SELECT 1"}))
    assert outcome(error) == ("connection_error", True, False)
    assert f"127.0.0.1:{port}" in error.message
    assert "refused" in error.message.lower()


async def test_the_password_never_shows(sql, admin, db_url, monkeypatch, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    calls = [
        call({"query": BY_ID}, {"order_id": 1}),
        call({"query": BY_ID}, {"order_id": "x"}),
        call({"query": "SELECT id FROM invoices"}),
        call({"query": "SELECT 1", "allow_hosts": []}),
        call({"query": "SELECT pg_sleep(5)", "timeout": 0.3}),
    ]
    shown = [text for tool_call in calls for text in await shown_by(sql, tool_call)]
    for url in [
        db_url.replace(":5432/", f":{free_port()}/"),
        db_url.replace("/reach_sql_", "/missing_"),
        db_url.replace("application_name", "unknown_option"),
        f"host=127.0.0.1 password={CANARY} junk",
    ]:
        monkeypatch.setenv("ORDERS_DB_URL", url)
        shown += await shown_by(sql, call({"query": "SELECT 1"}))
    shown += [record.getMessage() for record in caplog.records]
    assert len(shown) > 20  # every call above, and psycopg's own log lines
    assert not [text for text in shown if CANARY in text or "postgresql://" in text]


async def test_a_missing_database_is_a_misconfigured_tool(sql, db_url, monkeypatch) -> None:
    monkeypatch.setenv("ORDERS_DB_URL", db_url.replace("/reach_sql_", "/missing_"))
    error = await failure(sql, call({"query": "SELECT 1"}))
    assert outcome(error) == ("connector_error", False, False)
    assert "does not exist" in error.message


async def test_a_cancelled_call_leaves_no_statement_running(sql, admin, db_url, app_name) -> None:
    def running(state: str) -> bool:
        with psycopg.connect(POSTGRES_ADMIN, autocommit=True) as conn:
            found = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
                " AND state = ANY(%s)",
                [app_name, [state] if state else ["active", "idle in transaction", "idle"]],
            ).fetchone()
        return bool(found and found[0])

    slow = asyncio.create_task(sql.invoke(call({"query": "SELECT pg_sleep(60)", "timeout": 60})))
    await wait_for(lambda: running("active"), "the statement to start")
    slow.cancel()
    with pytest.raises(asyncio.CancelledError):
        await slow
    await wait_for(lambda: not running(""), "the backend to end")
