"""The audit log: sealed in order into one chain, verified, tamper-evident, and append-only in
the database itself, on both backends; one gapless chain under concurrent writers and sealers."""

from __future__ import annotations

import asyncio
import itertools
import random
import sqlite3
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from agent_reach_cli.main import main
from agent_reach_controller import audit
from agent_reach_controller.audit.chain import GENESIS
from agent_reach_controller.storage.engine import Database
from agent_reach_controller.storage.schema import audit_log

PAST = datetime.now(UTC) - timedelta(minutes=5)
REFUSED = r"append-only|is sealed|may only seal"


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Database]:
    database = Database(database_url)
    yield database
    await database.close()


async def append(db: Database, n: int, *, start: int = 0, at: datetime = PAST) -> None:
    """`n` entries, each in its own transaction (as each audited request will be)."""
    for i in range(start, start + n):
        async with db.transaction() as conn:
            await audit.record(
                conn,
                actor="alice",
                tenant="acme",
                action="task.submit",
                target=f"task:t-{i}",
                data={"i": i, "note": "北京"},
                now=at,
            )


async def rows(db: Database) -> list[Any]:
    async with db.transaction() as conn:
        result = await conn.execute(
            sa.select(
                audit_log.c.id,
                audit_log.c.target,
                audit_log.c.seq,
                audit_log.c.prev_hash,
                audit_log.c.hash,
            ).order_by(audit_log.c.id)
        )
        return list(result.all())


def tamper(url: str, *statements: str) -> None:
    """Run `statements` with the append-only triggers out of the way, as an attacker with
    superuser (Postgres) or file (SQLite) access could."""
    if make_url(url).get_backend_name() == "postgresql":
        with psycopg.connect(url) as conn:  # commits on leaving the block
            conn.execute("SET LOCAL session_replication_role = replica")
            for statement in statements:
                conn.execute(statement)
        return
    con = sqlite3.connect(str(make_url(url).database), isolation_level=None)
    try:
        con.execute("BEGIN")
        triggers = con.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'audit_log'"
        ).fetchall()
        assert triggers, "the migration should have created the triggers"
        for name, _ in triggers:
            con.execute(f"DROP TRIGGER {name}")
        for statement in statements:
            con.execute(statement)
        for _, sql in triggers:
            con.execute(sql)
        con.execute("COMMIT")
    finally:
        con.close()


async def test_records_are_sealed_in_order_into_one_chain(db: Database) -> None:
    await append(db, 5)
    assert await audit.seal(db) == 5
    assert await audit.seal(db) == 0
    sealed = await rows(db)
    assert [r.seq for r in sealed] == [1, 2, 3, 4, 5]
    assert sealed[0].prev_hash == GENESIS
    assert all(b.prev_hash == a.hash for a, b in itertools.pairwise(sealed))

    await append(db, 2, start=5)
    assert await audit.seal(db) == 2
    more = await rows(db)
    assert [r.seq for r in more] == [1, 2, 3, 4, 5, 6, 7]
    assert more[5].prev_hash == sealed[4].hash

    report = await audit.verify(db)
    assert report.ok, report.lines()
    assert (report.checked, report.sealed, report.pending) == (7, 7, 0)
    assert (report.head_seq, report.head_hash) == (7, more[6].hash)
    assert report.lines()[-1] == "OK: the chain is intact"


async def test_a_seal_hashes_exactly_what_was_recorded(db: Database) -> None:
    # Pinned: every stored chain was hashed so, and must still verify.
    at = datetime(2026, 1, 2, 3, 4, 5, 60_708, tzinfo=timezone(timedelta(hours=5, minutes=30)))
    for i, (tenant, data) in enumerate(
        [
            ("acme", {"steps": 1, "source": "plan", "environment": "default"}),
            (None, {"note": 'a "quote", a \\ and \u2028 北京 😀', "n": [1.5, -2, True, None, {}]}),
            ("beta", {"z": {"é": False, "E": "\x01"}, "a": []}),
        ]
    ):
        async with db.transaction() as conn:
            await audit.record(
                conn,
                actor="key:k-1",
                tenant=tenant,
                action="task.submit",
                target=f"task:t-{i}",
                data=data,
                now=at + timedelta(microseconds=i),
            )
    assert await audit.seal(db) == 3
    assert [r.hash for r in await rows(db)] == [
        "1da448f7ba77aa1b50f4143fee11e981d8d452a3ddeea82a0cb690c5c384a31a",
        "f66b4cda7bd6439c2eeb2734ae09041c3411b20535d6e3f37f35c52ebb8f1021",
        "0f146c8b71f144ec344996a83904d11d429571331c052f638a12c61cf8c80751",
    ]
    assert (await audit.verify(db)).ok


