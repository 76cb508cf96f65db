"""SQL of the tool catalogue: immutable versions, the current head of each tool, its history."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_reach_controller.storage import hot
from agent_reach_controller.storage.engine import (
    before_commit,
    commit_statement,
    dialect_insert,
)
from agent_reach_controller.storage.schema import catalog_state, tool_changes, tool_heads, tools


class CatalogChangedError(Exception):
    """The tool catalogue changed after the plan was validated: validate again."""


@dataclass(frozen=True, slots=True)
class HeadRow:
    name: str
    version: str
    revision: int
    updated_by: str
    updated_at: datetime
    spec: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ChangeRow:
    revision: int
    name: str
    action: str
    version: str | None
    principal: str
    created_at: datetime


async def save_versions(conn: AsyncConnection, rows: Sequence[dict[str, Any]]) -> None:
    """Store tool definitions by (name, version); a stored version never changes."""
    if rows:
        await conn.execute(
            dialect_insert(conn, tools).on_conflict_do_nothing(index_elements=["name", "version"]),
            list(rows),
        )


async def load_version(conn: AsyncConnection, name: str, version: str) -> dict[str, Any] | None:
    row = await conn.execute(
        sa.select(tools.c.spec).where(tools.c.name == name, tools.c.version == version)
    )
    spec: dict[str, Any] | None = row.scalar_one_or_none()
    return spec


CATALOG_REVISION = "SELECT revision FROM catalog_state WHERE id = 1"


# Whether the catalogue is still at the revision a plan was validated against (a submit's guard).
FRESH_CATALOG = "SELECT revision = %(expected)s AS fresh FROM catalog_state WHERE id = 1"


async def revision(conn: AsyncConnection, *, lock: bool = False) -> int:
    """The catalogue's revision; `lock` holds it until commit (one writer at a time)."""
    if not lock and conn.dialect.name == "postgresql":
        return int((await hot.tuples(conn, CATALOG_REVISION, {}))[0][0])
    query = sa.select(catalog_state.c.revision).where(catalog_state.c.id == 1)
    if lock:  # SQLite, one writer, compiles no FOR UPDATE
        query = query.with_for_update()
    return int((await conn.execute(query)).scalar_one())


async def expect_revision(conn: AsyncConnection, expected: int) -> None:
    """Commit only if the catalogue is still at `expected`, else raise CatalogChangedError.

    On Postgres the check is part of the commit statement, as late as it can be (no round trip
    of its own); on SQLite, the one writer, it is made at once.
    """
    if conn.dialect.name != "postgresql":
        if await revision(conn) != expected:
            raise CatalogChangedError
        return

    async def guard(c: AsyncConnection) -> None:
        fresh = "coalesce(bool_and(fresh), false)"
        params = {"expected": expected}
        commit_statement(c).expect(FRESH_CATALOG, params, holds=fresh, refusal=CatalogChangedError)

    before_commit(conn, guard)


async def load_heads(conn: AsyncConnection) -> list[HeadRow]:
    """Every tool in the live catalogue with its current definition, in name order."""
    rows = await conn.execute(
        sa.select(
            tool_heads.c.name,
            tool_heads.c.version,
            tool_heads.c.revision,
            tool_heads.c.updated_by,
            tool_heads.c.updated_at,
            tools.c.spec,
        )
        .join(
            tools,
            sa.and_(tools.c.name == tool_heads.c.name, tools.c.version == tool_heads.c.version),
        )
        .order_by(tool_heads.c.name)
    )
    return [HeadRow(*row) for row in rows]


async def write_changes(
    conn: AsyncConnection, changes: Sequence[ChangeRow], *, specs: dict[str, dict[str, Any]]
) -> None:
    """Record `changes` (in revision order), move each head, and set the catalogue's revision.

    `specs` holds the definition of every version a change points at, by version.
    """
    if not changes:
        return
    versions = {(c.name, c.version): c.created_at for c in changes if c.version is not None}
    await save_versions(
        conn,
        [
            {"name": name, "version": version, "spec": specs[version], "created_at": at}
            for (name, version), at in versions.items()
        ],
    )
    await conn.execute(sa.insert(tool_changes), [_change_values(c) for c in changes])
    for change in changes:
        if change.version is None:
            await conn.execute(sa.delete(tool_heads).where(tool_heads.c.name == change.name))
            continue
        head = {
            "version": change.version,
            "revision": change.revision,
            "updated_by": change.principal,
            "updated_at": change.created_at,
        }
        upsert = dialect_insert(conn, tool_heads).values(name=change.name, **head)
        await conn.execute(upsert.on_conflict_do_update(index_elements=["name"], set_=head))
    await conn.execute(
        sa.update(catalog_state)
        .where(catalog_state.c.id == 1)
        .values(revision=max(c.revision for c in changes))
    )


def _change_values(change: ChangeRow) -> dict[str, Any]:
    return {
        "revision": change.revision,
        "name": change.name,
        "action": change.action,
        "version": change.version,
        "principal": change.principal,
        "created_at": change.created_at,
    }


async def history(conn: AsyncConnection, name: str, *, limit: int) -> list[ChangeRow]:
    """A tool's changes, newest first."""
    rows = await conn.execute(
        sa.select(
            tool_changes.c.revision,
            tool_changes.c.name,
            tool_changes.c.action,
            tool_changes.c.version,
            tool_changes.c.principal,
            tool_changes.c.created_at,
        )
        .where(tool_changes.c.name == name)
        .order_by(tool_changes.c.revision.desc())
        .limit(limit)
    )
    return [ChangeRow(*row) for row in rows]
