"""SQL of long-term memory: entries, their full-text index, and the scrub a delete does.

One text serves both backends except full-text search, which is each backend's own: a generated
tsvector with a GIN index on Postgres, an FTS5 table keyed by the entry's rowid on SQLite (kept in
step here, in the same transaction). None of it is on the task hot path.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_reach_controller.domain.records import MemoryRow
from agent_reach_controller.storage.schema import (
    events,
    memories,
    memory_keys,
    run_messages,
    runs,
    steps,
    tasks,
)

# The types of an entry's columns, for rows a text statement reads.
_TYPES = {c.name: c.type for c in memories.c}


def _postgres(conn: AsyncConnection) -> bool:
    return conn.dialect.name == "postgresql"


async def hmac_key(conn: AsyncConnection) -> bytes:
    """The key the audit's HMACs use when the deployment set none: made once, then read."""
    found = (await conn.execute(sa.select(memory_keys.c.key).where(memory_keys.c.id == 1))).first()
    if found is not None:
        return bytes.fromhex(found[0])
    made = secrets.token_hex(32)
    insert = sa.insert(memory_keys).values(id=1, key=made)
    if _postgres(conn):
        insert = pg_insert(memory_keys).values(id=1, key=made).on_conflict_do_nothing()
    else:
        insert = insert.prefix_with("OR IGNORE")
    await conn.execute(insert)
    row = (await conn.execute(sa.select(memory_keys.c.key).where(memory_keys.c.id == 1))).one()
    return bytes.fromhex(row[0])


# -- reading ----------------------------------------------------------------------------------


async def load(conn: AsyncConnection, tenant: str, memory_id: str) -> MemoryRow | None:
    row = (
        (
            await conn.execute(
                sa.select(memories).where(
                    memories.c.tenant == tenant, memories.c.memory_id == memory_id
                )
            )
        )
        .mappings()
        .first()
    )
    return MemoryRow.from_mapping(row) if row is not None else None


async def load_entry(
    conn: AsyncConnection, tenant: str, subject: str, type_: str, key: str, *, lock: bool = False
) -> MemoryRow | None:
    """The entry at (subject, type, key), if there is one (row-locked until the transaction
    ends, with `lock`, on Postgres: concurrent writers of one key take turns)."""
    query = sa.select(memories).where(
        memories.c.tenant == tenant,
        memories.c.subject == subject,
        memories.c.type == type_,
        memories.c.key == key,
    )
    if lock:
        query = query.with_for_update()
    row = (await conn.execute(query)).mappings().first()
    return MemoryRow.from_mapping(row) if row is not None else None


async def list_entries(
    conn: AsyncConnection,
    tenant: str,
    subject: str,
    *,
    types: Sequence[str] = (),
    limit: int | None,
    pinned: bool | None = None,
) -> list[MemoryRow]:
    """A subject's entries, the most recently updated first (all of them: `limit` None)."""
    query = sa.select(memories).where(memories.c.tenant == tenant, memories.c.subject == subject)
    if types:
        query = query.where(memories.c.type.in_(list(types)))
    if pinned is not None:
        query = query.where(memories.c.pinned == pinned)
    query = query.order_by(memories.c.updated_at.desc(), memories.c.memory_id)
    if limit is not None:
        query = query.limit(limit)
    return [MemoryRow.from_mapping(r) for r in (await conn.execute(query)).mappings()]


async def list_subjects(
    conn: AsyncConnection, tenant: str, *, limit: int, after: str | None = None
) -> list[tuple[str, int, datetime]]:
    """A tenant's subjects in name order: (subject, entries, last updated)."""
    query = sa.select(
        memories.c.subject, sa.func.count(), sa.func.max(memories.c.updated_at)
    ).where(memories.c.tenant == tenant)
    if after is not None:
        query = query.where(memories.c.subject > after)
    query = query.group_by(memories.c.subject).order_by(memories.c.subject).limit(limit)
    rows = (await conn.execute(query)).all()
    # max() keeps the column's type: a UTC datetime on both backends.
    return [(r[0], int(r[1]), r[2]) for r in rows]


