"""Long-term memory's store on both backends: one entry per (subject, type, key), history in the
audit log and not in duplicates, full-text search, quotas, refusals, and a delete that leaves
nothing behind in the database."""

from __future__ import annotations

import asyncio
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from agent_reach_controller.domain.records import MemoryOrigin
from agent_reach_controller.services.memory import (
    Entry,
    MemoryInputError,
    MemoryQuotaError,
    Writer,
)
from agent_reach_controller.storage.schema import audit_log
from tests.integration.stack import components_for, write_tools

pytestmark = pytest.mark.asyncio

CALLER = Writer(tenant="acme", actor="alice")
RUN = Writer(tenant="acme", actor="run:r1", origin=MemoryOrigin.MODEL, source={"run": "r1"})


async def test_one_entry_per_key_and_its_history_in_the_audit_log(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path, [])) as c:
        first = await c.memory.put(
            CALLER, "u1", Entry(type="fact", key="city", text="Lives in Wuhan")
        )
        again = await c.memory.put(
            CALLER, "u1", Entry(type="fact", key="city", text="Lives in Wuhan")
        )
        moved = await c.memory.put(
            CALLER, "u1", Entry(type="fact", key="city", text="Lives in Oslo")
        )
        assert (first.created, again.changed, moved.created) == (True, False, False)
        assert (moved.entry.memory_id, moved.entry.version) == (first.entry.memory_id, 2)
        assert [e.text for e in await c.memory.entries("acme", "u1")] == ["Lives in Oslo"]
        async with c.db.transaction() as conn:
            rows = (
                await conn.execute(
                    sa.select(audit_log.c.action, audit_log.c.data).where(
                        audit_log.c.target == f"memory:{first.entry.memory_id}"
                    )
                )
            ).all()
        assert [r[0] for r in rows] == ["memory.write", "memory.update"]
        for _, data in rows:
            for plain in ("u1", "Wuhan", "Oslo"):
                assert plain not in str(data)
        assert rows[0][1]["subject"] == rows[1][1]["subject"]  # the same HMAC, not the name


async def test_full_text_finds_a_subjects_entries_and_no_one_elses(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(database_url, write_tools(tmp_path, [])) as c:
        await c.memory.put(
            CALLER,
            "u1",
            Entry(type="preference", key="channel", text="Prefers email over phone calls"),
        )
        await c.memory.put(CALLER, "u1", Entry(type="fact", key="city", text="Lives in Wuhan"))
        await c.memory.put(
            CALLER, "u2", Entry(type="preference", key="channel", text="Prefers email always")
        )
        other = Writer(tenant="globex", actor="bob")
        await c.memory.put(other, "u1", Entry(type="preference", key="channel", text="email me"))
        found = await c.memory.search("acme", "u1", "How should I email the user?")
        assert [(e.subject, e.key) for e, _ in found] == [("u1", "channel")]
        assert await c.memory.search("acme", "u1", "the of and") == []


async def test_refusals_quota_and_reserved_types(database_url: str, tmp_path: Path) -> None:
    async with components_for(database_url, write_tools(tmp_path, []), memory_per_subject=2) as c:
        with pytest.raises(MemoryInputError) as refused:
            await c.memory.put(RUN, "u1", Entry(type="profile", key="name", text="Mallory"))
        assert refused.value.problems[0].pointer == "/type"
        key = "AKIAIOSFODNN7EXAMPLE"
        with pytest.raises(MemoryInputError) as secret:
            await c.memory.put(CALLER, "u1", Entry(type="fact", key="aws", text=f"key {key}"))
        assert secret.value.problems[0].pointer == "/text"
        assert key not in str(secret.value)
        await c.memory.put(CALLER, "u1", Entry(type="profile", key="name", text="Alice"))
        await c.memory.put(CALLER, "u1", Entry(type="fact", key="city", text="Lives in Wuhan"))
        with pytest.raises(MemoryInputError) as overwrite:  # a run may not overwrite a caller's
            await c.memory.put(RUN, "u1", Entry(type="fact", key="city", text="Lives in Oslo"))
        assert overwrite.value.problems[0].pointer == "/key"
        with pytest.raises(MemoryQuotaError):
            await c.memory.put(CALLER, "u1", Entry(type="fact", key="y", text="third"))
        await c.memory.put(CALLER, "u2", Entry(type="fact", key="y", text="another subject"))


async def test_a_forgotten_entry_is_gone_from_the_sqlite_file(
    tmp_path: Path, sqlite_url: str
) -> None:
    canary = "canary-7c1d-the-user-hides-gold-under-the-oak"
    async with components_for(sqlite_url, write_tools(tmp_path, [])) as c:
        written = await c.memory.put(CALLER, "u1", Entry(type="fact", key="gold", text=canary))
        await c.memory.put(CALLER, "u1", Entry(type="fact", key="city", text="Lives in Wuhan"))
        assert [e.key for e, _ in await c.memory.search("acme", "u1", "gold oak")] == ["gold"]
        await c.memory.forget("acme", "alice", written.entry.memory_id)
        assert await c.memory.search("acme", "u1", "gold oak") == []
        async with c.db.transaction() as conn:
            await conn.execute(sa.text("PRAGMA wal_checkpoint(TRUNCATE)"))
    path = Path(sqlite_url.removeprefix("sqlite:///"))
    with sqlite3.connect(path) as db:
        dump = "\n".join(db.iterdump())
    assert "Wuhan" in dump  # the dump is read, and holds what was not forgotten
    assert canary not in dump
    raw = b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))
    assert canary.encode() not in raw


async def test_memory_has_its_own_retention_and_task_retention_keeps_it(
    database_url: str, tmp_path: Path
) -> None:
    async with components_for(
        database_url, write_tools(tmp_path, []), memory_retention_days=30, retention_days=1
    ) as c:
        now = datetime.now(UTC)
        soon = now + timedelta(hours=1)
        kept = await c.memory.put(CALLER, "u1", Entry(type="fact", key="kept", text="kept one"))
        await c.memory.put(
            CALLER, "u1", Entry(type="fact", key="brief", text="brief one", expires_at=soon)
        )
        assert await c.memory.prune(now=now) == 0
        await c.retention.prune(now=now + timedelta(days=10))  # tasks' retention: not memory's
        assert len(await c.memory.entries("acme", "u1")) == 2
        assert await c.memory.prune(now=soon) == 1  # expired
        assert [e.key for e in await c.memory.entries("acme", "u1")] == ["kept"]
        assert await c.memory.prune(now=now + timedelta(days=31)) == 1  # past memory's retention
        assert await c.memory.entries("acme", "u1") == []
        async with c.db.transaction() as conn:
            actions = (
                await conn.execute(
                    sa.select(audit_log.c.actor, audit_log.c.action).where(
                        audit_log.c.target == f"memory:{kept.entry.memory_id}"
                    )
                )
            ).all()
        assert [tuple(a) for a in actions] == [
            ("alice", "memory.write"),
            ("retention", "memory.forget"),
        ]


async def test_writers_racing_on_one_key_make_one_entry(database_url: str, tmp_path: Path) -> None:
    async with components_for(database_url, write_tools(tmp_path, [])) as c:
        texts = [f"Lives in city number {i}" for i in range(6)]
        written = await asyncio.gather(
            *(c.memory.put(CALLER, "u1", Entry(type="fact", key="city", text=t)) for t in texts)
        )
        [entry] = await c.memory.entries("acme", "u1")
    assert sum(w.created for w in written) == 1
    assert entry.text in texts
    assert entry.version == len([w for w in written if w.changed])