async def test_sealing_waits_for_entries_to_settle_and_takes_batches(db: Database) -> None:
    now = datetime.now(UTC)
    await append(db, 5, at=now)
    assert await audit.seal(db, settle_s=60, now=now) == 0
    report = await audit.verify(db)
    assert report.ok
    assert (report.sealed, report.pending) == (0, 5)
    assert await audit.seal(db, limit=3, now=now + timedelta(seconds=3)) == 3
    assert await audit.seal(db, limit=3, now=now + timedelta(seconds=3)) == 2
    assert [r.seq for r in await rows(db)] == [1, 2, 3, 4, 5]
    assert (await audit.verify(db)).ok


async def test_an_entry_rolls_back_with_its_transaction(db: Database) -> None:
    async def audited_change_that_fails() -> None:
        async with db.transaction() as conn:
            await audit.record(
                conn, actor="bob", tenant=None, action="task.cancel", target="task:x", now=PAST
            )
            raise RuntimeError("the audited change failed")

    with pytest.raises(RuntimeError):
        await audited_change_that_fails()
    assert await rows(db) == []


async def test_record_refuses_secrets_and_oversized_fields(db: Database) -> None:
    async with db.transaction() as conn:
        with pytest.raises(ValueError, match="secrets"):
            await audit.record(
                conn,
                actor="admin",
                tenant="acme",
                action="key.create",
                target="key:k1",
                data={"token": "sk-live-..."},
                now=PAST,
            )
        with pytest.raises(ValueError, match="longer than"):
            await audit.record(
                conn, actor="a" * 129, tenant=None, action="x.y", target="t", now=PAST
            )
    assert await rows(db) == []


async def test_update_and_delete_are_refused_by_the_database(db: Database) -> None:
    await append(db, 3)
    assert await audit.seal(db) == 3
    await append(db, 1, start=3, at=datetime.now(UTC))  # stays unsealed
    refused = [
        "UPDATE audit_log SET actor = 'mallory' WHERE seq = 2",
        "UPDATE audit_log SET hash = prev_hash WHERE seq = 2",
        "UPDATE audit_log SET seq = 99 WHERE seq = 3",
        "UPDATE audit_log SET seq = NULL, prev_hash = NULL, hash = NULL WHERE seq = 3",
        "DELETE FROM audit_log WHERE seq = 1",
        "DELETE FROM audit_log",
        # The unsealed row: only a complete seal, touching nothing else, may be written.
        "UPDATE audit_log SET actor = 'mallory' WHERE seq IS NULL",
        "UPDATE audit_log SET hash = 'x' WHERE seq IS NULL",
        "UPDATE audit_log SET seq = 4, prev_hash = 'p', hash = 'h', target = 'x' WHERE seq IS NULL",
        "DELETE FROM audit_log WHERE seq IS NULL",
    ]
    for statement in refused:
        with pytest.raises(sa.exc.DBAPIError, match=REFUSED):
            async with db.transaction() as conn:
                await conn.execute(sa.text(statement))
    before = await rows(db)
    assert [r.seq for r in before] == [1, 2, 3, None]
    assert await audit.seal(db, settle_s=0) == 1
    report = await audit.verify(db)
    assert report.ok
    assert report.sealed == 4


async def test_truncate_is_refused_on_postgres(postgres_url: str) -> None:
    db = Database(postgres_url)
    try:
        await append(db, 1)
        with pytest.raises(sa.exc.DBAPIError, match=REFUSED):
            async with db.transaction() as conn:
                await conn.execute(sa.text("TRUNCATE audit_log"))
        assert len(await rows(db)) == 1
    finally:
        await db.close()