async def count(conn: AsyncConnection, tenant: str, subject: str) -> int:
    found = await conn.execute(
        sa.select(sa.func.count()).where(memories.c.tenant == tenant, memories.c.subject == subject)
    )
    return int(found.scalar_one())


async def search_text(
    conn: AsyncConnection, tenant: str, subject: str, terms: Sequence[str], *, limit: int
) -> list[tuple[MemoryRow, float]]:
    """A subject's entries matching any of `terms` (plain words), best first, with a score
    where higher is better."""
    if not terms:
        return []
    if _postgres(conn):
        query_text = " | ".join(terms)
        found = await conn.execute(
            sa.text(
                "SELECT m.*, ts_rank(m.search, q) AS score "
                "FROM memories m, to_tsquery('english', :q) q "
                "WHERE m.tenant = :tenant AND m.subject = :subject AND m.search @@ q "
                "ORDER BY score DESC, m.memory_id LIMIT :limit"
            ),
            {"q": query_text, "tenant": tenant, "subject": subject, "limit": limit},
        )
        return [(MemoryRow.from_mapping(r), float(r["score"])) for r in found.mappings()]
    query_text = " OR ".join(f'"{t}"' for t in terms)
    found = await conn.execute(
        sa.text(
            "SELECT m.*, -bm25(memories_fts) AS score "
            "FROM memories_fts JOIN memories m ON m.rowid = memories_fts.rowid "
            "WHERE memories_fts MATCH :q AND m.tenant = :tenant AND m.subject = :subject "
            "ORDER BY score DESC, m.memory_id LIMIT :limit"
        ).columns(**_TYPES),  # SQLite gives JSON, times and booleans as stored: read them typed
        {"q": query_text, "tenant": tenant, "subject": subject, "limit": limit},
    )
    return [(MemoryRow.from_mapping(r), float(r["score"])) for r in found.mappings()]


async def with_embeddings(
    conn: AsyncConnection, tenant: str, subject: str, model: str
) -> list[MemoryRow]:
    """A subject's entries embedded by `model` (cosine is computed over these)."""
    found = await conn.execute(
        sa.select(memories).where(
            memories.c.tenant == tenant,
            memories.c.subject == subject,
            memories.c.embedding_model == model,
        )
    )
    return [MemoryRow.from_mapping(r) for r in found.mappings()]


async def expired(conn: AsyncConnection, now: datetime, *, limit: int) -> list[MemoryRow]:
    found = await conn.execute(
        sa.select(memories)
        .where(memories.c.expires_at.is_not(None), memories.c.expires_at <= now)
        .order_by(memories.c.expires_at)
        .limit(limit)
    )
    return [MemoryRow.from_mapping(r) for r in found.mappings()]


async def stale(conn: AsyncConnection, before: datetime, *, limit: int) -> list[MemoryRow]:
    """Entries not updated since `before` (memory's own retention)."""
    found = await conn.execute(
        sa.select(memories)
        .where(memories.c.updated_at < before)
        .order_by(memories.c.updated_at)
        .limit(limit)
    )
    return [MemoryRow.from_mapping(r) for r in found.mappings()]


# -- writing ----------------------------------------------------------------------------------


async def insert(conn: AsyncConnection, row: Mapping[str, Any]) -> bool:
    """Insert a new entry; False, and nothing written, when another transaction has just
    stored one at the same (tenant, subject, type, key) (Postgres waits for it to commit)."""
    # RETURNING, not rowcount: Postgres connections here may run pipelined, where a
    # statement's rowcount is not known when it is read.
    statement: Any
    if _postgres(conn):
        statement = (
            pg_insert(memories)
            .values(**row)
            .on_conflict_do_nothing(index_elements=["tenant", "subject", "type", "key"])
        )
    else:
        statement = sa.insert(memories).values(**row).prefix_with("OR IGNORE")
    added = await conn.execute(statement.returning(memories.c.memory_id))
    if added.first() is None:
        return False
    if not _postgres(conn):
        await conn.execute(
            sa.text(
                "INSERT INTO memories_fts (rowid, key, text) "
                "SELECT rowid, key, text FROM memories WHERE memory_id = :id"
            ),
            {"id": row["memory_id"]},
        )
    return True


