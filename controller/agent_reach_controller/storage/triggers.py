"""SQL of triggers: the head of each (`triggers`) and its immutable template versions."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from agent_reach_controller.storage.engine import Connection, dialect_insert
from agent_reach_controller.storage.schema import trigger_versions, triggers


@dataclass(frozen=True, slots=True, kw_only=True)
class TriggerRow:
    """One row of `triggers`, with its live version's template."""

    name: str
    tenant: str
    version: int
    enabled: bool
    secret: str
    owner: str
    key_id: str | None
    created_at: datetime
    updated_at: datetime
    updated_by: str
    template: dict[str, Any]
    sha256: str

    @classmethod
    def from_mapping(cls, row: Mapping[Any, Any]) -> TriggerRow:
        return cls(**{name: row[name] for name in cls.__dataclass_fields__})


@dataclass(frozen=True, slots=True, kw_only=True)
class VersionRow:
    """One row of `trigger_versions`."""

    name: str
    version: int
    template: dict[str, Any]
    sha256: str
    created_by: str
    created_at: datetime


_HEAD = sa.select(triggers, trigger_versions.c.template, trigger_versions.c.sha256).join(
    trigger_versions,
    sa.and_(
        trigger_versions.c.name == triggers.c.name,
        trigger_versions.c.version == triggers.c.version,
    ),
)


async def load(conn: Connection, name: str, *, lock: bool = False) -> TriggerRow | None:
    """A trigger with its live template; `lock` holds the head until commit (one writer)."""
    query = _HEAD.where(triggers.c.name == name)
    if lock:  # SQLite, one writer, compiles no FOR UPDATE
        query = query.with_for_update(of=triggers)
    row = (await conn.execute(query)).mappings().one_or_none()
    return TriggerRow.from_mapping(row) if row else None


async def list_heads(conn: Connection, *, tenant: str | None) -> list[TriggerRow]:
    """Every trigger (of `tenant`, unless None), by name."""
    query = _HEAD.order_by(triggers.c.name)
    if tenant is not None:
        query = query.where(triggers.c.tenant == tenant)
    return [TriggerRow.from_mapping(r) for r in (await conn.execute(query)).mappings()]


async def load_version(conn: Connection, name: str, version: int) -> VersionRow | None:
    query = sa.select(trigger_versions).where(
        trigger_versions.c.name == name, trigger_versions.c.version == version
    )
    row = (await conn.execute(query)).mappings().one_or_none()
    return VersionRow(**row) if row else None


async def last_version(conn: Connection, name: str) -> int:
    """The highest version ever stored under `name` (0 for none): a deleted trigger's versions
    stay, so that the tasks it started can still show what they ran."""
    query = sa.select(sa.func.max(trigger_versions.c.version)).where(
        trigger_versions.c.name == name
    )
    return int((await conn.execute(query)).scalar_one() or 0)


async def add_version(conn: Connection, row: VersionRow) -> bool:
    """Store a version; False when another writer stored that version first."""
    done = await conn.execute(
        dialect_insert(conn, trigger_versions)
        .values(
            name=row.name,
            version=row.version,
            template=row.template,
            sha256=row.sha256,
            created_by=row.created_by,
            created_at=row.created_at,
        )
        .on_conflict_do_nothing(index_elements=["name", "version"])
        .returning(trigger_versions.c.version)
    )
    # RETURNING, not rowcount: a statement may be pipelined, and its rowcount then unknown.
    return done.first() is not None


async def save_head(conn: Connection, values: Mapping[str, Any], *, exists: bool) -> bool:
    """Insert the head of a new trigger, or update the one that `exists`; False when the row
    was not as expected (another writer created or deleted it meanwhile)."""
    if exists:
        fields = {k: v for k, v in values.items() if k not in ("name", "created_at")}
        statement = sa.update(triggers).where(triggers.c.name == values["name"]).values(**fields)
    else:
        statement = (
            dialect_insert(conn, triggers)
            .values(**values)
            .on_conflict_do_nothing(index_elements=["name"])
        )
    done = await conn.execute(statement.returning(triggers.c.name))
    return done.first() is not None


async def delete_head(conn: Connection, name: str) -> bool:
    """Remove a trigger (its versions stay); False when there was none."""
    done = await conn.execute(
        sa.delete(triggers).where(triggers.c.name == name).returning(triggers.c.name)
    )
    return done.first() is not None
