"""An index for the next deferred step's due time.

Every claim asks when the earliest ready step that is not due yet becomes due. Without this
index that read walks every ready step of the connectors (a million queued steps: a million rows
per claim); deferred steps (retries in backoff, undo windows, rate-limited steps) are few, and
this partial index holds only them.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_DEFERRED = "status = 'ready' AND not_before IS NOT NULL"


def upgrade() -> None:
    op.create_index(
        "ix_steps_ready_deferred",
        "steps",
        ["connector", "not_before"],
        postgresql_where=sa.text(_DEFERRED),
        sqlite_where=sa.text(_DEFERRED),
    )


def downgrade() -> None:
    op.drop_index("ix_steps_ready_deferred", table_name="steps")