async def test_the_app_role_needs_only_column_update_rights(postgres_url: str) -> None:
    """The grants ARCHITECTURE.md suggests: no DELETE/TRUNCATE, UPDATE of the chain columns."""
    role = f"reach_app_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN")
        admin.execute(f"GRANT SELECT, INSERT ON audit_log TO {role}")
        admin.execute(f"GRANT UPDATE (seq, prev_hash, hash) ON audit_log TO {role}")
        admin.execute(f"GRANT USAGE ON SEQUENCE audit_log_id_seq TO {role}")
        admin.execute(f"GRANT SELECT ON audit_checkpoints TO {role}")
    app = Database(str(make_url(postgres_url).set(username=role)))
    try:
        await append(app, 3)
        assert await audit.seal(app) == 3
        assert (await audit.verify(app)).ok
        for statement in (
            "UPDATE audit_log SET actor = 'mallory' WHERE seq = 1",
            "DELETE FROM audit_log WHERE seq = 1",
            "TRUNCATE audit_log",
        ):
            with pytest.raises(sa.exc.DBAPIError, match="permission denied"):
                async with app.transaction() as conn:
                    await conn.execute(sa.text(statement))
    finally:
        await app.close()
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute(f"DROP OWNED BY {role}")
            admin.execute(f"DROP ROLE {role}")


async def sealed_log(db: Database, n: int = 5) -> list[Any]:
    await append(db, n)
    assert await audit.seal(db) == n
    assert (await audit.verify(db)).ok
    return await rows(db)


async def test_a_changed_field_is_a_hash_mismatch_at_its_seq(
    db: Database, database_url: str
) -> None:
    await sealed_log(db)
    tamper(database_url, """UPDATE audit_log SET data = '{"i": 99}' WHERE seq = 3""")
    report = await audit.verify(db)
    assert report.problem is not None
    assert (report.problem.kind, report.problem.seq) == ("hash_mismatch", 3)
    assert report.checked == 2
    assert report.lines()[-1].startswith("PROBLEM: hash_mismatch at seq 3 (id ")


async def test_a_deleted_middle_row_is_a_gap_at_its_seq(db: Database, database_url: str) -> None:
    await sealed_log(db)
    tamper(database_url, "DELETE FROM audit_log WHERE seq = 3")
    report = await audit.verify(db)
    assert report.problem is not None
    assert (report.problem.kind, report.problem.seq) == ("seq_gap", 3)
    assert "seq 3 missing; the next row is seq 4" in report.problem.detail


async def test_swapped_hashes_are_a_hash_mismatch(db: Database, database_url: str) -> None:
    log = await sealed_log(db)
    tamper(
        database_url,
        f"UPDATE audit_log SET hash = '{log[2].hash}' WHERE seq = 2",
        f"UPDATE audit_log SET hash = '{log[1].hash}' WHERE seq = 3",
    )
    report = await audit.verify(db)
    assert report.problem is not None
    assert (report.problem.kind, report.problem.seq) == ("hash_mismatch", 2)


async def test_reordered_rows_are_a_prev_hash_mismatch(db: Database, database_url: str) -> None:
    await sealed_log(db)
    tamper(
        database_url,
        "UPDATE audit_log SET seq = -1 WHERE seq = 2",
        "UPDATE audit_log SET seq = 2 WHERE seq = 3",
        "UPDATE audit_log SET seq = 3 WHERE seq = -1",
    )
    report = await audit.verify(db)
    assert report.problem is not None
    assert (report.problem.kind, report.problem.seq) == ("prev_hash_mismatch", 2)


async def test_an_anchor_catches_a_removed_tail(db: Database, database_url: str) -> None:
    await sealed_log(db)
    head = await audit.verify(db)
    anchor = (head.head_seq, head.head_hash)
    assert (await audit.verify(db, anchor=anchor)).ok
    tamper(database_url, "DELETE FROM audit_log WHERE seq = 5")
    # Without an anchor a shorter chain is still a valid chain ...
    assert (await audit.verify(db)).ok
    # ... with one, it is not.
    report = await audit.verify(db, anchor=anchor)
    assert report.problem is not None
    assert (report.problem.kind, report.problem.seq) == ("anchor_missing", 5)
    wrong = await audit.verify(db, anchor=(2, "0" * 64))
    assert wrong.problem is not None
    assert (wrong.problem.kind, wrong.problem.seq) == ("anchor_mismatch", 2)


