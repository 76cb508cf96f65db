"""Task deadline and attempt budget.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OPEN_WITH_DEADLINE = "deadline IS NOT NULL AND status IN ('pending', 'running')"


def upgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.add_column(sa.Column("deadline", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("max_attempts", sa.Integer(), nullable=True))
    op.create_index(
        "ix_tasks_open_deadline",
        "tasks",
        ["deadline"],
        postgresql_where=sa.text(OPEN_WITH_DEADLINE),
        sqlite_where=sa.text(OPEN_WITH_DEADLINE),
    )


def downgrade() -> None:
    op.drop_index("ix_tasks_open_deadline", table_name="tasks")
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("max_attempts")
        batch.drop_column("deadline")
