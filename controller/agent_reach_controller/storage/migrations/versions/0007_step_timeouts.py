"""A step's own timeouts, and when a queued attempt must have started (schedule_to_start).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_QUEUED = "status = 'ready' AND start_by IS NOT NULL"


def upgrade() -> None:
    json = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
    with op.batch_alter_table("steps") as batch:
        batch.add_column(sa.Column("timeouts", json, nullable=True))
        batch.add_column(sa.Column("start_by", sa.DateTime(timezone=True), nullable=True))
    op.create_index(
        "ix_steps_ready_start_by",
        "steps",
        ["start_by"],
        postgresql_where=sa.text(_QUEUED),
        sqlite_where=sa.text(_QUEUED),
    )


def downgrade() -> None:
    op.drop_index("ix_steps_ready_start_by", table_name="steps")
    with op.batch_alter_table("steps") as batch:
        batch.drop_column("start_by")
        batch.drop_column("timeouts")