async def test_a_late_commit_is_sealed_later(postgres_url: str) -> None:
    one, two = Database(postgres_url), Database(postgres_url)
    try:
        async with one.transaction() as late:
            # An entry whose row (and id) exists before others commit, while its own transaction
            # is still open. On Postgres a submit inserts its entry in the round trip before its
            # COMMIT, so another replica can commit entries with higher ids in between.
            await late.execute(
                sa.insert(audit_log).values(
                    at=PAST, actor="slow", action="task.submit", target="task:late", data={}
                )
            )
            await append(two, 3)
            assert await audit.seal(two) == 3  # the late row is not committed yet
        assert await audit.seal(one) == 1
        by_target = {r.target: r for r in await rows(one)}
        assert by_target["task:late"].id < by_target["task:t-0"].id
        assert by_target["task:late"].seq == 4
        assert (await audit.verify(one)).ok
    finally:
        await one.close()
        await two.close()


async def test_concurrent_writers_and_sealers_make_one_gapless_chain(postgres_url: str) -> None:
    replicas = [Database(postgres_url, pool_size=8), Database(postgres_url, pool_size=8)]
    writers_done = asyncio.Event()
    sealed_while_writing = [0, 0]

    async def writer(w: int) -> None:
        db = replicas[w % 2]
        for i in range(20):
            async with db.transaction() as conn:
                await audit.record(
                    conn,
                    actor=f"writer-{w}",
                    tenant="acme",
                    action="task.submit",
                    target=f"task:{w}-{i}",
                    data={"w": w, "i": i},
                    now=datetime.now(UTC),
                )
                await asyncio.sleep(random.uniform(0, 0.005))  # commits land out of id order

    async def sealer(r: int) -> None:
        while not writers_done.is_set():
            sealed_while_writing[r] += await audit.seal(replicas[r], limit=25, settle_s=0)
            await asyncio.sleep(0.001)

    async def write_all() -> None:
        await asyncio.gather(*(writer(w) for w in range(16)))
        writers_done.set()

    try:
        await asyncio.gather(write_all(), sealer(0), sealer(1))
        while await audit.seal(replicas[0], settle_s=0):
            pass
        report = await audit.verify(replicas[1])
        assert report.ok, report.lines()
        assert (report.checked, report.sealed, report.pending) == (320, 320, 0)
        assert sum(sealed_while_writing) > 0
        assert sorted(r.seq for r in await rows(replicas[0])) == list(range(1, 321))
    finally:
        for db in replicas:
            await db.close()


async def fill(url: str, n: int) -> None:
    db = Database(url)
    try:
        await sealed_log(db, n)
    finally:
        await db.close()


def test_cli_verify_reports_and_exits_1_on_a_problem(
    database_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    asyncio.run(fill(database_url, 3))
    monkeypatch.setenv("AGENT_REACH_CONTROLLER_DATABASE_URL", database_url)
    assert main(["audit", "verify"]) == 0
    out = capsys.readouterr().out
    assert "audit log: 3 sealed, 0 pending" in out
    assert "OK: the chain is intact" in out
    head = next(line for line in out.splitlines() if line.startswith("head:"))
    anchor = head.removeprefix("head: seq ").replace(", hash ", ":")
    assert main(["audit", "verify", "--anchor", anchor]) == 0
    capsys.readouterr()

    tamper(database_url, "UPDATE audit_log SET actor = 'mallory' WHERE seq = 2")
    monkeypatch.delenv("AGENT_REACH_CONTROLLER_DATABASE_URL")
    assert main(["audit", "verify", "--database-url", database_url]) == 1
    assert "PROBLEM: hash_mismatch at seq 2" in capsys.readouterr().out
    assert main(["audit", "verify", "--database-url", database_url, "--anchor", "x"]) == 2


def test_cli_verify_without_a_database(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "verify", "--database-url", f"sqlite:///{tmp_path}/none.db"]) == 2
    assert "no SQLite database" in capsys.readouterr().err
    assert not (tmp_path / "none.db").exists()


async def test_every_replica_background_loop_seals(database_url: str, tmp_path: Path) -> None:
    from agent_reach_controller.runtime import background
    from tests.integration.stack import components_for, write_tools

    async with components_for(database_url, write_tools(tmp_path), reap_interval_seconds=0.05) as c:
        before = (await audit.verify(c.db)).pending  # the tools file's tool.create entries
        await append(c.db, 2)
        async with background(c):
            for _ in range(200):
                if (await audit.verify(c.db)).sealed == before + 2:
                    break
                await asyncio.sleep(0.02)
        report = await audit.verify(c.db)
        assert report.ok
        assert (report.sealed, report.pending) == (before + 2, 0)
