"""SQL of a run's recall by embeddings: which of a subject's memories still lack a vector for a
model, and the embed step's output put down once its vectors are stored with the memories."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_reach_controller.domain.records import MemoryOrigin
from agent_reach_controller.storage.schema import memories, steps


async def unembedded(
    conn: AsyncConnection, tenant: str, subject: str, model: str, *, limit: int
) -> list[tuple[str, str, str]]:
    """(id, mark, text) of at most `limit` of a subject's memories with no vector by `model`,
    the most recently updated first: those recall may rank (neither pinned, which are always
    recalled, nor from a tool's output, which never is)."""
    found = await conn.execute(
        sa.select(memories.c.memory_id, memories.c.mark, memories.c.text)
        .where(
            memories.c.tenant == tenant,
            memories.c.subject == subject,
            memories.c.pinned.is_(False),
            memories.c.origin != MemoryOrigin.RECEIPT.value,
            sa.or_(memories.c.embedding_model.is_(None), memories.c.embedding_model != model),
        )
        .order_by(memories.c.updated_at.desc(), memories.c.memory_id)
        .limit(limit)
    )
    return [(r[0], r[1], r[2]) for r in found.all()]


async def put_output(conn: AsyncConnection, key: int, output: Mapping[str, Any]) -> None:
    """Replace a succeeded step's output, and its receipt's copy of it (`data`)."""
    receipt = (await conn.execute(sa.select(steps.c.receipt).where(steps.c.id == key))).scalar()
    values: dict[str, Any] = {"output": dict(output)}
    if isinstance(receipt, Mapping) and "data" in receipt:
        values["receipt"] = dict(receipt) | {"data": dict(output)}
    await conn.execute(sa.update(steps).where(steps.c.id == key).values(**values))
