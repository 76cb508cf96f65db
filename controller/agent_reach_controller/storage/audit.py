"""SQL of the hash-chained audit log (`audit/log.py` is the use case).

Rows are inserted unsealed; sealing sets `seq`, `prev_hash` and `hash`, which the caller
computes (`audit/chain.py`). Triggers refuse every UPDATE but that sealing, and every DELETE but
retention's of sealed rows up to a checkpoint (`audit_checkpoints`) written first.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

import sqlalchemy as sa

from agent_reach_controller.storage import hot
from agent_reach_controller.storage.commit import json_rows
from agent_reach_controller.storage.engine import (
    TX_STATE_PREFIX,
    Connection,
    Database,
    before_commit,
    commit_statement,
)
from agent_reach_controller.storage.schema import audit_checkpoints, audit_log

# `json.loads` without its two scans for whitespace, half its CPU on an entry's small object: the
# text of a jsonb has none around it (were there any, this would raise, not decode differently).
_json_value = json.JSONDecoder().raw_decode

# A Postgres transaction's entries, written when it commits.
_PENDING = f"{TX_STATE_PREFIX}audit"

_COLUMNS = (
    audit_log.c.id,
    audit_log.c.at,
    audit_log.c.actor,
    audit_log.c.tenant,
    audit_log.c.action,
    audit_log.c.target,
    audit_log.c.data,
)


class AuditRow(NamedTuple):
    """An entry's stored content, sealed or not (what its hash covers, plus its `id`).

    A named tuple rather than a frozen dataclass: the sealer reads one per task, and a tuple is
    built in a fifth of the CPU. Its fields are in `_COLUMNS`' order."""

    id: int
    at: datetime
    actor: str
    tenant: str | None
    action: str
    target: str
    data: Any


@dataclass(frozen=True, slots=True, kw_only=True)
class SealedRow:
    """A sealed entry: its content and its place in the chain."""

    id: int
    at: datetime
    actor: str
    tenant: str | None
    action: str
    target: str
    data: Any
    seq: int
    prev_hash: str | None
    hash: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Seal:
    """The chain fields to write on one unsealed row."""

    id: int
    seq: int
    prev_hash: str
    hash: str


async def insert_entry(  # noqa: PLR0913  (the fields of one entry, all by keyword)
    conn: Connection,
    *,
    at: datetime,
    actor: str,
    tenant: str | None,
    action: str,
    target: str,
    data: dict[str, Any],
) -> None:
    """INSERT one unsealed entry (no seq, no hash)."""
    entry = {"at": at, "data": data, "actor": actor, "tenant": tenant, "action": action}
    entry["target"] = target
    if conn.dialect.name == "postgresql":
        # Written at commit, in the commit statement: a transaction's entries are one insert,
        # so their ids keep the order they were recorded in.
        pending: list[dict[str, Any]] | None = conn.info.get(_PENDING)
        if pending is None:
            pending = conn.info[_PENDING] = []
            before_commit(conn, _insert_pending)
        pending.append(entry)
    else:
        await conn.execute(sa.insert(audit_log).values(**entry))


# A transaction's unsealed audit entries (no seq, no hash: the sealer chains them later), in the
# order recorded.
INSERT_AUDIT_ENTRIES = """
INSERT INTO audit_log (at, actor, tenant, action, target, data)
SELECT e.at, e.actor, e.tenant, e.action, e.target, e.data
FROM ROWS FROM (jsonb_to_recordset(%(rows)s::jsonb) AS (
    at timestamptz, actor text, tenant text, action text, target text, data jsonb
)) WITH ORDINALITY AS e(at, actor, tenant, action, target, data, n)
ORDER BY e.n
"""


# Audit entries chained by the sealer (audit/log.py), from a JSON array, each only if unsealed
# (the sealer compares how many were with how many it sent).
SEAL_AUDIT_ENTRIES = f"""
UPDATE audit_log AS a SET seq = v.seq, prev_hash = v.prev_hash, hash = v.hash
FROM jsonb_to_recordset(%(rows)s::jsonb) AS v(id bigint, seq bigint, prev_hash text, hash text)
WHERE a.id = v.id AND a.hash IS NULL AND a.id = ANY({hot.keys_of("id", "bigint")})
"""


