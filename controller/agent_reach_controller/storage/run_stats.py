"""SQL of an agent's figures: its ended runs and their rounds' tool steps, summed per version."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from agent_reach.states import StepStatus
from agent_reach_controller.storage.schema import runs, steps, tasks

# What an empty or absent list of claims is stored as (a JSON column keeps None as `null`).
_NO_CLAIMS = ("[]", "null")


@dataclass(frozen=True, slots=True, kw_only=True)
class VersionSums:
    """An agent version's ended runs, summed (rates are the service's)."""

    version: str
    runs: int
    succeeded: int
    rounds: int
    input_tokens: int
    output_tokens: int
    cost: float
    ungrounded: int  # succeeded runs whose answer made claims nothing showed
    tool_steps: int
    tool_failures: int
    first_run_at: datetime


async def version_sums(  # noqa: PLR0913 - one query's filters, each needed
    conn: AsyncConnection,
    *,
    tenant: str,
    agent: str,
    ended: Sequence[str],
    succeeded: str,
    round_steps: Sequence[str],
    version: str | None = None,
) -> list[VersionSums]:
    """Per version of `agent`, the tenant's runs in an `ended` status summed, newest version
    (by its first run) first."""
    where = [runs.c.tenant == tenant, runs.c.agent == agent, runs.c.status.in_(list(ended))]
    if version is not None:
        where.append(runs.c.agent_version == version)
    is_ok = runs.c.status == succeeded
    claimed = sa.and_(
        is_ok,
        runs.c.ungrounded_claims.is_not(None),
        sa.cast(runs.c.ungrounded_claims, sa.Text).not_in(_NO_CLAIMS),
    )
    totals = (
        sa.select(
            runs.c.agent_version,
            sa.func.count().label("runs"),
            sa.func.sum(sa.case((is_ok, 1), else_=0)).label("succeeded"),
            sa.func.sum(runs.c.round).label("rounds"),
            sa.func.sum(runs.c.input_tokens).label("input_tokens"),
            sa.func.sum(runs.c.output_tokens).label("output_tokens"),
            sa.func.sum(runs.c.cost).label("cost"),
            sa.func.sum(sa.case((claimed, 1), else_=0)).label("ungrounded"),
            sa.func.min(runs.c.created_at).label("first_run_at"),
        )
        .where(*where)
        .group_by(runs.c.agent_version)
    )
    found = {r["agent_version"]: r for r in (await conn.execute(totals)).mappings()}
    tools = await _tool_steps(conn, where, round_steps)
    sums = [
        VersionSums(
            version=v,
            runs=int(r["runs"]),
            succeeded=int(r["succeeded"] or 0),
            rounds=int(r["rounds"] or 0),
            input_tokens=int(r["input_tokens"] or 0),
            output_tokens=int(r["output_tokens"] or 0),
            cost=float(r["cost"] or 0.0),
            ungrounded=int(r["ungrounded"] or 0),
            tool_steps=tools.get(v, (0, 0))[0],
            tool_failures=tools.get(v, (0, 0))[1],
            first_run_at=r["first_run_at"],
        )
        for v, r in found.items()
    ]
    return sorted(sums, key=lambda s: (s.first_run_at, s.version), reverse=True)


async def _tool_steps(
    conn: AsyncConnection, where: list[sa.ColumnElement[bool]], round_steps: Sequence[str]
) -> dict[str, tuple[int, int]]:
    """Per version: the tool steps of the runs' rounds' tasks (not `round_steps`: the model's
    call, the recall), and how many of them failed."""
    query = (
        sa.select(
            runs.c.agent_version,
            sa.func.count().label("steps"),
            sa.func.sum(sa.case((steps.c.status == StepStatus.FAILED, 1), else_=0)).label("failed"),
        )
        .select_from(
            runs.join(tasks, tasks.c.run_id == runs.c.run_id).join(
                steps, steps.c.task_id == tasks.c.task_id
            )
        )
        .where(*where, steps.c.step_id.not_in(list(round_steps)))
        .group_by(runs.c.agent_version)
    )
    rows = (await conn.execute(query)).all()
    return {r[0]: (int(r[1]), int(r[2] or 0)) for r in rows}