async def update(
    conn: AsyncConnection, entry: MemoryRow, values: Mapping[str, Any], *, now: datetime
) -> bool:
    """Change an entry read at `entry.version`; False if it moved (or went) meanwhile."""
    changed = await conn.execute(
        sa.update(memories)
        .where(memories.c.memory_id == entry.memory_id, memories.c.version == entry.version)
        .values(**values, version=entry.version + 1, updated_at=now)
    )
    if changed.rowcount != 1:
        return False
    if not _postgres(conn) and ({"key", "text"} & set(values)):
        await _fts_delete(conn, [entry.memory_id])
        await conn.execute(
            sa.text(
                "INSERT INTO memories_fts (rowid, key, text) "
                "SELECT rowid, key, text FROM memories WHERE memory_id = :id"
            ),
            {"id": entry.memory_id},
        )
    return True


async def _fts_delete(conn: AsyncConnection, ids: Sequence[str]) -> None:
    await conn.execute(
        sa.text(
            "DELETE FROM memories_fts WHERE rowid IN "
            "(SELECT rowid FROM memories WHERE memory_id IN (SELECT value FROM json_each(:ids)))"
        ),
        {"ids": _json_list(ids)},
    )


def _json_list(values: Sequence[str]) -> str:
    return json.dumps(list(values))


async def delete(conn: AsyncConnection, ids: Sequence[str]) -> int:
    """Delete these entries and their index entries. On SQLite the FTS index is merged so no
    segment keeps a deleted entry's tokens (secure_delete then zeroes the freed pages)."""
    if not ids:
        return 0
    if not _postgres(conn):
        await _fts_delete(conn, ids)
        await conn.execute(sa.text("INSERT INTO memories_fts (memories_fts) VALUES ('optimize')"))
    gone = await conn.execute(sa.delete(memories).where(memories.c.memory_id.in_(list(ids))))
    return gone.rowcount or 0


# -- a run's provenance ------------------------------------------------------------------------


async def user_messages(conn: AsyncConnection, run_id: str) -> list[Any]:
    """What a run's user said: its user messages, in order."""
    found = await conn.execute(
        sa.select(run_messages.c.message)
        .where(run_messages.c.run_id == run_id, run_messages.c.role == "user")
        .order_by(run_messages.c.seq)
    )
    return [r[0] for r in found.all()]


async def receipts_read(
    conn: AsyncConnection, run_id: str, *, before_task: str | None, internal: Sequence[str]
) -> bool:
    """Whether the run's model has read a tool's output: a tool step (not of the `internal`
    connectors) ended in a round before `before_task` (the current one, whose outputs the model
    has not seen yet)."""
    query = (
        sa.select(steps.c.id)
        .join(tasks, tasks.c.task_id == steps.c.task_id)
        .where(
            tasks.c.run_id == run_id,
            steps.c.connector.not_in(list(internal)),
            steps.c.finished_at.is_not(None),
        )
        .limit(1)
    )
    if before_task is not None:
        query = query.where(tasks.c.task_id < before_task)
    return (await conn.execute(query)).first() is not None


# -- the scrub: copies of forgotten text a subject's runs made ---------------------------------


async def subject_runs(conn: AsyncConnection, tenant: str, subject: str) -> list[str]:
    found = await conn.execute(
        sa.select(runs.c.run_id).where(runs.c.tenant == tenant, runs.c.subject == subject)
    )
    return [r[0] for r in found.all()]


async def run_tasks(conn: AsyncConnection, run_ids: Sequence[str]) -> list[str]:
    if not run_ids:
        return []
    found = await conn.execute(sa.select(tasks.c.task_id).where(tasks.c.run_id.in_(list(run_ids))))
    return [r[0] for r in found.all()]