def insert_audit_entries(conn: Connection, rows: str) -> None:
    """Append audit entries at commit: `rows` is a JSON array of unsealed `audit_log` rows."""
    commit_statement(conn).write(INSERT_AUDIT_ENTRIES, {"rows": rows})


async def _insert_pending(conn: Connection) -> None:
    insert_audit_entries(conn, json_rows(conn.info.pop(_PENDING, [])))


# The sealer's lock, held until its transaction ends; false at once if another replica holds it.
TRY_SEAL_LOCK = "SELECT pg_try_advisory_xact_lock(hashtext(%(key)s))"


async def try_seal_lock(conn: Connection, key: str) -> bool:
    """Take the sealer's transaction-scoped advisory lock without waiting (SQLite: always)."""
    if conn.dialect.name != "postgresql":
        return True
    return bool((await hot.tuples(conn, TRY_SEAL_LOCK, {"key": key}))[0][0])


# The sealer's read, oldest first (the partial index ix_audit_log_unsealed holds just these rows,
# in id order). `data` as text, decoded by the caller: psycopg's jsonb loader, which calls
# `json.loads` on that same text, costs twice the CPU.
UNSEALED_ENTRIES = """
SELECT id, at, actor, tenant, action, target, data::text FROM audit_log
WHERE hash IS NULL AND at <= %(cutoff)s ORDER BY id LIMIT %(limit)s
"""


async def unsealed_entries(conn: Connection, *, cutoff: datetime, limit: int) -> list[AuditRow]:
    """Up to `limit` unsealed entries recorded at or before `cutoff`, in id order (on Postgres,
    `at` in the session's time zone: the hash spells it in UTC whatever its zone)."""
    if conn.dialect.name != "postgresql":
        result = await conn.execute(
            sa.select(*_COLUMNS)
            .where(audit_log.c.hash.is_(None), audit_log.c.at <= cutoff)
            .order_by(audit_log.c.id)
            .limit(limit)
        )
        return [AuditRow._make(row) for row in result]
    # As tuples through psycopg: the sealer reads one entry per task, and SQLAlchemy's rows
    # cost more CPU to read than the entries cost to hash.
    found = await hot.tuples(conn, UNSEALED_ENTRIES, {"cutoff": cutoff, "limit": limit})
    return [
        AuditRow(id, at, actor, tenant, action, target, _json_value(data)[0])
        for id, at, actor, tenant, action, target, data in found
    ]


# The sealed entry with the highest seq (the unique index on seq finds it).
CHAIN_HEAD = "SELECT seq, hash FROM audit_log WHERE seq IS NOT NULL ORDER BY seq DESC LIMIT 1"


async def chain_head(conn: Connection) -> tuple[int, str | None] | None:
    """The (seq, hash) of the sealed entry with the highest seq, else of the newest checkpoint
    (retention removed every sealed entry); None when nothing was ever sealed."""
    head: Sequence[Any] | None
    if conn.dialect.name == "postgresql":
        found = await hot.tuples(conn, CHAIN_HEAD, {})
        head = found[0] if found else None
    else:
        head = (
            await conn.execute(
                sa.select(audit_log.c.seq, audit_log.c.hash)
                .where(audit_log.c.seq.is_not(None))
                .order_by(audit_log.c.seq.desc())
                .limit(1)
            )
        ).first()
    if head is None:
        return await latest_checkpoint(conn)
    return int(head[0]), head[1]


async def latest_checkpoint(conn: Connection) -> tuple[int, str] | None:
    """The (seq, hash) the chain now starts after; None when retention removed nothing yet."""
    row = (
        await conn.execute(
            sa.select(audit_checkpoints.c.seq, audit_checkpoints.c.hash)
            .order_by(audit_checkpoints.c.seq.desc())
            .limit(1)
        )
    ).first()
    return (int(row.seq), row.hash) if row is not None else None