async def subject_tasks(conn: AsyncConnection, tenant: str, subject: str) -> list[str]:
    """The tasks that act for a subject: callers' own, and runs' rounds (by a partial index)."""
    found = await conn.execute(
        sa.select(tasks.c.task_id).where(tasks.c.tenant == tenant, tasks.c.subject == subject)
    )
    return [r[0] for r in found.all()]


# (table, key columns, text columns): where a run's or a task's copies of a text can be.
_RUN_COPIES = ((runs, ("run_id",), ("answer", "error", "context")),)
_MESSAGE_COPIES = ((run_messages, ("run_id", "seq"), ("message",)),)
_TASK_COPIES = (
    (steps, ("id",), ("args", "resolved_args", "output", "error", "receipt", "approval")),
    (events, ("id",), ("data",)),
    (tasks, ("task_id",), ("request", "context", "goal")),
)


async def copies(
    conn: AsyncConnection, run_ids: Sequence[str], task_ids: Sequence[str]
) -> Iterable[tuple[sa.Table, dict[str, Any], dict[str, Any]]]:
    """Every row that may hold a copy: (table, its key, its text columns)."""
    found: list[tuple[sa.Table, dict[str, Any], dict[str, Any]]] = []
    groups = [
        (_RUN_COPIES, "run_id", run_ids),
        (_MESSAGE_COPIES, "run_id", run_ids),
        (_TASK_COPIES, "task_id", task_ids),
    ]
    for tables, by, ids in groups:
        if not ids:
            continue
        for table, keys, columns in tables:
            rows = await conn.execute(
                sa.select(*(table.c[k] for k in keys), *(table.c[c] for c in columns)).where(
                    table.c[by].in_(list(ids))
                )
            )
            for r in rows.mappings():
                found.append((table, {k: r[k] for k in keys}, {c: r[c] for c in columns}))
    return found


async def rewrite(
    conn: AsyncConnection, table: sa.Table, key: Mapping[str, Any], values: Mapping[str, Any]
) -> None:
    await conn.execute(
        sa.update(table).where(*(table.c[k] == v for k, v in key.items())).values(**values)
    )


# -- embeddings -----------------------------------------------------------------------------------


async def set_embedding(
    conn: AsyncConnection, memory_id: str, model: str, blob: bytes, *, mark: str | None = None
) -> bool:
    """Store an entry's embedding; with `mark`, only while the entry still holds the content
    that was embedded. No new version: what the entry says did not change."""
    query = sa.update(memories).where(memories.c.memory_id == memory_id)
    if mark is not None:
        query = query.where(memories.c.mark == mark)
    changed = await conn.execute(query.values(embedding=blob, embedding_model=model))
    return changed.rowcount == 1


async def embedded(
    conn: AsyncConnection, tenant: str, subject: str, model: str, *, limit: int
) -> list[tuple[str, bytes]]:
    """(id, packed vector) of at most `limit` of a subject's entries embedded by `model` (the
    vectors only: the texts are read for the nearest few)."""
    found = await conn.execute(
        sa.select(memories.c.memory_id, memories.c.embedding)
        .where(
            memories.c.tenant == tenant,
            memories.c.subject == subject,
            memories.c.embedding_model == model,
            memories.c.embedding.is_not(None),
        )
        .order_by(memories.c.updated_at.desc(), memories.c.memory_id)
        .limit(limit)
    )
    return [(r[0], bytes(r[1])) for r in found.all()]


async def load_many(conn: AsyncConnection, tenant: str, ids: Sequence[str]) -> dict[str, MemoryRow]:
    """These entries of a tenant, by id (those that exist)."""
    if not ids:
        return {}
    found = await conn.execute(
        sa.select(memories).where(memories.c.tenant == tenant, memories.c.memory_id.in_(list(ids)))
    )
    return {r["memory_id"]: MemoryRow.from_mapping(r) for r in found.mappings()}