async def prune_before(
    conn: Connection, *, before: datetime, limit: int, now: datetime
) -> tuple[int, int]:
    """Remove up to `limit` of the oldest sealed entries, stopping at the first one made at or
    after `before`: a checkpoint at the last one removed first, then the rows (the triggers let
    only those through). Returns (checkpoint seq, rows removed); (0, 0) when none is due."""
    start = (await latest_checkpoint(conn) or (0, ""))[0]
    first_young = await conn.scalar(
        sa.select(sa.func.min(audit_log.c.seq)).where(
            audit_log.c.seq > start, audit_log.c.at >= before
        )
    )
    head = await conn.scalar(sa.select(sa.func.max(audit_log.c.seq)))
    if head is None or head <= start:
        return 0, 0
    cut = min(int(head), start + limit, int(first_young) - 1 if first_young is not None else head)
    if cut <= start:
        return 0, 0
    cut_hash = await conn.scalar(sa.select(audit_log.c.hash).where(audit_log.c.seq == cut))
    await conn.execute(
        sa.insert(audit_checkpoints).values(
            seq=cut, hash=cut_hash, entries=cut - start, created_at=now
        )
    )
    removed = await conn.execute(
        sa.delete(audit_log).where(audit_log.c.seq.is_not(None), audit_log.c.seq <= cut)
    )
    return cut, removed.rowcount or 0


async def seal_entries(conn: Connection, seals: Sequence[Seal]) -> int:
    """Write seq, prev_hash and hash on these rows if still unsealed; returns how many were."""
    if conn.dialect.name == "postgresql":  # one statement, not one per row
        rows = [{"id": s.id, "seq": s.seq, "prev_hash": s.prev_hash, "hash": s.hash} for s in seals]
        return (await hot.run(conn, SEAL_AUDIT_ENTRIES, {"rows": json_rows(rows)})).rowcount
    result = await conn.execute(
        sa.update(audit_log)
        .where(audit_log.c.id == sa.bindparam("b_id"), audit_log.c.hash.is_(None))
        .values(
            seq=sa.bindparam("b_seq"),
            prev_hash=sa.bindparam("b_prev"),
            hash=sa.bindparam("b_hash"),
        ),
        [{"b_id": s.id, "b_seq": s.seq, "b_prev": s.prev_hash, "b_hash": s.hash} for s in seals],
    )
    return int(result.rowcount)


@contextlib.asynccontextmanager
async def snapshot(db: Database) -> AsyncIterator[Connection]:
    """One consistent, read-only view of the table (SQLite transactions already are one)."""
    if not db.is_postgres:
        async with db.transaction() as conn:
            yield conn
        return
    async with db.engine.connect() as plain:
        conn = await plain.execution_options(
            isolation_level="REPEATABLE READ", postgresql_readonly=True
        )
        async with conn.begin():
            yield conn


async def count_sealed(conn: Connection) -> int:
    """How many entries are sealed (have a seq)."""
    counted = await conn.scalar(sa.select(sa.func.count()).where(audit_log.c.seq.is_not(None)))
    return int(counted or 0)


async def count_pending(conn: Connection) -> int:
    """How many entries are not sealed yet (no seq)."""
    counted = await conn.scalar(sa.select(sa.func.count()).where(audit_log.c.seq.is_(None)))
    return int(counted or 0)


async def sealed_after(conn: Connection, *, after: int | None, limit: int) -> list[SealedRow]:
    """Up to `limit` sealed entries in seq order, those past seq `after` (None: from the first)."""
    rows = await conn.execute(
        sa.select(*_COLUMNS, audit_log.c.seq, audit_log.c.prev_hash, audit_log.c.hash)
        .where(audit_log.c.seq.is_not(None) if after is None else audit_log.c.seq > after)
        .order_by(audit_log.c.seq)
        .limit(limit)
    )
    return [SealedRow(**r) for r in rows.mappings()]


async def first_stray_seal(conn: Connection) -> int | None:
    """The lowest id of a row with no seq but a hash or prev_hash (a half-done or forged seal)."""
    row = (
        await conn.execute(
            sa.select(audit_log.c.id)
            .where(
                audit_log.c.seq.is_(None),
                sa.or_(audit_log.c.hash.is_not(None), audit_log.c.prev_hash.is_not(None)),
            )
            .order_by(audit_log.c.id)
            .limit(1)
        )
    ).first()
    return None if row is None else int(row.id)
